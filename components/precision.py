"""Precision component: fp32, bf16 / fp16 mixed precision (fp32 master weights), auto, tf32."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from hydratune.components.config.errors import ConfigError
from hydratune.components.config.ranges import AT_LEAST_ONE, NON_NEGATIVE, POSITIVE, Range, knob
from hydratune.components.config.registry import component

DTYPES = ("fp32", "bf16", "fp16", "auto")

#: ``precision=auto`` on a CPU with bf16 instructions: bf16 autocast from this many parameters on, where it
#: saves at least a fifth of a step (bf16 trades fp32's exactness for speed, so a small gain is not worth
#: it). Measured by ``bench/precision_cpu.py`` (docs/benchmarks.md, "bf16 on a CPU"; under hydratune's thread
#: policy, 2026-11-27): bf16 ÷ fp32 step time 1.17 at 0.14 M parameters, 0.87 at 0.67 M (the tiny model),
#: 0.53 at 3.3 M; SmolLM2-135M LoRA 0.66 (bench/throughput.py --real). A fifth is crossed near 0.9 M.
CPU_BF16_MIN_PARAMS = 1_000_000
#: /proc/cpuinfo flags of native bf16 matmuls (Intel AMX, AVX512-BF16 on Intel and AMD Zen 4+)
CPU_BF16_FLAGS = ("amx_bf16", "avx512_bf16")


def cpu_flags() -> set[str]:
    """The CPU's feature flags (Linux /proc/cpuinfo; empty elsewhere)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.partition(":")[2].split())
    except OSError:
        pass
    return set()


def cpu_bf16_flag() -> str | None:
    """The flag that gives this CPU native bf16 matmuls (AMX first), None without one. torch must use it
    too: its CPU capability (``torch.backends.cpu.get_cpu_capability()``) is AVX512 or better."""
    import torch

    flags = cpu_flags()
    found = next((flag for flag in CPU_BF16_FLAGS if flag in flags), None)
    capability = torch.backends.cpu.get_cpu_capability()
    return found if found and capability.startswith(("AVX512", "AMX")) else None


def device_supports_bf16(device: str) -> bool:
    """bf16 autocast works on CPU (emulated, slow, without amx_bf16 / avx512_bf16) and on Ampere+ / recent
    AMD GPUs."""
    import torch

    if device == "cuda":  # no GPU visible: planning for one (mode=plan), assume Ampere or newer
        return not torch.cuda.is_available() or torch.cuda.is_bf16_supported()
    return device in ("cpu", "mps")


@component("precision")
@dataclass(frozen=True)
class Precision:
    """Mixed precision keeps fp32 master weights and autocasts compute to ``dtype``.

    fp16 uses dynamic loss scaling: DeepSpeed's fp16 block takes every ``loss_scale*`` knob; elsewhere
    (single, DDP, FSDP, PPO's own loop) torch's ``GradScaler`` takes ``initial_scale_power`` and
    ``loss_scale_window`` (:meth:`grad_scaler_kwargs`), and the knobs it has no equivalent for are refused
    (:meth:`check_grad_scaler`) rather than ignored.
    """

    # fp32 | bf16 | fp16 | auto (GPU: bf16 where supported, else fp16; CPU: bf16 with amx_bf16 /
    # avx512_bf16 for a model of >= CPU_BF16_MIN_PARAMS parameters, else fp32)
    dtype: str = "fp32"
    tf32: bool | None = None  # Ampere+ matmuls in tf32; None leaves torch's default
    loss_scale: float = knob(0.0, NON_NEGATIVE)  # fp16: 0 = dynamic
    initial_scale_power: int = knob(16, Range(0, 64))  # fp16 dynamic scaling starts at 2**power
    loss_scale_window: int = knob(1000, AT_LEAST_ONE)
    hysteresis: int = knob(2, AT_LEAST_ONE)
    min_loss_scale: float = knob(1.0, POSITIVE)

    def validate(self) -> None:
        if self.dtype not in DTYPES:
            raise ConfigError(f"unknown dtype '{self.dtype}'", key="precision.dtype", hint=f"one of {DTYPES}")

    def resolve(self, device: str, params: int | None = None) -> str:
        """The concrete dtype for ``device`` ('cpu', 'cuda', 'mps') and a model of ``params`` parameters
        (None: unknown); errors early when impossible."""
        return self.choose(device, params)[0]

    def choose(self, device: str, params: int | None = None) -> tuple[str, str]:
        """(the concrete dtype, why): ``auto`` says what it read; errors early when impossible."""
        if self.tf32 and device != "cuda":
            raise ConfigError(
                "tf32 needs an NVIDIA Ampere+ GPU", key="precision.tf32", hint="drop precision.tf32"
            )
        if self.dtype == "auto":
            return auto_dtype(device, params)
        if self.dtype == "bf16" and not device_supports_bf16(device):
            raise ConfigError(
                f"bf16 was requested but this {device} device has no bf16 support",
                key="precision",
                hint="use precision=fp16 (pre-Ampere GPUs) or precision=auto",
            )
        if self.dtype == "fp16" and device == "cpu":
            raise ConfigError(
                "fp16 mixed precision needs a GPU (no fp16 loss scaling on CPU)",
                key="precision",
                hint="use precision=bf16 or precision=fp32 on CPU",
            )
        return self.dtype, f"precision={self.dtype}"

    def grad_scaler_kwargs(self) -> dict[str, Any]:
        """torch ``GradScaler`` arguments of the dynamic-scaling knobs (accelerate's ``GradScalerKwargs``)."""
        return {"init_scale": 2.0**self.initial_scale_power, "growth_interval": int(self.loss_scale_window)}

    def scaler_handlers(self, dtype: str) -> list[Any]:
        """accelerate ``kwargs_handlers`` that carry the knobs to its ``GradScaler`` (fp16 only)."""
        if dtype != "fp16":
            return []
        from accelerate.utils import GradScalerKwargs

        return [GradScalerKwargs(**self.grad_scaler_kwargs())]

    def check_grad_scaler(self) -> None:
        """fp16 outside DeepSpeed: refuse the knobs torch's ``GradScaler`` cannot honour (it backs off on
        every overflow with no floor, and has no static scale)."""
        defaults = {f.name: f.default for f in dataclasses.fields(Precision)}
        hint = "use a DeepSpeed strategy (zero0-3) for it, or drop the override"
        if self.loss_scale > 0:
            raise ConfigError(
                f"a static loss scale ({self.loss_scale:g}) is DeepSpeed-only: torch's GradScaler is dynamic",
                key="precision.loss_scale",
                hint="precision.loss_scale=0 with precision.initial_scale_power=N, or " + hint,
            )
        for key in ("hysteresis", "min_loss_scale"):
            if getattr(self, key) != defaults[key]:
                raise ConfigError(
                    f"{key} is DeepSpeed-only: torch's GradScaler has no equivalent", key=f"precision.{key}",
                    hint=hint,
                )  # fmt: skip

    def training_args(self, device: str, dtype: str | None = None) -> dict[str, Any]:
        """The TrainingArguments fields this precision sets (``dtype``: as the run resolved it)."""
        dtype = dtype or self.resolve(device)
        args: dict[str, Any] = {"bf16": dtype == "bf16", "fp16": dtype == "fp16"}
        if self.tf32 is not None:
            args["tf32"] = self.tf32
        return args

    def warn_model_dtype(self, trained_dtype: str | None, device: str) -> str | None:
        """A warning when fp16 meets a model trained in bf16 (activations may overflow fp16's range)."""
        if self.resolve(device) == "fp16" and trained_dtype in ("bfloat16", "torch.bfloat16"):
            return (
                "precision=fp16 on a model whose config says it was trained in bf16: activations can "
                "overflow fp16's range (loss becomes nan). Prefer precision=bf16 on Ampere+ GPUs."
            )
        return None


def auto_dtype(device: str, params: int | None) -> tuple[str, str]:
    """``precision=auto``: bf16 where the device supports it, else fp16 on GPU; on a CPU bf16 only with
    native bf16 matmuls and a model of at least :data:`CPU_BF16_MIN_PARAMS` parameters, else fp32."""
    if device != "cpu":
        if device_supports_bf16(device):
            return "bf16", f"auto: {device} supports bf16"
        return ("fp16", "auto: this GPU has no bf16") if device == "cuda" else ("fp32", f"auto: {device}")
    flag = cpu_bf16_flag()
    if flag is None:
        return "fp32", "auto: this CPU has no amx_bf16 / avx512_bf16 (bf16 would be emulated)"
    if params is None:
        return "fp32", f"auto: the CPU has {flag}, the model's size is unknown"
    size = f"{params / 1e6:.2f} M parameters"
    limit = f"{CPU_BF16_MIN_PARAMS / 1e6:g} M"
    if params < CPU_BF16_MIN_PARAMS:
        why = "where bf16 autocast saves less than a fifth of a step"
        return "fp32", f"auto: the CPU has {flag}, but {size} < {limit}, {why}"
    return "bf16", f"auto: the CPU has {flag} and {size} >= {limit}"
