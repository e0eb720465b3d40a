"""DPO's and KTO's per-token log-probabilities through hydratune's chunked LM head
(``recipe.loss_impl=chunked``).

TRL 1.16's ``DPOTrainer`` and ``KTOTrainer`` ask the model for ``model(..., labels=..., fused_lm_head=True)``
(their ``add_fused_lm_head``) and compute their loss and metrics from the ``FusedCausalLMOutput`` it returns.
:func:`install` answers that call instead: the last hidden state, then :class:`ChunkedTokenStats` over the
positions whose label is not -100 only (TRL's head on a device without Triton scores every position, prompt
and padding too), ``chunk`` positions at a time, never the full logits. The per-token metrics TRL reads
(entropy, mean logit, top-1) are computed only for the policy pass of a logging step's micro-batches and of
every eval batch (:class:`ChunkedHead`); TRL: on every pass, the reference pass too. TRL's loss code runs
unchanged on the output. Imports torch: import this module lazily.
"""

from __future__ import annotations

import functools
import sys
import types
from typing import Any

import torch

from hydratune.components.runtime.lm_loss import ChunkedNLL, _logits, chunk_for, compute_dtype, is_log_step

#: the per-token metric fields of TRL's ``FusedCausalLMOutput`` this head computes (the columns of the stats)
STATS = ("entropy", "mean_logits", "is_top1")


class ChunkedTokenStats(ChunkedNLL):
    """:class:`ChunkedNLL` per position: the log-probabilities ``[N]`` (float32, differentiable; the same
    backward) and, when ``metrics``, ``[N, 3]`` float32 statistics (:data:`STATS`: the entropy, the mean
    logit over the vocabulary, 1 where the target is the first argmax), else an empty ``[0, 3]``."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        hidden: torch.Tensor,  # [N, H]
        weight: torch.Tensor,  # [V, H]
        bias: torch.Tensor | None,  # [V]
        targets: torch.Tensor,  # [N], no -100
        chunk: int,
        metrics: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        cd = compute_dtype(hidden)
        n = hidden.shape[0]
        w = weight.to(cd)
        b = None if bias is None else bias.to(cd)
        log_probs = torch.empty(n, device=hidden.device, dtype=torch.float32)
        log_z = torch.empty(n, device=hidden.device, dtype=torch.float32)
        stats = torch.zeros(n if metrics else 0, len(STATS), device=hidden.device, dtype=torch.float32)
        with torch.autocast(hidden.device.type, enabled=False):
            for s in range(0, n, chunk):
                e = min(s + chunk, n)
                z = _logits(hidden[s:e].to(cd), w, b)
                t = targets[s:e]
                if metrics:  # one exp pass for the normaliser and the entropy; top-1: the first argmax
                    top, arg = z.max(-1)
                    ez = (z - top[:, None]).exp_()
                    total = ez.sum(-1)
                    lz = top + total.log()
                    stats[s:e, 0] = lz - (ez * z).sum(-1) / total
                    stats[s:e, 1] = z.mean(-1)
                    stats[s:e, 2] = (arg == t).float()
                else:
                    lz = torch.logsumexp(z, dim=-1)
                log_probs[s:e] = z.gather(1, t[:, None]).squeeze(1) - lz
                log_z[s:e] = lz
        ctx.save_for_backward(hidden, weight, bias, targets, log_z)
        ctx.chunk, ctx.cd = chunk, cd
        ctx.mark_non_differentiable(stats)
        return log_probs, stats


def install(model: Any, outputs: tuple[str, ...]) -> None:
    """Let ``model`` (the causal LM itself, below PEFT; TRL's fused head already added) answer
    ``model(..., labels=..., fused_lm_head=True)`` with :class:`ChunkedTokenStats`: TRL's
    ``FusedCausalLMOutput`` with ``log_probs``, ``loss``, ``label_mask`` and the ``outputs`` among
    :data:`STATS`, computed only while ``model.hydratune_head_metrics`` is set and the call carries gradients
    or the model is in eval mode (TRL's reference and KL passes run under ``no_grad``), zero otherwise.
    Pre-shifted ``shift_labels`` and calls without ``fused_lm_head`` go to the forward it had."""
    from trl.trainer.utils import FusedCausalLMOutput

    unknown = [o for o in outputs if o != "log_probs" and o not in STATS]
    if unknown:  # log_sum_sq_probs: WPO's weights (the recipes do not set use_weighting)
        raise ValueError(f"the chunked head does not compute {unknown}")
    inner = model.forward
    wanted = [(i, name) for i, name in enumerate(STATS) if name in outputs]
    model.hydratune_head_metrics = False

    @functools.wraps(type(model).forward)
    def forward(
        self: Any,
        *args: Any,
        fused_lm_head: bool = False,
        labels: torch.Tensor | None = None,
        shift_labels: torch.Tensor | None = None,
        num_items_in_batch: Any = None,
        **kwargs: Any,
    ) -> Any:
        if not fused_lm_head or shift_labels is not None:
            return inner(
                *args,
                fused_lm_head=fused_lm_head,
                labels=labels,
                shift_labels=shift_labels,
                num_items_in_batch=num_items_in_batch,
                **kwargs,
            )
        # the policy's pass (the one with gradients; in eval every pass) of a micro-batch that logs
        metrics = (
            self.hydratune_head_metrics and bool(wanted) and (torch.is_grad_enabled() or not self.training)
        )
        kwargs["use_cache"] = False
        head = self.get_output_embeddings()
        hidden = self.base_model(*args, **kwargs).last_hidden_state[:, :-1].to(head.weight.device)
        labels = labels[:, 1:].to(head.weight.device)
        mask = labels != -100
        vocab = head.weight.shape[0]
        per_token, stats = ChunkedTokenStats.apply(
            hidden[mask], head.weight, head.bias, labels[mask], chunk_for(vocab), metrics
        )
        # masked_scatter keeps a micro-batch with no labelled position connected to the model (TRL's way)
        log_probs = per_token.new_zeros(mask.shape).masked_scatter(mask, per_token)
        n = mask.sum().clamp(min=1) if num_items_in_batch is None else num_items_in_batch
        fields: dict[str, torch.Tensor] = {}
        for i, name in wanted:  # off a metrics pass: zeros, which ChunkedHead drops from the metrics
            field = stats.new_zeros(mask.shape)
            if metrics:
                field.masked_scatter_(mask, stats[:, i])
            fields[name] = field.bool() if name == "is_top1" else field
        return FusedCausalLMOutput(loss=-log_probs.sum() / n, log_probs=log_probs, label_mask=mask, **fields)

    model.forward = types.MethodType(forward, model)


class ChunkedHead:
    """Mixin before TRL's ``DPOTrainer`` / ``KTOTrainer`` (:func:`with_chunked_head`): wherever its
    ``__init__`` adds TRL's fused head to a model (the policy below PEFT, the reference model),
    :func:`install` answers that head's calls, with the statistics TRL asked for, before accelerate wraps the
    reference in its autocast and before the reference log-probs TRL precomputes
    (``precompute_ref_log_probs``). The per-token metrics (``head_metrics``, TRL's names) come from the
    policy pass of every micro-batch of a logging step (:func:`is_log_step`) and of every eval batch;
    the other micro-batches append none (TRL: every micro-batch, the log their mean since the last)."""

    #: the TRL metrics computed from the per-token statistics
    head_metrics: tuple[str, ...] = ()
    #: the model whose statistics the metrics read (the policy: its fused head computes more than log-probs)
    head_model: Any = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        trl_cls = next(c for c in type(self).__mro__ if c.__module__.startswith("trl."))
        module = sys.modules[trl_cls.__module__]
        trls_head = module.add_fused_lm_head

        def add_fused_lm_head(model: Any, **options: Any) -> None:
            trls_head(model, **options)
            if options.get("temperature", 1.0) != 1.0 or options.get("cast_lm_head_to_fp32"):
                return  # not a setup this head was checked for: TRL's answers
            outputs = options.get("outputs", ("log_probs",))
            install(model, outputs)
            if outputs != ("log_probs",):
                self.head_model = model

        module.add_fused_lm_head = add_fused_lm_head
        try:
            super().__init__(*args, **kwargs)
        finally:
            module.add_fused_lm_head = trls_head
        if self.head_model is None:
            raise RuntimeError(f"{trl_cls.__name__} added no fused LM head to its policy")

    def compute_loss(
        self, model: Any, inputs: dict[str, Any], return_outputs: bool = False, num_items_in_batch: Any = None
    ) -> Any:
        mode = "train" if self.model.training else "eval"  # type: ignore[attr-defined]
        metrics = return_outputs or mode == "eval" or is_log_step(self)
        self.head_model.hydratune_head_metrics = metrics
        logged = self._metrics[mode]  # type: ignore[attr-defined]
        before = {k: len(logged[k]) for k in self.head_metrics if k in logged}
        try:
            out = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)  # type: ignore[misc]
        finally:
            self.head_model.hydratune_head_metrics = False
        if not metrics:  # what TRL made of the zeros the head returned for them: not metrics
            for k in self.head_metrics:
                if k in logged:
                    del logged[k][before.get(k, 0) :]
                    if not logged[k]:
                        del logged[k]
        return out


def with_chunked_head(trainer_cls: type, metrics: tuple[str, ...]) -> type:
    """``trainer_cls`` (TRL's DPOTrainer or KTOTrainer) with the chunked head: ``metrics`` are the metrics it
    computes from the head's per-token statistics."""
    return type(trainer_cls.__name__, (ChunkedHead, trainer_cls), {"head_metrics": metrics})


def choose_head(session: Any, trainer_cls: type, path: tuple[str, str], metrics: tuple[str, ...]) -> type:
    """``trainer_cls`` with the chunked head where ``path`` (:func:`head_path.head_path`'s answer) and the
    built model's head allow it, else ``trainer_cls``; the summary's ``loss: implementation`` says which head
    runs and why."""
    from hydratune.components.head_path import chunked_head_line
    from hydratune.components.runtime.lm_loss import head_refusal

    impl, why = path
    model = session.model.get_base_model() if hasattr(session.model, "get_base_model") else session.model
    refused = head_refusal(model) if impl == "chunked" else None
    if refused:
        impl, why = "trl", refused
    session.report.setdefault("loss", {})["implementation"] = (
        chunked_head_line(metrics) if impl == "chunked" else f"TRL's fused LM head ({why})"
    )
    return with_chunked_head(trainer_cls, metrics) if impl == "chunked" else trainer_cls
