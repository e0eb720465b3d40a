"""``strategy=auto``'s OOM ladder: the first (strategy layout, gradient checkpointing) rung that fits.

Pure arithmetic over the rungs it is given: the strategy options come from conf/
(``hydratune.components.strategy.training_options``), each with the shape and mesh its component declares,
plus their tensor / sequence / pipeline parallel variants (``strategy_rungs`` in
``components/memory/spec.py``), so a new strategy option joins the ladder with no change here.

The order, every speed ASSUMED (``components/memory/shapes.py``): **tier 0**, data parallel with every
state on the GPUs (single/DDP, ZeRO-0..3, FSDP, ZeRO++); **tier 1**, the model split over tp / sp / pp
ranks on top of such an option, tried only when no tier-0 rung fits ("ZeRO alone does not fit");
**tier 2**, states offloaded to the host or NVMe, the last resort. Inside a tier the faster assumed speed
first (each rung without, then with gradient checkpointing at x0.75; under PP with the computed bubble of
its micro-batch split), the smaller model-parallel size on ties.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from hydratune.components.memory.estimate import Estimate, GiB, RunSpec, estimate
from hydratune.components.memory.shapes import CHECKPOINTING_SPEED, StrategyShape, parallel_speed

TIERS = ("data parallel on the GPUs", "tensor/sequence/pipeline parallel", "offload")
#: a tier's tried rungs beyond this many are summarised in one line
SHOWN_PER_TIER = 8


@dataclass(frozen=True)
class Rung:
    """One layout the ladder can try: an option of conf/strategy/, the knobs set on it as a user types
    them (``strategy.tp_size=4``), the memory shape and the mesh sizes the component declares for them."""

    option: str
    shape: StrategyShape
    tp: int = 1
    sp: int = 1
    pp: int = 1
    overrides: tuple[str, ...] = ()
    ep: int = 1  # expert-parallel ranks (of the data-parallel ones)

    @property
    def label(self) -> str:
        """``zero1 tp_size=4``."""
        return " ".join([self.option, *(o.removeprefix("strategy.") for o in self.overrides)])

    @property
    def model_parallel(self) -> int:
        return self.tp * self.sp * self.pp

    @property
    def tier(self) -> int:
        """0: data parallel on the GPUs, 1: tp / sp / pp on the GPUs, 2: states offloaded (module doc)."""
        if self.shape.offload_optimizer != "none" or self.shape.offload_param != "none":
            return 2
        return 1 if self.model_parallel > 1 or self.ep > 1 else 0

    def apply(self, spec: RunSpec, **over: Any) -> RunSpec:
        """``spec`` under this rung's shape and mesh."""
        return replace(spec, strategy=self.shape, tp=self.tp, sp=self.sp, pp=self.pp, ep=self.ep, **over)

    def speed(self, gradient_checkpointing: bool, micro_batches: int = 1) -> float:
        """ASSUMED relative throughput: the shape's, the model-parallel costs and bubble, checkpointing's."""
        gc = CHECKPOINTING_SPEED if gradient_checkpointing else 1.0
        mp = parallel_speed(self.tp, self.sp, self.pp, micro_batches, self.shape, self.ep)
        return self.shape.speed * mp * gc


def as_rungs(shapes: Mapping[str, StrategyShape] | Iterable[Rung]) -> list[Rung]:
    """Rungs from ``{option: shape}`` (data parallel only) or rungs as they are."""
    if isinstance(shapes, Mapping):
        return [Rung(name, shape) for name, shape in shapes.items()]
    return list(shapes)


def micro_batch_order(batch: int, pp: int = 1) -> list[int]:
    """Micro-batch sizes dividing a replica's ``batch``, best first: the largest; under PP the largest that
    still leaves at least 4 x pp micro-batches (the GPipe paper's rule for a negligible bubble), then those
    with more micro-batches first (a smaller bubble)."""
    divisors = [d for d in range(batch, 0, -1) if batch % d == 0]
    if pp <= 1:
        return divisors
    enough = [d for d in divisors if batch // d >= 4 * pp]
    return enough + [d for d in reversed(divisors) if d not in enough]


def ordered(rungs: Iterable[Rung], gradient_checkpointing: bool, batch: int = 1) -> list[tuple[Rung, bool]]:
    """(rung, checkpointing) pairs in the ladder's order (module doc); ``gradient_checkpointing`` already on
    leaves only rungs with it on; ``batch``: the per-GPU batch (a PP rung's bubble depends on its split)."""

    def key(pair: tuple[Rung, bool]) -> tuple[int, float, int, str]:
        rung, gc = pair
        replica = batch * rung.model_parallel
        micro_batches = replica // micro_batch_order(replica, rung.pp)[0]
        return rung.tier, -rung.speed(gc, micro_batches), rung.model_parallel, rung.label

    checkpointing = (True,) if gradient_checkpointing else (False, True)
    return sorted(((rung, gc) for rung in rungs for gc in checkpointing), key=key)


def ladder(
    shapes: Mapping[str, StrategyShape] | Iterable[Rung], gradient_checkpointing: bool
) -> list[tuple[str, bool]]:
    """(rung label, checkpointing) in the ladder's order."""
    return [(rung.label, gc) for rung, gc in ordered(as_rungs(shapes), gradient_checkpointing)]


@dataclass
class Decision:
    """What ``strategy=auto`` chose and why."""

    strategy: str | None  # the option name; None: nothing fits
    micro_batch: int
    accumulation: int
    gradient_checkpointing: bool
    estimate: Estimate | None
    tried: list[tuple[str, bool, float, int]]  # (rung label, checkpointing, GiB at micro-batch 1, tier)
    gpu_memory: float
    margin: float
    speed: float = 0.0  # the chosen rung's assumed relative speed
    rung: Rung | None = None

    @property
    def overrides(self) -> list[str]:
        """The choice as a user types it: ``strategy=zero1 strategy.tp_size=4 model.gradient_checkpointing=…
        train.micro_batch_size=… train.gradient_accumulation_steps=…``."""
        if self.strategy is None:
            return []
        return [
            f"strategy={self.strategy}",
            *(self.rung.overrides if self.rung else ()),
            f"model.gradient_checkpointing={str(self.gradient_checkpointing).lower()}",
            f"train.micro_batch_size={self.micro_batch}",
            f"train.gradient_accumulation_steps={self.accumulation}",
        ]

    def explain(self) -> str:
        budget = self.gpu_memory * (1 - self.margin) / GiB
        lines = [
            f"strategy=auto: budget {budget:.1f} GiB per GPU ({self.gpu_memory / GiB:.0f} GiB "
            f"less a {self.margin:.0%} safety margin)"
        ]
        for tier, name in enumerate(TIERS):
            group = [t for t in self.tried if t[3] == tier]
            hidden = group[SHOWN_PER_TIER:-1] if len(group) > SHOWN_PER_TIER + 1 else []
            head, tail = (group[:SHOWN_PER_TIER], group[-1:]) if hidden else (group, [])
            lines += [_tried_line(t, budget) for t in head]
            if hidden:
                least = min(hidden, key=lambda t: t[2])
                lines.append(
                    f"  … {len(hidden)} more {name} rungs, too big (the smallest needs {least[2]:.1f} GiB: "
                    f"{least[0]} checkpointing={'on' if least[1] else 'off'})"
                )
            lines += [_tried_line(t, budget) for t in tail]
        if self.strategy is None:
            lines.append(
                "  nothing fits: fewer/longer-memory GPUs, more GPUs, a shorter data.max_length, "
                "peft=lora or quantization=nf4"
            )
            return "\n".join(lines)
        assert self.estimate is not None
        tier = TIERS[self.rung.tier] if self.rung else TIERS[0]
        bubble = self.estimate.bubble
        lines.append(
            f"chose {' '.join(self.overrides)}: the first rung that fits in the ladder's order ({tier}; "
            f"assumed relative speed {self.speed:.2f}, see components/memory/shapes.py), "
            f"{self.estimate.total / GiB:.1f} GiB of {budget:.1f} GiB, the largest micro-batch keeping the "
            "global batch" + (f"; pipeline bubble {bubble:.0%} of the step" if bubble else "")
        )
        return "\n".join(lines)


def _tried_line(tried: tuple[str, bool, float, int], budget: float) -> str:
    label, gc, need, _ = tried
    mark = "fits" if need <= budget else "too big"
    return f"  {label:<20} checkpointing={'on ' if gc else 'off'}  {need:7.1f} GiB  {mark}"


def choose(
    spec: RunSpec,
    shapes: Mapping[str, StrategyShape] | Iterable[Rung],
    gpu_memory: float,
    margin: float = 0.1,
    per_gpu_batch: int | None = None,
    candidates: Iterable[str] | None = None,
    micro_batch: int | None = None,
) -> Decision:
    """Walk the ladder of ``shapes`` (``{option: shape}`` or :class:`Rung` s applicable to this world size):
    the first (rung, checkpointing) whose micro-batch-1 run fits, then the best micro-batch split
    (:func:`micro_batch_order`) that still fits. The global batch is kept: a rung with tp x sp x pp = k has
    k times fewer data-parallel replicas, so each replica takes k times the per-GPU batch."""
    batch = per_gpu_batch or spec.micro_batch
    allowed = set(candidates) if candidates else None
    tried: list[tuple[str, bool, float, int]] = []
    for rung, gc in ordered(as_rungs(shapes), spec.gradient_checkpointing, batch):
        if allowed is not None and rung.option not in allowed:
            continue
        replica = batch * rung.model_parallel
        base = rung.apply(spec, gradient_checkpointing=gc)
        first = estimate(replace(base, micro_batch=1, micro_batches=replica))
        tried.append((rung.label, gc, first.total / GiB, rung.tier))
        if not first.fits(gpu_memory, margin):
            continue
        for mb in [micro_batch] if micro_batch else micro_batch_order(replica, rung.pp):
            est = estimate(replace(base, micro_batch=mb, micro_batches=replica // mb))
            if est.fits(gpu_memory, margin):
                m, speed = replica // mb, rung.speed(gc, replica // mb)
                return Decision(rung.option, mb, m, gc, est, tried, gpu_memory, margin, speed, rung)
    return Decision(None, 1, batch, spec.gradient_checkpointing, None, tried, gpu_memory, margin)
