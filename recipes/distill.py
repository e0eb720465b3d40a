"""Knowledge distillation on TRL's DistillationTrainer (Agarwal et al. 2024, on-policy distillation).

The student is the run's ``model`` (+ PEFT, quantization, strategy, as every recipe); the teacher is
``recipe.teacher`` (a finished run dir or a model dir, read with ``model.from_run``'s rules and checked before
load: components/modeling/teacher.py), frozen, inference only: loaded in the compute dtype with no gradient,
under ZeRO-3 partitioned as it loads and made an inference engine by TRL (as PPO's reference). For every
prompt the student samples a completion; the loss is the generalized Jensen-Shannon divergence between the
student's and the teacher's next-token distributions on it (``beta`` 0 = forward KL(teacher || student),
1 = reverse KL(student || teacher), 0.5 = JSD), at ``temperature``. The summary compares the student's exact
match on the held-out prompts before and after with the teacher's.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, ClassVar

from omegaconf import DictConfig

from hydratune.components.config.errors import ConfigError
from hydratune.components.config.ranges import AT_LEAST_ONE, POSITIVE, UNIT, knob, one_of
from hydratune.components.recipe import Recipe, recipe
from hydratune.components.runtime.run import Components, RunContext

#: what each beta is called (the plan and the summary say it)
DIVERGENCES = {0.0: "forward KL(teacher || student)", 1.0: "reverse KL(student || teacher)"}


def divergence_name(beta: float) -> str:
    """The divergence ``beta`` selects, in words."""
    return DIVERGENCES.get(float(beta), f"generalized JSD, beta={beta:g} (0.5: the symmetric JSD)")


@recipe
@dataclass(frozen=True)
class Distill(Recipe):
    """Distillation on TRL's DistillationTrainer: the student matches a frozen teacher on its own samples."""

    title: ClassVar[str] = "Distillation"
    data_kinds: ClassVar[tuple[str, ...]] = ("prompts",)

    teacher: str | None = None  # a finished run dir (its final/) or a model dir (config.json + weights)
    # optimizer steps unless train.max_steps > 0; null = train.epochs
    steps: int | None = knob(100, AT_LEAST_ONE)
    beta: float = knob(0.5, UNIT)  # 0 = forward KL, 0.5 = JSD, 1 = reverse KL
    # share of the student's own samples: 1 (on-policy) only, for now (below 1: the dataset's completions)
    lmbda: float = knob(
        1.0,
        one_of(1),
        hint="the dataset's completions (lmbda < 1) are not built yet: TRL 1.16's DistillationTrainer "
        "samples every completion from the student; recipe.lmbda=1, or recipe=sft on the teacher's "
        "generations",
    )
    temperature: float = knob(1.0, POSITIVE)  # sampling and both distributions of the loss
    max_completion_length: int = knob(8, AT_LEAST_ONE)  # tokens the student samples per prompt

    def check(self, cfg: DictConfig, comps: Components) -> None:
        """The teacher exists and may be loaded, is not the student, speaks the student's tokenizer and fits
        beside it (by the estimate, when the GPU's memory is known)."""
        from hydratune.components.modeling.teacher import check_not_student, teacher_component

        if comps.peft.adds_virtual_tokens:  # TRL refuses it after the model loads: said here, before
            raise ConfigError(
                "prompt learning's virtual tokens would never be prepended: TRL's distillation loss runs the "
                "student's backbone directly, past the adapter's forward",
                key="peft",
                hint="peft=lora (or another adapter on the weights), or peft=none",
            )
        teacher = teacher_component(self.teacher, trust_remote_code=comps.model.trust_remote_code)
        check_not_student(teacher, comps.model)
        if teacher.adapter and comps.strategy.partitions_at_load:
            raise ConfigError(
                f"the teacher {self.teacher} is an adapter, which is merged into its base as it loads: not "
                "under ZeRO-3's partitioned load",
                key="recipe.teacher",
                hint="a teacher run trained with merge=true (final/merged), or another strategy",
            )
        check_tokenizers(teacher, comps.model)
        self.check_memory(cfg)

    def check_memory(self, cfg: DictConfig) -> None:
        """With the GPU's memory known (``estimate.gpu_memory`` or a detected GPU): the teacher must fit in
        what the student's estimate leaves."""
        from hydratune.components.memory.estimate import estimate
        from hydratune.components.memory.spec import gpu_memory_of, spec_from_config

        gpu = gpu_memory_of(cfg)
        if gpu is None:
            return
        try:
            est = estimate(spec_from_config(cfg))
        except ConfigError as err:
            if err.key == "recipe.teacher":
                raise
            return  # the student's numbers are unknown (a hub id's architecture): the estimate cannot say
        teacher = est.row("teacher (frozen)")
        margin = 0.1  # Estimate.fits' margin
        left = gpu * (1 - margin) - (est.total - teacher)
        if teacher > left:
            raise ConfigError(
                f"the teacher needs {size(teacher)} per rank and the student's run leaves "
                f"{size(max(left, 0))} of {size(gpu)} (hydratune estimate, 10% margin)",
                key="recipe.teacher",
                hint="a smaller teacher, strategy=zero3 over more GPUs (the teacher is sharded), or "
                "precision=bf16 (the teacher is held in the compute dtype)",
            )

    def loss_args(self) -> dict[str, Any]:
        """DistillationConfig's fields of the loss and the sampling (TRL's beta: 0 forward, 1 reverse KL)."""
        return {
            "beta": self.beta,
            "temperature": self.temperature,
            "max_completion_length": self.max_completion_length,
        }

    def plan_lines(self, cfg: DictConfig, comps: Components) -> list[str]:
        """Student, teacher, loss and the memory per rank the estimate gives."""
        from hydratune.components.memory.estimate import estimate
        from hydratune.components.memory.spec import spec_from_config
        from hydratune.components.modeling.teacher import teacher_component

        teacher = teacher_component(self.teacher, trust_remote_code=comps.model.trust_remote_code)
        lines = [
            f"# distill: student {comps.model.describe_weights()}",
            f"# distill: teacher {teacher.describe_weights()} (frozen: no gradient, inference only)",
            f"# distill: loss {divergence_name(self.beta)} at temperature {self.temperature:g} on the "
            f"student's own samples (lmbda={self.lmbda:g}), {self.max_completion_length} tokens each",
        ]
        try:
            est = estimate(spec_from_config(cfg))
        except ConfigError as err:  # a model without architecture numbers: the plan says so, the run goes on
            return [*lines, f"# distill: memory per rank: not estimated ({err})"]
        teacher_b = est.row("teacher (frozen)")
        return [
            *lines,
            f"# distill: memory per rank (estimate): {size(est.total)}, of which the teacher "
            f"{size(teacher_b)}",
        ]

    def load_teacher(self, ctx: RunContext) -> Any:
        """The teacher in the compute dtype, eval mode, no parameter requiring a gradient (under ZeRO-3 the
        student's zero.Init is live: it is partitioned as it loads)."""
        from hydratune.components.modeling.teacher import teacher_component

        c = ctx.components
        teacher = teacher_component(self.teacher, trust_remote_code=c.model.trust_remote_code)
        dtype = {"bf16": "bfloat16", "fp16": "float16"}.get(ctx.plan.dtype, "float32")
        model = teacher.build(dtype=dtype)
        if teacher.adapter:
            from peft import PeftModel

            from hydratune.components.peft import merge_and_unload

            model = merge_and_unload(PeftModel.from_pretrained(model, teacher.adapter))
        return model.eval().requires_grad_(False)

    def run(self, ctx: RunContext) -> dict[str, Any]:
        from trl import DistillationConfig

        from hydratune.components.runtime.distill_trainer import MeasuredDistillationTrainer
        from hydratune.components.runtime.session import Session
        from hydratune.components.runtime.trainer_loop import TrainerLoop

        t = ctx.train
        session = Session.start(ctx)
        data = session.load_data()
        session.build_model()
        session.evaluate_generations("before")
        teacher = self.load_teacher(ctx)
        evaluate_teacher(session, teacher)
        session.report["run"]["distillation"] = (
            f"{divergence_name(self.beta)}, temperature {self.temperature:g}, on-policy (lmbda=1); teacher "
            f"{self.teacher}"
        )
        steps = t.max_steps if t.max_steps > 0 or self.steps is None else self.steps
        args = DistillationConfig(
            **ctx.training_args(
                max_steps=steps,
                **self.loss_args(),
                disable_dropout=True,
                include_num_input_tokens_seen="no",
                remove_unused_columns=False,
            )
        )
        trainer = session.trainer(MeasuredDistillationTrainer, args, data, teacher_model=teacher)
        return session.run(TrainerLoop(session, trainer))


def check_tokenizers(teacher: Any, student: Any) -> None:
    """The teacher's and the student's (model components) tokenizers agree (``compare_tokenizers``), loaded
    once per process for each pair of sources (a sweep or the matrix asks again and again)."""
    tokenizer_agreement(
        teacher.source_dir(),
        student.tokenizer or student.source_dir(),
        student.chat_template,
        student.describe_weights().split(" (")[0],
        student.trust_remote_code,
    )


@functools.cache
def tokenizer_agreement(
    teacher: str, student: str, chat_template: str | None, described: str, trusted: bool
) -> None:
    """Loads both tokenizers and compares them (a refusal raises, which is not cached)."""
    from hydratune.components.modeling.teacher import compare_tokenizers
    from hydratune.components.text.tokenizer import build_tokenizer

    compare_tokenizers(
        build_tokenizer(teacher, trust_remote_code=trusted),
        build_tokenizer(student, trust_remote_code=trusted, chat_template=chat_template),
        teacher,
        described,
    )


def size(nbytes: float) -> str:
    """Bytes as GiB, or MiB below one GiB."""
    from hydratune.components.memory.estimate import GiB, MiB

    return f"{nbytes / GiB:.2f} GiB" if nbytes >= GiB else f"{nbytes / MiB:.2f} MiB"


def evaluate_teacher(session: Any, teacher: Any) -> None:
    """The teacher's exact match on the held-out prompts, beside the student's before / after (summary)."""
    if not session.eval_prompts:
        return
    strategy = session.ctx.components.strategy
    accuracy = session.report.setdefault("eval accuracy (exact match)", {})
    if strategy.shards_parameters:
        accuracy["teacher"] = "skipped (sharded parameters)"
        return
    from hydratune.components.generation.evaluation import evaluate_generations

    result = evaluate_generations(
        teacher, session.tokenizer, session.eval_prompts, max_new_tokens=session.ctx.train.max_new_tokens
    )
    accuracy["teacher"] = result["exact_match"]
