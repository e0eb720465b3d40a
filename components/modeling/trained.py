"""A finished run dir's model, for what comes after training (export, generation, chat, evaluation).

``TrainedRun.open(run_dir)`` reads the run's own resolved config (``.hydra/config.yaml``) and its ``final/``
folder and says what the model is: a full model, an adapter with a merged copy, or an adapter alone,
whose base is rebuilt from the run's ``model:`` node (hub id, local dir, GGUF folder, an earlier run).
Everything is checked before a weight is read.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from hydratune.components.config.errors import ConfigError
from hydratune.components.config.legacy import load_saved

#: the only ``_target_`` prefix a run dir's model node may name here (a run dir is data, not code)
OWN_TARGETS = ("hydratune.components.model.",)


@dataclass
class TrainedRun:
    """One run dir: its resolved config and the model it left in ``final/``."""

    path: Path
    cfg: DictConfig
    key: str = "model.from_run"  # the config key (or subcommand) errors name
    #: the command line granted model.trust_remote_code=true: the saved model node may load code
    trust_remote_code: bool = False

    @classmethod
    def open(
        cls, run: str | Path, key: str = "model.from_run", trust_remote_code: bool = False
    ) -> TrainedRun:
        """Check that ``run`` is a finished run dir and read its config (no weights)."""
        path = Path(run).expanduser().resolve()
        saved = path / ".hydra" / "config.yaml"
        if not saved.is_file():
            raise ConfigError(
                f"{path} is not a run dir: {saved} not found",
                key=key,
                hint="pass a run dir, e.g. outputs/<date>/<time>_sft_<tag>",
            )
        trained = cls(path, load_saved(saved), key, trust_remote_code)  # type: ignore[arg-type]
        if trained.kind == "none":
            interrupted = " (it was interrupted: resume it first)" if (path / "checkpoints").is_dir() else ""
            raise ConfigError(f"{path} has no final model in final/{interrupted}", key=key)
        return trained

    @property
    def final(self) -> Path:
        return self.path / "final"

    @property
    def kind(self) -> str:
        """``full`` (final/ is a whole model), ``merged`` (adapter + final/merged), ``adapter``, ``none``."""
        if (self.final / "merged" / "config.json").is_file():
            return "merged"
        if (self.final / "adapter_config.json").is_file():
            return "adapter"
        if (self.final / "config.json").is_file() and any(self.final.glob("*.safetensors")):
            return "full"
        return "none"

    @property
    def recipe(self) -> str:
        """The recipe's option name (``sft``, ``best_of_n``), from the run's ``recipe._target_``."""
        from hydratune.components.config.registry import recipe_name

        return recipe_name(str(self.cfg.recipe.get("_target_", "")))

    @property
    def produces_causal_lm(self) -> bool:
        """The run's ``final/`` is a causal LM (its recipe says so; False for a recipe not registered)."""
        from hydratune.components.config.registry import recipe_class

        known = recipe_class(str(self.cfg.recipe.get("_target_", "")))
        return known is not None and known.produces_causal_lm

    @property
    def quantized(self) -> bool:
        """The run trained an adapter on a quantized base (QLoRA): its quantization component says so."""
        return bool(self.quantization().enabled)

    def quantization(self) -> Any:
        """The run's ``quantization:`` node instantiated (hydratune's own components only)."""
        from hydra.utils import instantiate

        node = self.cfg.quantization
        target = str(node.get("_target_", ""))
        if not target.startswith("hydratune.components.quantization."):
            raise ConfigError(
                f"{self.path}'s quantization node names _target_ '{target}', not a hydratune component",
                key=self.key,
                hint="use a run dir written by hydratune",
            )
        self.check_node("quantization")
        return instantiate(node, _convert_="all")

    def model_dir(self) -> Path:
        """The folder a full model loads from: ``final/merged`` or ``final/`` (not for adapters)."""
        return final_model_dir(str(self.path))

    def check_node(self, group: str) -> None:
        """The saved ``group:`` node may build nothing but hydratune's own components (nested ones too) and
        may load the model dir's code only when the command line grants it (components/config/trust.py)."""
        from hydratune.components.config.trust import check_saved_node

        node = OmegaConf.to_container(self.cfg[group], resolve=False)
        check_saved_node(
            group, node, self.path / ".hydra" / "config.yaml", remote_code=self.trust_remote_code
        )

    def base_component(self) -> Any:
        """The run's ``model:`` node instantiated (it names the adapter's base); only hydratune's own model
        components may be named there."""
        from hydra.utils import instantiate

        node = self.cfg.model
        target = str(node.get("_target_", ""))
        if not target.startswith(OWN_TARGETS):
            raise ConfigError(
                f"{self.path}'s model node names _target_ '{target}', not a hydratune model component",
                key=self.key,
                hint="use a run dir written by hydratune",
            )
        self.check_node("model")
        model = instantiate(node, _convert_="all")
        if model.init == "random":
            raise ConfigError(
                f"{self.path} trained an adapter on a randomly initialised base, which cannot be rebuilt",
                key=self.key,
                hint="train with merge=true (final/merged holds the whole model), or from a saved base "
                "(model.from_run=<run> or model.name_or_path=<dir>)",
            )
        return model

    def load(
        self, *, dtype: str = "float32", merge: bool = False, task: str = "causal_lm"
    ) -> tuple[Any, Any]:
        """(model, tokenizer) in eval mode. An adapter is put on its base as it was trained (quantized base
        included) unless ``merge`` folds it into a full-precision base."""
        import torch
        from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(self.final)
        auto = AutoModelForSequenceClassification if task == "seq_cls" else AutoModelForCausalLM
        if self.kind != "adapter" and self.is_vision:
            from transformers import AutoModelForImageTextToText

            auto = AutoModelForImageTextToText
        if self.kind != "adapter":
            model = auto.from_pretrained(self.model_dir(), dtype=getattr(torch, dtype))
            return model.eval(), tokenizer
        from peft import PeftModel

        base_model = self.base_component()
        load_kwargs: dict[str, Any] = {}
        if self.quantized and not merge:
            from hydratune.components.quantization import TORCH_DTYPES

            compute = {torch_name: name for name, torch_name in TORCH_DTYPES.items()}[dtype]
            load_kwargs = self.quantization().load_kwargs(compute)
        base = base_model.build(task=task, dtype=dtype, **load_kwargs)
        if base.get_input_embeddings().weight.shape[0] < len(tokenizer):
            base.resize_token_embeddings(len(tokenizer))
        model = PeftModel.from_pretrained(base, self.final)
        if merge:
            from hydratune.components.peft import merge_and_unload

            model = merge_and_unload(model)
        return model.eval(), tokenizer

    @property
    def is_vision(self) -> bool:
        """The model left in final/ is a vision-language model (its config has a vision_config)."""
        import json

        from hydratune.components.modeling.vision import is_vision_config

        folder = self.final if self.kind == "adapter" else self.model_dir()
        config = folder / "config.json"
        if config.is_file():
            return is_vision_config(json.loads(config.read_text()))
        return self.kind == "adapter" and self.base_component().is_vision

    def processor(self, tokenizer: Any = None) -> Any:
        """The processor saved in final/ (a vision-language model's), with ``tokenizer`` in it; None
        when the run saved none (a text model)."""
        from hydratune.components.modeling.vision import has_processor, load_processor

        if not has_processor(self.final):
            return None
        return load_processor(str(self.final), tokenizer)

    def overrides(self) -> list[str]:
        """The command-line overrides the run was started with."""
        saved = self.path / ".hydra" / "overrides.yaml"
        return [str(o) for o in OmegaConf.load(saved)] if saved.is_file() else []


def final_model_dir(run: str, adapter_ok: bool = False) -> Path:
    """The model a run left behind: ``final/merged`` when it merged an adapter, else ``final``; with
    ``adapter_ok`` also ``final`` holding an adapter alone, if the run dir says what its base was."""
    run_dir = Path(run).expanduser()
    final = run_dir / "final"
    if (final / "merged" / "config.json").is_file():
        return final / "merged"
    if (final / "config.json").is_file():
        return final
    if (final / "adapter_config.json").is_file():
        if adapter_ok and (run_dir / ".hydra" / "config.yaml").is_file():
            return final
        raise ConfigError(
            f"{final} holds only an adapter and {run_dir} has no .hydra/config.yaml naming its base",
            key="model.from_run",
            hint="re-run that recipe with merge=true (final/merged), or set model.name_or_path to the base "
            "and load the adapter",
        )
    raise ConfigError(f"{run} has no final model (final/config.json)", key="model.from_run")
