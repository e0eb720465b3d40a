"""A composed config as the estimate's numbers: the run's components say what they contribute.

The bridge between a run's config and the pure arithmetic of ``components/memory/estimate.py``: the PEFT
option counts its trainable parameters, the optimizer names its state size, the quantization its storage,
the strategy its shape; the architecture comes from the model node (its numbers, or a local config.json).
Nothing loads weights or imports torch; ``hydratune estimate``, ``strategy=auto`` and the GPU benches use it.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from hydratune.components.config.errors import ConfigError
from hydratune.components.distributed.mesh import Mesh
from hydratune.components.distributed.model_parallel import AUTOEP_MODEL_TYPES
from hydratune.components.memory.arch import Arch, param_counts
from hydratune.components.memory.estimate import Estimate, GiB, KiB, MiB, RunSpec, estimate
from hydratune.components.memory.ladder import Rung
from hydratune.components.memory.parallel import mesh_refusal
from hydratune.components.memory.shapes import StrategyShape
from hydratune.components.memory.states import DTYPE_BYTES
from hydratune.components.strategy.parallelism import AXES


def get(obj: Any, key: str, default: Any = None) -> Any:
    """``obj.key`` for dataclasses, dicts and DictConfigs alike."""
    if obj is None:
        return default
    if isinstance(obj, Mapping) or (hasattr(obj, "keys") and hasattr(obj, "get")):
        try:
            value = obj.get(key, default)
        except Exception:  # an interpolation that cannot resolve offline
            return default
        return default if value is None and default is not None else value
    return getattr(obj, key, default)


def arch_of_model(model: Any) -> Arch:
    """The architecture of a ``model`` config node (or CausalLM): its ``architecture`` numbers, over the
    local dir's config.json when ``name_or_path`` is one. No weights, no network, no transformers."""
    arch = dict(get(model, "architecture", {}) or {})
    name = str(get(model, "name_or_path", "") or "")
    from_run = get(model, "from_run", None)
    candidates = [
        Path(str(from_run)).expanduser() / "final",
        Path(str(from_run)).expanduser() / "final/merged",
    ]
    candidates = (candidates if from_run else []) + [Path(name).expanduser()]
    for folder in candidates:
        config = folder / "config.json"
        if config.is_file():
            arch = {**json.loads(config.read_text()), **arch}
            break
    needed = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
    text = {**arch, **(arch.get("text_config") or {})}  # a vision-language model's decoder
    missing = [k for k in needed if k not in text]
    if missing:
        raise ConfigError(
            f"the estimate needs the architecture numbers of '{name}' and {', '.join(missing)} "
            "are not in model.architecture (and it is not a local dir with config.json)",
            key="model.architecture",
            hint="use a shipped model (conf/model/), or pass model.architecture.<key>=… from its config.json",
        )
    try:
        return Arch.from_dict(arch)
    except ValueError as err:  # numbers it cannot read (what it does not model is Arch.unmodelled)
        raise ConfigError(f"cannot estimate '{name}': {err}", key="model.architecture") from None


def vision_knobs(model: Any, peft: Any, arch: Arch) -> dict[str, Any]:
    """A vision-language model's part of the RunSpec: image tokens per row (``model.image_tokens_per_row``,
    else one image at the processor's default size), parameters ``model.freeze`` keeps frozen under full
    fine-tuning, and whether the vision tower trains (full fine-tuning not freezing it, or adapters let onto
    it with ``peft.exclude_modules=[]``): only then does autograd keep its activations."""
    vision = arch.vision
    if vision is None:
        return {}
    frozen_parts = list(get(model, "freeze", []) or [])
    tokens = get(model, "image_tokens_per_row", None)
    tokens = vision.default_image_tokens if tokens is None else int(tokens)
    frozen = 0
    if not peft.enabled:  # an adapter freezes the base anyway: its trainable count is its own
        sizes = {
            "vision_tower": vision.tower,
            "projector": vision.projector,
            "language_model": param_counts(arch).total - vision.params,
        }
        frozen = sum(sizes[part] for part in frozen_parts if part in sizes)
    trains = (not peft.enabled or peft.adapts_vision) and "vision_tower" not in frozen_parts
    return {"image_tokens": tokens, "frozen_params": frozen, "vision_trains": trains}


def parse_memory(text: Any) -> float | None:
    """'80GB' / '80 GiB' / '24GiB' / '80' (GiB) / '512MB' -> bytes; 'auto' -> None."""
    if text is None:
        return None
    if isinstance(text, (int, float)):
        return float(text) * GiB
    s = str(text).strip().replace(" ", "")
    if s.lower() in ("auto", "", "0"):
        return None
    m = re.fullmatch(r"(?i)([0-9]*\.?[0-9]+)([kmgt]?i?b?)?", s)
    if not m:
        raise ConfigError(
            f"cannot read a memory size from '{text}'",
            key="estimate.gpu_memory",
            hint="e.g. 80GB, 24GiB or 80 (GiB)",
        )
    value, unit = float(m.group(1)), (m.group(2) or "").lower()
    # GPU memory is sold in GiB-ish "GB": an "80GB" H100 has 79.6 GiB usable; treat GB as GiB
    scale = {
        "": GiB,
        "k": KiB,
        "kb": KiB,
        "kib": KiB,
        "m": MiB,
        "mb": MiB,
        "mib": MiB,
        "g": GiB,
        "gb": GiB,
        "gib": GiB,
        "t": 1024 * GiB,
        "tb": 1024 * GiB,
        "tib": 1024 * GiB,
    }[unit]
    return value * scale


def detect_gpus() -> tuple[int, float | None]:
    """(visible GPUs, memory of the first) without importing torch when no GPU can be present."""
    import os
    import shutil

    if not shutil.which("nvidia-smi") and not os.path.exists("/proc/driver/nvidia"):
        return 1, None
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.device_count(), float(torch.cuda.get_device_properties(0).total_memory)
    except Exception:
        pass
    return 1, None


def world_of(cfg: Any) -> tuple[int, int]:
    """(GPUs per node, nodes) the estimate is for: ``estimate.*``, else the launcher's processes, else the
    visible GPUs."""
    est, launcher = get(cfg, "estimate", {}) or {}, get(cfg, "launcher", {}) or {}
    num_gpus = int(get(est, "num_gpus", 0) or 0)
    if num_gpus <= 0:  # the launcher's processes per node, else the visible GPUs
        nproc = int(get(launcher, "nproc_per_node", 1) or 1)
        num_gpus = nproc if nproc > 1 else detect_gpus()[0]
    num_nodes = int(get(est, "num_nodes", 1) or 1)
    if num_nodes == 1:
        num_nodes = int(get(launcher, "nnodes", 1) or 1)
    return num_gpus, num_nodes


def built(node: Any) -> Any:
    """A group's component from its config node (an instance passes through)."""
    from omegaconf import DictConfig

    if not isinstance(node, DictConfig):
        return node
    from hydra.utils import instantiate

    return instantiate(node, _convert_="all")


def trained_as(strategy: Any) -> Any:
    """The engine a run of the ``strategy`` option trains with: with pipeline stages the staged engine
    (``strategy/pipeline.py`` ``with_stages``), which the estimate's shape and mesh are of."""
    from hydratune.components.strategy import with_stages

    return with_stages(strategy)


def spec_from_config(cfg: Any, strategy: StrategyShape | None = None, **over: Any) -> RunSpec:
    """A RunSpec from a composed config: the peft, optimizer, quantization and strategy components say
    their part (built from their nodes: no weights, no torch)."""
    from hydratune.components.model import base_loads_in_half

    model, data, train = get(cfg, "model"), get(cfg, "data"), get(cfg, "train")
    peft, optimizer, quant = (
        built(get(cfg, "peft")),
        built(get(cfg, "optimizer")),
        built(get(cfg, "quantization")),
    )
    strategy_component = trained_as(built(get(cfg, "strategy")))
    arch = arch_of_model(model)
    num_gpus, num_nodes = world_of(cfg)
    mesh = checked_mesh(strategy_component, arch, num_gpus * num_nodes)
    precision = str(get(get(cfg, "precision"), "dtype", "fp32"))
    compute = {"fp32": 4, "bf16": 2, "fp16": 2, "auto": 2}.get(precision, 2)
    bits, quant_type, double_quant = quant.memory_format()
    weight = DTYPE_BYTES.get(str(get(model, "dtype", "auto")), 4)
    if str(get(model, "dtype", "auto")) == "auto" and precision in ("bf16", "auto"):
        weight = 2 if base_loads_in_half(peft, quant, strategy_component) else weight  # CausalLM.weight_dtype
    vision = vision_knobs(model, peft, arch)
    spec = RunSpec(
        arch=arch,
        trainable=peft.trainable_params(arch) - vision.get("frozen_params", 0),
        full_finetune=not peft.enabled,
        weight_bytes=weight,
        compute_bytes=compute,
        optimizer=optimizer.memory_kind,
        quant_bits=bits,
        quant_type=quant_type,
        double_quant=double_quant,
        micro_batch=int(get(train, "micro_batch_size", 1)),
        seq_len=int(get(data, "max_length", 1024) or 1024),
        gradient_checkpointing=bool(get(model, "gradient_checkpointing", False)),
        attn_implementation=str(get(model, "attn_implementation", "sdpa")),
        strategy=strategy or strategy_component.memory_shape(num_gpus),
        num_gpus=num_gpus,
        num_nodes=num_nodes,
        lora_inputs_per_layer=peft.adapter_inputs(arch),
        lora_dropout=peft.adapter_dropout,
        tp=mesh.tp,
        sp=mesh.sp,
        pp=mesh.pp,
        ep=mesh.ep,
        micro_batches=int(get(train, "gradient_accumulation_steps", 1) or 1),
        **vision,
        **teacher_knobs(get(cfg, "recipe"), compute),
        **reward_knobs(cfg, compute, peft, quant, strategy_component),
    )
    spec = replace(spec, **episode_knobs(cfg, spec))
    spec = replace(spec, **loss_knobs(cfg, peft, strategy_component, arch))
    spec = replace(spec, **value_knobs(get(cfg, "recipe"), spec, peft))
    return replace(spec, **over) if over else spec


def loss_knobs(cfg: Any, peft: Any, strategy: Any, arch: Any) -> dict[str, Any]:
    """The logits a step holds: one chunk of positions when the recipe's own loss path says it takes the
    chunked LM head (recipes/sft.py ``loss_path``: the same decision the run makes), else every position's."""
    from types import SimpleNamespace

    from hydratune.components.modeling.lm_head_chunk import chunk_for

    recipe = built(get(cfg, "recipe"))
    loss_path = getattr(recipe, "loss_path", None)
    if loss_path is None or not getattr(strategy, "decided", True):  # strategy=auto: count every position
        return {}
    impl, _ = loss_path(SimpleNamespace(strategy=strategy, peft=peft, model=built(get(cfg, "model"))))
    return {"logits_chunk": chunk_for(arch.vocab_size)} if impl == "chunked" else {}


def episode_knobs(cfg: Any, spec: RunSpec) -> dict[str, Any]:
    """recipe=grpo's sequences for the RunSpec: a prompt and its episode, ``data.max_prompt_length`` +
    ``recipe.max_completion_length`` tokens (not ``data.max_length``). TRL caps the whole episode at
    ``max_completion_length``, every turn and every tool result in it (a result that would pass it is
    dropped, a turn cut at it), so ``recipe.max_tool_calls`` adds turns, not tokens; the tools' schemas are
    inside the prompt's limit (checked before load). Generation holds the keys and values of the generation
    batch (``micro_batch_size`` x ``gradient_accumulation_steps`` sequences, TRL's default
    ``steps_per_generation``)."""
    recipe, data, train = get(cfg, "recipe"), get(cfg, "data"), get(cfg, "train")
    if not str(get(recipe, "_target_", "")).endswith(".GRPO"):
        return {}
    prompt = int(get(data, "max_prompt_length", None) or spec.seq_len)
    completion = int(get(recipe, "max_completion_length", 0) or 0)
    seq = prompt + completion
    batch = spec.micro_batch * int(get(train, "gradient_accumulation_steps", 1) or 1)
    notes = [
        f"recipe=grpo: a sequence is a prompt and its episode, data.max_prompt_length {prompt} + "
        f"recipe.max_completion_length {completion} = {seq} tokens; the generation batch ({batch} sequences) "
        "holds their keys and values while it generates"
    ]
    tools = list(get(recipe, "tools", None) or [])
    if tools or get(recipe, "environment", None):
        limit = get(recipe, "max_tool_calls", None)
        rounds = "any number of" if limit is None else f"up to {limit}"
        notes.append(
            f"tools: {rounds} tool-calling rounds per episode add turns, not tokens: TRL caps the whole "
            f"episode (every turn, every tool result) at recipe.max_completion_length {completion}, so the "
            "sequence above is the longest; each turn is generated again from the whole context (no KV cache "
            "kept between turns), and the tools' schemas are inside data.max_prompt_length"
        )
    return {"seq_len": seq, "generation_tokens": batch * seq, "notes": tuple(notes)}


def teacher_knobs(recipe: Any, compute_bytes: int) -> dict[str, Any]:
    """recipe=distill's teacher for the RunSpec: its parameters (config.json) in the compute dtype; with
    ``recipe.teacher_quantization`` its decoder layers' linear weights k-bit (bytes per parameter: the
    mean)."""
    spec = get(recipe, "teacher", None)
    if not spec:
        return {}
    from hydratune.components.modeling.teacher import rekeyed, teacher_component

    teacher = teacher_component(str(spec))
    node = {"name_or_path": teacher.source_dir(), "architecture": dict(teacher.architecture or {})}
    try:
        counts = param_counts(arch_of_model(node))
    except ConfigError as err:  # no architecture numbers: said of recipe.teacher
        raise rekeyed(err) from None
    bits = {"nf4": 4, "fp4": 4, "int8": 8}.get(str(get(recipe, "teacher_quantization", "none")))
    if bits is None:
        return {"teacher_params": int(counts.total), "teacher_bytes": compute_bytes}
    from hydratune.components.memory.states import quantized_bytes_per_param

    linear = counts.layer_linear * counts.num_layers  # what bitsandbytes quantizes (not the head, embeddings)
    held = (
        linear * quantized_bytes_per_param(bits, double_quant=True) + (counts.total - linear) * compute_bytes
    )
    return {"teacher_params": int(counts.total), "teacher_bytes": held / counts.total}


def reward_knobs(cfg: Any, compute_bytes: int, peft: Any, quant: Any, strategy: Any) -> dict[str, Any]:
    """recipe=ppo's reward model for the RunSpec: a separate model's parameters in the compute dtype, or,
    where it loads as an adapter on the policy's base (``placement``), only its adapter and score head;
    recipe=grpo's ``reward_model`` the same way."""
    from types import SimpleNamespace

    from hydratune.components.rewards import adapter_run, reward_model_dir

    recipe = get(cfg, "recipe")
    target = str(get(recipe, "_target_", ""))
    path = get(get(recipe, "reward", None), "model", None)
    if target.endswith(".GRPO"):  # recipe.reward_model, held beside the policy as PPO's is
        path = get(recipe, "reward_model", None)
    elif not target.endswith(".PPO") or get(recipe, "reward_url", None):
        return {}
    if not path:
        return {}
    run = adapter_run(str(path))
    if run is None:
        params = param_counts(arch_of_model({"name_or_path": reward_model_dir(str(path))})).total
        return {"reward_params": int(params), "reward_bytes": compute_bytes}
    from hydratune.components.reward_placement import adapter_params, placement

    adapter = adapter_params(run.final)
    comps = SimpleNamespace(peft=peft, quantization=quant, strategy=strategy, model=built(get(cfg, "model")))
    if placement(str(path), comps).shared:
        return {"reward_params": adapter, "reward_bytes": 4, "reward_shared": True}
    # loaded separately, the adapter is folded into its base: the base's parameters
    base = param_counts(arch_of_model({"name_or_path": run.base_component().source_dir()})).total
    return {"reward_params": int(base), "reward_bytes": compute_bytes}


def value_knobs(recipe: Any, spec: RunSpec, peft: Any) -> dict[str, Any]:
    """recipe=ppo's value function for the RunSpec: a head's parameters (hidden + 1), a critic adapter's (the
    policy's LoRA shape) + a head's, or a separate critic's (the reward model's size when it starts from a
    separate one, else the policy's)."""
    if not str(get(recipe, "_target_", "")).endswith(".PPO"):
        return {}
    kind = str(get(recipe, "value_model", "head"))
    head = spec.arch.hidden_size + 1
    if kind == "adapter":
        return {"value_model": kind, "value_params": peft.trainable_params(spec.arch) + head}
    if kind == "separate":
        params = spec.reward_params if spec.reward_params and not spec.reward_shared else None
        return {"value_model": kind, "value_params": params or param_counts(spec.arch).total}
    return {"value_model": kind, "value_params": head}


def checked_mesh(strategy: Any, arch: Arch, world_size: int) -> Mesh:
    """The strategy's split of ``world_size`` processes (its ``parallel`` keys' mesh), refused (a ConfigError
    naming the knob) when it does not divide the world or the model cannot be split that way."""
    mesh = strategy.parallel.mesh(world_size)
    mesh.check()
    refusal = mesh_refusal(arch, mesh.tp, mesh.sp, mesh.pp, ep=mesh.ep)
    if refusal:
        key, why = refusal
        hint = "pick a size the model divides"
        if key == "strategy.tp_size" and arch.is_moe:
            hint = "strategy.tp_size=1; strategy.ep_size (zero0-zero2) splits a mixture's experts over ranks"
        raise ConfigError(f"cannot split the model: {why}", key=key, hint=hint)
    return mesh


def gpu_memory_of(cfg: Any) -> float | None:
    """``estimate.gpu_memory`` in bytes, or the detected GPU's memory, or None (unknown)."""
    value = parse_memory(get(get(cfg, "estimate", {}), "gpu_memory", "auto"))
    return value if value is not None else detect_gpus()[1]


def strategy_shapes(world_size: int | None = None, gpus_per_node: int = 8) -> dict[str, StrategyShape]:
    """The memory shape of every strategy option (conf/strategy/), fastest first, as its component
    declares it (``Strategy.memory_shape``); with ``world_size``, only those that apply to that many
    ranks (``Strategy.applicable``)."""
    from hydratune.components.strategy import training_options

    return {
        name: strategy.memory_shape(gpus_per_node)
        for name, strategy in training_options().items()
        if world_size is None or strategy.applicable(world_size)
    }


def option_rung(name: str, strategy: Any, spec: RunSpec, overrides: tuple[str, ...] = ()) -> Rung | None:
    """The rung of strategy option ``name`` (its component ``strategy``, knobs already set) for ``spec``'s
    world, or None when its mesh does not divide that world or the model cannot be split so (TP kept
    inside a node, Ulysses' sequence length included)."""
    try:
        if overrides:  # a knob auto sets: the option's own refusals (a shipped option may leave one unset)
            strategy.validate()
        mesh = strategy.parallel.mesh(spec.world_size)
        mesh.check()
    except ConfigError:
        return None
    refused = mesh_refusal(
        spec.arch, mesh.tp, mesh.sp, mesh.pp, gpus_per_node=spec.num_gpus, seq_len=spec.seq_len, ep=mesh.ep
    )
    if refused or (mesh.ep > 1 and spec.arch.model_type not in AUTOEP_MODEL_TYPES):
        return None
    shape = strategy.memory_shape(spec.num_gpus)
    return Rung(name, shape, mesh.tp, mesh.sp, mesh.pp, overrides, ep=mesh.ep)


def strategy_rungs(spec: RunSpec, options: Mapping[str, Any] | None = None) -> list[Rung]:
    """The ladder for ``spec``'s world size: every strategy option that applies to it, as shipped, and, for
    those keeping every state on the GPUs, each size of each mesh dimension it declares it can split
    (``Strategy.searched_axes``) set through its ``strategy.<dim>_size`` knob, as a user would type it.
    ``options``: ``{name: component}`` (default: every option of conf/strategy/ that trains)."""
    from hydratune.components.strategy import training_options

    world = spec.world_size
    rungs: list[Rung] = []
    for name, strategy in (options if options is not None else training_options()).items():
        if not strategy.applicable(world):
            continue
        base = option_rung(name, strategy, spec)
        if base is None:
            continue
        rungs.append(base)
        if base.tier == 2:  # model parallelism is what avoids offload: not combined with it
            continue
        for dim in strategy.searched_axes:
            assert dim in AXES, f"{name}: unknown parallel dim {dim!r}"
            for size in range(2, world + 1):
                if world % size or size == getattr(base, dim):
                    continue
                knob = f"{dim}_size"
                variant = option_rung(
                    name, dataclasses.replace(strategy, **{knob: size}), spec, (f"strategy.{knob}={size}",)
                )
                rungs += [variant] if variant else []
    return rungs


def compare(spec: RunSpec) -> dict[str, Estimate]:
    """The same run under every strategy option that applies to its world size, each as shipped (with the
    mesh its component declares)."""
    return {rung.option: estimate(rung.apply(spec)) for rung in strategy_rungs(spec) if not rung.overrides}
