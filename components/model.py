"""Model component: a causal LM (or a vision-language model generating text) from a hub id, a local dir, or
random init from shipped config numbers."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hydratune.components.config.errors import ConfigError
from hydratune.components.config.ranges import NON_NEGATIVE, knob
from hydratune.components.config.registry import component
from hydratune.components.modeling.model_dir import (
    WEIGHT_PATTERNS,
    check_model_dir,
    check_no_remote_tokenizer,
    weight_files,
)
from hydratune.components.modeling.vision_language import VisionLanguage

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase

#: the configs :meth:`CausalLM.load_config` read, and the module names of the models built from them, by
#: what each was read from (``CausalLM._read_stamp``)
_READ_CONFIGS: dict[tuple, PretrainedConfig] = {}
_MODULE_NAMES: dict[tuple, tuple[str, ...]] = {}

# auto = varlen_sdpa (components/modeling/attention.py) unless the model needs a feature it lacks
ATTN_IMPLEMENTATIONS = (
    "auto",
    "varlen_sdpa",
    "sdpa",
    "eager",
    "flash_attention_2",
    "flash_attention_3",
    "flex_attention",
)
WEIGHT_DTYPES = ("auto", "float32", "bfloat16", "float16")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


@component("model")
@dataclass(frozen=True)
class CausalLM(VisionLanguage):
    """A decoder-only language model and its tokenizer.

    ``name_or_path`` is a hub id or a local directory; with ``gguf_file`` it is the folder of that GGUF
    checkpoint, converted once into a plain model dir that the run then uses
    (``components/modeling/gguf.py``).
    ``init=random`` builds the architecture from ``name_or_path``'s config (plus ``architecture``
    overrides) with fresh weights; the shipped ``conf/model/*.yaml`` carry the architecture numbers of
    popular models so they compose offline. ``init=auto`` (``model=tiny``'s) decides from
    ``name_or_path`` as the component is built: a bundled dir holding no weight file is built at random
    (the tiny models; a dir of the user's without weights is refused), anything holding weights (a dir
    with safetensors / .bin files, a GGUF file, a hub id) is loaded; ``init_note`` says which and why
    (``mode=plan`` and the summary print it).

    A config with a ``vision_config`` is a vision-language model (docs/vlm.md): it loads as
    ``AutoModelForImageTextToText``, its processor (``processor``, default: the tokenizer's source) is
    built with the run's tokenizer and saved with every checkpoint and export, ``freeze`` keeps named parts
    (``vision_tower``, ``projector``, ``language_model``) frozen, and LoRA adapts the language model only
    unless ``peft.exclude_modules`` says otherwise (its methods: :class:`VisionLanguage`,
    components/modeling/vision_language.py).
    """

    name_or_path: str = "???"
    from_run: str | None = None  # start from an earlier run dir's final/ model (overrides name_or_path)
    gguf_file: str | None = None  # a .gguf file inside name_or_path (llama.cpp / Ollama checkpoints)
    init: str = "pretrained"  # pretrained | random | auto (random only for a bundled dir without weights)
    architecture: dict[str, Any] = field(default_factory=dict)  # config.json numbers (offline / overrides)
    tokenizer: str | None = None  # defaults to name_or_path
    revision: str | None = None
    trust_remote_code: bool = False
    attn_implementation: str = "auto"  # see ATTN_IMPLEMENTATIONS
    dtype: str = "auto"  # weight dtype at load; auto = float32 master weights (mixed precision autocasts)
    gradient_checkpointing: bool = False
    chat_template: str | None = None  # a name (chatml, llama3_2, ...), a .jinja file or template text
    padding_side: str = "right"  # for training; generation always pads left
    liger: bool | None = None  # Liger Triton kernels (RMSNorm, SwiGLU, RoPE); None = on CUDA if installed
    compile: bool = False  # torch.compile the model (the first steps pay the compile time)
    compile_mode: str = "default"  # default | reduce-overhead | max-autotune | max-autotune-no-cudagraphs
    # ---- vision-language models only (a config with vision_config; refused for text models) ----
    processor: str | None = None  # the processor's source (image processor settings); default: tokenizer's
    freeze: list[str] = field(default_factory=list)  # frozen parts: vision_tower, projector, language_model
    # the estimate's image tokens per row (all its images); None: one image at the processor's default size
    image_tokens_per_row: int | None = knob(None, NON_NEGATIVE)
    #: from_run left an adapter alone: its dir (the base is rebuilt from that run's model node); not a knob
    adapter: str | None = field(default=None, init=False)
    #: init=auto: what it became and why (the plan and the summary say it); not a knob
    init_note: str | None = field(default=None, init=False)

    # ---- checks (no weights touched) -------------------------------------------------------------
    def __post_init__(self) -> None:
        """``from_run`` is resolved as the component is built (never later): it then names the model that
        run left, a whole model dir or an adapter on the run's own base."""
        if not self.from_run:
            self.resolve_auto_init()
            return
        from hydratune.components.modeling.trained import TrainedRun, final_model_dir

        final = final_model_dir(self.from_run, adapter_ok=True)
        if (final / "config.json").is_file():  # the run saved an ordinary model dir
            resolved = {"name_or_path": str(final), "init": "pretrained", "gguf_file": None}
        else:  # an adapter: its base is the run's own model node, the tokenizer as trained (chat template)
            base = TrainedRun.open(self.from_run, trust_remote_code=self.trust_remote_code).base_component()
            names = ("name_or_path", "gguf_file", "init", "architecture", "revision", "trust_remote_code")
            resolved = {name: getattr(base, name) for name in names}
            resolved.update(tokenizer=str(final), adapter=str(final))
        for name, value in resolved.items():
            object.__setattr__(self, name, value)  # frozen: only construction sets fields
        self.resolve_auto_init()

    def resolve_auto_init(self) -> None:
        """``init=auto`` becomes ``random`` for a bundled dir (components/assets/) that holds no weight file,
        else ``pretrained``: a ``name_or_path`` that names weights means those weights, and a dir of the
        user's without them is refused before load (``check_local_dir``), never trained from random init
        unasked (``model.init=random``, written by the user, still trains from random init)."""
        if self.init != "auto":
            return
        if self.gguf_file or not self.is_local:
            init, why = "pretrained", "a GGUF checkpoint" if self.gguf_file else "a hub id"
        else:
            from hydratune.components.config.resolvers import ASSETS

            path = Path(self.name_or_path).expanduser()
            found = weight_files(path)
            bundled = path.resolve().is_relative_to(ASSETS)
            init = "random" if bundled and not found else "pretrained"
            why = "a dir with weights" if found else "a dir without weight files"
            why += "" if found or bundled else " (not a bundled one)"
        then = "model.init=random to train from random init instead" if init == "pretrained" else ""
        note = f"model.init=auto chose {init}: model.name_or_path is {why}" + (f" ({then})" if then else "")
        object.__setattr__(self, "init", init)
        object.__setattr__(self, "init_note", note)

    def describe_weights(self) -> str:
        """Where the weights come from, for ``mode=plan`` and the summary: the dir, hub id or GGUF file they
        load from, or random init (and, for ``init=auto``, why)."""
        if self.init == "random":
            what = f"random init (no weights read) from the config of {self.name_or_path}"
            what += "" if self.init_note else " (model.init=random)"
        elif self.gguf_file:
            what = f"loaded from {Path(self.name_or_path) / self.gguf_file} (GGUF, converted once)"
        elif self.is_local:
            found = weight_files(Path(self.name_or_path).expanduser())
            what = f"loaded from {self.name_or_path} ({', '.join(found[:3]) or 'no weight file found'})"
        else:
            what = f"loaded from the hub id {self.name_or_path}" + (
                f"@{self.revision}" if self.revision else ""
            )
        return f"{what}; {self.init_note}" if self.init_note else what

    def validate(self) -> None:
        """Cheap checks of the knobs themselves."""
        if self.init not in ("pretrained", "random"):  # auto is resolved as the component is built
            raise ConfigError(
                f"unknown init '{self.init}'", key="model.init", hint="use pretrained, random or auto"
            )
        if self.attn_implementation not in ATTN_IMPLEMENTATIONS:
            raise ConfigError(
                f"unknown attn_implementation '{self.attn_implementation}'",
                key="model.attn_implementation",
                hint=f"one of {', '.join(ATTN_IMPLEMENTATIONS)}",
            )
        if self.dtype not in WEIGHT_DTYPES:
            raise ConfigError(
                f"unknown dtype '{self.dtype}'", key="model.dtype", hint=f"one of {', '.join(WEIGHT_DTYPES)}"
            )
        if self.compile_mode not in COMPILE_MODES:
            raise ConfigError(
                f"unknown compile_mode '{self.compile_mode}'",
                key="model.compile_mode",
                hint=f"one of {', '.join(COMPILE_MODES)}",
            )
        if self.chat_template:
            from hydratune.components.text.chat_template import resolve_chat_template

            resolve_chat_template(self.chat_template)  # an unknown name or a missing file fails here
        if self.padding_side not in ("left", "right"):
            raise ConfigError("padding_side must be left or right", key="model.padding_side")
        self.check_vision_knobs()
        self.check_vision_packages()
        if self.gguf_file:
            from hydratune.components.modeling import gguf

            gguf.gguf_path(self.name_or_path, self.gguf_file)  # folder, file, gguf package
        elif self.is_local:
            self.check_local_dir()
        separate = Path(self.tokenizer).expanduser() if self.tokenizer else None
        if separate is not None and separate.is_dir() and not self.trust_remote_code:
            check_no_remote_tokenizer(separate, key="model.trust_remote_code")
        self.check_attention_package()

    def check_local_dir(self) -> None:
        """A local ``name_or_path`` must be a model dir: a folder holding config.json, with
        ``init=pretrained`` a weight file, that loads without running its own code unasked, with weights that
        unpickle safely (components/modeling/model_dir.py)."""
        path = Path(self.name_or_path).expanduser()
        problem = "not found" if not path.is_dir() else "has no config.json"
        if not (path / "config.json").is_file():
            raise ConfigError(
                f"model directory {problem}: {self.name_or_path}",
                key="model.name_or_path",
                hint="point it at a directory holding config.json, or at a hub id such as Qwen/Qwen2.5-0.5B",
            )
        key = "model.from_run" if self.from_run else "model.name_or_path"
        flag = "model.trust_remote_code"
        check_model_dir(path, key=key, trust_remote_code=self.trust_remote_code, flag=flag)
        if self.init == "pretrained" and not weight_files(path):
            held = sorted(f.name for f in path.iterdir())
            shown = ", ".join(held[:12]) + (f" (+{len(held) - 12} more)" if len(held) > 12 else "")
            asked = (
                "model.init=auto (a dir of yours, not a bundled one)"
                if self.init_note
                else "model.init=pretrained"
            )
            raise ConfigError(
                f"{asked} loads weights, and {self.name_or_path} holds no weight file "
                f"({', '.join(WEIGHT_PATTERNS)}); it holds: {shown}",
                key="model.name_or_path",
                hint="point it at a dir with the weights (save_pretrained's model.safetensors), or pass "
                "model.init=random to train from random init with its config",
            )

    def check_attention_package(self) -> None:
        """flash_attention_2/3 need their package installed (else transformers fails at load)."""
        import importlib.util

        package = {"flash_attention_2": "flash_attn", "flash_attention_3": "flash_attn_interface"}
        needed = package.get(self.attn_implementation)
        if needed and importlib.util.find_spec(needed) is None:
            raise ConfigError(
                f"attn_implementation={self.attn_implementation} needs the '{needed}' package, which is "
                "not installed",
                key="model.attn_implementation",
                hint="model.attn_implementation=auto (or sdpa), or pip install flash-attn "
                "--no-build-isolation on a CUDA machine",
            )

    # ---- where it loads from --------------------------------------------------------------------
    def config_dict(self) -> dict[str, Any]:
        """config.json's keys without transformers: ``architecture`` over a local dir's config.json; a hub
        id without shipped numbers asks transformers (cached or served; {} when neither answers)."""
        import json

        if self.is_local and not self.gguf_file:
            path = Path(self.name_or_path).expanduser() / "config.json"
            found = json.loads(path.read_text()) if path.is_file() else {}
            return {**found, **self.architecture}
        if self.architecture or self.gguf_file:
            return dict(self.architecture)
        from hydratune.components.modeling import hub

        if hub.unavailable(self.name_or_path, "config.json", self.revision):
            return {}  # neither cached nor served: nothing to read (transformers would retry for ~25 s)
        try:
            return self.load_config().to_dict()
        except ConfigError:
            return {}

    def check_sources(self) -> None:
        """The hub ids a training run will read: the tokenizer always, the weights (``init=pretrained``) or
        the config (``init=random`` without shipped architecture numbers); each is local, cached or served
        by the hub, else one ConfigError naming its key (components/modeling/hub.py)."""
        from hydratune.components.modeling.hub import check_available

        if self.init == "pretrained" or not self.architecture:
            check_available(
                self.name_or_path, key="model.name_or_path", filename="config.json", revision=self.revision
            )
        key = "model.tokenizer" if self.tokenizer else "model.name_or_path"
        tokenizer = self.tokenizer or self.name_or_path
        check_available(tokenizer, key=key, filename="tokenizer_config.json", revision=self.revision)

    @property
    def is_local(self) -> bool:
        """True when ``name_or_path`` names a local path rather than a hub id."""
        from hydratune.components.modeling.hub import is_local

        return is_local(self.name_or_path)

    def source_dir(self) -> str:
        """What the weights and tokenizer load from: ``name_or_path``, or with ``gguf_file`` the plain
        model dir converted from it (converted now, once; later runs reuse the cached dir)."""
        if not self.gguf_file:
            return self.name_or_path
        from hydratune.components.modeling import gguf

        return str(gguf.ensure_converted(gguf.gguf_path(self.name_or_path, self.gguf_file)))

    def load_config(self) -> PretrainedConfig:
        """The architecture config, offline when the YAML carries the numbers: read once a process per
        model and version of its config.json (:meth:`_read_stamp`), handed out as a copy the caller may
        change (the pre-load checks ask for it a dozen times a run)."""
        import copy

        stamp = self._read_stamp()
        if stamp is None:
            return self._read_config()
        if stamp not in _READ_CONFIGS:
            _READ_CONFIGS[stamp] = self._read_config()
        return copy.deepcopy(_READ_CONFIGS[stamp])

    def _read_stamp(self) -> tuple | None:
        """What :meth:`load_config` reads depends on: this model's fields and, for a local dir, the size and
        time of its config.json (None, read every time: a hub id, a GGUF, a dir without a config.json)."""
        if self.gguf_file:
            return None
        fields = (
            self.name_or_path,
            self.revision,
            self.trust_remote_code,
            repr(sorted(self.architecture.items())),
        )
        if not self.is_local:
            return (*fields, None) if self.architecture else None
        try:
            stat = (Path(self.name_or_path).expanduser() / "config.json").stat()
        except OSError:
            return None
        return (*fields, stat.st_size, stat.st_mtime_ns)

    def _read_config(self) -> PretrainedConfig:
        from transformers import AutoConfig

        kwargs = {"revision": self.revision, "trust_remote_code": self.trust_remote_code}
        if self.gguf_file:  # the GGUF's metadata (or its cached conversion): no weight is dequantized
            from hydratune.components.modeling import gguf

            config = gguf.read_config(gguf.gguf_path(self.name_or_path, self.gguf_file))
            for key, value in self.architecture.items():
                setattr(config, key, value)
            return config
        if self.is_local or not self.architecture:
            try:
                config = AutoConfig.from_pretrained(self.name_or_path, **kwargs)
            except OSError as err:
                raise ConfigError(
                    f"cannot read the config of '{self.name_or_path}' ({err.__class__.__name__}): "
                    "not a local model dir and the hub is unreachable or the id is wrong",
                    key="model.name_or_path",
                    hint="use a local directory, check the id, or set HF_HUB_OFFLINE=0 with network access",
                ) from None
            for key, value in self.architecture.items():
                setattr(config, key, value)
            return config
        arch = dict(self.architecture)
        model_type = arch.pop("model_type", None)
        if model_type is None:
            raise ConfigError("architecture needs a model_type", key="model.architecture.model_type")
        return AutoConfig.for_model(model_type, **arch)

    def module_names(self) -> list[str]:
        """Fully-qualified module names of the model, built on the meta device (no memory, no weights)."""
        import torch

        stamp = self._read_stamp()
        if stamp is None or stamp not in _MODULE_NAMES:
            with torch.device("meta"):
                model = self.auto_class().from_config(self.load_config())
            names = tuple(name for name, _ in model.named_modules())
            if stamp is None:
                return list(names)
            _MODULE_NAMES[stamp] = names
        return list(_MODULE_NAMES[stamp])

    def auto_class(self, task: str = "causal_lm") -> Any:
        """The transformers Auto class this model builds with: image-text-to-text for a VLM (no score head:
        a VLM reward model is refused), sequence classification for ``seq_cls``, else causal LM."""
        from transformers import (
            AutoModelForCausalLM,
            AutoModelForImageTextToText,
            AutoModelForSequenceClassification,
        )

        if self.is_vision:
            if task == "seq_cls":
                raise ConfigError(
                    f"{self.name_or_path} is a vision-language model: a score head (reward / value model) on "
                    "it is not supported",
                    key="model.name_or_path",
                    hint="use a text model for reward and value models",
                )
            return AutoModelForImageTextToText
        return AutoModelForSequenceClassification if task == "seq_cls" else AutoModelForCausalLM

    def use_liger(self, device: str) -> bool:
        """Whether Liger's kernels apply: ``liger=None`` means on CUDA when liger-kernel is installed."""
        import importlib.util

        installed = importlib.util.find_spec("liger_kernel") is not None
        if self.liger is None:
            return device == "cuda" and installed
        if self.liger and device != "cuda":
            raise ConfigError(
                f"Liger kernels are Triton GPU kernels; this run is on {device}",
                key="model.liger",
                hint="drop model.liger (auto turns it on where a GPU is)",
            )
        if self.liger and not installed:
            raise ConfigError(
                "model.liger=true but liger-kernel is not installed",
                key="model.liger",
                hint="pip install 'hydratune[liger]', or drop model.liger",
            )
        return self.liger

    def training_args(self, device: str) -> dict[str, Any]:
        """The TrainingArguments fields this model sets: Liger kernels, torch.compile, checkpointing."""
        args: dict[str, Any] = {
            "use_liger_kernel": self.use_liger(device),
            "torch_compile": self.compile,
            # TRL's configs default to gradient checkpointing on: say what the user chose
            "gradient_checkpointing": self.gradient_checkpointing,
            "gradient_checkpointing_kwargs": {"use_reentrant": False},
            # DDP: a vision-language model's tower is unused by a batch without images (strategy=ddp's
            # find_unused_parameters, when set, overrides this)
            "ddp_find_unused_parameters": self.is_vision,
        }
        if self.compile:
            args["torch_compile_mode"] = self.compile_mode
        return args

    def resolved_attn_implementation(self) -> str:
        """What the model is built with: ``auto`` becomes ``varlen_sdpa`` (registered here, so worker
        processes have it too) or, for models needing what it lacks, the fallback it names."""
        from hydratune.components.modeling import attention

        if self.attn_implementation not in ("auto", attention.NAME):
            return self.attn_implementation
        if self.is_vision:  # varlen_sdpa is for packed text rows; the vision tower attends its own way
            if self.attn_implementation == attention.NAME:
                raise ConfigError(
                    f"{attention.NAME} is for text models' packed rows; this is a vision-language model",
                    key="model.attn_implementation",
                    hint="use auto (sdpa for vision-language models), sdpa or eager",
                )
            return "sdpa"
        config = self.load_config()
        if self.attn_implementation == attention.NAME:
            fallback = attention.fallback_for(config)
            if fallback is not None:
                raise ConfigError(
                    f"{attention.NAME} cannot run this model: {fallback[1]}",
                    key="model.attn_implementation",
                    hint=f"use auto (falls back to {fallback[0]}) or {fallback[0]}",
                )
        impl = attention.resolve(self.attn_implementation, config)
        if impl == attention.NAME:
            attention.register()
        return impl

    # ---- construction ----------------------------------------------------------------------------
    def weight_dtype(self, precision: str = "fp32", frozen_base: bool = False) -> str:
        """The dtype the weights load in. ``dtype=auto``: float32 master weights (mixed precision
        autocasts), except that a base the PEFT option freezes loads in bfloat16 under bf16 precision
        (trained parameters are then upcast to float32; see ``upcast_trainable``)."""
        if self.dtype != "auto":
            return self.dtype
        return "bfloat16" if frozen_base and precision == "bf16" else "float32"

    def torch_dtype(self, name: str | None = None) -> Any:
        import torch

        return getattr(torch, self.weight_dtype() if name is None else name)

    def build(self, task: str = "causal_lm", dtype: str | None = None, **load_kwargs: Any) -> PreTrainedModel:
        """Load (or randomly initialise) the model in ``dtype`` (default: ``weight_dtype()``);
        ``task="seq_cls"`` puts a one-logit score head on it (reward / value models). Seed the RNGs
        before calling for a reproducible init."""
        auto = self.auto_class(task)
        common: dict[str, Any] = {
            "attn_implementation": self.resolved_attn_implementation(),
            "dtype": self.torch_dtype(dtype),
        }
        if task == "seq_cls":
            common["num_labels"] = 1
        if self.init == "random":
            config = self.load_config()
            if task == "seq_cls":
                config.num_labels = common.pop("num_labels")
            model = auto.from_config(config, trust_remote_code=self.trust_remote_code, **common)
            if load_kwargs:  # quantized: bitsandbytes quantizes while loading, so load the random init
                model = _reload(auto, model, common, load_kwargs)
        else:
            try:
                model = auto.from_pretrained(
                    self.source_dir(),
                    revision=self.revision,
                    trust_remote_code=self.trust_remote_code,
                    **common,
                    **load_kwargs,
                )
            except OSError as err:
                raise ConfigError(
                    f"cannot load weights of '{self.name_or_path}': {err}",
                    key="model.name_or_path",
                    hint="point it at a local directory with the weights, or make the hub reachable",
                ) from None
        if self.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            model.config.use_cache = False
        return model

    def build_tokenizer(self, convert: bool = True) -> PreTrainedTokenizerBase:
        """The tokenizer, set up for training: a pad token, right padding, the chat template.
        ``convert=False`` (``mode=plan``): a GGUF checkpoint not converted yet gives its tokenizer from the
        file itself, and no weight is dequantized."""
        from hydratune.components.modeling import gguf
        from hydratune.components.text.tokenizer import build_tokenizer

        source, gguf_file = self.tokenizer, None
        if source is None and self.gguf_file and not convert:
            path = gguf.gguf_path(self.name_or_path, self.gguf_file)
            if not gguf.is_converted(path):
                source, gguf_file = str(path.parent), path.name
        return build_tokenizer(
            source or self.source_dir(),
            gguf_file=gguf_file,
            revision=self.revision,
            trust_remote_code=self.trust_remote_code,
            chat_template=self.chat_template,
            padding_side=self.padding_side,
        )


#: the files ``from_pretrained`` reads weights from (a dir holding none of them has no weights)
def base_loads_in_half(peft: Any, quantization: Any, strategy: Any) -> bool:
    """Whether the base may load in bf16 under bf16 precision (``CausalLM.weight_dtype``'s ``frozen_base``):
    the PEFT option freezes it, it is not quantized (bitsandbytes has its own storage) and the strategy does
    not shard it one dtype per module (FSDP2). The memory estimate asks the same."""
    return peft.freezes_base and not quantization.enabled and not strategy.one_dtype_per_shard


def upcast_trainable(model: Any) -> int:
    """Cast trainable half-precision parameters to float32 (frozen ones keep their dtype): the optimizer
    then updates fp32 master weights. Returns how many parameters were cast."""
    import torch

    cast = 0
    for param in model.parameters():
        if param.requires_grad and param.dtype in (torch.bfloat16, torch.float16):
            param.data = param.data.float()
            cast += 1
    return cast


def describe_dtypes(model: Any) -> str:
    """'trained float32, frozen bfloat16': the dtypes of trained and frozen parameters."""

    def names(trained: bool) -> str:
        params = [p for p in model.parameters() if p.requires_grad == trained]
        found = {str(p.dtype).removeprefix("torch.") for p in params}
        return "/".join(sorted(found)) or "none"

    return f"trained {names(True)}, frozen {names(False)}"


def _reload(auto: Any, model: PreTrainedModel, common: dict[str, Any], load_kwargs: dict[str, Any]) -> Any:
    """``model`` saved to a temporary dir and loaded back with ``load_kwargs`` (e.g. quantized)."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="hydratune-init-") as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        del model
        common = {k: v for k, v in common.items() if k != "num_labels"}
        return auto.from_pretrained(tmp, **common, **load_kwargs)
