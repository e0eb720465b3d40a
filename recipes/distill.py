"""Knowledge distillation on TRL's DistillationTrainer (Agarwal et al. 2024, on-policy distillation).

The student is the run's ``model`` (+ PEFT, quantization, strategy, as every recipe); the teacher is
``recipe.teacher`` (a finished run dir or a model dir, read with ``model.from_run``'s rules and checked before
load: components/modeling/teacher.py), frozen, inference only: loaded in the compute dtype with no gradient,
under ZeRO-3 partitioned as it loads and made an inference engine by TRL (as PPO's reference). For every
prompt the student samples a completion; the loss is the generalized Jensen-Shannon divergence between the
student's and the teacher's next-token distributions on it (``beta`` 0 = forward KL(teacher || student),
1 = reverse KL(student || teacher), 0.5 = JSD), at ``temperature``; or, ``loss``, the RL anchors' top-k
forward KL or k1 / k3 sampled-token estimators (components/runtime/distill_losses.py). ``lmbda`` < 1 mixes
in the dataset's completions (chat data), scored by the teacher. The summary compares the student's exact
match on the held-out prompts before and after with the teacher's.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, ClassVar

from omegaconf import DictConfig

from hydratune.components.config.errors import ConfigError
from hydratune.components.config.ranges import AT_LEAST_ONE, POSITIVE, UNIT, knob
from hydratune.components.recipe import Recipe, recipe
from hydratune.components.runtime.run import Components, RunContext

#: recipe.loss's choices (components/runtime/distill_losses.py's LOSSES: that module imports torch)
LOSSES = ("jsd", "topk_forward_kl", "k1", "k3")
#: recipe.teacher_quantization's choices: bitsandbytes' (bits, 4-bit type) for the teacher's linear layers
TEACHER_QUANTIZATION = {"none": None, "nf4": (4, "nf4"), "fp4": (4, "fp4"), "int8": (8, "nf4")}


def teacher_bitsandbytes(name: str) -> Any:
    """The quantization component of ``recipe.teacher_quantization`` (None: ``none``)."""
    from hydratune.components.quantization import BitsAndBytes

    spec = TEACHER_QUANTIZATION[name]
    return None if spec is None else BitsAndBytes(bits=spec[0], quant_type=spec[1])


@recipe
@dataclass(frozen=True)
class Distill(Recipe):
    """Distillation on TRL's DistillationTrainer: the student matches a frozen teacher on its own samples."""

    title: ClassVar[str] = "Distillation"
    data_kinds: ClassVar[tuple[str, ...]] = ("prompts", "chat")

    teacher: str | None = None  # a finished run dir (its final/) or a model dir (config.json + weights)
    # the teacher's linear layers in bitsandbytes' k-bit weights (inference only): none | nf4 | fp4 | int8
    teacher_quantization: str = "none"
    # optimizer steps unless train.max_steps > 0; null = train.epochs
    steps: int | None = knob(100, AT_LEAST_ONE)
    loss: str = "jsd"  # jsd (TRL's, recipe.beta) | topk_forward_kl (recipe.top_k) | k1 | k3 (sampled tokens)
    beta: float = knob(0.5, UNIT)  # loss=jsd: 0 = forward KL, 0.5 = JSD, 1 = reverse KL
    top_k: int = knob(64, AT_LEAST_ONE)  # loss=topk_forward_kl: the teacher's most likely tokens per position
    # the share of generation batches that are the student's own samples; the others are the dataset's
    # completions (chat data), scored by the teacher: 1 = on-policy, 0 = offline
    lmbda: float = knob(1.0, UNIT)
    temperature: float = knob(1.0, POSITIVE)  # sampling and both distributions of the loss
    max_completion_length: int = knob(8, AT_LEAST_ONE)  # tokens the student samples per prompt

    @property
    def reads_completions(self) -> bool:
        """Some batches are the dataset's completions (``lmbda`` < 1): the data must have them."""
        return self.lmbda < 1

    def validate(self) -> None:
        if self.teacher_quantization not in TEACHER_QUANTIZATION:
            raise ConfigError(
                f"unknown teacher quantization {self.teacher_quantization!r}",
                key="recipe.teacher_quantization",
                hint=f"one of {', '.join(TEACHER_QUANTIZATION)}",
            )
        if self.loss not in LOSSES:
            raise ConfigError(
                f"unknown loss {self.loss!r}", key="recipe.loss", hint=f"one of {', '.join(LOSSES)}"
            )
        if self.reads_completions and self.loss in ("k1", "k3"):
            raise ConfigError(
                f"the {self.loss} estimator reads the student's sampled tokens; with "
                f"recipe.lmbda={self.lmbda:g} some batches are the dataset's completions, where it "
                "estimates nothing",
                key="recipe.loss",
                hint="recipe.loss=jsd or recipe.loss=topk_forward_kl, or recipe.lmbda=1",
            )

    def warnings(self, cfg: DictConfig, comps: Components) -> list[str]:
        """A knob of another loss set away from its default: the chosen loss does not read it."""
        unread = {"beta": self.loss != "jsd", "top_k": self.loss != "topk_forward_kl"}
        defaults = {name: f.default for name, f in type(self).__dataclass_fields__.items()}
        return [
            f"recipe.{name}={getattr(self, name)} is not used by recipe.loss={self.loss}"
            for name, unused in unread.items()
            if unused and getattr(self, name) != defaults[name]
        ]

    def check(self, cfg: DictConfig, comps: Components) -> None:
        """The teacher exists and may be loaded, is not the student, speaks the student's tokenizer and fits
        beside it (by the estimate, when the GPU's memory is known); the dataset's completions exist when
        ``lmbda`` < 1."""
        from hydratune.components.modeling.teacher import check_not_student, teacher_component

        if self.reads_completions and comps.data.kind != "chat":
            raise ConfigError(
                f"recipe.lmbda={self.lmbda:g} trains on the dataset's completions, and "
                f"{comps.data.kind} data has prompts only",
                key="data",
                hint="chat data whose rows end with the assistant's answer (data=demo_sft, or "
                "data=jsonl_messages data.path=<chats or prompt/completion rows>), or recipe.lmbda=1",
            )
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
        self.check_teacher_quantization(comps, teacher)
        self.check_memory(cfg)

    def check_teacher_quantization(self, comps: Components, teacher: Any) -> None:
        """A k-bit teacher: bitsandbytes installed; not under a strategy that shards parameters (ZeRO-3 /
        FSDP flatten a unit's parameters into one tensor of one dtype, and partition them as they load); not
        an adapter run (merging into k-bit weights rounds the merged weights again)."""
        bnb = teacher_bitsandbytes(self.teacher_quantization)
        if bnb is None:
            return
        key = "recipe.teacher_quantization"
        try:
            bnb.validate()
        except ConfigError as err:
            raise ConfigError(f"a quantized teacher: {err}", key=key, hint=err.hint) from None
        if comps.strategy.shards_parameters:
            raise ConfigError(
                f"a {self.teacher_quantization} teacher cannot be sharded by {comps.strategy.label}: its "
                "k-bit weights and their full-precision neighbours cannot be flattened into one tensor of "
                "one dtype",
                key=key,
                hint="recipe.teacher_quantization=none (the teacher is sharded instead), or strategy=ddp / "
                "zero2",
            )
        if teacher.adapter:
            raise ConfigError(
                f"the teacher {self.teacher} is an adapter, merged into its base as it loads: merged into "
                f"{self.teacher_quantization} weights it would be rounded again",
                key=key,
                hint="a teacher run trained with merge=true (final/merged), or "
                "recipe.teacher_quantization=none",
            )

    def check_data(self, comps: Components, splits: Any, tokenizer: Any) -> None:
        """Chat data: every row a conversation whose last turn is the assistant's (its completion; the turns
        before it the prompt), else refused naming the first row that is not; with ``lmbda`` < 1 the chat
        template must write the first rows' prompts alike alone and before their answers (the answer's tokens
        are the rest)."""
        if comps.data.kind != "chat":
            return
        for name, split in splits.items():
            if "messages" not in split.column_names:
                raise ConfigError(
                    f"recipe=distill reads conversations, and {comps.data.path}'s {name} rows are text "
                    f"(columns: {', '.join(split.column_names)})",
                    key="data.format",
                    hint="chats or prompt/completion rows (data.format=messages or prompt_completion)",
                )
            for i, messages in enumerate(split["messages"]):
                if not messages or messages[-1]["role"] != "assistant" or len(messages) < 2:
                    raise ConfigError(
                        f"row {i} of {comps.data.path}'s {name} split does not end with the assistant's "
                        "answer after a prompt: recipe=distill takes the last turn as the completion, the "
                        "turns before it as the prompt",
                        key="data.path",
                        hint="rows ending with an assistant turn, or prompt-only data with recipe.lmbda=1",
                    )
        if self.reads_completions and tokenizer is not None:
            check_prompt_prefix(tokenizer, splits["train"]["messages"][:PREFIX_ROWS], str(comps.data.path))

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

    def describe_loss(self) -> str:
        """The loss in words, with its temperature and where its completions come from."""
        from hydratune.components.runtime.distill_losses import describe

        source = (
            "the student's own samples"
            if self.lmbda >= 1
            else "the dataset's completions"
            if self.lmbda <= 0
            else f"the student's samples with probability {self.lmbda:g}, else the dataset's completions"
        )
        return (
            f"{describe(self.loss, self.beta, self.top_k)} at temperature {self.temperature:g} on {source} "
            f"(lmbda={self.lmbda:g})"
        )

    def trainer_args(self) -> dict[str, Any]:
        """MeasuredDistillationTrainer's own arguments: the estimator and the on-policy share."""
        return {"loss": self.loss, "top_k": self.top_k, "lmbda": self.lmbda}

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
        quantized = (
            ""
            if self.teacher_quantization == "none"
            else f", its linear layers {self.teacher_quantization} (bitsandbytes)"
        )
        lines = [
            f"# distill: student {comps.model.describe_weights()}",
            f"# distill: teacher {teacher.describe_weights()} (frozen: no gradient, inference "
            f"only{quantized})",
            f"# distill: loss {self.describe_loss()}, {self.max_completion_length} tokens per completion",
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
        """The teacher in the compute dtype (its linear layers k-bit with ``teacher_quantization``), eval
        mode, no parameter requiring a gradient (under ZeRO-3 the student's zero.Init is live: it is
        partitioned as it loads)."""
        from hydratune.components.modeling.teacher import teacher_component

        c = ctx.components
        teacher = teacher_component(self.teacher, trust_remote_code=c.model.trust_remote_code)
        dtype = {"bf16": "bfloat16", "fp16": "float16"}.get(ctx.plan.dtype, "float32")
        bnb = teacher_bitsandbytes(self.teacher_quantization)
        model = teacher.build(
            dtype=dtype, **({} if bnb is None else bnb.load_kwargs(ctx.plan.dtype, ctx.device))
        )
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
        if ctx.components.strategy.partitions_at_load:  # proof that the teacher is sharded too
            from hydratune.components.strategy import partition_at_load

            session.report["run"]["teacher zero.Init"] = partition_at_load(teacher)
        evaluate_teacher(session, teacher)
        quantized = (
            "" if self.teacher_quantization == "none" else f" ({self.teacher_quantization}, bitsandbytes)"
        )
        session.report["run"]["distillation"] = f"{self.describe_loss()}; teacher {self.teacher}{quantized}"
        if ctx.components.data.kind == "chat":
            data = {name: split.map(prompt_and_completion) for name, split in data.items()}
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
        trainer = session.trainer(
            MeasuredDistillationTrainer, args, data, teacher_model=teacher, **self.trainer_args()
        )
        return session.run(TrainerLoop(session, trainer))


#: the rows whose prompt tokens check_prompt_prefix compares (the template's behaviour, not the rows')
PREFIX_ROWS = 16


def check_prompt_prefix(tokenizer: Any, conversations: list[list[dict[str, Any]]], path: str) -> None:
    """The chat template writes each prompt (with its generation prompt) as the start of the whole
    conversation, so the dataset's answer tokens are the rest; else refused naming the row."""
    for i, messages in enumerate(conversations):
        prompt = tokenizer.apply_chat_template(messages[:-1], add_generation_prompt=True, tokenize=True)
        whole = tokenizer.apply_chat_template(messages, tokenize=True)
        prompt, whole = (list(getattr(x, "input_ids", x)) for x in (prompt, whole))
        if whole[: len(prompt)] != prompt:
            raise ConfigError(
                f"the chat template writes row {i} of {path}'s prompt differently alone (with the generation "
                "prompt) and before its answer, so the answer's tokens cannot be told apart",
                key="model.chat_template",
                hint="a chat template whose generation prompt is the start of the assistant's turn, or "
                "recipe.lmbda=1 (the student's own samples only)",
            )


def prompt_and_completion(row: dict[str, Any]) -> dict[str, Any]:
    """A chat row as TRL's prompt (the turns before the last) and completion (the last, the assistant's)."""
    messages = row["messages"]
    return {"prompt": messages[:-1], "completion": messages[-1:]}


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
