"""``strategy=auto``'s OOM ladder: the fastest (strategy, gradient checkpointing) rung that fits.

Pure arithmetic over the shapes it is given: the strategy options themselves come from conf/
(``components.strategy.training_options``), each with the shape its component declares, so a new
strategy option joins the ladder with no change here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from components.memory.estimate import Estimate, GiB, RunSpec, estimate
from components.memory.shapes import CHECKPOINTING_SPEED, StrategyShape


@dataclass
class Decision:
    """What ``strategy=auto`` chose and why."""

    strategy: str | None  # the option name; None: nothing fits
    micro_batch: int
    accumulation: int
    gradient_checkpointing: bool
    estimate: Estimate | None
    tried: list[tuple[str, bool, float]]  # (strategy, checkpointing, GiB at micro-batch 1)
    gpu_memory: float
    margin: float
    speed: float = 0.0  # the chosen rung's assumed relative speed

    def explain(self) -> str:
        budget = self.gpu_memory * (1 - self.margin) / GiB
        lines = [
            f"strategy=auto: budget {budget:.1f} GiB per GPU ({self.gpu_memory / GiB:.0f} GiB "
            f"less a {self.margin:.0%} safety margin)"
        ]
        for name, gc, need in self.tried:
            mark = "fits" if need <= budget else "too big"
            lines.append(f"  {name:<14} checkpointing={'on ' if gc else 'off'}  {need:7.1f} GiB  {mark}")
        if self.strategy is None:
            lines.append(
                "  nothing fits: fewer/longer-memory GPUs, more GPUs, a shorter data.max_length, "
                "peft=lora or quantization=nf4"
            )
            return "\n".join(lines)
        assert self.estimate is not None
        gc_text = str(self.gradient_checkpointing).lower()
        lines.append(
            f"chose strategy={self.strategy} model.gradient_checkpointing={gc_text}"
            f" train.micro_batch_size={self.micro_batch}"
            f" train.gradient_accumulation_steps={self.accumulation}"
            f": the fastest rung that fits (assumed relative speed {self.speed:.2f}, see "
            "components/memory/shapes.py), "
            f"{self.estimate.total / GiB:.1f} GiB of {budget:.1f} GiB, the largest micro-batch keeping the "
            "global batch"
        )
        return "\n".join(lines)


def rung_speed(shape: StrategyShape, gradient_checkpointing: bool) -> float:
    return shape.speed * (CHECKPOINTING_SPEED if gradient_checkpointing else 1.0)


def ladder(shapes: Mapping[str, StrategyShape], gradient_checkpointing: bool) -> list[tuple[str, bool]]:
    """(strategy, checkpointing) rungs, fastest first: the strategy's assumed speed x checkpointing's cost;
    ``gradient_checkpointing`` already on leaves only rungs with it on."""
    rungs = [(name, gc) for name in shapes for gc in ((True,) if gradient_checkpointing else (False, True))]
    return sorted(rungs, key=lambda r: -rung_speed(shapes[r[0]], r[1]))


def choose(
    spec: RunSpec,
    shapes: Mapping[str, StrategyShape],
    gpu_memory: float,
    margin: float = 0.1,
    per_gpu_batch: int | None = None,
    candidates: Iterable[str] | None = None,
) -> Decision:
    """Walk the ladder of ``shapes`` (the options applicable to this world size): the fastest (strategy,
    checkpointing) rung whose micro-batch-1 run fits, then the largest micro-batch dividing the per-GPU
    batch (micro x accumulation) that still fits."""
    batch = per_gpu_batch or spec.micro_batch
    allowed = set(candidates) if candidates else None
    tried: list[tuple[str, bool, float]] = []
    for name, gc in ladder(shapes, spec.gradient_checkpointing):
        if allowed is not None and name not in allowed:
            continue
        base = replace(spec, strategy=shapes[name], gradient_checkpointing=gc)
        first = estimate(replace(base, micro_batch=1))
        tried.append((name, gc, first.total / GiB))
        if not first.fits(gpu_memory, margin):
            continue
        for mb in sorted((d for d in range(1, batch + 1) if batch % d == 0), reverse=True):
            est = estimate(replace(base, micro_batch=mb))
            if est.fits(gpu_memory, margin):
                speed = rung_speed(shapes[name], gc)
                return Decision(name, mb, batch // mb, gc, est, tried, gpu_memory, margin, speed)
    return Decision(None, 1, batch, spec.gradient_checkpointing, None, tried, gpu_memory, margin)
