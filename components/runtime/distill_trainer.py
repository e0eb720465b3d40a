"""recipe=distill's trainer: TRL's DistillationTrainer, plus the metrics of the student's samples.

TRL logs the divergence (``loss``) and the student's entropy. Each step here also logs, over the completion
tokens the student sampled: ``student_logp`` and ``teacher_logp`` (the mean log-probability each model gives
the sampled token, at the loss's temperature) and ``teacher_agreement`` (the share of sampled tokens that are
the teacher's most likely one). They are read from the hidden states the loss already computed (no second
forward) through each model's output head, a chunk of positions at a time, without gradient; a head's logit
scale or soft-capping (Cohere, Gemma 2), which TRL's loss applies, is not applied here.

Two private methods of the installed TRL are wrapped (``PRIVATE_METHODS``, pinned by
``tests/unit/test_distill.py``): ``_get_last_hidden_state`` (its result kept, detached) and ``_compute_loss``
(the metrics computed after it, inside the same forward redirection, where a sharded head is whole).
"""

from __future__ import annotations

from typing import Any

import torch
from trl import DistillationTrainer

#: the private DistillationTrainer methods wrapped here, with their parameters after ``self``
PRIVATE_METHODS: dict[str, tuple[str, ...]] = {
    "_get_last_hidden_state": ("unwrapped_model", "input_ids", "attention_mask", "logits_to_keep"),
    "_compute_loss": ("unwrapped_student", "inputs", "num_items_in_batch"),
}
METRICS = ("student_logp", "teacher_logp", "teacher_agreement")


def sample_sums(
    student_hidden: torch.Tensor,
    teacher_hidden: torch.Tensor,
    student_head: torch.nn.Module,
    teacher_head: torch.nn.Module,
    tokens: torch.Tensor,
    mask: torch.Tensor,
    temperature: float = 1.0,
    chunk: int = 1024,
) -> torch.Tensor:
    """Sums over the masked positions of (student log-prob of ``tokens``, teacher log-prob, teacher's argmax
    == token, positions), as one float64 tensor of 4 (so ranks add them)."""
    valid = mask.reshape(-1) != 0
    h_s = student_hidden.reshape(-1, student_hidden.size(-1))[valid]
    h_t = teacher_hidden.reshape(-1, teacher_hidden.size(-1))[valid]
    ids = tokens.reshape(-1)[valid]
    sums = torch.zeros(4, dtype=torch.float64, device=ids.device)
    with torch.no_grad():
        for start in range(0, ids.numel(), chunk):
            end = start + chunk
            target = ids[start:end].unsqueeze(-1)
            logp_s = torch.log_softmax(student_head(h_s[start:end]).double() / temperature, -1)
            logp_t = torch.log_softmax(teacher_head(h_t[start:end]).double() / temperature, -1)
            sums[0] += logp_s.gather(-1, target).sum()
            sums[1] += logp_t.gather(-1, target).sum()
            sums[2] += (logp_t.argmax(-1) == ids[start:end]).sum()
    sums[3] = ids.numel()
    return sums


def means(sums: torch.Tensor) -> dict[str, float]:
    """The metrics from summed :func:`sample_sums` (nothing when no position was valid)."""
    n = float(sums[3])
    return {name: float(value) / n for name, value in zip(METRICS, sums[:3], strict=True)} if n else {}


class MeasuredDistillationTrainer(DistillationTrainer):
    """DistillationTrainer whose steps also log :data:`METRICS` (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._hidden: list[torch.Tensor] = []
        self._sums: torch.Tensor | None = None

    def _get_last_hidden_state(self, unwrapped_model: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        hidden = super()._get_last_hidden_state(unwrapped_model, *args, **kwargs)
        self._hidden.append(hidden.detach())
        return hidden

    def _compute_loss(self, unwrapped_student: Any, inputs: dict[str, Any], num_items_in_batch: Any) -> Any:
        self._hidden = []
        out = super()._compute_loss(unwrapped_student, inputs, num_items_in_batch)
        if len(self._hidden) == 2:  # the student's, then the teacher's
            teacher = self.accelerator.unwrap_model(self.teacher_model)
            mask = inputs["completion_mask"] * inputs.get("tool_mask", 1)
            self._sums = sample_sums(
                *self._hidden,
                unwrapped_student.get_output_embeddings(),
                teacher.get_output_embeddings(),
                inputs["completion_ids"],
                mask,
                self.temperature,
            )
        self._hidden = []
        return out

    def compute_loss(
        self, model: Any, inputs: Any, return_outputs: bool = False, num_items_in_batch: Any = None
    ):
        result = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        if self._sums is not None:
            mode = "train" if self.model.training else "eval"
            for name, value in means(self.accelerator.reduce(self._sums, reduction="sum")).items():
                self._metrics[mode][name].append(value)
            self._sums = None
        return result
