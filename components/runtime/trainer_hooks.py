"""Every override of a transformers ``Trainer`` method, in one module: the mixins hydratune's trainers are
assembled from (:func:`hydratune_trainer`).

Three of the hooks are private methods that transformers offers no public alternative for; each is listed
in :data:`PRIVATE_OVERRIDES` with the signature it was written against, and
``tests/unit/test_trainer_hooks.py`` fails loudly when the installed transformers changes a signature or
stops calling one of them (an override that silently stops being called would lose atomic checkpoints,
token counts or the fp16 scaler knobs):

- ``_save_checkpoint(model, trial)``: the whole checkpoint (weights, optimizer, schedule, RNG, trainer
  state) is written into a staging dir and renamed into place when whole (``TrainerCallback.on_save``
  runs only after the files are written in place);
- ``_track_num_input_tokens(inputs)``: the token count stays on the device and is read back at log and
  save steps only (upstream ``.item()``s it every micro-batch, a host sync per step);
- ``_build_accelerator_args(**kwargs)``: accelerate's ``GradScalerKwargs`` handler carries the precision
  group's fp16 loss-scaling knobs (TrainingArguments has no field for them; upstream sets
  ``kwargs_handlers`` to its DDP handler alone).

``log(logs, ...)`` is public (transformers documents it for overriding); it flushes the token count.
``get_batch_samples(...)`` is public too: it draws no batch once ``max_steps`` steps are done, runs
Ulysses' data loader on across epochs (:class:`ContinuousEpochs`), and masks the rows accelerate repeats to
complete an epoch's last batches on data-parallel ranks out of the loss (:class:`RepeatedRowsOutOfTheLoss`).
``compute_loss(...)`` is public: under DeepSpeed Ulysses it keeps the loss and divides its gradient by the
sequence-parallel size (:class:`SequenceParallelLoss`).
``get_train_dataloader()`` and ``train(...)`` are overridden for ``data.streaming`` (:class:`StreamedData`).
``save_model(...)`` is public: under expert parallel it writes every expert whole (:class:`WholeExperts`).
``training_step(...)`` is public: where DeepSpeed's engine steps the scheduler, the learning rate of each
step is read before it trains, and ``log`` logs that one (:class:`LearningRateOfTheStep`).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

#: the private Trainer methods overridden here -> the parameters (after ``self``) they were written against
PRIVATE_OVERRIDES: dict[str, tuple[str, ...]] = {
    "_save_checkpoint": ("model", "trial"),
    "_track_num_input_tokens": ("inputs",),
    "_build_accelerator_args": ("kwargs",),
}


class DeferredTokenCount:
    """``num_input_tokens_seen`` summed on the device, gathered at log and save time only: HF's Trainer
    gathers and ``.item()``s the count of every micro-batch, which stalls the host until the GPU has caught
    up; here the host can queue the next steps."""

    _pending_tokens: Any = None
    #: ranks that train on the same tokens (a tensor-parallel group): the summed count is divided by it
    token_replicas: int = 1

    def _track_num_input_tokens(self, inputs: dict[str, Any]) -> None:
        mode = self.args.include_num_input_tokens_seen  # type: ignore[attr-defined]
        if mode == "no" or "input_ids" not in inputs:
            return
        count = count_tokens(inputs, self.processing_class, non_padding=mode == "non_padding")  # type: ignore[attr-defined]
        self._pending_tokens = count if self._pending_tokens is None else self._pending_tokens + count

    def flush_token_count(self) -> None:
        """Add the tokens counted since the last flush, summed over ranks (a collective: every rank calls)."""
        if self._pending_tokens is None:
            return
        pending, self._pending_tokens = self._pending_tokens, None
        total = int(self.accelerator.gather(pending).sum().item())  # type: ignore[attr-defined]
        self.state.num_input_tokens_seen += total // self.token_replicas  # type: ignore[attr-defined]

    def log(self, logs: dict[str, float], *args: Any, **kwargs: Any) -> None:
        self.flush_token_count()
        super().log(logs, *args, **kwargs)  # type: ignore[misc]

    def _save_checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        self.flush_token_count()
        return super()._save_checkpoint(*args, **kwargs)  # type: ignore[misc]


def count_tokens(inputs: dict[str, Any], tokenizer: Any, *, non_padding: bool) -> Any:
    """Tokens of a micro-batch as a 0-d int64 tensor on its device (no sync): the attention mask's ones;
    a padding-free row (position_ids, no mask) is all real tokens; else tokens that are not padding."""
    import torch

    ids = inputs["input_ids"]
    if not non_padding:
        return torch.tensor(ids.numel(), device=ids.device, dtype=torch.int64)
    if inputs.get("attention_mask") is not None:
        return inputs["attention_mask"].sum().to(torch.int64)
    pad = getattr(tokenizer, "pad_token_id", None)
    if "position_ids" in inputs or pad is None:  # padding-free batches carry no padding at all
        return torch.tensor(ids.numel(), device=ids.device, dtype=torch.int64)
    return (ids != pad).sum().to(torch.int64)


class AtomicCheckpoints:
    """Each checkpoint is written into ``checkpoints/.staging`` and renamed into place only when whole, with
    a completion marker; keep-last-K then only ever counts whole checkpoints."""

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        from transformers.trainer_utils import rotate_checkpoints

        from hydratune.components.runtime.checkpoint import mark_complete
        from hydratune.components.runtime.diskspace import ensure_room_for_checkpoint

        root = Path(self.args.output_dir)  # type: ignore[attr-defined]
        staging = root / ".staging"
        name = f"checkpoint-{self.state.global_step}"  # type: ignore[attr-defined]
        if self.args.should_save:  # type: ignore[attr-defined]
            shutil.rmtree(staging, ignore_errors=True)
            ensure_room_for_checkpoint(model, root, root.parent)  # named error, not a half-written save
        self.accelerator.wait_for_everyone()  # type: ignore[attr-defined]
        self.args.output_dir = str(staging)  # type: ignore[attr-defined]
        try:
            super()._save_checkpoint(model, trial)  # type: ignore[misc]
        finally:
            self.args.output_dir = str(root)  # type: ignore[attr-defined]
        self.checkpoint_extras(staging / name)
        self.accelerator.wait_for_everyone()  # type: ignore[attr-defined]  # every rank's shards are written
        if self.args.should_save:  # type: ignore[attr-defined]
            mark_complete(staging / name, self.state.global_step, root.parent)  # type: ignore[attr-defined]
            target = root / name
            if target.exists():
                shutil.rmtree(target)
            (staging / name).rename(target)
            shutil.rmtree(staging, ignore_errors=True)
            rotate_checkpoints(
                output_dir=str(root),
                save_total_limit=self.args.save_total_limit,  # type: ignore[attr-defined]
                use_mtime=True,
            )
        self.accelerator.wait_for_everyone()  # type: ignore[attr-defined]

    def checkpoint_extras(self, folder: Path) -> None:
        """What a run adds to each checkpoint beside the Trainer's files, on every rank, before the
        checkpoint is marked whole: a vision-language model's processor (rank 0 writes it)."""
        processor = getattr(self, "hydratune_processor", None)
        if processor is not None and self.args.should_save:  # type: ignore[attr-defined]
            from hydratune.components.modeling.vision import save_processor

            save_processor(processor, folder)


class LearningRateOfTheStep:
    """The learning rate logged for step N is the one step N trained with, as one process logs it. The
    Trainer reads it after ``optimizer.step()`` and steps the scheduler after that; but when DeepSpeed built
    the optimizer (expert parallel, DeepSpeed's CPU Adam, ``strategy.optimizer_impl=deepspeed``) the engine
    owns the scheduler and steps it inside the step's last backward (accelerate's
    ``DeepSpeedSchedulerWrapper.step`` does nothing), so the Trainer logged the next step's rate. Then the
    rate is read before each micro-batch trains (the last read before the engine steps is the step's)."""

    _rate_of_the_step: float | None = None

    def training_step(self, model: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        if engine_steps_the_scheduler(self.lr_scheduler):  # type: ignore[attr-defined]
            self._rate_of_the_step = self._get_learning_rate()  # type: ignore[attr-defined]
        return super().training_step(model, inputs, *args, **kwargs)  # type: ignore[misc]

    def log(self, logs: dict[str, float], *args: Any, **kwargs: Any) -> None:
        if self._rate_of_the_step is not None and "learning_rate" in logs:
            logs = {**logs, "learning_rate": self._rate_of_the_step}
        super().log(logs, *args, **kwargs)  # type: ignore[misc]


def engine_steps_the_scheduler(scheduler: Any) -> bool:
    """True when DeepSpeed's engine steps ``scheduler`` (accelerate wraps it so; the Trainer's own step of
    it does nothing), not the Trainer after its optimizer step. accelerate exports the wrapper only where
    deepspeed is installed (an optional extra): without it no engine steps a scheduler."""
    try:
        from accelerate.utils import DeepSpeedSchedulerWrapper
    except ImportError:
        return False
    return isinstance(scheduler, DeepSpeedSchedulerWrapper)


class RepeatedRowsOutOfTheLoss:
    """On data-parallel ranks accelerate completes an epoch's last micro-batches with the epoch's first rows
    (``even_batches``: every rank trains as many), where one process trains a smaller last step: those rows
    counted twice shifted that step's loss (measured: 4.044 vs one process's 4.293 on 20 rows, micro-batch 4
    on 2 ranks). Their labels are set to -100 here as each micro-batch is drawn, before the Trainer counts
    the step's tokens: they still pass through the model, but neither add to the loss nor count, so the
    step's loss (the tokens of every rank: ``average_tokens_across_devices``) and gradient are one
    process's. Only where each sampled row is a row of the batch, or one document of its padding-free row
    (``repeated_rows``, set by
    :func:`hydratune_trainer`: not packed); ``rows_masked`` counts them on this rank."""

    repeated_rows: bool = False
    rows_masked: int = 0

    def get_batch_samples(self, epoch_iterator: Any, num_batches: int, device: Any) -> tuple[list, Any]:
        if self.repeated_rows:
            epoch_iterator = _RepeatsMasked(self, epoch_iterator)
        return super().get_batch_samples(epoch_iterator, num_batches, device)  # type: ignore[misc]


class _RepeatsMasked:
    """The micro-batches of one optimizer step, the repeated rows' labels -100 (see
    :class:`RepeatedRowsOutOfTheLoss`); the step's place in its epoch from the Trainer's step count (a
    resumed run skips to the same place)."""

    def __init__(self, trainer: Any, source: Any) -> None:
        import math

        args = trainer.args
        self.trainer, self.source = trainer, source
        self.rows, self.micro = len(trainer.train_dataset), args.per_device_train_batch_size
        self.world, self.rank = args.world_size, args.process_index
        per_rank = math.ceil(math.ceil(self.rows / self.micro) / self.world)  # accelerate's len() (even)
        steps = math.ceil(per_rank / args.gradient_accumulation_steps)
        self.batch = (trainer.state.global_step % steps) * args.gradient_accumulation_steps

    def __iter__(self) -> _RepeatsMasked:
        return self

    def __next__(self) -> Any:
        from hydratune.components.distributed.model_parallel import epoch_rows

        batch = next(self.source)
        own = epoch_rows(self.rows, self.micro, self.world, self.rank, self.batch)
        self.batch += 1
        if own < self.micro:
            self.trainer.rows_masked += mask_rows_from(batch, own, self.micro)
        return batch


def mask_rows_from(batch: dict[str, Any], first: int, rows: int) -> int:
    """Labels -100 from row ``first`` of a micro-batch of ``rows`` rows on: a ``[rows, length]`` batch, or one
    row flattened padding-free (each row's ``position_ids`` start at 0; padding after them). The rows
    masked; 0 where the batch is neither (nothing changed)."""
    labels = batch.get("labels")
    if labels is None:
        return 0
    if labels.shape[0] == rows:
        labels[first:] = -100
        return rows - first
    positions = batch.get("position_ids")
    if labels.shape[0] == 1 and positions is not None:
        starts = (positions[0] == 0).nonzero().flatten()
        if len(starts) >= rows:
            labels[0, int(starts[first]) :] = -100
            return rows - first
    return 0


class WholeExperts:
    """Expert parallel (DeepSpeed AutoEP): the model weights of each checkpoint are the model's own, every
    expert gathered whole from its rank (``full_expert_state_dict``, a collective), so a checkpoint loads
    as the model it is; the engine's own files (each rank's experts and optimizer state) resume training.
    The Trainer's save would write rank 0's AutoEP blocks: half the experts, under DeepSpeed's names."""

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        from hydratune.components.distributed.model_parallel import autoep_layers, full_expert_state_dict

        if not autoep_layers(self.model):  # type: ignore[attr-defined]
            return super().save_model(output_dir, _internal_call)  # type: ignore[misc]
        state = full_expert_state_dict(self.model)  # type: ignore[attr-defined]
        if self.args.should_save:  # type: ignore[attr-defined]
            self._save(output_dir or self.args.output_dir, state_dict=state)  # type: ignore[attr-defined]
        return None


class StreamedData:
    """``data.streaming``: the training batches come from the stream's feed
    (``components/data/feed.py``): this rank's own loader, not re-sharded by accelerate (the stream
    is this rank's share already); every checkpoint holds each rank's stream position, and a resume starts
    the stream there (``ignore_data_skip``: no batch is read again to be passed over)."""

    feed: Any = None  # the run's Feed, set on the class by hydratune_trainer

    def get_train_dataloader(self) -> Any:
        return self.feed.loader(self)

    def train(self, resume_from_checkpoint: Any = None, **kwargs: Any) -> Any:
        if resume_from_checkpoint:
            self.feed.restore(Path(resume_from_checkpoint))
        result = super().train(resume_from_checkpoint=resume_from_checkpoint, **kwargs)  # type: ignore[misc]
        self.stream_report = self.feed.report(self.accelerator)  # type: ignore[attr-defined]
        return result

    def checkpoint_extras(self, folder: Path) -> None:
        super().checkpoint_extras(folder)  # type: ignore[misc]
        self.feed.save(folder)


class NoStepPastTheEnd:
    """No batch is drawn once ``max_steps`` optimizer steps are done: a run resumed from the checkpoint of its
    last step trains nothing (the Trainer's loop would otherwise run one more step before it checks)."""

    def get_batch_samples(self, epoch_iterator: Any, num_batches: int, device: Any) -> tuple[list, Any]:
        state = self.state  # type: ignore[attr-defined]
        if state.max_steps > 0 and state.global_step >= state.max_steps:
            return [], None
        return super().get_batch_samples(epoch_iterator, num_batches, device)  # type: ignore[misc]


class ContinuousEpochs:
    """DeepSpeed's Ulysses data loader (``UlyssesSPDataLoaderAdapter``) restarts its wrapped loader (the next
    epoch's shuffle) only by raising ``StopIteration`` once, at the first draw after the last batch: the
    Trainer then lost one optimizer step per epoch (an epochs-based run of the demo trained 1162 of its 1200
    steps). Here a ``StopIteration`` from that loader is followed by one more draw, so the micro-batches run
    on across epochs as one process's do; a resumed run's first epoch, fast-forwarded by
    ``ResumeSplitRows``, runs on into the next alike."""

    def get_batch_samples(self, epoch_iterator: Any, num_batches: int, device: Any) -> tuple[list, Any]:
        if hasattr(epoch_iterator, "refill"):  # the Ulysses adapter
            epoch_iterator = _DrawOnce(epoch_iterator)
        return super().get_batch_samples(epoch_iterator, num_batches, device)  # type: ignore[misc]


class _DrawOnce:
    """An iterator that answers its source's ``StopIteration`` with one more draw (the source restarted)."""

    def __init__(self, source: Any) -> None:
        self.source = source

    def __iter__(self) -> _DrawOnce:
        return self

    def __next__(self) -> Any:
        try:
            return next(self.source)
        except StopIteration:
            return next(self.source)


class LossScaling:
    """accelerate's ``GradScaler`` gets the precision's fp16 knobs (``scaler_handlers``, set on the class
    by :func:`hydratune_trainer`); transformers builds its ``Accelerator`` from these arguments."""

    scaler_handlers: tuple[Any, ...] = ()

    def _build_accelerator_args(self, **kwargs: Any) -> dict[str, Any]:
        args = super()._build_accelerator_args(**kwargs)  # type: ignore[misc]
        args["kwargs_handlers"] = [*args.get("kwargs_handlers", []), *self.scaler_handlers]
        return args


class SequenceParallelLoss:
    """Under DeepSpeed Ulysses the Trainer's loss (``deepspeed_sp_compute_loss``) is the token-weighted mean
    over the whole sequence-parallel group, all-gathered with autograd: every rank's backward then sums
    ``sp`` copies of its slice's gradient, and DeepSpeed sums the group's gradients again (it averages over
    data-parallel replicas only). Measured with SGD, no clipping: one process 3.8923 at step 3, SP=2 without
    this 6.7787 (grad norm 2x); AdamW and clipping hide it (both scale-free). The value is kept, the gradient
    divided by ``sp``. The first micro-batch's split of the tokens is recorded (``sequence_split``)."""

    sequence_split: dict[str, Any] | None = None

    def ulysses_size(self) -> int:
        """The sequence-parallel size when the Trainer computes Ulysses' loss (its own condition), else 1."""
        config = getattr(self.accelerator, "parallelism_config", None)  # type: ignore[attr-defined]
        ulysses = config is not None and config.sp_backend == "deepspeed" and config.sp_enabled
        return int(config.sp_size) if ulysses else 1

    def compute_loss(self, model: Any, inputs: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        sp = self.ulysses_size() if model.training else 1
        if sp > 1 and self.sequence_split is None:
            local = int(inputs["input_ids"].shape[-1])
            self.sequence_split = {"tokens per row on this rank": local, "tokens per row": local * sp}
        result = super().compute_loss(model, inputs, *args, **kwargs)  # type: ignore[misc]
        if sp == 1:
            return result
        loss, *rest = result if isinstance(result, tuple) else (result,)
        loss = loss.detach() + (loss - loss.detach()) / sp
        return (loss, *rest) if rest else loss


def hydratune_trainer(
    trainer_cls: type,
    scaler_handlers: tuple[Any, ...] = (),
    feed: Any = None,
    *,
    token_replicas: int = 1,
    processor: Any = None,
    repeated_rows: bool = False,
) -> type:
    """``trainer_cls`` (TRL's SFTTrainer, DPOTrainer, ...) with the hooks above: atomic checkpoints, the
    token count read at log steps only (divided by ``token_replicas``, the ranks that see the same tokens),
    no step past ``max_steps``, the fp16 scaler knobs, Ulysses' gradient; ``feed``: the training data is a
    stream (``StreamedData``); ``processor``: a vision-language model's, saved into every checkpoint;
    ``repeated_rows``: the rows accelerate repeats to complete an epoch's last batches on data-parallel
    ranks are out of the loss (``RepeatedRowsOutOfTheLoss``)."""
    mixins = (
        DeferredTokenCount,
        LearningRateOfTheStep,
        RepeatedRowsOutOfTheLoss,
        AtomicCheckpoints,
        NoStepPastTheEnd,
        ContinuousEpochs,
        LossScaling,
        SequenceParallelLoss,
        WholeExperts,
    )
    mixins = (StreamedData, *mixins) if feed is not None else mixins
    attrs = {
        "scaler_handlers": tuple(scaler_handlers),
        "token_replicas": token_replicas,
        "feed": feed,
        "hydratune_processor": processor,
        "repeated_rows": repeated_rows,
    }
    return type(f"Hydratune{trainer_cls.__name__}", (*mixins, trainer_cls), attrs)
