"""Quantization component: how base weights are stored — as they are, or bitsandbytes int8 / nf4 / fp4.

A quantized base is frozen: it trains through an adapter (QLoRA), and ``prepare_model_for_kbit_training``
(fp32 norms/head, input grads for checkpointing) runs before the adapter is added.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hydratune.components.config.errors import ConfigError
from hydratune.components.config.ranges import NON_NEGATIVE, knob, one_of
from hydratune.components.config.registry import component

TORCH_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


@component("quantization")
@dataclass(frozen=True)
class NoQuantization:
    """Weights stay in the model's dtype."""

    @property
    def enabled(self) -> bool:
        return False

    @property
    def needs_adapter(self) -> bool:
        """Quantized bases cannot be trained directly: they need a PEFT adapter on top."""
        return False

    def validate(self) -> None:
        """Nothing to check."""

    def memory_format(self) -> tuple[int | None, str, bool]:
        """(bits, 4-bit type, double quantization) of the stored base weights, for the memory estimate;
        bits None: not quantized."""
        return None, "nf4", False

    def sharding_refusal(self, dtype: str, strategy: str) -> ConfigError | None:
        """Why these weights cannot be sharded by ``strategy`` (ZeRO-3, FSDP) training in ``dtype``."""
        return None

    def load_kwargs(self, compute_dtype: str, device: str = "cpu") -> dict[str, Any]:
        """Extra ``from_pretrained`` kwargs (a ``quantization_config`` for quantized loads)."""
        return {}

    def prepare(self, model: Any, gradient_checkpointing: bool = False) -> Any:
        """Ready a loaded model for training before PEFT wraps it (no-op unquantized)."""
        return model


@component("quantization")
@dataclass(frozen=True)
class BitsAndBytes(NoQuantization):
    """bitsandbytes k-bit weights: ``bits=8`` LLM.int8 (outlier threshold), ``bits=4`` NF4/FP4 (QLoRA)."""

    bits: int = knob(4, one_of(4, 8))  # 4-bit (nf4 / fp4) or 8-bit (LLM.int8) weights
    quant_type: str = "nf4"  # 4-bit: nf4 | fp4
    double_quant: bool = True  # 4-bit: quantize the quantization constants too (~0.4 bit/param saved)
    compute_dtype: str = "auto"  # 4-bit matmul dtype: auto = the precision group's dtype
    quant_storage: str = "uint8"  # 4-bit storage dtype; = the training dtype under ZeRO-3/FSDP sharding
    int8_threshold: float = knob(6.0, NON_NEGATIVE)  # 8-bit: LLM.int8 outlier threshold
    skip_modules: list[str] | None = None  # kept in full precision (default: the lm_head)

    @property
    def enabled(self) -> bool:
        return True

    @property
    def needs_adapter(self) -> bool:
        return True

    def memory_format(self) -> tuple[int | None, str, bool]:
        return self.bits, self.quant_type or "nf4", self.double_quant

    def sharding_refusal(self, dtype: str, strategy: str) -> ConfigError | None:
        """8-bit weights cannot be sharded; 4-bit ones only stored in the training dtype (FSDP / ZeRO-3
        flatten every parameter of a unit into one tensor of one dtype)."""
        if self.bits == 8:
            return ConfigError(
                "8-bit (LLM.int8) weights cannot be sharded by ZeRO-3 / FSDP",
                key="quantization",
                hint="use quantization=nf4 with quantization.quant_storage=" + dtype + ", or strategy=zero2",
            )
        if self.quant_storage != dtype:
            return ConfigError(
                f"sharding 4-bit weights under {strategy} needs quantization.quant_storage to match the "
                f"training dtype ({dtype}); it is {self.quant_storage}",
                key="quantization.quant_storage",
                hint=f"quantization.quant_storage={dtype}",
            )
        return None

    def validate(self) -> None:
        if self.quant_type not in ("nf4", "fp4"):
            raise ConfigError(
                f"unknown 4-bit type '{self.quant_type}'", key="quantization.quant_type", hint="nf4 or fp4"
            )
        for key in ("compute_dtype", "quant_storage"):
            allowed = ("auto", *TORCH_DTYPES) if key == "compute_dtype" else ("uint8", *TORCH_DTYPES)
            if getattr(self, key) not in allowed:
                raise ConfigError(
                    f"unknown dtype '{getattr(self, key)}'",
                    key=f"quantization.{key}",
                    hint=f"one of {allowed}",
                )
        try:
            import bitsandbytes  # noqa: F401
        except ImportError as err:
            raise ConfigError(
                "quantization needs bitsandbytes, which is not installed",
                key="quantization",
                hint="pip install 'hydratune[bnb]'",
            ) from err

    def config(self, compute_dtype: str) -> Any:
        """transformers' ``BitsAndBytesConfig``; 4-bit compute in the training precision."""
        import torch
        from transformers import BitsAndBytesConfig

        if self.bits == 8:
            return BitsAndBytesConfig(
                load_in_8bit=True,
                llm_int8_threshold=self.int8_threshold,
                llm_int8_skip_modules=self.skip_modules,
            )
        compute = compute_dtype if self.compute_dtype == "auto" else self.compute_dtype
        storage = (
            torch.uint8 if self.quant_storage == "uint8" else getattr(torch, TORCH_DTYPES[self.quant_storage])
        )
        return BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type=self.quant_type,
            bnb_4bit_use_double_quant=self.double_quant,
            bnb_4bit_compute_dtype=getattr(torch, TORCH_DTYPES[compute]),
            bnb_4bit_quant_storage=storage,
            llm_int8_skip_modules=self.skip_modules,
        )

    def load_kwargs(self, compute_dtype: str, device: str = "cpu") -> dict[str, Any]:
        """The quantization config, and a device map placing every rank's copy on its own device
        (bitsandbytes quantizes while the weights move there)."""
        import os

        where: Any = "cpu" if device == "cpu" else {"": int(os.environ.get("LOCAL_RANK", 0))}
        return {"quantization_config": self.config(compute_dtype), "device_map": where}

    def prepare(self, model: Any, gradient_checkpointing: bool = False) -> Any:
        from peft import prepare_model_for_kbit_training

        for module in model.modules():
            # bitsandbytes' CPU inference fast path repacks 4-bit weights in place on the first no-grad
            # forward (e.g. an eval), after which training steps fail on layers with a bias
            if hasattr(module, "support_avx512bf16_for_cpu"):
                module.support_avx512bf16_for_cpu = False
        return prepare_model_for_kbit_training(model, use_gradient_checkpointing=gradient_checkpointing)
