"""SFT's causal-LM loss owned by hydratune (``recipe.loss_impl=chunked``): the LM head and the cross-entropy
in chunks of positions, never the full ``[tokens, vocab]`` logits.

The model runs to its last hidden state (no logits); the positions whose next-token label is not -100 go
through :class:`ChunkedNLL`, which projects ``chunk`` positions at a time, keeps only each position's
log-normaliser, and recomputes a chunk's logits in the backward pass to form its gradient. The loss is
TRL 1.16's ``SFTTrainer.compute_loss`` (the label shift, ``num_items_in_batch`` under gradient
accumulation, ``average_tokens_across_devices``, ``loss_type=dft``); its logged metrics (``entropy``,
``mean_token_accuracy``) are computed as TRL computes them, but only on the micro-batches of a logging
step (TRL: on every micro-batch) and on every eval batch. ``SFT.loss_path`` (recipes/sft.py) names the
setups that keep TRL's fused LM head instead. Imports torch: import this module lazily.
"""

from __future__ import annotations

import functools
import types
from typing import Any

import torch

from hydratune.components.modeling.lm_head_chunk import chunk_for


def compute_dtype(t: torch.Tensor) -> torch.dtype:
    """The autocast dtype when autocast is on for ``t``'s device, else ``t``'s own."""
    kind = t.device.type
    return torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else t.dtype


class ChunkedNLL(torch.autograd.Function):
    """Per-position log-probabilities ``log_softmax(hidden @ weight.T + bias)[target]`` (float32), with,
    when ``metrics``, the summed entropy and the count of positions whose target is the argmax (both
    non-differentiable). The projection runs in the autocast dtype (as the model's own head would), the
    normaliser in float32.

    When gradients are wanted, the forward also forms each chunk's ``(onehot - softmax)`` and its products
    with the weight and the hidden states, the gradients for an upstream gradient of 1 per position (as
    Liger's fused linear cross-entropy does): the backward then only scales them, three projections of the
    head a step instead of four. That holds when the upstream gradient is the same at every position (a
    summed or mean NLL: SFT's loss); any other (``loss_type=dft``, per-sequence weights) recomputes each
    chunk's logits in the backward: ``g * (onehot - softmax)``."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        hidden: torch.Tensor,  # [N, H]
        weight: torch.Tensor,  # [V, H]
        bias: torch.Tensor | None,  # [V]
        targets: torch.Tensor,  # [N], no -100
        chunk: int,
        metrics: bool,
        grads: bool = True,  # torch.is_grad_enabled() where it is applied (the forward runs without grad)
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        cd = compute_dtype(hidden)
        n = hidden.shape[0]
        w = weight.to(cd)
        b = None if bias is None else bias.to(cd)
        log_probs = torch.empty(n, device=hidden.device, dtype=torch.float32)
        log_z = torch.empty(n, device=hidden.device, dtype=torch.float32)
        entropy = torch.zeros((), device=hidden.device, dtype=torch.float32)
        correct = torch.zeros((), device=hidden.device, dtype=torch.int64)
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        unit = _UnitGrads(hidden, weight, bias, grads and need_h, grads and need_w, grads and need_b)
        with torch.autocast(hidden.device.type, enabled=False):
            for s in range(0, n, chunk):
                e = min(s + chunk, n)
                h = hidden[s:e].to(cd)
                z = _logits(h, w, b)
                t = targets[s:e]
                if metrics:  # one exp pass for the normaliser and the entropy; top-1: the first argmax
                    top, arg = z.max(-1)
                    ez = (z - top[:, None]).exp_()
                    total = ez.sum(-1)
                    lz = top + total.log()
                    entropy += (lz - (ez * z).sum(-1) / total).sum()
                    correct += (arg == t).sum()
                else:
                    lz = torch.logsumexp(z, dim=-1)
                log_probs[s:e] = z.gather(1, t[:, None]).squeeze(1) - lz
                log_z[s:e] = lz
                if (
                    unit.wanted
                ):  # z becomes onehot - softmax in place: the chunk's logits are not needed again
                    dz = z.sub_(lz[:, None]).exp_().neg_()
                    dz.scatter_add_(1, t[:, None], torch.ones_like(lz[:, None]))
                    unit.add(s, e, h, w, dz, cd)
        ctx.save_for_backward(hidden, weight, bias, targets, log_z, *unit.tensors())
        ctx.chunk, ctx.cd, ctx.unit = chunk, cd, unit.wanted
        ctx.mark_non_differentiable(entropy, correct)
        return log_probs, entropy, correct

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor, *_: Any) -> tuple[Any, ...]:  # type: ignore[override]
        hidden, weight, bias, targets, log_z, *unit = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        rest = (None,) * (len(ctx.needs_input_grad) - 3)  # targets, chunk, ... (a subclass may add inputs)
        if getattr(ctx, "unit", False) and (grad.numel() == 0 or bool((grad == grad[0]).all())):
            g = grad[0].float() if grad.numel() else grad.new_zeros((), dtype=torch.float32)
            gh, gw, gb = unit
            return (
                (gh * g).to(hidden.dtype) if need_h else None,
                (gw * g).to(weight.dtype) if need_w else None,
                (gb * g).to(bias.dtype) if need_b else None,
                *rest,
            )
        cd, chunk, n = ctx.cd, ctx.chunk, hidden.shape[0]
        w = weight.to(cd)
        b = None if bias is None else bias.to(cd)
        grad_h = torch.empty_like(hidden) if need_h else None
        grad_w = torch.zeros(weight.shape, device=weight.device, dtype=torch.float32) if need_w else None
        grad_b = torch.zeros(bias.shape, device=bias.device, dtype=torch.float32) if need_b else None
        grad = grad.float()
        with torch.autocast(hidden.device.type, enabled=False):
            for s in range(0, n, chunk):
                e = min(s + chunk, n)
                h = hidden[s:e].to(cd)
                g = grad[s:e]
                dz = _logits(h, w, b).sub_(log_z[s:e, None]).exp_().mul_(-g[:, None])  # -g * softmax
                dz.scatter_add_(1, targets[s:e, None], g[:, None])  # + g * onehot
                if grad_b is not None:
                    grad_b += dz.sum(0)
                dz_c = dz.to(cd)
                if grad_h is not None:
                    grad_h[s:e] = (dz_c @ w).to(hidden.dtype)
                if grad_w is not None:
                    grad_w += (dz_c.t() @ h).float()
        return (
            grad_h,
            None if grad_w is None else grad_w.to(weight.dtype),
            None if grad_b is None else grad_b.to(bias.dtype),
            *rest,
        )


class _UnitGrads:
    """:class:`ChunkedNLL`'s gradients for an upstream gradient of 1 at every position, formed chunk by chunk
    in the forward: for the hidden states ``(onehot - softmax) @ W`` per position, for the weight and the
    bias their sums over the positions."""

    def __init__(
        self, hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, h: bool, w: bool, b: bool
    ) -> None:
        self.wanted = h or w or b
        z = torch.zeros((0,), device=hidden.device)
        self.h = torch.empty_like(hidden) if self.wanted and h else z
        self.w = (
            torch.zeros(weight.shape, device=weight.device, dtype=torch.float32) if self.wanted and w else z
        )
        self.b = torch.zeros(bias.shape, device=bias.device, dtype=torch.float32) if self.wanted and b else z

    def add(
        self, s: int, e: int, h: torch.Tensor, w: torch.Tensor, dz: torch.Tensor, cd: torch.dtype
    ) -> None:
        if self.b.numel():
            self.b += dz.sum(0)
        dz_c = dz.to(cd)
        if self.h.numel():
            self.h[s:e] = (dz_c @ w).to(self.h.dtype)
        if self.w.numel():
            self.w += (dz_c.t() @ h).float()

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return (self.h, self.w, self.b) if self.wanted else ()


def _logits(h: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    z = h @ w.t() if b is None else torch.addmm(b, h, w.t())
    return z.float()


def token_log_probs(
    hidden: torch.Tensor, labels: torch.Tensor, head: Any, *, chunk: int | None = None, metrics: bool = False
) -> dict[str, torch.Tensor]:
    """The shifted next-token log-probabilities of ``hidden`` ``[B, T, H]`` under ``head`` (an
    ``nn.Linear``) for ``labels`` ``[B, T]`` (-100: out of the loss), at the positions in the loss only:
    ``log_probs`` ``[N]``, ``num_valid`` (N, a 0-d tensor) and, when ``metrics``, ``entropy_sum`` and
    ``num_correct`` over those positions."""
    hidden = hidden[:, :-1].to(head.weight.device)
    labels = labels[:, 1:].to(head.weight.device)
    mask = labels != -100
    vocab = head.weight.shape[0]
    log_probs, entropy, correct = ChunkedNLL.apply(
        hidden[mask],
        head.weight,
        head.bias,
        labels[mask],
        chunk or chunk_for(vocab),
        metrics,
        torch.is_grad_enabled(),
    )
    out = {"log_probs": log_probs, "num_valid": mask.sum()}
    if metrics:
        out.update(entropy_sum=entropy, num_correct=correct)
    return out


def install(model: Any) -> None:
    """Let ``model`` (the causal LM itself, below PEFT, DDP or DeepSpeed wrappers, which pass the keyword
    through) answer ``model(..., labels=..., hydratune_lm_loss="loss"|"metrics")`` with
    :func:`token_log_probs` of its last hidden state instead of logits; without the keyword its forward is
    the one it had (TRL's fused head, generation)."""
    inner = model.forward

    @functools.wraps(type(model).forward)
    def forward(self: Any, *args: Any, hydratune_lm_loss: str | None = None, **kwargs: Any) -> Any:
        if hydratune_lm_loss is None:
            return inner(*args, **kwargs)
        labels = kwargs.pop("labels")
        kwargs.pop("num_items_in_batch", None)
        kwargs["use_cache"] = False
        hidden = self.base_model(*args, **kwargs).last_hidden_state
        return token_log_probs(
            hidden, labels, self.get_output_embeddings(), metrics=hydratune_lm_loss == "metrics"
        )

    model.forward = types.MethodType(forward, model)


def head_refusal(model: Any) -> str | None:
    """Why the built model's head cannot take the chunked loss (None: it can): the head must be a plain
    ``nn.Linear`` (not an adapter-wrapped or quantized layer)."""
    head = model.get_output_embeddings()
    if type(head) is not torch.nn.Linear:
        return f"its LM head is a {type(head).__name__}, not a plain Linear layer"
    return None


def is_log_step(trainer: Any) -> bool:
    """Whether the optimizer step in progress ends with a log (transformers' DefaultFlowCallback rule); any
    strategy but ``steps`` (an epoch's log): every step."""
    args, state = trainer.args, trainer.state
    if str(getattr(args.logging_strategy, "value", args.logging_strategy)) != "steps":
        return True
    step = state.global_step + 1
    every = state.logging_steps or args.logging_steps
    return (step == 1 and args.logging_first_step) or (every > 0 and step % every == 0)


class ChunkedLMLoss:
    """Mixin before TRL's ``SFTTrainer``: its loss through :func:`token_log_probs` (installed on the model by
    :meth:`use_chunked_loss`) when ``chunked_loss`` is on, TRL's own otherwise. Same loss, normalisation and
    metrics as ``SFTTrainer.compute_loss`` (nll or dft, no MoE aux loss, no label smoothing, no
    ``compute_loss_func``: those keep TRL's path); the metrics only at logging steps and eval batches."""

    chunked_loss: bool = False

    def use_chunked_loss(self) -> None:
        """Install the chunked loss on the trainer's model (after TRL's own head, which it wraps)."""
        model = self.model  # type: ignore[attr-defined]
        install(model.get_base_model() if hasattr(model, "get_base_model") else model)
        self.chunked_loss = True

    def compute_loss(
        self, model: Any, inputs: dict[str, Any], return_outputs: bool = False, num_items_in_batch: Any = None
    ) -> Any:
        if not self.chunked_loss or return_outputs:
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)  # type: ignore[misc]
        acc = self.accelerator  # type: ignore[attr-defined]
        mode = "train" if self.model.training else "eval"  # type: ignore[attr-defined]
        metrics = mode == "eval" or is_log_step(self)
        inputs["use_cache"] = False
        out = model(**inputs, hydratune_lm_loss="metrics" if metrics else "loss")
        log_probs = out["log_probs"]
        per_token = -log_probs
        if self.args.loss_type == "dft":  # type: ignore[attr-defined]
            per_token = per_token * log_probs.exp().detach()
        n = out["num_valid"] if num_items_in_batch is None else num_items_in_batch
        loss = per_token.sum() / torch.as_tensor(n).clamp(min=1)
        if self.args.average_tokens_across_devices and num_items_in_batch is not None:  # type: ignore[attr-defined]
            loss = loss * (acc.num_processes // self.get_tp_size())  # type: ignore[attr-defined]
        m = self._metrics[mode]  # type: ignore[attr-defined]
        if metrics:
            valid = acc.gather_for_metrics(out["num_valid"]).sum()
            entropy = acc.gather_for_metrics(out["entropy_sum"]).sum()
            correct = acc.gather_for_metrics(out["num_correct"]).sum()
            m["entropy"].append((entropy / valid).item() if valid > 0 else 0.0)
            m["mean_token_accuracy"].append((correct / valid).item() if valid > 0 else 0.0)
        if mode == "train":  # TRL's token count (its ``num_tokens`` metric)
            if "attention_mask" in inputs:
                tokens = acc.gather_for_metrics(inputs["attention_mask"].sum()).sum().item()
            else:
                ids = inputs["position_ids"]
                tokens = acc.gather_for_metrics(torch.tensor(ids.size(1), device=ids.device)).sum().item()
            self._total_train_tokens += tokens // self._tp_size  # type: ignore[attr-defined]
        m["num_tokens"] = [self._total_train_tokens]  # type: ignore[attr-defined]
        return loss
