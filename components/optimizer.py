"""Optimizer component: AdamW (fused where the device allows), Adafactor, SGD.

Each returns ``(optimizer class, kwargs)``: the HF/TRL trainers take it as ``optimizer_cls_and_kwargs``
(keeping their weight-decay grouping of biases and norms) and our own loops call ``build(params)``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from hydratune.components.config.errors import ConfigError
from hydratune.components.config.ranges import FRACTION, NON_NEGATIVE, POSITIVE, Range, knob, one_of
from hydratune.components.config.registry import component

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Optimizer:
    """Base: learning rate and weight decay every optimizer shares."""

    lr: float = knob(1e-4, POSITIVE, hint="e.g. 2e-5")
    weight_decay: float = knob(0.0, NON_NEGATIVE)

    #: DeepSpeed's CPU Adam computes this optimizer's update: ZeRO offload on GPU may use it instead
    deepspeed_cpu_adam: ClassVar[bool] = False

    @property
    def memory_kind(self) -> str:
        """The estimate's name for its state size per parameter (``components/memory/estimate.py``'s
        ``optimizer_bytes``): adamw | adamw_8bit | adafactor | sgd | sgd_momentum."""
        return "adamw"

    def check_device(self, device: str) -> None:
        """Refuse a device this optimizer cannot run on (before any model loads)."""

    def validate(self) -> None:
        """Checks beyond each knob's declared range (``check_values`` has checked those)."""

    def cls_and_kwargs(self, device: str) -> tuple[type, dict[str, Any]]:
        raise NotImplementedError

    def training_args(self, device: str) -> dict[str, Any]:
        """Mirror lr / decay into TrainingArguments (logged, and used by DeepSpeed's "auto" filling)."""
        return {"learning_rate": self.lr, "weight_decay": self.weight_decay}

    def build(self, params: Iterable[torch.nn.Parameter], device: str = "cpu") -> torch.optim.Optimizer:
        cls, kwargs = self.cls_and_kwargs(device)
        return cls([p for p in params if p.requires_grad], **kwargs)


@component("optimizer")
@dataclass(frozen=True)
class AdamW(Optimizer):
    """torch AdamW; ``fused: auto`` uses the fused kernel on CUDA and CPU when torch provides it."""

    betas: list[float] = knob([0.9, 0.95], FRACTION)  # (beta1, beta2), each in [0, 1)
    eps: float = knob(1e-8, POSITIVE)
    fused: bool | None = None  # None = auto

    deepspeed_cpu_adam: ClassVar[bool] = True

    def validate(self) -> None:
        super().validate()
        if len(self.betas) != 2:
            raise ConfigError(
                f"betas must be two numbers (beta1 beta2), got {self.betas}", key="optimizer.betas"
            )

    def cls_and_kwargs(self, device: str) -> tuple[type, dict[str, Any]]:
        import torch

        fused = self.fused if self.fused is not None else device in ("cuda", "cpu")
        kwargs = {
            "lr": self.lr,
            "weight_decay": self.weight_decay,
            "betas": tuple(self.betas),
            "eps": self.eps,
            "fused": fused,
        }
        return torch.optim.AdamW, kwargs

    def training_args(self, device: str) -> dict[str, Any]:
        return {
            **super().training_args(device),
            "adam_beta1": self.betas[0],
            "adam_beta2": self.betas[1],
            "adam_epsilon": self.eps,
        }


@component("optimizer")
@dataclass(frozen=True)
class Adafactor(Optimizer):
    """Adafactor (factored second moments: far less optimizer memory than Adam) from transformers."""

    lr: float = 1e-3
    scale_parameter: bool = False
    relative_step: bool = False
    warmup_init: bool = False
    clip_threshold: float = knob(1.0, POSITIVE)
    decay_rate: float = knob(-0.8, Range(-1, 0, high_open=True))  # second moments decay as 1 - t^decay_rate
    beta1: float | None = knob(None, FRACTION)  # None: no first moment

    @property
    def memory_kind(self) -> str:
        return "adafactor"

    def cls_and_kwargs(self, device: str) -> tuple[type, dict[str, Any]]:
        from transformers.optimization import Adafactor as HFAdafactor

        kwargs = {
            "lr": None if self.relative_step else self.lr,
            "weight_decay": self.weight_decay,
            "scale_parameter": self.scale_parameter,
            "relative_step": self.relative_step,
            "warmup_init": self.warmup_init,
            "clip_threshold": self.clip_threshold,
            "decay_rate": self.decay_rate,
            "beta1": self.beta1,
        }
        return HFAdafactor, kwargs


@component("optimizer")
@dataclass(frozen=True)
class SGD(Optimizer):
    """Stochastic gradient descent with optional (Nesterov) momentum."""

    lr: float = 1e-2
    momentum: float = knob(0.9, FRACTION)
    nesterov: bool = False

    @property
    def memory_kind(self) -> str:
        return "sgd_momentum" if self.momentum > 0 else "sgd"

    def validate(self) -> None:
        super().validate()
        if self.nesterov and self.momentum <= 0:
            raise ConfigError("nesterov needs momentum > 0", key="optimizer.nesterov")

    def cls_and_kwargs(self, device: str) -> tuple[type, dict[str, Any]]:
        import torch

        kwargs = {
            "lr": self.lr,
            "momentum": self.momentum,
            "nesterov": self.nesterov,
            "weight_decay": self.weight_decay,
        }
        return torch.optim.SGD, kwargs


@component("optimizer")
@dataclass(frozen=True)
class BnbAdamW(AdamW):
    """bitsandbytes AdamW: 8-bit states (``bits: 8``, ~75% less optimizer memory) and/or paged states
    (``paged: true``: spill to CPU under memory spikes instead of OOM). CUDA only."""

    bits: int = knob(8, one_of(8, 32))  # 8-bit or 32-bit optimizer states
    paged: bool = False
    fused: bool | None = None  # unused (bitsandbytes kernels are fused already)

    deepspeed_cpu_adam: ClassVar[bool] = False  # its 8-bit / paged states are not DeepSpeed's Adam

    @property
    def memory_kind(self) -> str:
        return "adamw_8bit" if self.bits == 8 else "adamw"

    def validate(self) -> None:
        super().validate()
        try:
            import bitsandbytes  # noqa: F401
        except ImportError as err:
            raise ConfigError(
                "this optimizer needs bitsandbytes, which is not installed",
                key="optimizer",
                hint="pip install 'hydratune[bnb]', or use optimizer=adamw",
            ) from err

    def check_device(self, device: str) -> None:
        if device != "cuda":
            raise ConfigError(
                f"bitsandbytes optimizers need a CUDA GPU, this run is on {device}",
                key="optimizer",
                hint="use optimizer=adamw",
            )

    @property
    def class_name(self) -> str:
        return ("Paged" if self.paged else "") + ("AdamW8bit" if self.bits == 8 else "AdamW32bit")

    def cls_and_kwargs(self, device: str) -> tuple[type, dict[str, Any]]:
        import bitsandbytes as bnb

        kwargs = {
            "lr": self.lr,
            "weight_decay": self.weight_decay,
            "betas": tuple(self.betas),
            "eps": self.eps,
        }
        return getattr(bnb.optim, self.class_name), kwargs
