"""How a mixture of experts spreads its tokens: every router's top-k choices counted while training (a
forward hook on each router module, training passes only), the imbalance logged with the losses
(``expert_imbalance``: the busiest expert's load over the mean, averaged over layers, since the last log)
and a per-layer table in the summary (``expert load``). A dense model gets neither.

The load-balancing (router auxiliary) loss itself is TRL's: on with the architecture's own
``router_aux_loss_coef`` and logged as ``aux_loss``. Under expert parallel (DeepSpeed AutoEP, which puts its
own blocks in place of the model's when the engine is built) the counts are read from each block's
``tokens_per_expert`` instead, hooked when training begins.
"""

from __future__ import annotations

import re
from typing import Any

from transformers import TrainerCallback


def routers(model: Any) -> list[tuple[str, Any]]:
    """``(name, module)`` of every router of a mixture of experts (transformers' ``*TopKRouter``s)."""
    return [
        (name, module)
        for name, module in model.named_modules()
        if type(module).__name__.endswith("Router") and hasattr(module, "top_k")
    ]


def _experts(module: Any) -> int:
    return int(getattr(module, "num_experts", 0) or module.weight.shape[0])


class ExpertLoad(TrainerCallback):
    """Counts each router's expert choices over the run and per logging interval (see the module doc);
    ``report``: the session's summary sections, where ``expert load`` is written at the end."""

    def __init__(self, model: Any, report: dict[str, Any]) -> None:
        import torch

        self.report = report
        self.names: list[str] = []
        self.run: list[Any] = []  # per layer: tokens routed to each expert over the run
        self.interval: list[Any] = []
        self.handles = []
        for i, (name, module) in enumerate(routers(model)):
            found = re.search(r"layers\.(\d+)\.", name)
            self.names.append(f"layer {found.group(1)}" if found else name)
            self.run.append(torch.zeros(_experts(module), dtype=torch.float64))
            self.interval.append(torch.zeros(_experts(module), dtype=torch.float64))
            self.handles.append(module.register_forward_hook(self._hook(i)))

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kw: Any) -> None:
        """The engine is built: where AutoEP replaced the mixture blocks, count at its blocks instead."""
        from hydratune.components.distributed.model_parallel import autoep_layers

        blocks = list(autoep_layers(model).values()) if model is not None else []
        if len(blocks) != len(self.run):
            return
        for handle in self.handles:
            handle.remove()
        self.handles = [block.register_forward_hook(self._count_block(i)) for i, block in enumerate(blocks)]

    def _count_block(self, layer: int) -> Any:
        """An AutoEP block's hook: the growth of its ``tokens_per_expert`` (every expert's tokens from this
        rank) since its last training pass."""
        import torch

        last: list[Any] = []

        def count(module: Any, inputs: Any, output: Any) -> None:
            now = module.tokens_per_expert.detach().to("cpu", copy=True).to(torch.float64)
            before = last[0] if last and bool((now >= last[0]).all()) else torch.zeros_like(now)
            last[:] = [now]
            if module.training:
                self.interval[layer] += now - before

        return count

    def _hook(self, layer: int) -> Any:
        import torch

        def count(module: Any, inputs: Any, output: Any) -> None:
            if not module.training:
                return
            outputs = output if isinstance(output, tuple) else (output,)
            indices = next(t for t in reversed(outputs) if not torch.is_floating_point(t))
            found = torch.bincount(indices.detach().reshape(-1), minlength=len(self.run[layer]))
            self.interval[layer] += found.cpu().to(torch.float64)

        return count

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, float] | None = None, **kw: Any
    ) -> None:
        loads = [c for c in self.interval if c.sum() > 0]
        if logs is not None and loads and "loss" in logs:
            logs["expert_imbalance"] = round(sum(float(c.max() / c.mean()) for c in loads) / len(loads), 4)
        self._close_interval()

    def _close_interval(self) -> None:
        """Add the interval's counts to the run's and start a new interval."""
        for layer, counts in enumerate(self.interval):
            self.run[layer] += counts
            counts.zero_()

    def on_train_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        import torch.distributed as dist

        self._close_interval()
        if dist.is_available() and dist.is_initialized():  # every rank's tokens
            for counts in self.run:
                dist.all_reduce(counts)
        for handle in self.handles:
            handle.remove()
        self.report["expert load"] = self.table()

    def table(self) -> dict[str, str]:
        """Per layer: top-k assignments, the least and most loaded expert's share, imbalance (max/mean)."""
        rows = {}
        for name, counts in zip(self.names, self.run, strict=True):
            total = float(counts.sum())
            if not total:
                rows[name] = "no token routed while training"
                continue
            share = counts / total
            low, high = int(share.argmin()), int(share.argmax())
            rows[name] = (
                f"{int(total):,} assignments; share min {float(share[low]):.1%} (expert {low}), "
                f"max {float(share[high]):.1%} (expert {high}); imbalance "
                f"{float(counts.max() / counts.mean()):.2f}; idle experts {int((counts == 0).sum())}"
            )
        return rows
