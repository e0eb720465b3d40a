"""``hydratune estimate <overrides>``: the memory per GPU of a composed run, every strategy side by side,
and the verdict for the GPU it is meant for (or ``strategy=auto``'s choice). Nothing is loaded."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hydratune.components.auto import decide, is_auto
from hydratune.components.distributed.mesh import Mesh
from hydratune.components.memory.arch import param_counts
from hydratune.components.memory.estimate import (
    CUDA_CONTEXT_BYTES,
    FRAGMENTATION,
    Estimate,
    GiB,
    RunSpec,
    estimate,
)
from hydratune.components.memory.ladder import choose
from hydratune.components.memory.spec import compare, get, gpu_memory_of, spec_from_config, strategy_rungs


def gib(x: float) -> str:
    return f"{x / GiB:.2f}"


#: Width of the tables when stdout is not a terminal (piped, captured): rich would otherwise assume 80
#: columns and cut the strategy names ("zero2_…").
PIPE_WIDTH = 160


def _console() -> Any:
    """A rich Console for stdout: the terminal's width, or ``PIPE_WIDTH`` when piped (COLUMNS wins)."""
    import os

    from rich.console import Console

    console = Console(highlight=False)
    if console.is_terminal or os.environ.get("COLUMNS"):
        return console
    return Console(highlight=False, width=PIPE_WIDTH)


def render(cfg: Any, console: Any = None) -> bool:
    """Print the per-GPU table, the strategy comparison and the verdict (rich); returns fits."""
    from rich.table import Table

    console = console or _console()
    spec = spec_from_config(cfg)
    est = estimate(spec)
    gpu_memory = gpu_memory_of(cfg)
    margin = float(get(get(cfg, "estimate", {}), "safety_margin", 0.1))
    auto = is_auto(cfg)
    a = spec.arch
    moe = ""
    if a.is_moe:
        active = param_counts(a).active
        moe = f"; a mixture of experts: {a.num_experts} experts, {a.experts_per_token} per token, "
        moe += f"{active / 1e9:.3f} B active per token"
    if a.vision:
        v = a.vision
        moe += f"; vision tower {v.tower / 1e9:.3f} B + projector {v.projector / 1e9:.3f} B"
        moe += f", {spec.image_tokens} image tokens/row" + ("" if spec.vision_trains else " (tower frozen)")
    title = (
        f"{get(get(cfg, 'model'), 'name_or_path', '?')}: {est.params_total / 1e9:.3f} B params "
        f"({est.params_trainable:,} trainable{moe}), {spec.world_size} GPU(s), "
        f"micro-batch {spec.micro_batch} x {spec.seq_len} tokens, {a.num_layers} layers"
    )
    for note in (*a.unmodelled, *spec.notes):
        console.print(f"note: {note}")
    if not auto:
        console.print(f"mesh: {Mesh(spec.world_size, spec.tp, spec.sp, spec.pp).describe()}")
        for line in held(est):
            console.print(f"  {line}")
        if est.stages:
            console.print(stage_table(est))
        table = Table(title=f"Memory per GPU — {title}" + heaviest(est), title_justify="left")
        table.add_column("item", overflow="fold")
        table.add_column("GiB", justify="right", no_wrap=True)
        table.add_column("how", overflow="fold")
        for r in est.rows:
            table.add_row(r.name if r.in_peak else f"[dim]{r.name}[/]", gib(r.bytes), r.note)
        table.add_row(
            "peak allocated",
            gib(est.peak_allocated),
            f"the sum of the rows held in the {est.peak_phase}, the largest phase (dimmed: held in another)",
        )
        table.add_row(
            "[bold]total[/]",
            f"[bold]{gib(est.total)}[/]",
            f"+{FRAGMENTATION:.0%} fragmentation + {CUDA_CONTEXT_BYTES / GiB:.2f} GiB CUDA context",
        )
        console.print(table)
    comp = Table(
        title="Every strategy option as shipped for the same run (per GPU, GiB; its heaviest pipeline stage)",
        title_justify="left",
    )
    for col in (
        "strategy",
        "params",
        "grads",
        "optimizer",
        "activations+logits",
        "total",
        "CPU RAM",
        "speed (assumed)",
        "fits",
    ):
        comp.add_column(col, justify="left" if col == "strategy" else "right", overflow="fold")
    for name, e in compare(spec).items():
        ok = "?" if gpu_memory is None else ("yes" if e.fits(gpu_memory, margin) else "no")
        comp.add_row(
            name,
            gib(e.row("parameters") + e.row("quantized weights")),
            gib(e.row("gradients")),
            gib(e.row("optimizer states")),
            gib(e.row("activations") + e.row("vision activations") + e.row("logits + loss")),
            gib(e.total),
            gib(e.cpu_bytes),
            f"{e.spec.strategy.speed:.2f}",
            ok,
        )
    console.print(comp)
    if gpu_memory is None:
        console.print(
            f"total {gib(est.total)} GiB per GPU; GPU memory unknown (no GPU detected): pass "
            "estimate.gpu_memory=80GB to get a verdict"
        )
        return True
    if auto:
        decision = decide(cfg, spec, gpu_memory, margin)
        console.print(decision.explain())
        return decision.strategy is not None
    fits = est.fits(gpu_memory, margin)
    verdict = "[bold green]FITS[/]" if fits else "[bold red]DOES NOT FIT[/]"
    console.print(
        f"{verdict}: needs {gib(est.total)} GiB per GPU of {gib(gpu_memory)} GiB "
        f"({margin:.0%} safety margin: budget {gib(gpu_memory * (1 - margin))} GiB)"
    )
    if not fits:
        for hint in hints(spec, gpu_memory, margin):
            console.print(f"  try: {hint}")
    return fits


def one_line(cfg: Any) -> str:
    """``mode=plan``'s line of the estimate: the total per GPU and the verdict (``render`` itemizes it)."""
    est = estimate(spec_from_config(cfg))
    gpu_memory = gpu_memory_of(cfg)
    margin = float(get(get(cfg, "estimate", {}), "safety_margin", 0.1))
    if gpu_memory is None:
        verdict = "GPU memory unknown (no GPU here: estimate.gpu_memory=80GB gives a verdict)"
    else:
        fits = "fits in" if est.fits(gpu_memory, margin) else "DOES NOT FIT in"
        verdict = f"{fits} {gib(gpu_memory)} GiB with {margin:.0%} kept free"
    return f"{gib(est.total)} GiB per GPU, estimated; {verdict}; `hydratune estimate` itemizes it"


def hints(spec: RunSpec, gpu_memory: float, margin: float) -> list[str]:
    """Changes that make the run fit: single ones first, then the cheapest combination, then the ladder."""
    steps: list[tuple[str, dict[str, Any]]] = []
    if not spec.gradient_checkpointing:
        steps.append(("model.gradient_checkpointing=true", {"gradient_checkpointing": True}))
    if spec.weight_bytes == 4 and not spec.full_finetune and not spec.quant_bits:
        steps.append(("model.dtype=bfloat16", {"weight_bytes": 2}))
    if spec.micro_batch > 1:
        mb = spec.micro_batch
        steps.append(
            (f"train.micro_batch_size=1 (x{mb} train.gradient_accumulation_steps)", {"micro_batch": 1})
        )
    if not spec.full_finetune and not spec.quant_bits:
        steps.append(("quantization=nf4", {"quant_bits": 4, "double_quant": True}))
    out: list[str] = []
    for text, change in steps:
        e = estimate(replace(spec, **change))
        if e.fits(gpu_memory, margin):
            out.append(f"{text} -> {gib(e.total)} GiB")
    if not out:
        texts: list[str] = []
        current = spec
        for text, change in steps:
            current, texts = replace(current, **change), [*texts, text]
            e = estimate(current)
            if e.fits(gpu_memory, margin):
                out.append(" ".join(texts) + f" -> {gib(e.total)} GiB")
                break
    global_batch = spec.micro_batch * spec.micro_batches * spec.data_parallel
    decision = choose(spec, strategy_rungs(spec), gpu_memory, margin, max(1, global_batch // spec.world_size))
    if decision.strategy and decision.strategy not in ("single", "ddp") and decision.estimate is not None:
        out.append(
            f"{' '.join(decision.overrides)} -> {gib(decision.estimate.total)} GiB (strategy=auto finds it)"
        )
    return out


def held(est: Estimate) -> list[str]:
    """What of the model one GPU holds when tensor or pipeline parallelism splits it, and the bubble."""
    spec, lines = est.spec, []
    if spec.tp > 1:
        lines.append(
            f"tp {spec.tp}: each GPU holds every decoder linear and an untied lm_head / {spec.tp}, the "
            "embedding and norms whole (DeepSpeed AutoTP / transformers' tp_plan); logits gathered whole"
        )
    if spec.sp > 1:
        lines.append(f"sp {spec.sp} (Ulysses): activations and logits / {spec.sp}, no weight split")
    if spec.pp > 1:
        lines.append(
            f"pp {spec.pp}: {spec.strategy.pipeline_schedule}, {spec.micro_batches} micro-batches "
            f"(train.gradient_accumulation_steps), bubble (p-1)/(m+p-1) = {est.bubble:.1%} of the step"
        )
    if (
        spec.zero_ranks > 1
        and spec.strategy.kind not in ("single", "ddp")
        and spec.zero_ranks != spec.world_size
    ):
        lines.append(f"ZeRO/FSDP shard the states over the {spec.zero_ranks} data x sequence parallel ranks")
    return lines


def heaviest(est: Estimate) -> str:
    """The table title's note on which pipeline stage it shows."""
    if not est.stages or est.part is None:
        return ""
    return f" — pipeline stage {est.part.stage + 1} of {est.part.stages}, the heaviest"


def stage_table(est: Estimate) -> Any:
    """Every pipeline stage of the run, per GPU: what it holds and its memory split."""
    from rich.table import Table

    table = Table(title="Per pipeline stage (per GPU, GiB)", title_justify="left")
    columns = ("stage", "layers", "holds", "params", "grads", "optimizer", "in flight", "activations+logits")
    for col in (*columns, "total"):
        table.add_column(col, justify="left" if col in ("stage", "holds") else "right")
    for e in est.stages:
        part = e.part
        assert part is not None
        holds = ", ".join(x for x, on in (("embedding", part.first), ("norm + head", part.last)) if on)
        mark = " (heaviest)" if e is est else ""
        table.add_row(
            f"{part.stage + 1}{mark}",
            str(part.layers),
            holds,
            gib(e.row("parameters") + e.row("quantized weights")),
            gib(e.row("gradients")),
            gib(e.row("optimizer states")),
            f"{part.in_flight:g}",
            gib(e.row("activations") + e.row("vision activations") + e.row("logits + loss")),
            gib(e.total),
        )
    return table


def cli(args: list[str]) -> int:
    """``hydratune estimate <overrides>`` (or ``hydratune mode=estimate …``): compose, print, no weights.

    Exit code 0 when the run fits (or the GPU memory is unknown), 1 when it does not."""
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from hydratune.components.config.errors import ConfigError

    overrides = [a for a in args if a != "mode=estimate"]
    GlobalHydra.instance().clear()
    try:
        with initialize_config_module(config_module="hydratune.conf", version_base=None):
            cfg = compose(config_name="config", overrides=overrides)
    except (HydraException, OmegaConfBaseException) as err:
        raise ConfigError(f"cannot compose the config: {err}", key="estimate") from None
    finally:
        GlobalHydra.instance().clear()
    from hydratune.components.memory.spec import built
    from hydratune.components.runtime.image_estimate import estimate_image_tokens
    from hydratune.components.strategy import stages_note, with_stages

    option = built(cfg.strategy)
    staged = with_stages(option)  # strategy.pp_size: estimated as the staged engine it trains as
    if staged is not option:
        print(stages_note(option, staged))
    cfg, measured = estimate_image_tokens(cfg)  # a VLM's image rows: the estimate counts what they hold
    if measured:
        print(measured)
    return 0 if render(cfg) else 1
