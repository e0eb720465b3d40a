"""The lifecycle every recipe shares, so recipes stay one screen long.

``Session.start`` seeds, prepares the run dir and the tokenizer; ``load_data`` reads and checks the rows
(the recipe's ``check_data`` too) before any model; ``build_model`` applies quantization and PEFT;
``trainer`` builds a Trainer recipe's trainer; ``run(loop)`` trains the loop the recipe names with the one
driver (``runtime/driver.py``: resume, steps, checkpoints, stopping cleanly on SIGTERM/SIGINT) and
``finish`` saves ``final/`` and the summary.
"""

from __future__ import annotations

import copy
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from hydratune.components.config.errors import ConfigError, Interrupted, ServerError, ServerFailed
from hydratune.components.data.feed import Feed
from hydratune.components.data.prepare import check_image_recipe, eval_every, prepare_data
from hydratune.components.data.stream_prepare import is_stream
from hydratune.components.distributed.interrupt import GracefulInterrupt
from hydratune.components.generation.evaluation import EvalPrompt, evaluate_generations
from hydratune.components.model import base_loads_in_half, describe_dtypes, upcast_trainable
from hydratune.components.peft import trainable_summary
from hydratune.components.runtime.callbacks import (
    FirstStepTimer,
    LayoutCheck,
    MetricsCallback,
    NonFiniteLossGuard,
    ResumeSplitRows,
    progress_callback,
)
from hydratune.components.runtime.checkpoint import checkpoints_in, save_final
from hydratune.components.runtime.diskspace import ensure_room_for_final
from hydratune.components.runtime.driver import Final, Loop, drive
from hydratune.components.runtime.expert_load import ExpertLoad, routers
from hydratune.components.runtime.run import RunContext, peak_memory_gb
from hydratune.components.text.chat_template import generation_header, label_for, mask_segments
from hydratune.components.text.masking import check_label_mask, label_mask_stats, stop_token_ids
from hydratune.components.tracker import TrackerRun

log = logging.getLogger("hydratune")


@dataclass
class Session:
    """One run's live state around its trainer: what the run derives from its components (which stay as
    configured) lives here."""

    ctx: RunContext
    tokenizer: Any
    model: Any = None
    report: dict[str, dict[str, Any]] = field(default_factory=dict)
    eval_prompts: list[EvalPrompt] = field(default_factory=list)  # tokenized in load_data, pre-model
    # the tokens the trainer reads, by split, when the recipe has them prepared with the data (SFT)
    tokens: dict[str, Any] | None = None
    token_facts: dict[str, Any] = field(default_factory=dict)
    interrupt: GracefulInterrupt = field(default_factory=GracefulInterrupt)
    first_step: FirstStepTimer = field(default_factory=FirstStepTimer)
    trackers: TrackerRun = field(default_factory=TrackerRun)  # rank 0: what the trackers opened
    keep_alive: list[Any] = field(default_factory=list)  # e.g. ZeRO-3's config, weakly held by transformers
    #: what this rank holds of a split model (``LayoutCheck``), written to ``.rank<r>.layout.json``
    layout: dict[str, Any] = field(default_factory=dict)
    #: the model's attention function before Ulysses wrapped it (generation runs with it)
    attention: Any = None
    eval_cost: dict[str, Any] = field(default_factory=dict)  # the end-of-run evaluation: seconds, rows
    #: the passes outside the training steps (probes, eval generations) before / after training: seconds
    probe_cost: dict[str, Any] = field(default_factory=dict)
    #: a vision-language model's processor (its image processor + this tokenizer); None for text models.
    #: Saved with every checkpoint and final/ (and so with every export)
    processor: Any = None

    @classmethod
    def start(cls, ctx: RunContext) -> Session:
        """Seed, write versions.json, set up trackers, build the tokenizer (no model yet: data first)."""
        import datasets
        from transformers.utils import logging as hf_logging

        datasets.disable_progress_bars()
        hf_logging.disable_progress_bar()
        c = ctx.components
        ctx.seed_everything()
        trackers = TrackerRun()
        if ctx.is_main_process:  # one writer per shared run dir; one tracker run per job
            ctx.run_dir.write_versions({"device": ctx.device, "world_size": ctx.plan.world_size})
            for name, content in c.strategy.files(ctx.plan, ctx.device).items():
                ctx.run_dir.write_json(name, content)  # e.g. the generated deepspeed.json
            trackers = c.tracker.start(ctx.run_info())
        interrupt = GracefulInterrupt(c.launcher.preemption_signals())  # SLURM's pre-emption signal too
        tokenizer = c.model.build_tokenizer()
        session = cls(ctx, tokenizer, interrupt=interrupt, trackers=trackers)
        session.processor = c.model.build_processor(tokenizer)
        mesh = ctx.plan.mesh
        shown = mesh is not None and (not mesh.is_data_parallel_only or mesh.ep > 1)  # a split to describe
        session.report["run"] = {
            "recipe": c.recipe.name,
            "model": c.model.name_or_path,
            "model weights": c.model.describe_weights(),
            **({"vision": c.model.describe_vision()} if c.model.is_vision else {}),
            "peft": type(c.peft).__name__,
            "strategy": c.strategy.label,
            "processes": ctx.plan.world_size,
            **({"mesh": mesh.describe()} if shown else {}),
            # a recipe that generates or scores has no batch arithmetic
            **({} if c.recipe.inference_only else {"global batch": ctx.plan.global_batch_size}),
            "precision": f"{ctx.plan.dtype} ({ctx.plan.dtype_reason})",
            "device": ctx.device,
            **({"cpu threads": cpu_threads()} if ctx.device == "cpu" else {}),
            "run dir": str(ctx.run_dir.path),
            "overrides": " ".join(ctx.overrides()) or "(none)",
        }
        return session

    def load_data(self) -> Any:
        """The data component's train/eval splits, length policy applied, and the eval prompts for
        generation tokenized under the same policy; bad or empty data fails here, before any model loads.
        A tokenizer without a chat template gets the documented default for conversational data. What the
        recipe's ``tokens()`` makes with the rows (SFT: every row tokenized, in ``self.tokens``; preference
        recipes: the lengths counted) is made here too, as ``mode=plan`` makes it."""
        c, train = self.ctx.components, self.ctx.train
        tokens = c.recipe.tokens(c)
        prepared = prepare_data(c.data, self.tokenizer, train.eval_generations, eval_every(c, train), tokens)
        check_image_recipe(c.recipe, prepared.splits)  # before any model loads
        c.recipe.check_data(c, prepared.splits, self.tokenizer)  # every recipe's own check, as mode=plan's
        self.eval_prompts = prepared.prompts
        self.tokens, self.token_facts = prepared.tokens, prepared.token_facts
        self.report["data"] = prepared.notes
        method = (prepared.token_facts.get("plan") or {}).get("mask")
        if method and method != "none":
            from hydratune.components.data.tokens import token_plan

            self.report.setdefault("loss mask", {})["method"] = token_plan(prepared.token_facts).method
        self.report_chat_template(prepared.default_template)
        return prepared.splits

    def report_chat_template(self, default: str | None) -> None:
        """Name the chat template in the summary; warn when it is the default (the tokenizer had none)."""
        if default:
            log.warning(
                "the tokenizer of %s has no chat template: using %s (set model.chat_template to choose)",
                self.ctx.components.model.name_or_path,
                default,
            )
            self.report["run"]["chat template"] = f"{default} (default: the tokenizer has none)"
        elif self.tokenizer.chat_template:
            self.report["run"]["chat template"] = label_for(self.ctx.components.model, self.tokenizer)

    def build_model(self, task: str = "causal_lm") -> Any:
        """The model with quantization and PEFT applied, no KV cache while training.

        ``task="seq_cls"`` builds a one-logit score head (reward models); PEFT adapters then save it."""
        c, ctx = self.ctx.components, self.ctx
        ctx.seed_everything()  # the init does not depend on what ran before
        live = c.strategy.before_model_load(ctx)  # ZeRO-3: zero.Init must be live before the weights exist
        if live is not None:
            self.keep_alive.append(live)  # for the whole run
        loaded = self._load(task)
        if c.strategy.partitions_at_load:  # proof that zero.Init was live: no rank built the whole model
            from hydratune.components.strategy import partition_at_load

            self.report["run"]["zero.Init"] = partition_at_load(loaded)
        model = c.quantization.prepare(loaded, c.model.gradient_checkpointing)
        if task == "seq_cls":
            model.config.pad_token_id = (
                self.tokenizer.pad_token_id
            )  # the score is read at the last real token
        # a SEQ_CLS adapter saves the score head with it; a VLM's adapters stay off its vision modules
        model = c.peft.for_task(task).for_model(c.model.adapter_exclusion()).apply(model)
        if c.model.apply_freeze(model) and not any(p.requires_grad for p in model.parameters()):
            raise ConfigError(
                f"model.freeze={list(c.model.freeze)} leaves nothing to train under this peft option",
                key="model.freeze",
                hint="leave the part the PEFT option trains (language_model for adapters) out of it",
            )
        upcast_trainable(model)  # a half-precision frozen base keeps fp32 trained weights
        self.report["run"]["weights"] = describe_dtypes(model)
        # No KV cache while training: besides wasting memory, a cache makes transformers skip the
        # packed-sequence mask, so padding-free packed examples would attend across boundaries.
        model.config.use_cache = False
        self.model = ctx.model = model
        self.report["run"]["trainable"] = trainable_summary(model)
        return model

    def build_frozen(self, task: str = "causal_lm") -> Any:
        """The configured model as loaded, frozen, without PEFT (PPO's reference under ZeRO-3, where the
        policy's sharded weights cannot be copied); seeded like ``build_model`` so a random init matches."""
        self.ctx.seed_everything()
        return self._load(task).eval().requires_grad_(False)

    def frozen_reference(self) -> Any:
        """The reference of a preference loss (DPO, KTO) when the policy has no adapter to switch off: a
        frozen copy of the policy; under ZeRO-3, whose policy is partitioned as it loads (a copy would hold
        empty shards), the model loaded again, seeded alike, under the same zero.Init (TRL then makes it an
        inference engine)."""
        if self.ctx.components.strategy.partitions_at_load:
            return self.build_frozen()
        return copy.deepcopy(self.model).eval().requires_grad_(False)

    def _load(self, task: str) -> Any:
        """The configured model in its load dtype (bf16 frozen base under an adapter), quantized if asked."""
        c, device = self.ctx.components, self.ctx.device
        precision = self.ctx.plan.dtype  # precision=auto resolved with the model's size
        frozen_base = base_loads_in_half(c.peft, c.quantization, c.strategy)
        dtype = c.model.weight_dtype(precision, frozen_base=frozen_base)
        load = {
            **c.quantization.load_kwargs(precision, device),
            **c.strategy.model_split.model_load_kwargs(self.ctx.plan),
        }
        return c.model.build(task=task, dtype=dtype, **load)

    def callbacks(self) -> list[Any]:
        c, mesh = self.ctx.components, self.ctx.plan.mesh
        engine: list[Any] = []
        if split(mesh):  # what the engine built, before step 1
            engine.append(LayoutCheck(c.strategy.model_split, mesh, self.layout))
        if c.strategy.model_split.splits_sequences:
            engine.append(ResumeSplitRows())  # Ulysses' data loader where the resumed run left it
        if self.model is not None and routers(self.model):  # a mixture of experts: its routers' choices
            engine.append(ExpertLoad(self.model, self.report))  # before MetricsCallback: logs what it adds
        return [
            *engine,
            MetricsCallback(self.ctx.run_dir),
            NonFiniteLossGuard(),
            progress_callback(c.recipe.name),
            self.first_step,
            *c.tracker.callbacks(self.ctx.run_info()),
        ]

    def trainer(
        self, trainer_cls: type, args: Any, data: Any, *, processing_class: Any = None, **extra: Any
    ) -> Any:
        """``trainer_cls`` (atomic checkpoints, token count read at log steps only) on this session's model,
        tokenizer (or ``processing_class``: a VLM's processor for image rows), data and callbacks."""
        from hydratune.components.runtime.trainer_hooks import hydratune_trainer

        c = self.ctx.components
        # fp16 outside DeepSpeed (whose config carries them): the loss-scaling knobs reach torch's GradScaler
        handlers = () if c.strategy.scales_loss else tuple(c.precision.scaler_handlers(self.ctx.plan.dtype))
        replicas = self.ctx.plan.mesh.tp if self.ctx.plan.mesh is not None else 1
        train, feed = data["train"], None
        if is_stream(train):  # tokenized as it is read; the feed batches it and keeps its position
            feed, train = Feed(train, c.data), train.dataset()
        plan = self.ctx.plan
        # data-parallel ranks only (no tp / sp / pp split), rows batched one by one (no stream, no packing),
        # batches with labels (SFT's; a preference pair's have none: its repeated rows are trained again)
        repeated_rows = plan.world_size > 1 and plan.data_parallel_size == plan.world_size and feed is None
        packed = c.data.kind == "chat" and c.data.packing
        repeated_rows = repeated_rows and not packed and sft_batches(trainer_cls)
        trainer = hydratune_trainer(
            trainer_cls,
            handlers,
            feed,
            token_replicas=replicas,
            processor=self.processor,
            repeated_rows=repeated_rows,
        )(
            model=self.model,
            args=args,
            train_dataset=train,
            eval_dataset=data["eval"] if len(data["eval"]) else None,
            processing_class=self.tokenizer if processing_class is None else processing_class,
            callbacks=self.callbacks(),
            **extra,
        )
        if c.strategy.model_split.splits_sequences:
            from hydratune.components.distributed.model_parallel import attention_function

            self.attention = attention_function(self.ctx.plan.attention)  # before train() wraps it
        if plan.world_size > 1 and feed is None:
            self.note_last_batches(trainer, repeated_rows)
        return trainer

    def note_last_batches(self, trainer: Any, masked: bool) -> None:
        """When the train rows do not fill whole batches on every rank, accelerate completes each epoch's
        last ones with its first rows (every rank trains as many micro-batches; under a sequence split
        Ulysses' attention needs them whole), where one process trains a smaller last step; ``masked``: those
        rows are out of the loss (``RepeatedRowsOutOfTheLoss``). The summary says which."""
        from hydratune.components.distributed.model_parallel import whole_last_batches

        plan, rows = self.ctx.plan, len(trainer.train_dataset)
        if whole_last_batches(rows, plan.micro_batch_size, plan.world_size):
            return
        what = (
            "masked out of the loss (labels -100): the step's loss and gradient are one process's smaller "
            "last step"
            if masked
            else "trained again, where one process trains a smaller last step"
        )
        self.report["data"]["last batches"] = (
            f"{rows} train rows do not fill whole batches of {plan.micro_batch_size} on {plan.world_size} "
            "ranks: accelerate completes each epoch's last batches with its first rows (even_batches), "
            f"{what}"
        )

    def evaluate_generations(self, when: str) -> None:
        """Exact-match accuracy of greedy answers to the eval prompts (see ``load_data``), for the summary."""
        if not self.eval_prompts:
            return
        strategy = self.ctx.components.strategy
        model_split = strategy.model_split
        # each rank holds a shard: no lone generate(); a pipeline's model is whole before it is cut and
        # gathered whole on rank 0 after training
        if strategy.shards_parameters and strategy.parallel.pp == 1 and not model_split.generates_together:
            self.report.setdefault("eval accuracy (exact match)", {})[when] = "skipped (sharded parameters)"
            return
        from hydratune.components.distributed.model_parallel import unwrapped_attention

        started = time.perf_counter()
        with unwrapped_attention(self.ctx.plan.attention, self.attention):  # Ulysses' wrapper drops masks
            result = evaluate_generations(
                self.model,
                self.tokenizer,
                self.eval_prompts,
                max_new_tokens=self.ctx.train.max_new_tokens,
                processor=self.processor,
            )
        # train.eval_generations prompts, train.max_new_tokens each (0 prompts: off): its seconds in the cost
        self.probe_cost[f"eval generations {when} (s)"] = round(time.perf_counter() - started, 1)
        self.report.setdefault("eval accuracy (exact match)", {})[when] = result["exact_match"]
        if when == "after" and self.ctx.is_main_process:
            path = self.ctx.run_dir.path / "generations.jsonl"
            path.write_text("".join(json.dumps(s) + "\n" for s in result["samples"]))

    def check_loss_mask(self, dataset: Any, *, masked: bool) -> None:
        """Fail on a mask that trains nothing, everything or never the stop token; report its stats and the
        first training example as trained / untrained segments."""
        stats = label_mask_stats(dataset, stop_token_ids(self.tokenizer))
        check_label_mask(stats, masked=masked)
        self.report.setdefault("loss mask", {}).update(stats)
        first = next(iter(dataset), None)  # a stream's too (its first example, tokenized)
        if first is not None and "labels" in first:
            self.report["loss mask: first training example"] = mask_segments(
                self.tokenizer, first["input_ids"], first["labels"], header=generation_header(self.tokenizer)
            )

    def check_image_loss_mask(self, trainer: Any, *, masked: bool, rows: int = 8) -> None:
        """``check_loss_mask`` for image rows, on a batch the trainer's collator makes of the first
        ``rows`` train rows (the processor tokenizes them there): something trained in every row, the stop
        token trained, and no image token ever trained (a ConfigError naming the template otherwise)."""
        from hydratune.components.text.batching import image_token_ids

        train = trainer.train_dataset
        batch = trainer.data_collator([train[i] for i in range(min(rows, len(train)))])
        found = []
        columns = (batch["input_ids"], batch["labels"], batch["attention_mask"])
        for ids, labels, mask in zip(*columns, strict=True):
            keep = mask.bool()
            found.append({"input_ids": ids[keep].tolist(), "labels": labels[keep].tolist()})
        image = image_token_ids(self.processor)
        trained_images = sum(t in image for row in found for t in row["labels"] if t != -100)
        if trained_images:
            raise ConfigError(
                f"{trained_images} image tokens are in the loss of the first {len(found)} train rows: the "
                "model would be trained to write image tokens",
                key="model.chat_template",
                hint="a chat template whose {% generation %} markers wrap the assistant's answer only",
            )
        self.note_image_tokens([row["input_ids"] for row in found])
        stats = label_mask_stats(iter(found), stop_token_ids(self.tokenizer))
        check_label_mask(stats, masked=masked)
        self.report.setdefault("loss mask", {}).update(stats | {"image tokens trained": 0})
        first, header = found[0], generation_header(self.tokenizer)
        self.report["loss mask: first training example"] = mask_segments(
            self.tokenizer, first["input_ids"], first["labels"], header=header
        )

    def note_image_tokens(self, rows: list[list[int]]) -> None:
        """The image tokens per row the processor made of the first train rows (``rows``: their input ids),
        beside what the memory estimate counted (``model.image_tokens_per_row`` or one default image); a
        warning, naming the knob, when the rows hold more than the estimate assumed."""
        from hydratune.components.data.images import expanded_image_tokens

        image = expanded_image_tokens(self.processor) if self.processor is not None else set()
        if not image or not rows:
            return
        counts = [sum(t in image for t in ids) for ids in rows]
        assumed = self.ctx.components.model.estimated_image_tokens()
        mean = sum(counts) / len(counts)
        line = f"max {max(counts):,}, mean {mean:,.1f} on the first {len(rows)} train rows"
        if assumed is not None:
            line += f"; the memory estimate counts {assumed:,} (model.image_tokens_per_row)"
        self.report["data"]["image tokens per row (measured)"] = line
        if assumed is not None and max(counts) > assumed:
            log.warning(
                "the first train rows hold up to %d image tokens, the memory estimate counted %d: set "
                "model.image_tokens_per_row=%d for an estimate (and strategy=auto) that fits them",
                max(counts),
                assumed,
                max(counts),
            )

    def finish_trackers(self) -> None:
        """Flush and close what the trackers opened (rank 0; a no-op elsewhere)."""
        self.trackers.finish()

    def note_late_signal(self) -> None:
        """A signal after the last training step: say that final/ was finished and what was skipped."""
        if self.interrupt.signum is None:
            return
        import signal
        import sys

        name = signal.Signals(self.interrupt.signum).name
        note = (
            f"{name} after the last training step: final/ and the summary were finished, evaluation skipped"
        )
        self.report["run"]["signal"] = note
        print(f"hydratune: {note}", file=sys.stderr, flush=True)

    def server_failed(self, err: ServerError, step: int, first: int, save: Any) -> Exception:
        """A server the run calls failed during step ``step + 1``: the error to raise. Before any step of
        this run finished (``step == first``): a ConfigError naming the server (exit 2, nothing written
        worth keeping). After: ``save()`` checkpoints the last finished step (a collective call), the summary
        says how to resume, and the CLI exits ``EXIT_SERVER_FAILED``."""
        if step <= first:
            return ConfigError(
                f"the reward server failed before the first training step: {err}",
                key=err.key,
                hint="fix the server (it must answer every batch with one finite score per completion), "
                "then run again",
            )
        save()
        saved = checkpoints_in(self.ctx.run_dir.path)
        failed = ServerFailed(str(err), step, str(saved[-1]) if saved else None)
        if self.ctx.is_main_process:
            self.report["stopped"] = {
                "reason": str(failed),
                "resume with": f"hydratune resume={self.ctx.run_dir.path} (once the server answers)",
            }
            self.write_report({})
        return failed

    def stopped(self, step: int, checkpoint: str | None, metrics: dict[str, Any]) -> Interrupted:
        """After a signal and its checkpoint: the summary (rank 0) says where the run stopped and how to
        resume; returns the ``Interrupted`` to raise (the CLI exits 75)."""
        assert self.interrupt.signum is not None
        stop = Interrupted(self.interrupt.signum, step, checkpoint)
        if self.ctx.is_main_process:
            self.report["interrupted"] = {
                "reason": str(stop),
                "resume with": f"hydratune resume={self.ctx.run_dir.path}",
                **(
                    {"pre-empted": "the launcher requeues the job; it continues here"}
                    if self.interrupt.preempted
                    else {}
                ),
            }
            self.write_report(metrics)
        return stop

    def log_metrics(self, record: dict[str, Any]) -> None:
        """One record of a recipe that owns its loop (PPO): appended to ``metrics.jsonl`` and sent to every
        configured tracker at ``record["step"]`` (numbers only; ``time`` stays in the run dir). Rank 0."""
        if not self.ctx.is_main_process:
            return
        self.ctx.run_dir.append_metrics(record)
        values = {
            k: float(v)
            for k, v in record.items()
            if k not in ("step", "time") and isinstance(v, (int, float)) and not isinstance(v, bool)
        }
        self.trackers.log(values, int(record["step"]))

    def run(self, loop: Loop) -> dict[str, Any]:
        """Train ``loop`` (the recipe names it: a Trainer's, PPO's, the pipeline stages') with the one driver
        (``runtime/driver.py``): resume, the steps, checkpoints, the stop agreement, then :meth:`finish`."""
        return drive(self, loop)

    def finish(self, final: Final, metrics: dict[str, Any]) -> dict[str, Any]:
        """After the last step: each rank's weights noted, the eval generations (on every rank when they
        generate together), and on rank 0 ``final/`` (plus ``final.extra`` modules as
        ``final/<name>.safetensors``, e.g. PPO's value head), summary.md and result.json."""
        from safetensors.torch import save_file

        ctx = self.ctx
        self.model = ctx.model = final.model
        ctx.record_rank_weights(final.model)
        if final.generate_together and not self.interrupt.agreed():  # TP: every rank generates
            self.evaluate_generations("after")
        if not ctx.is_main_process:  # rank 0 writes the run dir
            return metrics
        if not self.interrupt.requested and not final.generate_together:
            self.evaluate_generations("after")  # a signal after the last step: final/ and the summary only
        ensure_room_for_final(final.model, ctx.run_dir.final, ctx.cfg.merge)
        self.report["outputs"] = save_final(
            final.model,
            self.tokenizer,
            ctx.run_dir.final,
            merge=ctx.cfg.merge,
            state_dict=final.gathered.get("model"),
            processor=self.processor,
        )
        for name, module in final.extra.items():
            state = final.gathered.get(name) or module.state_dict()
            state = {k: v.detach().contiguous().cpu() for k, v in state.items()}
            save_file(state, str(ctx.run_dir.final / f"{name}.safetensors"))
        self.note_late_signal()
        self.write_report(metrics)
        return metrics

    def write_report(self, metrics: dict[str, Any], cost: dict[str, Any] | None = None) -> None:
        """summary.md and result.json: the report's sections, the numeric ``metrics`` and the cost (wall
        time, peak memory, the training figures a run has, and the recipe's own ``cost`` rows)."""
        from datetime import datetime, timezone

        ctx = self.ctx
        self.report.setdefault("run", {})["finished at"] = datetime.now(timezone.utc).isoformat(
            timespec="milliseconds"
        )
        self.report["final metrics"] = {k: v for k, v in metrics.items() if isinstance(v, (int, float))}
        rows = {
            "wall time (s)": round(ctx.elapsed(), 1),
            "train time (s)": metrics.get("train_runtime"),
            "tokens/s (train, non-pad)": _tokens_per_second(ctx),
            **_eval_during_training(ctx, final=bool(self.eval_cost)),
            **self.eval_cost,
            **self.probe_cost,
            **(cost or {}),
            "peak memory (GiB)": round(peak_memory_gb(ctx.device), 3),
            "command to first step (s)": self.first_step.seconds,
        }
        self.report["cost"] = {k: v for k, v in rows.items() if v is not None}  # none: not measured here
        if ctx.train.write_plots:
            ctx.run_dir.plot_losses()
        ctx.run_dir.write_summary(f"{ctx.components.recipe.title}: {ctx.run_name}", self.report.items())
        ctx.run_dir.write_json("result.json", self.report)


def cpu_threads() -> str:
    """torch's intra-op threads and the OpenMP wait policy this process runs with (the thread policy:
    components/runtime/threads.py; its measured cost both ways: docs/performance.md)."""
    import torch

    from hydratune.components.runtime.threads import describe_threads

    return describe_threads(torch.get_num_threads())


def sft_batches(trainer_cls: type) -> bool:
    """Whether ``trainer_cls`` trains on TRL's SFT batches: token rows with ``labels``."""
    from trl import SFTTrainer

    return issubclass(trainer_cls, SFTTrainer)


def split(mesh: Any) -> bool:
    """The run splits the model's layers over ranks (tensor / sequence / expert parallel): its engine's build
    is checked before step 1 (pipeline stages are checked by ``components/runtime/stage_cut.py``)."""
    return mesh is not None and (mesh.tp > 1 or mesh.sp > 1 or mesh.ep > 1)


def _eval_during_training(ctx: RunContext, *, final: bool) -> dict[str, Any]:
    """The periodic evaluations (``train.eval_every``) as the trainer logged them: how many, seconds in all.
    ``final``: the end-of-run evaluation, measured apart, was logged last (it is left out here)."""
    runs = [r["eval_runtime"] for r in ctx.run_dir.read_metrics() if "eval_runtime" in r]
    runs = runs[:-1] if final else runs
    if not runs:
        return {}
    return {"evals during training": len(runs), "eval time during training (s)": round(sum(runs), 1)}


def _tokens_per_second(ctx: RunContext) -> float | None:
    rates = [
        r["train_tokens_per_second"] for r in ctx.run_dir.read_metrics() if "train_tokens_per_second" in r
    ]
    return round(rates[-1], 1) if rates else None
