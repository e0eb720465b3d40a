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

``recipe.loss`` other than ``jsd`` (components/runtime/distill_losses.py) replaces TRL's chunked JSD inside
``_compute_loss``: the same two backbone forwards (the teacher's through its wrapper, without gradient), then
each chunk of completion positions projected through both heads (TRL's logit scale and soft-capping applied)
and its loss recomputed in the backward pass (``torch.utils.checkpoint``), so a chunk's logits are live only
while it is computed. ``recipe.lmbda`` < 1: with probability 1 - lmbda a generation batch is the dataset's
completions, tokenized as the student's chat template writes them, instead of the student's samples
(``_generate_and_score_completions``); the draw is a function of the seed and the step (:func:`on_policy`),
so every rank draws alike and a resumed run draws as the straight one.
"""

from __future__ import annotations

import random
from typing import Any

import torch
from trl import DistillationTrainer

from hydratune.components.runtime.distill_losses import per_token

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


def logit_transform(config: Any) -> tuple[float, float | None]:
    """(scale, soft-cap) of a model's output logits, read from its config as TRL's ``_compute_loss`` reads
    them: ``logit_scale`` / ``output_multiplier`` / ``lm_head_multiplier`` multiply, ``logits_scaling``
    divides (multiplies for HyperCLOVA X); ``final_logit_softcapping`` caps after the scale."""
    config = config.get_text_config()
    scale = getattr(config, "logit_scale", None)
    for name in ("output_multiplier", "lm_head_multiplier"):
        scale = getattr(config, name, None) if scale is None else scale
    scaling = getattr(config, "logits_scaling", None)
    if scale is None and scaling is not None:
        scale = scaling if config.model_type == "hyperclovax" else 1 / scaling
    return (1.0 if scale is None else scale), getattr(config, "final_logit_softcapping", None)


def head_logits(
    head: torch.nn.Module, hidden: torch.Tensor, transform: tuple[float, float | None]
) -> torch.Tensor:
    """The head's logits of ``hidden`` (at least fp32), scaled and soft-capped as ``transform`` says."""
    logits = head(hidden)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32)) * transform[0]
    cap = transform[1]
    return logits if cap is None else cap * torch.tanh(logits / cap)


def estimator_loss(
    loss: str,
    student_hidden: torch.Tensor,
    teacher_hidden: torch.Tensor,
    student_head: torch.nn.Module,
    teacher_head: torch.nn.Module,
    tokens: torch.Tensor,
    mask: torch.Tensor,
    *,
    temperature: float = 1.0,
    top_k: int = 64,
    num_items_in_batch: Any = None,
    transforms: tuple[tuple[float, float | None], tuple[float, float | None]] = ((1.0, None), (1.0, None)),
    chunk: int = 1024,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``recipe.loss``'s estimator (not ``jsd``) over the masked completion positions, as TRL's chunked loss
    returns it: (loss = sum / ``num_items_in_batch``, or the mean over the positions without it; the student's
    entropy summed, detached; the number of positions). A chunk's logits are recomputed in the backward."""
    from torch.utils.checkpoint import checkpoint

    valid = mask.reshape(-1) != 0
    h_s = student_hidden.reshape(-1, student_hidden.size(-1))[valid]
    h_t = teacher_hidden.reshape(-1, teacher_hidden.size(-1))[valid].detach()
    ids = tokens.reshape(-1)[valid]
    n = valid.sum()

    def chunk_loss(
        h_s: torch.Tensor, h_t: torch.Tensor, ids: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        student = head_logits(student_head, h_s, transforms[0]) / temperature
        with torch.no_grad():
            teacher = head_logits(teacher_head, h_t, transforms[1]) / temperature
            logp = torch.log_softmax(student.detach(), -1)
            entropy = -(logp.exp() * logp).sum()
        return per_token(loss, student, teacher, ids, top_k).sum(), entropy

    total = student_hidden.sum() * 0  # a graph through the backbone even when no position is valid
    entropy = torch.zeros((), dtype=torch.float64, device=ids.device)
    for start in range(0, ids.numel(), chunk):
        end = start + chunk
        part, part_entropy = checkpoint(
            chunk_loss, h_s[start:end], h_t[start:end], ids[start:end], use_reentrant=False
        )
        total = total + part
        entropy += part_entropy.double()
    if num_items_in_batch is None:
        return total / n.clamp(min=1), entropy, n
    if isinstance(num_items_in_batch, torch.Tensor):
        num_items_in_batch = num_items_in_batch.to(total.device)
    return total / num_items_in_batch, entropy, n


def eos_ids(*sources: Any) -> list[int]:
    """The end-of-sequence ids among ``sources`` (each an id, a list of ids or None)."""
    out: list[int] = []
    for source in sources:
        out += [] if source is None else [source] if isinstance(source, int) else list(source)
    return out


def on_policy(lmbda: float, seed: int, step: int) -> bool:
    """Whether the generation batch of optimizer step ``step`` is the student's samples: with probability
    ``lmbda``, drawn from (seed, step) alone (the same on every rank, again on a resume)."""
    return lmbda >= 1 or random.Random(f"{seed}:{step}").random() < lmbda


class MeasuredDistillationTrainer(DistillationTrainer):
    """DistillationTrainer whose steps also log :data:`METRICS`, with ``recipe.loss``'s estimator and
    ``recipe.lmbda``'s share of the student's own samples (see the module docstring)."""

    def __init__(
        self, *args: Any, loss: str = "jsd", top_k: int = 64, lmbda: float = 1.0, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self._hidden: list[torch.Tensor] = []
        self._sums: torch.Tensor | None = None
        self.loss_name, self.top_k, self.lmbda = loss, top_k, lmbda

    def _get_last_hidden_state(self, unwrapped_model: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        hidden = super()._get_last_hidden_state(unwrapped_model, *args, **kwargs)
        self._hidden.append(hidden.detach())
        return hidden

    def _compute_loss(self, unwrapped_student: Any, inputs: dict[str, Any], num_items_in_batch: Any) -> Any:
        self._hidden = []
        if self.loss_name == "jsd":
            out = super()._compute_loss(unwrapped_student, inputs, num_items_in_batch)
        else:
            out = self._estimator_loss(unwrapped_student, inputs, num_items_in_batch)
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

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        """The student's samples (TRL's) with probability ``lmbda`` (:func:`on_policy`), else the rows'
        ``completion`` turns tokenized after their prompts; below 1 each record says which (``on_policy``)."""
        if self.lmbda >= 1:
            return super()._generate_and_score_completions(inputs)
        mode = "train" if self.model.training else "eval"
        sampled = on_policy(self.lmbda, self.args.seed, self.state.global_step)
        self._metrics[mode]["on_policy"].append(float(sampled))
        if sampled:
            return super()._generate_and_score_completions(inputs)
        return self._dataset_completions(inputs, mode)

    def _dataset_completions(self, inputs: list[dict[str, Any]], mode: str) -> dict[str, Any]:
        """The batch TRL's generation would make, from the dataset's completions: prompt ids as the student's
        chat template writes the prompt (with the generation prompt), completion ids the rest of the whole
        conversation's up to its first end-of-sequence token (where the student's samples stop; what a
        template writes after it carries no loss), cut at ``max_completion_length`` (the share cut logged:
        ``completions_cut``)."""
        from trl.trainer.utils import pad

        tok, device = self._tokenizer, self.accelerator.device
        prompt_ids, _, _ = self._tokenize_prompts([x["prompt"] for x in inputs])
        completion_ids, cut = [], 0
        stops = set(eos_ids(self.model.generation_config.eos_token_id, tok.eos_token_id))
        for x, prompt in zip(inputs, prompt_ids, strict=True):
            whole = self.processing_class.apply_chat_template(
                x["prompt"] + x["completion"],
                tools=self.tools or None,
                chat_template=self.chat_template,
                tokenize=True,
                return_dict=True,
                **self.chat_template_kwargs,
            )["input_ids"]
            if list(whole[: len(prompt)]) != list(prompt):
                raise ValueError(
                    "the chat template writes the prompt differently alone (with the generation prompt) and "
                    f"before its answer, so the answer's tokens cannot be told apart: {x['prompt']!r}"
                )
            ids = list(whole[len(prompt) :])
            end = next((i for i, t in enumerate(ids) if t in stops), None)
            ids = ids if end is None else ids[: end + 1]  # as the student's samples end: at the end of turn
            cut += len(ids) > self.max_completion_length
            completion_ids.append(ids[: self.max_completion_length])
        self._metrics[mode]["completions_cut"].append(cut / len(inputs))

        def padded(rows: list[list[int]], side: str) -> tuple[torch.Tensor, torch.Tensor]:
            ids = [torch.tensor(r, dtype=torch.long) for r in rows]
            masks = [torch.ones_like(i) for i in ids]
            multiple = self.pad_to_multiple_of
            return (
                pad(ids, padding_value=tok.pad_token_id, padding_side=side, pad_to_multiple_of=multiple).to(
                    device
                ),
                pad(masks, padding_value=0, padding_side=side, pad_to_multiple_of=multiple).to(device),
            )

        prompt, prompt_mask = padded([list(p) for p in prompt_ids], "left")
        completion, completion_mask = padded(completion_ids, "right")
        return {
            "prompt_ids": prompt,
            "prompt_mask": prompt_mask,
            "completion_ids": completion,
            "completion_mask": completion_mask,
            "num_items_in_batch": self.accelerator.gather(completion_mask.sum()).sum(),
        }

    def _estimator_loss(self, unwrapped_student: Any, inputs: dict[str, Any], num_items_in_batch: Any) -> Any:
        """TRL's ``_compute_loss`` with :func:`estimator_loss` in place of its chunked JSD (text only: the
        recipe refuses image rows)."""
        input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        mask = inputs["completion_mask"] * inputs.get("tool_mask", 1)
        keep = inputs["completion_ids"].size(1)
        student_hidden = self._get_last_hidden_state(unwrapped_student, input_ids, attention_mask, keep)
        self.teacher_model.eval()
        teacher = self.accelerator.unwrap_model(self.teacher_model)
        with torch.no_grad():
            teacher_hidden = self._forward_redirection(
                self.teacher_model,
                teacher,
                self._get_last_hidden_state,
                teacher,
                input_ids,
                attention_mask,
                keep,
            )
        student_head, teacher_head = (
            unwrapped_student.get_output_embeddings(),
            teacher.get_output_embeddings(),
        )
        device = student_head.weight.device
        return estimator_loss(
            self.loss_name,
            student_hidden.to(device),
            teacher_hidden.to(device),
            student_head,
            teacher_head,
            inputs["completion_ids"].to(device),
            mask.to(device),
            temperature=self.temperature,
            top_k=self.top_k,
            num_items_in_batch=num_items_in_batch,
            transforms=(logit_transform(unwrapped_student.config), logit_transform(teacher.config)),
        )
