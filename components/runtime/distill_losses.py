"""The estimators besides TRL's generalized JSD (``recipe.loss``): the RL anchors' (NeMo-RL, verl).

Each takes the student's and the teacher's logits at the completion positions (``(N, V)``, already divided by
the temperature) and returns the loss per position (``(N,)``); the trainer takes their masked mean
(``components/runtime/distill_trainer.py``).

- ``topk_forward_kl``: the forward KL(teacher || student) over the teacher's ``k`` most likely tokens, both
  distributions renormalised over those ``k`` (NeMo-RL's ``DistillationLossFn`` default,
  ``zero_outside_topk=false``): sum_{i in topk} p^_t(i) (log p^_t(i) - log p^_s(i)), p^ = softmax over the k.
- ``k1`` and ``k3``: Schulman's sampled-token estimators of the reverse KL(student || teacher), on the token y
  the student sampled: k1 = log p_s(y) - log p_t(y); k3 = exp(d) - 1 - d with d = log p_t(y) - log p_s(y).
  Their values are the estimators. Gradients: k3's is its own derivative, (1 - p_t/p_s) grad log p_s, whose
  mean over the student's samples is the gradient of the forward KL(teacher || student) (verl's
  ``low_var_kl`` as a loss); k1's own derivative, grad log p_s, averages to zero over the student's samples,
  so k1 carries the score-function gradient instead, k1 * grad log p_s (the token's reverse KL as a reward,
  the policy gradient of KL(student || teacher): NeMo-RL's and verl's on-policy distillation as a reward).
"""

from __future__ import annotations

import torch

#: recipe.loss's choices; ``jsd`` is TRL's own chunked generalized JSD (recipe.beta)
LOSSES = ("jsd", "topk_forward_kl", "k1", "k3")
#: the estimators that read the student's sampled token (on the dataset's completions they estimate nothing)
SAMPLED = ("k1", "k3")


def describe(loss: str, beta: float, top_k: int) -> str:
    """The loss in words (the plan and the summary)."""
    if loss == "topk_forward_kl":
        return f"forward KL(teacher || student) over the teacher's top-{top_k} tokens, renormalised"
    if loss in SAMPLED:
        return f"{loss} estimator of the reverse KL(student || teacher) on the sampled tokens"
    if beta == 0:
        return "forward KL(teacher || student)"
    if beta == 1:
        return "reverse KL(student || teacher)"
    return f"generalized JSD, beta={beta:g} (0.5: the symmetric JSD)"


def topk_forward_kl(student: torch.Tensor, teacher: torch.Tensor, top_k: int) -> torch.Tensor:
    """Forward KL over the teacher's top-``top_k`` tokens, both renormalised there (the whole vocabulary when
    ``top_k`` is at least its size)."""
    values, index = teacher.topk(min(top_k, teacher.size(-1)), dim=-1)
    logp_t = torch.log_softmax(values, -1)
    logp_s = torch.log_softmax(student.gather(-1, index), -1)
    return (logp_t.exp() * (logp_t - logp_s)).sum(-1)


def sampled_logps(
    student: torch.Tensor, teacher: torch.Tensor, tokens: torch.Tensor
) -> tuple[torch.Tensor, ...]:
    """(log p_s(y), log p_t(y)) of the tokens ``tokens`` (``(N,)``)."""
    index = tokens.unsqueeze(-1)
    logp_s = torch.log_softmax(student, -1).gather(-1, index).squeeze(-1)
    logp_t = torch.log_softmax(teacher, -1).gather(-1, index).squeeze(-1)
    return logp_s, logp_t


def k1(student: torch.Tensor, teacher: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """k1 = log p_s(y) - log p_t(y); gradient k1 * grad log p_s(y) (see the module docstring)."""
    logp_s, logp_t = sampled_logps(student, teacher, tokens)
    value = (logp_s - logp_t).detach()
    return value + value * (logp_s - logp_s.detach())


def k3(student: torch.Tensor, teacher: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """k3 = exp(d) - 1 - d, d = log p_t(y) - log p_s(y), differentiated as written."""
    logp_s, logp_t = sampled_logps(student, teacher, tokens)
    d = logp_t - logp_s
    return d.exp() - 1 - d


def per_token(
    loss: str, student: torch.Tensor, teacher: torch.Tensor, tokens: torch.Tensor, top_k: int
) -> torch.Tensor:
    """The per-position loss ``loss`` names (not ``jsd``: TRL computes that one)."""
    if loss == "topk_forward_kl":
        return topk_forward_kl(student, teacher, top_k)
    if loss == "k1":
        return k1(student, teacher, tokens)
    if loss == "k3":
        return k3(student, teacher, tokens)
    raise ValueError(f"recipe.loss={loss!r}: one of {LOSSES[1:]} here")
