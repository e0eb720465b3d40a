"""The feed of a streamed run (``data.streaming``): the stream's tokens (each row tokenized as it is read) as
training batches, and each rank's position in it, which every checkpoint holds.

The feed takes ``data.stream_window`` examples at a time from the stream (fewer where a pass over the
data ends: a window never holds a row twice), shuffles them (seeded by data.seed and where the window
starts), packs them (``data.packing``, TRL's ``pack_dataset``) and hands them out; each example carries
where its window starts in the stream and how many of the window's examples come before it. The collator
records that for the last example of every micro-batch, and the checkpoint holds it per rank
(``stream_position_<rank>.json``): a resume starts the stream at that window, prepares it again and passes
over what was trained: the same examples, in the same order, as a run that never stopped, at the cost of
one window (the Trainer's own skipping, which re-reads every batch before, is switched off:
``ignore_data_skip``). The loader is this process's own (no accelerate re-sharding: the stream is this
rank's share already) and reads in the training process (``train.num_workers=0``), so what it read is
what was trained.
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any

from torch.utils.data import IterableDataset as TorchIterable

from hydratune.components.data.stream import STREAM, Position, RowStream
from hydratune.components.data.stream_prepare import POSITION_FILE, rank_and_world

FEED = "_feed"  # the column carrying each example's place in its window (dropped before the collator)
KEPT = ("input_ids", "labels", "seq_lengths")  # what TRL's collator reads of an example
TRACE = "HYDRATUNE_STREAM_TRACE"  # a folder: each rank appends the stream position of every row it trains


@dataclass
class Place:
    """An example's place in the stream: its window's start, how many of the window's examples come up to
    and including it, and the stream's counts at the window's end. A checkpoint holds the last trained."""

    window: dict[str, Any] = field(default_factory=lambda: Position().as_dict())
    next: int = 0
    counts: dict[str, Any] = field(default_factory=lambda: Position().as_dict())
    trained: int = 0  # examples this rank handed to training so far (packed rows, with data.packing)


class Windows(TorchIterable):
    """The examples of the stream's tokens (each row tokenized as it is read), a window at a time: shuffled,
    packed, each with its :class:`Place`; from ``start`` (the stream restarted at its window, its examples
    before passed over)."""

    def __init__(self, prepared: Any, stream: RowStream, data: Any, start: Place) -> None:
        self.prepared, self.stream, self.data, self.start = prepared, stream, data, start

    def __iter__(self) -> Any:
        window, skip = self.start.window, self.start.next
        self.stream.start = Position.of(window)
        examples, pending = iter(self.prepared), None
        while True:  # a window ends at the end of a pass, so it never holds a row twice
            taken, pending = [pending] if pending is not None else [], None
            for example in islice(examples, self.data.stream_window - len(taken)):
                if taken and example[STREAM]["epoch"] != taken[0][STREAM]["epoch"]:
                    pending = example
                    break
                taken.append(example)
            if not taken:
                return
            end = taken[-1][STREAM]
            arranged = self.arrange(taken, window)
            for k in range(skip, len(arranged)):
                row = arranged[k].get(STREAM)  # where the row was (not for packed rows)
                yield {**arranged[k], FEED: {"window": window, "next": k + 1, "counts": end, "row": row}}
            window, skip = end, 0

    def arrange(self, taken: list[dict[str, Any]], window: dict[str, Any]) -> list[dict[str, Any]]:
        """One window's examples in training order: shuffled (seeded by data.seed and the window's start)
        and packed (TRL's ``pack_dataset``) when asked."""
        rng = random.Random(f"{self.data.seed}:{json.dumps(window, sort_keys=True)}")
        rows = [{k: ex[k] for k in (*KEPT, STREAM) if k in ex} for ex in taken]
        if self.data.stream_shuffle:
            rng.shuffle(rows)
        if not self.data.packing:
            return rows
        from datasets import Dataset
        from trl import pack_dataset

        table = Dataset.from_list([{k: r[k] for k in ("input_ids", "labels")} for r in rows])
        packed = pack_dataset(table, self.data.max_length, self.data.packing_strategy).to_list()
        if self.data.stream_shuffle:
            rng.shuffle(packed)
        return packed


class Feed:
    """One rank's streamed training data in the trainer (``trainer_hooks.StreamedData``): its loader, its
    position in every checkpoint, and the rows it read for the summary."""

    def __init__(self, stream: RowStream, data: Any) -> None:
        self.stream, self.data = stream, data
        self.start = Place()
        self.last: Place | None = None  # of the last micro-batch handed out

    def loader(self, trainer: Any) -> Any:
        """The training DataLoader: this rank's own (not re-sharded by accelerate), read in this process."""
        from torch.utils.data import DataLoader

        windows = Windows(trainer.train_dataset, self.stream, self.data, self.start)
        return DataLoader(
            windows,
            batch_size=trainer.args.per_device_train_batch_size,
            collate_fn=self.collate(trainer.data_collator),
            pin_memory=trainer.args.dataloader_pin_memory,
            num_workers=0,
        )

    def collate(self, collator: Any) -> Any:
        folder = os.environ.get(TRACE)
        trace = Path(folder) / f"rank{rank_and_world()[0]}.jsonl" if folder else None

        def collate(examples: list[dict[str, Any]]) -> Any:
            place = examples[-1][FEED]
            trained = self.place.trained + len(examples)
            self.last = Place(place["window"], place["next"], place["counts"], trained)
            if trace is not None:
                with trace.open("a") as f:
                    f.writelines(json.dumps(ex[FEED]["row"]) + "\n" for ex in examples)
            return collator([{k: v for k, v in ex.items() if k in KEPT} for ex in examples])

        return collate

    @property
    def place(self) -> Place:
        return self.last or self.start

    def save(self, checkpoint: Path) -> None:
        """This rank's stream position into ``checkpoint`` (every rank writes its own file)."""
        rank, world = rank_and_world()
        checkpoint.mkdir(parents=True, exist_ok=True)
        record = {"rank": rank, "world": world, **self.place.__dict__}
        (checkpoint / POSITION_FILE.format(rank=rank)).write_text(json.dumps(record, indent=1))

    def restore(self, checkpoint: Path) -> None:
        """Continue from this rank's position in ``checkpoint``."""
        record = json.loads((checkpoint / POSITION_FILE.format(rank=rank_and_world()[0])).read_text())
        self.start = Place(record["window"], record["next"], record["counts"], record["trained"])

    def report(self, accelerator: Any) -> dict[str, Any]:
        """Every rank's rows read, skipped and dropped (a collective call: every rank makes it)."""
        from accelerate.utils import gather_object

        counts = Position.of(self.place.counts)
        mine = {**counts.counts(), "trained": self.place.trained, "pass": counts.epoch + 1}
        every = gather_object([mine]) if accelerator.num_processes > 1 else [mine]
        what = "packed rows" if self.data.packing else "rows"
        lines = "; ".join(
            f"rank {r}: {c['trained']} {what} trained; {c['read']} rows read (pass {c['pass']}; windows "
            f"of {self.data.stream_window} are read ahead), {c['skipped']} skipped (bad), {c['dropped']} "
            "dropped (too long)"
            for r, c in enumerate(every)
        )
        keys: dict[str, int] = {}
        for c in every:
            for key, n in c["keys"].items():
                keys[key] = keys.get(key, 0) + n
        shown = ", ".join(f"{k} ({n:,} rows)" for k, n in keys.items()) or "none"
        return {"streamed (per rank)": lines, "streamed message keys ignored (every rank)": shown}
