"""The staged loop (pipeline stages: ``strategy.pp_size`` > 1): a Trainer recipe's run with the model cut into
stages, trained by our own loop over ``torch.distributed.pipelining`` instead of ``Trainer.train``.

``cut_model`` (``runtime/stage_cut.py``) runs before the recipe's trainer is built (the recipe calls it):
every rank builds the model whole, then keeps its stages (``components/distributed/stages.py``), their layers
split over the stage's tensor-parallel ranks with ``strategy.tp_size`` > 1
(``components/distributed/stage_tp.py``), so the trainer only ever holds this rank's part. The trainer still
does what it is good at and what keeps the run equal to a single-process one: the recipe's data preparation
(TRL's tokenization, label masks, truncation), the optimizer with its weight-decay groups, and the
learning-rate schedule. :class:`StagedLoop` then runs the steps (the driver, ``runtime/driver.py``, decides
checkpoints, evaluations and the stop after each): each optimizer step is
``train.gradient_accumulation_steps`` micro-batches of ``train.micro_batch_size`` rows per data-parallel
replica, pushed through the schedule; rows are right-padded to one length (the stages exchange fixed-shape
activations; a causal mask never lets a real token see the padding). The loss is the recipe's causal-LM
cross-entropy summed over the step's trained tokens of every replica and divided by their count, as the
Trainer's ``num_items_in_batch`` does; gradients are summed over the replicas and between the two copies of a
tied embedding, clipped by the norm over all stages and tensor-parallel shards. Its checkpoints hold each
pipeline rank's stage folder; the final weights are gathered into a normal model folder on rank 0.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from hydratune.components.config.errors import ConfigError, Diverged
from hydratune.components.distributed import pp_schedule as pp
from hydratune.components.distributed import stage_fsdp
from hydratune.components.distributed import stages as st
from hydratune.components.runtime.driver import AfterStep, Final
from hydratune.components.runtime.stage_cut import Cut, note_shards

STAGE_DIR = "stage-{stage}"  # in a checkpoint: one pipeline rank's weights and optimizer state
LAYOUT = "pipeline.json"  # in a checkpoint: the mesh and split that wrote it


def optimizer_file(mesh: pp.PipelineGroups, zero: bool, reading: bool = False) -> str | None:
    """This rank's optimizer file in its stage folder: one per stage, one per tensor-parallel rank (each
    holds its shards), or under ZeRO-1 one per data-parallel rank (each holds its partition); None: the
    rank writes none (replica 0 holds the same states, which every replica reads)."""
    if zero:
        return f"optimizer-dp{mesh.dp_rank}.pt"
    if mesh.dp_rank and not reading:
        return None
    return "optimizer.pt" if mesh.tp == 1 else f"optimizer-tp{mesh.tp_rank}.pt"


def loss_function(vocab_size: int, stash: list[torch.Tensor]) -> Any:
    """The last stage's loss of one micro-batch: the causal-LM cross-entropy summed over its trained tokens
    and divided by ``num_items`` (the step's trained tokens over every replica), transformers' own loss
    function; the micro-batch's mean token entropy and accuracy go to ``stash`` (as TRL logs them)."""
    from transformers.loss.loss_utils import ForCausalLMLoss

    def loss_fn(logits: torch.Tensor, labels: torch.Tensor, num_items: int) -> torch.Tensor:
        loss = ForCausalLMLoss(logits, labels, vocab_size, num_items_in_batch=num_items)
        with torch.no_grad():
            stash.append(token_stats(logits, labels))
        return loss

    return loss_fn


def token_stats(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """[trained tokens, their summed entropy, how many the greedy choice gets right] of a micro-batch, on its
    device (no wait for the host)."""
    shifted = labels[:, 1:]
    mask = shifted != -100
    scores = logits[:, :-1][mask].float()
    logp = torch.log_softmax(scores, dim=-1)
    entropy = -(logp.exp() * logp).sum(-1)
    right = scores.argmax(-1) == shifted[mask]
    return torch.stack([mask.sum(), entropy.sum(), right.sum()]).double()


@dataclass
class Batches:
    """The rows of a split as fixed-shape micro-batches: ``rows`` of ``length`` tokens, right-padded (ids with
    the pad token, labels with -100); missing rows of a short last batch are all padding (no trained token,
    so no loss and no gradient)."""

    data: Any  # a datasets.Dataset with input_ids and labels
    rows: int
    length: int
    pad_id: int

    def tensors(self, batches: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor, int]:
        """Token ids and labels of ``batches`` stacked (``len(batches) * rows`` rows), and their real
        (not padding) token count."""
        ids = torch.full((len(batches) * self.rows, self.length), self.pad_id, dtype=torch.long)
        labels = torch.full_like(ids, -100)
        real = 0
        for b, indices in enumerate(batches):
            part = self.data[indices] if indices else {"input_ids": [], "labels": []}
            for r, (row_ids, row_labels) in enumerate(zip(part["input_ids"], part["labels"], strict=True)):
                ids[b * self.rows + r, : len(row_ids)] = torch.tensor(row_ids)
                labels[b * self.rows + r, : len(row_labels)] = torch.tensor(row_labels)
                real += len(row_ids)
        return ids, labels, real


def longest(*datasets: Any) -> int:
    """The longest row of the datasets, rounded up to a multiple of 8: every micro-batch's length."""
    n = max((len(ids) for data in datasets if data is not None for ids in data["input_ids"]), default=1)
    return 8 * math.ceil(n / 8)


@dataclass
class StagedLoop:
    """The pipeline stages' loop (the driver's ``Loop``): the stages and their schedules, the optimizer and
    schedule the trainer made for this rank's parameters, the data order, and the counters."""

    session: Any
    trainer: Any
    cut: Cut
    pipe: pp.StageSchedules
    model: Any  # this rank's cut model (the trainer's)
    optimizer: Any
    scheduler: Any
    sampler: Any  # seeded per epoch like the Trainer's (accelerate's SeedableRandomSampler)
    batches: Any  # the sampler in micro-batches, sharded over the data-parallel replicas
    train_rows: Batches
    eval_rows: Batches | None
    max_steps: int
    steps_per_epoch: int
    stash: list[torch.Tensor]
    counted: set[int]  # parameters whose squared gradient this rank adds to the norm
    tied_param: Any = None  # this rank's copy of a tied embedding
    sharded: bool = False  # FSDP2 on each stage over the data-parallel replicas (zero_stage 2 / 3)
    timing: pp.Timing = field(default_factory=pp.Timing)
    start: float = field(default_factory=time.time)
    tokens: int = 0
    steps_run: int = 0
    kinds: dict[str, int] = field(default_factory=dict)  # schedule -> steps it ran
    logged: list[dict[str, float]] = field(default_factory=list)  # the steps since the last log
    last: dict[str, Any] = field(default_factory=dict)  # the last record logged
    total_loss: float = 0.0
    last_finite: int | None = None
    done: int = 0  # the last step that finished
    epoch: float = 0.0  # where it ended, in epochs

    @property
    def evaluates(self) -> bool:
        return self.eval_rows is not None

    @classmethod
    def build(cls, session: Any, trainer: Any, cut: Cut) -> StagedLoop:
        """The loop over ``cut`` (this rank's stages, :func:`cut_model`) with ``trainer``'s data, optimizer
        and schedule."""
        from accelerate.data_loader import BatchSamplerShard, SeedableRandomSampler
        from torch.utils.data import BatchSampler

        ctx = session.ctx
        c, t, args = ctx.components, ctx.train, trainer.args
        model = trainer.model
        layout = st.CausalLMParts.of(model)
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(ctx.plan.dtype)
        modules = [st.Stage(model, cut.plan, s, autocast=dtype) for s in cut.stage_ids]
        sharded = c.strategy.shards_stages and cut.mesh.dp > 1
        if sharded:  # before the optimizer is made: it steps the DTensor shards
            stage_fsdp.shard_stages(modules, cut.mesh.dp_mesh, c.strategy.zero_stage == 3)
            note_shards(session.report["pipeline"], cut, model, c.strategy.zero_stage)
        stash: list[torch.Tensor] = []
        pipe = pp.StageSchedules(modules, cut.stage_ids, cut.plan.num_stages, cut.mesh, c.strategy.schedule,
                           loss_function(layout.config.vocab_size, stash))  # fmt: skip
        trainer.optimizer_cls_and_kwargs = c.optimizer.cls_and_kwargs(ctx.device)  # as every trainer
        optimizer = trainer.create_optimizer()  # weight-decay groups over this rank's parameters
        if c.strategy.zero_stage == 1 and cut.mesh.dp > 1:  # the states sharded over the replicas
            optimizer = trainer.optimizer = pp.shard_over_replicas(optimizer, cut.mesh.dp_group)
        rows = trainer.train_dataset
        sampler = SeedableRandomSampler(range(len(rows)), data_seed=args.data_seed)
        batches: Any = BatchSampler(sampler, t.micro_batch_size, args.dataloader_drop_last)
        if cut.mesh.dp > 1:
            batches = BatchSamplerShard(batches, num_processes=cut.mesh.dp, process_index=cut.mesh.dp_rank)
        accum = t.gradient_accumulation_steps
        steps_per_epoch = max(math.ceil(len(batches) / accum), 1)
        max_steps = t.max_steps if t.max_steps > 0 else math.ceil(t.epochs * steps_per_epoch)
        scheduler = trainer.create_scheduler(max_steps, optimizer)
        evals = trainer.eval_dataset
        length = longest(rows, evals)
        pad = session.tokenizer.pad_token_id
        tied = None
        if cut.tied and cut.mesh.pp > 1:
            tied = layout.backbone.embed_tokens.weight if pipe.has_first else layout.top.lm_head.weight
        counted = {id(p) for p in model.parameters() if p is not tied or pipe.has_first}
        session.report["pipeline"].update(
            {
                "micro-batches per step": f"{accum} (train.gradient_accumulation_steps) of "
                f"{t.micro_batch_size} rows per replica",
                "sequence length": f"{length} tokens: every row right-padded to the longest (rounded up to "
                "8); data.padding_free and per-batch padding do not apply (the stages exchange fixed shapes)",
                "bubble (theoretical)": round(c.strategy.bubble(accum), 4),
            }
        )
        return cls(
            session, trainer, cut, pipe, model, optimizer, scheduler, sampler, batches,
            Batches(rows, t.micro_batch_size, length, pad),
            Batches(evals, t.micro_batch_size, length, pad) if evals is not None and len(evals) else None,
            max_steps, steps_per_epoch, stash, counted, tied, sharded=sharded,
        )  # fmt: skip

    def elapsed(self) -> float:
        return round(time.time() - self.start, 3)

    # ---- data order ---------------------------------------------------------------------------------
    def epoch_steps(self, epoch: int) -> list[list[list[int]]]:
        """Epoch ``epoch``'s optimizer steps, each a list of micro-batches (row indices): the Trainer's order
        (the sampler seeded with data_seed + epoch), its last step short when the epoch's micro-batches do not
        divide by the accumulation."""
        self.sampler.set_epoch(epoch)
        micro = list(self.batches)
        accum = self.session.ctx.train.gradient_accumulation_steps
        return [micro[i : i + accum] for i in range(0, len(micro), accum)]

    def steps(self, done: int) -> Any:
        """``(step, epoch float, micro-batches)`` from step ``done + 1`` to ``max_steps``."""
        epoch, skip = divmod(done, self.steps_per_epoch)
        step = done
        while step < self.max_steps:
            plan = self.epoch_steps(epoch)
            for i, micro in enumerate(plan[skip:], start=skip):
                step += 1
                yield step, epoch + (i + 1) / len(plan), micro
                if step >= self.max_steps:
                    return
            epoch, skip = epoch + 1, 0

    # ---- one step -------------------------------------------------------------------------------------
    def step(self, micro: list[list[int]]) -> dict[str, float]:
        """Forward and backward of the step's micro-batches through the pipeline, gradients summed over the
        replicas and tied copies, clipped, one optimizer and schedule step (a collective call)."""
        import torch.distributed as dist

        mesh, device = self.cut.mesh, self.cut.mesh.device
        ids, labels, real = self.train_rows.tensors(micro)
        items = torch.tensor(int((labels[:, 1:] != -100).sum()), device=device)
        dist.all_reduce(items, group=mesh.dp_group)  # the step's trained tokens over every replica
        self.stash.clear()
        ran = self.pipe.run(ids.to(device), labels.to(device), len(micro), self.train_rows.length,
                            loss_kwargs={"num_items": int(items)})  # fmt: skip
        if not ran.fresh:  # a step that built its schedule pays the set-up: not timed
            self.timing.add(ran.busy, ran.wall)
        self.kinds[ran.kind] = self.kinds.get(ran.kind, 0) + 1
        params = [p for p in self.model.parameters() if p.requires_grad]
        if not self.sharded:  # FSDP2 reduce-scattered them (summed) on the step's last micro-batch
            pp.all_reduce_grads(params, mesh.dp_group, mesh.dp)
        if self.tied_param is not None and self.tied_param.grad is not None:  # both copies alike sharded
            dist.all_reduce(pp.local(self.tied_param.grad), group=mesh.tied_group)
        # the squares summed over the stages, the tensor-parallel shards and FSDP2's shards of the replicas
        groups = [
            mesh.pp_group,
            mesh.tp_group if mesh.tp > 1 else None,
            mesh.dp_group if self.sharded else None,
        ]
        norm = pp.clip_grad_norm(
            params, self.session.ctx.train.max_grad_norm, groups, self.counted, mesh.tp_rank
        )
        lr = self.scheduler.get_last_lr()[0]
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        local = torch.zeros(5, dtype=torch.float64, device=device)
        if self.pipe.has_last and mesh.tp_rank == 0:  # a built schedule probed the loss once more: the last m
            stats = torch.stack(self.stash[-len(micro) :])
            n, trained = stats[:, 0], stats[:, 0] > 0
            local[0] = torch.stack(ran.result).double().sum()
            local[1] = (stats[trained, 1] / n[trained]).sum()
            local[2] = (stats[trained, 2] / n[trained]).sum()
            local[3], local[4] = len(stats), real
        dist.all_reduce(local)  # the last stage of every replica holds the numbers (its first tp rank counts)
        loss, entropy, right, counted, tokens = local.tolist()
        self.tokens += int(tokens)
        self.steps_run += 1
        return {"loss": loss, "grad_norm": norm, "learning_rate": lr, "entropy": entropy / max(counted, 1),
                "mean_token_accuracy": right / max(counted, 1)}  # fmt: skip

    def evaluate(self) -> dict[str, float]:
        """The eval split's loss as the Trainer reports it (each batch's mean token loss, weighted by its
        rows) and mean token accuracy, forward only through the pipeline (a collective call)."""
        import torch.distributed as dist

        assert self.eval_rows is not None
        mesh, rows, begun = self.cut.mesh, self.eval_rows.rows, time.time()
        indices = list(range(len(self.eval_rows.data)))
        mine = [indices[i : i + rows] for i in range(0, len(indices), rows)][mesh.dp_rank :: mesh.dp]
        chunk = self.session.ctx.train.gradient_accumulation_steps
        sums = [0.0, 0.0, 0.0]  # rows x batch mean loss, rows, rows x batch accuracy
        for start in range(0, len(mine), chunk):
            part = mine[start : start + chunk]
            part += [[]] * (chunk - len(part))  # one shape per schedule: padding micro-batches
            ids, labels, _ = self.eval_rows.tensors(part)
            length = self.eval_rows.length
            outputs = self.pipe.run(ids.to(mesh.device), None, chunk, length, train=False).result
            if not self.pipe.has_last or mesh.tp_rank:  # the last stage's tensor-parallel ranks agree
                continue
            logits = outputs[0]
            for b, batch in enumerate(part):
                if not batch:
                    continue
                sl = slice(b * rows, (b + 1) * rows)
                n, _, right = token_stats(logits[sl], labels[sl].to(logits.device)).tolist()
                if n:
                    loss = torch.nn.functional.cross_entropy(
                        logits[sl, :-1].flatten(0, 1).float(), labels[sl, 1:].flatten().to(logits.device),
                        ignore_index=-100,
                    )  # fmt: skip
                    sums[0] += len(batch) * float(loss)
                    sums[2] += len(batch) * right / n
                sums[1] += len(batch)
        total = torch.tensor(sums, dtype=torch.float64, device=mesh.device)
        dist.all_reduce(total)
        loss, count, accuracy = total.tolist()
        return {
            "eval_loss": loss / max(count, 1),
            "eval_mean_token_accuracy": accuracy / max(count, 1),
            "eval_runtime": round(time.time() - begun, 4),
        }

    # ---- checkpoints ------------------------------------------------------------------------------------
    def save(self, step: int) -> Path:
        """``checkpoints/checkpoint-<step>``: each pipeline rank's weights (safetensors, the whole model's
        names) and optimizer state in ``stage-<rank>/`` (data-parallel replica 0 writes them: the weights
        gathered whole, the optimizer state one file per tensor-parallel rank), the schedule, the step and the
        layout, every rank's RNG states; atomic and checksummed (a collective call)."""
        import torch.distributed as dist
        from safetensors.torch import save_file

        from hydratune.components.runtime.checkpoint import LOOP_STATE, staged_checkpoint

        ctx, mesh = self.session.ctx, self.cut.mesh
        main = dist.get_rank() == 0
        # replica 0 writes the stage, gathered whole (a collective)
        state = pp.whole_stage(self.model.state_dict(), mesh, self.sharded)
        with staged_checkpoint(ctx.run_dir, step, main=main, barrier=dist.barrier,
                               keep_last=ctx.train.keep_last) as staging:  # fmt: skip
            folder = staging / STAGE_DIR.format(stage=mesh.pp_rank)
            if mesh.dp_rank == 0 and mesh.tp_rank == 0:
                folder.mkdir()
                save_file(state, str(folder / "model.safetensors"))
            dist.barrier()  # the stage's folder exists before its tensor-parallel ranks write into it
            name = optimizer_file(mesh, self.zero)
            if name is not None:
                torch.save(pp.optimizer_part_state(self.optimizer), folder / name)
            if main:
                torch.save(self.scheduler.state_dict(), staging / "scheduler.pt")
                torch.save({"step": step, "epoch": self.epoch, "tokens": self.tokens}, staging / LOOP_STATE)
                (staging / LAYOUT).write_text(json.dumps(self.layout()))
        return ctx.run_dir.checkpoints / f"checkpoint-{step}"

    @property
    def zero(self) -> bool:
        """The optimizer states sharded over the data-parallel replicas (ZeRO-1, or FSDP2's shards)."""
        return self.sharded or pp.optimizer_part(self.optimizer) is not self.optimizer

    def layout(self) -> dict[str, Any]:
        """What a checkpoint's stage folders fit: the mesh and the split (a resume must match it)."""
        mesh = self.cut.mesh
        return {"pp": mesh.pp, "dp": mesh.dp, "tp": mesh.tp, "bounds": list(self.cut.plan.bounds)}

    def restore(self, checkpoint: str) -> int:
        """Load ``checkpoint`` into this rank's stages (weights, optimizer, schedule, RNG); the last step it
        holds. A checkpoint of another layout is refused, naming both."""
        from safetensors.torch import load_file

        from hydratune.components.runtime.checkpoint import loop_rng_file, loop_state

        path, mesh = Path(checkpoint), self.cut.mesh
        rng = loop_rng_file(path)
        saved = json.loads((path / LAYOUT).read_text()) if (path / LAYOUT).is_file() else None
        here = self.layout()
        if saved is not None and "tp" not in saved:  # written before tensor parallel stages: tp 1
            saved = {**saved, "tp": 1}
        if saved != here:
            raise ConfigError(
                f"{path} was written by a pipeline of {saved}, this run is {here}",
                key="resume",
                hint="resume with the strategy.pp_size, strategy.tp_size, strategy.split and process count "
                "of the run that wrote it",
            )
        folder = path / STAGE_DIR.format(stage=mesh.pp_rank)
        weights = load_file(str(folder / "model.safetensors"))
        missing, unexpected = pp.load_full_state(self.model, weights)
        if missing or unexpected:
            raise ConfigError(f"{folder}: missing {missing[:3]}, unexpected {unexpected[:3]}", key="resume")
        name = optimizer_file(mesh, self.zero, reading=True)
        pp.load_optimizer_part(
            self.optimizer, torch.load(folder / str(name), map_location="cpu", weights_only=True)
        )
        pp.shard_optimizer_state(self.optimizer)
        state = loop_state(path, self.scheduler, rng)
        self.tokens = int(state.get("tokens", 0))
        return int(state["step"])

    # ---- around the steps ---------------------------------------------------------------------------------
    def resume(self, checkpoint: str | None) -> int:
        """Restore ``checkpoint`` if given and say in the summary which steps this run's loss covers; the
        last step done."""
        from hydratune.components.runtime.resume import loss_span

        report = self.session.report["run"]
        done = self.restore(checkpoint) if checkpoint else 0
        if checkpoint:
            report["resumed from"] = checkpoint
        report["train_loss covers"] = loss_span(done + 1, self.max_steps, checkpoint)
        report["live strategy"] = self.cut.mesh.describe()
        return done

    def log(self, step: int, epoch: float, values: dict[str, float]) -> None:
        """Every ``train.log_every`` steps (and the first and last): the record as the Trainer writes it
        (the mean loss of the steps since the last log, the last step's gradient norm and learning rate,
        TRL's token metrics averaged) to metrics.jsonl and the trackers, and the progress line; a non-finite
        loss stops the run (``Diverged``) before the next save."""
        from hydratune.components.runtime.callbacks import progress_line

        ctx, session = self.session.ctx, self.session
        self.total_loss += values["loss"]
        self.logged.append(values)
        if not (step == 1 or step % ctx.train.log_every == 0 or step == self.max_steps):
            return
        mean = lambda key: sum(v[key] for v in self.logged) / len(self.logged)  # noqa: E731
        last = self.logged[-1]
        record = {
            "step": step, "epoch": epoch, "time": self.elapsed(), "loss": mean("loss"),
            "grad_norm": last["grad_norm"], "learning_rate": last["learning_rate"],
            "entropy": mean("entropy"),
            "mean_token_accuracy": mean("mean_token_accuracy"), "num_tokens": float(self.tokens),
            "train_tokens_per_second": self.tokens / max(self.elapsed(), 1e-9),
        }  # fmt: skip
        self.logged, self.last = [], record
        if not math.isfinite(record["loss"]):
            lr, clip = record["learning_rate"], ctx.train.max_grad_norm
            raise Diverged(step, record["loss"], self.last_finite, lr, clip)
        self.last_finite = step
        session.log_metrics(record)
        if ctx.is_main_process:
            shown = {"loss": record["loss"], "lr": record["learning_rate"]}
            shown["tok/s"] = record["train_tokens_per_second"]
            name, elapsed = ctx.components.recipe.name, self.elapsed()
            print(progress_line(name, step, self.max_steps, elapsed, self.steps_run, shown), flush=True)

    def train(self, done: int, after_step: AfterStep) -> dict[str, Any]:
        """The steps after ``done``: each logged, then the driver's decision carried out (an evaluation
        logged, a checkpoint, the stop). The run's metrics: stopped early, its time and the last record."""
        self.done = done
        for step, epoch, micro in self.steps(done):
            self.log(step, epoch, self.step(micro))
            self.done, self.epoch = step, epoch
            decision = after_step(step)
            if decision.evaluate:
                self.session.log_metrics(
                    {"step": step, "epoch": epoch, "time": self.elapsed(), **self.evaluate()}
                )
            if decision.save:
                self.save(step)
            if decision.stop:
                return {"train_runtime": self.elapsed(), **self.last}
        return {
            "train_runtime": self.elapsed(),
            "train_loss": self.total_loss / max(self.steps_run, 1),
            "train_tokens_per_second": self.tokens / max(self.elapsed(), 1e-9),
        }

    def last_step(self) -> int:
        return self.done

    def finish(self, metrics: dict[str, Any]) -> Final:
        """After the last step: the final evaluation (skipped when a signal came after the last step), the
        bubble and the optimizer states per rank for the summary, the whole model gathered on rank 0 (a
        collective call)."""
        session = self.session
        if self.eval_rows is not None and not session.interrupt.agreed():
            metrics.update(self.evaluate())
        session.log_metrics({"step": self.done, "epoch": self.epoch, "time": self.elapsed(), **metrics})
        session.report["pipeline"].update(self.bubble())
        states = pp.all_gather(pp.held_states(self.optimizer))  # collective
        zero = " (each data-parallel replica holds its partition)" if self.zero else ""
        session.report["pipeline"]["optimizer states per rank"] = ", ".join(f"{n:,}" for n in states) + zero
        return Final(self.whole_model())  # collective: every rank sends its part to rank 0

    # ---- the end -------------------------------------------------------------------------------------
    def whole_model(self) -> Any:
        """The whole model on rank 0, built from the config (an adapter applied as configured) and loaded
        with the weights gathered from every pipeline rank, the two copies of a tied matrix checked equal;
        this rank's cut model elsewhere (a collective call)."""
        from transformers import AutoModelForCausalLM
        from transformers.initialization import no_init_weights

        from hydratune.components.model import upcast_trainable

        gathered = pp.gather_state_dict(self.model.state_dict(), self.cut.mesh, every_replica=self.sharded)
        if gathered is None:
            return self.model
        layout, peft = st.CausalLMParts.of(self.model), self.session.ctx.components.peft
        with no_init_weights():  # which also leaves the tied matrices untied: tied again below
            whole = AutoModelForCausalLM.from_config(layout.config, dtype=layout.top.dtype)
        whole.tie_weights()
        if peft.is_adapter:
            whole = peft.for_task("causal_lm").apply(whole)
            upcast_trainable(whole)
        if self.cut.tied:  # both copies were trained alike: they must be one matrix still
            head = st.CausalLMParts.of(whole).top.lm_head.weight
            names = [n for n, p in whole.named_parameters(remove_duplicate=False) if p is head]
            if any(not torch.equal(gathered[n], gathered[names[0]]) for n in names if n in gathered):
                raise ConfigError(
                    "the tied embedding's two copies (first and last stage) differ after training",
                    key="strategy",
                    hint="a bug: please report it with this message",
                )
        whole.load_state_dict(gathered)
        whole.generation_config = self.model.generation_config
        return whole.eval()

    def bubble(self) -> dict[str, Any]:
        """The measured bubble: over the timed steps of every rank, the share of the schedule's wall time a
        rank was not computing its stages (waiting on its neighbours, sending and receiving)."""
        rows = pp.all_gather((self.timing.compute, self.timing.wall, self.timing.steps))
        compute, wall = sum(r[0] for r in rows), sum(r[1] for r in rows)
        return {
            "bubble (measured)": round(1 - compute / wall, 4) if wall > 0 else None,
            "bubble per rank (measured)": [round(1 - c / w, 4) if w > 0 else None for c, w, _ in rows],
            "steps timed": f"{rows[0][2]} (the steps that built a schedule are left out)",
            "schedules run": ", ".join(f"{k}: {v} steps" for k, v in self.kinds.items()),
        }
