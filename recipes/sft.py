"""Supervised fine-tuning on TRL's SFTTrainer.

tokenizer → data (checked, length policy) and its tokens with the assistant-only mask (TRL's, or hydratune's
turn-by-turn one for templates without {% generation %} markers), made by hydratune as TRL would make them
and cached with the data → model (+ PEFT) → trainer → train or resume → evaluate → save → report.
Everything but the trainer's own knobs comes from the shared components.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from omegaconf import DictConfig

from hydratune.components.config.errors import ConfigError
from hydratune.components.head_path import check_loss_impl, head_path
from hydratune.components.recipe import Recipe, recipe
from hydratune.components.runtime.run import Components, RunContext
from hydratune.components.text.batching import SPLIT_ROWS, check_padding_free, collator_for

LOSS_TYPES = ("nll", "dft")


@recipe
@dataclass(frozen=True)
class SFT(Recipe):
    """Supervised fine-tuning on TRL's SFTTrainer (chat, instruction, prompt/completion or text data)."""

    title: ClassVar[str] = "SFT"
    data_kinds: ClassVar[tuple[str, ...]] = ("chat",)
    splits: ClassVar[frozenset[str]] = frozenset({"tp", "sp", "pp", "ep"})  # pp: loss_type=nll in the stages
    streams_data: ClassVar[bool] = True
    image_rows: ClassVar[bool] = True  # a VLM's image rows: TRL's vision collator (run_image_rows)

    assistant_only_loss: bool = True  # conversational data: loss on assistant turns only
    # prompt/completion data (formats prompt_completion, alpaca): loss on the completion only, whatever
    # assistant_only_loss says (both on: the completion's assistant turns); no effect on messages data
    completion_only_loss: bool = True
    loss_type: str = "nll"  # nll | dft
    # chunked: hydratune's LM head + cross-entropy in chunks of positions (components/runtime/lm_loss.py),
    # metrics at log steps only; trl: TRL's fused LM head (entropy and top-1 on every step)
    loss_impl: str = "chunked"

    def check(self, cfg: DictConfig, comps: Components) -> None:
        if self.loss_type not in LOSS_TYPES:
            raise ConfigError(
                f"unknown '{self.loss_type}'", key="recipe.loss_type", hint=f"one of {LOSS_TYPES}"
            )
        if comps.strategy.parallel.pp > 1 and self.loss_type != "nll":
            raise ConfigError(
                f"loss_type={self.loss_type} is not computed by the pipeline stages (their loss is nll)",
                key="recipe.loss_type",
                hint="recipe.loss_type=nll, or another strategy",
            )
        check_loss_impl(self.loss_impl)
        check_padding_free(comps)

    def loss_path(self, comps: Components) -> tuple[str, str]:
        """Which loss the run computes (``chunked`` or ``trl``) and why, from the config alone; the built
        model's head and image rows are checked again at run time."""
        return head_path(self.loss_impl, comps)

    def plan_lines(self, cfg: DictConfig, comps: Components) -> list[str]:
        impl, why = self.loss_path(comps)
        if impl == "chunked":
            return [
                "# sft: loss hydratune's chunked LM head + cross-entropy (no full logits); entropy and "
                "mean_token_accuracy at log steps only (recipe.loss_impl=trl: TRL's fused head)"
            ]
        return [f"# sft: loss TRL's fused LM head ({why})"]

    def tokens(self, comps: Components) -> Any:
        """Every row tokenized and masked before the model loads, as TRL would (cached with the data)."""
        from hydratune.components.data.tokens import SFTTokens

        d = comps.data
        return SFTTokens(
            self.assistant_only_loss,
            self.completion_only_loss,
            d.max_length,
            d.packing,
            d.packing_strategy,
            comps.model,
        )

    def run(self, ctx: RunContext) -> dict[str, Any]:
        from trl import SFTConfig, SFTTrainer

        from hydratune.components.data.stream_prepare import sft_data_args
        from hydratune.components.data.tokens import token_plan
        from hydratune.components.runtime.pipeline_loop import StagedLoop
        from hydratune.components.runtime.session import Session
        from hydratune.components.runtime.stage_cut import cut_model
        from hydratune.components.runtime.trainer_loop import TrainerLoop

        c = ctx.components
        session = Session.start(ctx)
        rows = session.load_data()  # the rows checked and tokenized (TRL's masks or hydratune's)
        if rows.has_images:  # image rows: not tokenized by load_data, the processor tokenizes them
            return self.run_image_rows(session, rows)
        plan = token_plan(session.token_facts)
        model = session.build_model()
        session.evaluate_generations("before")
        extra: dict[str, Any] = {}
        # padding-free: one flattened row per micro-batch; a sequence split: padded rows the engine splits
        collator = collator_for(c, session.tokenizer, model, ctx.device)
        if collator is not None:
            extra["data_collator"] = collator
        if c.strategy.model_split.splits_sequences:
            session.report["data"]["batches"] = SPLIT_ROWS

        args = SFTConfig(
            **ctx.training_args(
                loss_type=self.loss_type,
                **sft_data_args(c.data),  # the tokens are TRL's already; a stream: packed by hydratune's feed
            )
        )
        staged = c.strategy.parallel.pp > 1  # pipeline stages: the trainer gets this rank's stages only
        cut = cut_model(session) if staged else None
        trainer = session.trainer(chunkable(SFTTrainer), args, session.tokens, **extra)
        self.choose_loss(session, trainer)
        session.check_loss_mask(trainer.train_dataset, masked=plan.mask != "none" or plan.completion)
        # the trainer prepares data, optimizer and schedule; the stages train through their own loop
        return session.run(StagedLoop.build(session, trainer, cut) if cut else TrainerLoop(session, trainer))

    def choose_loss(self, session: Any, trainer: Any) -> None:
        """The chunked loss on ``trainer`` where :meth:`loss_path` and the built model allow it; the
        summary's ``loss`` says which loss ran and why."""
        from hydratune.components.runtime.lm_loss import head_refusal

        impl, why = self.loss_path(session.ctx.components)
        model = trainer.model.get_base_model() if hasattr(trainer.model, "get_base_model") else trainer.model
        refused = head_refusal(model) if impl == "chunked" else None
        if refused:
            impl, why = "trl", refused
        if impl == "chunked":
            trainer.use_chunked_loss()
        session.report.setdefault("loss", {})["implementation"] = (
            "hydratune's chunked LM head + cross-entropy; entropy and mean_token_accuracy at log steps only"
            if impl == "chunked"
            else f"TRL's fused LM head ({why})"
        )

    def run_image_rows(self, session: Any, rows: Any) -> dict[str, Any]:
        """Image rows on a vision-language model: the rows themselves to TRL's SFTTrainer with the model's
        processor (its ``DataCollatorForVisionLanguageModeling`` expands each image to its image tokens and
        masks the loss to the assistant's answer, by the template's generation markers), every image token
        kept out of the loss besides (``NoImageTokenLoss``). No ``data.max_length`` cut (TRL would cut
        image tokens or the answer), no padding-free batches and no packing (TRL refuses both for images;
        packing is refused before load)."""
        from trl import SFTConfig, SFTTrainer

        from hydratune.components.runtime.trainer_loop import TrainerLoop
        from hydratune.components.text.batching import NoImageTokenLoss, image_token_ids

        ctx = session.ctx
        session.build_model()
        session.evaluate_generations("before")
        conversational = "messages" in rows["train"].column_names
        args = SFTConfig(
            **ctx.training_args(
                loss_type=self.loss_type,
                max_length=None,
                packing=False,
                padding_free=False,
                assistant_only_loss=self.assistant_only_loss and conversational,
                completion_only_loss=False if conversational else self.completion_only_loss,
            )
        )
        trainer = session.trainer(SFTTrainer, args, rows, processing_class=session.processor)
        trainer.data_collator = NoImageTokenLoss(trainer.data_collator, image_token_ids(session.processor))
        session.report["data"]["batches"] = (
            "image rows padded per batch by the model's processor (no data.max_length cut, no padding-free "
            "batches); image tokens never in the loss"
        )
        masked = (self.assistant_only_loss and conversational) or not conversational
        session.report.setdefault("loss mask", {})["method"] = (
            "the processor's assistant mask (the chat template's generation markers), made batch by batch by "
            "TRL's vision collator; image tokens never trained (NoImageTokenLoss)"
            if args.assistant_only_loss
            else "every token but padding and image tokens (NoImageTokenLoss)"
            if conversational
            else "the completion only (TRL's vision collator); image tokens never trained"
        )
        session.report.setdefault("loss", {})["implementation"] = "TRL's fused LM head (image rows)"
        session.check_image_loss_mask(trainer, masked=masked)
        return session.run(TrainerLoop(session, trainer))


def chunkable(trainer_cls: type) -> type:
    """TRL's ``SFTTrainer`` able to take hydratune's chunked loss (``ChunkedLMLoss.use_chunked_loss``)."""
    from hydratune.components.runtime.lm_loss import ChunkedLMLoss

    return type(trainer_cls.__name__, (ChunkedLMLoss, trainer_cls), {})
