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
    normaliser in float32; the backward recomputes each chunk's logits: ``g * (onehot - softmax)``."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        hidden: torch.Tensor,  # [N, H]
        weight: torch.Tensor,  # [V, H]
        bias: torch.Tensor | None,  # [V]
        targets: torch.Tensor,  # [N], no -100
        chunk: int,
        metrics: bool,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        cd = compute_dtype(hidden)
        n = hidden.shape[0]
        w = weight.to(cd)
        b = None if bias is None else bias.to(cd)
        log_probs = torch.empty(n, device=hidden.device, dtype=torch.float32)
        log_z = torch.empty(n, device=hidden.device, dtype=torch.float32)
        entropy = torch.zeros((), device=hidden.device, dtype=torch.float32)
        correct = torch.zeros((), device=hidden.device, dtype=torch.int64)
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
                    entropy += (lz - (ez * z).sum(-1) / total).sum()
                    correct += (arg == t).sum()
                else:
                    lz = torch.logsumexp(z, dim=-1)
                log_probs[s:e] = z.gather(1, t[:, None]).squeeze(1) - lz
                log_z[s:e] = lz
        ctx.save_for_backward(hidden, weight, bias, targets, log_z)
        ctx.chunk, ctx.cd = chunk, cd
        ctx.mark_non_differentiable(entropy, correct)
        return log_probs, entropy, correct

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor, *_: Any) -> tuple[Any, ...]:  # type: ignore[override]
        hidden, weight, bias, targets, log_z = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
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
            None,
            None,
            None,
        )


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
        hidden[mask], head.weight, head.bias, labels[mask], chunk or chunk_for(vocab), metrics
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
