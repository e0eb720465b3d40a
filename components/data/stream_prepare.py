"""``data.streaming=true`` in a run: the refusals before load, the stream's preparation beside the loaded
eval rows (never cached: ``components/data/prepare.py``), its rows tokenized as they are read exactly as
loaded rows are (``components/text/sft_tokens.py``), SFTConfig's data fields, the positions a resume needs.
No torch import here (the checks run before it); the feed is ``components/data/feed.py``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hydratune.components.config.errors import ConfigError
from hydratune.components.data.stream import Dropped, RowStream

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from hydratune.components.data.rows import LoadedData
    from hydratune.components.data.tokens import SFTTokens
    from hydratune.components.distributed.workers import Workers
    from hydratune.components.runtime.run import Components

POSITION_FILE = "stream_position_{rank}.json"  # in a checkpoint: where each rank's stream stands


def rank_and_world() -> tuple[int, int]:
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def planned_world(cfg: DictConfig) -> int:
    """The processes of the job ``cfg`` launches (this job's WORLD_SIZE inside a worker)."""
    launcher = cfg.launcher
    return int(os.environ.get("WORLD_SIZE") or launcher.get("nproc_per_node", 1) * launcher.get("nnodes", 1))


def is_stream(split: Any) -> bool:
    return isinstance(split, RowStream)


# ------------------------------------------------------------------------------------- before the load
def check_streaming(cfg: DictConfig, comps: Components) -> None:
    """Refuse, before anything loads, what a stream cannot do (naming the fix)."""
    data, recipe = comps.data, comps.recipe
    if not getattr(data, "streaming", False):
        return
    if not recipe.streams_data:
        raise ConfigError(
            f"recipe={recipe.name} cannot stream its data: only recipe=sft reads rows as it trains (the "
            "preference and RL trainers tokenize or sample from a whole data set they index, the inference "
            "recipes generate from every row of a finite file)",
            key="data.streaming",
            hint="data.streaming=false (data.max_samples=N reads the first N rows only), or recipe=sft",
        )
    if data.mixture:
        raise ConfigError(
            "data.streaming reads one source, and data.mixture names several",
            key="data.mixture",
            hint="put the sources' files in one folder and stream that (data.path=<folder>), or "
            "data.streaming=false",
        )
    if cfg.train.max_steps <= 0:
        raise ConfigError(
            "a stream has no length to count epochs in: data.streaming trains train.max_steps optimizer "
            f"steps (train.epochs is not used), and train.max_steps={cfg.train.max_steps}",
            key="train.max_steps",
            hint="set train.max_steps=N (a stream shorter than that is read again from its start)",
        )
    if cfg.train.num_workers:
        raise ConfigError(
            f"train.num_workers={cfg.train.num_workers}: dataloader workers would each read the stream, and "
            "the stream's position (what a resume continues from) is kept in the training process",
            key="train.num_workers",
            hint="train.num_workers=0 (tokenization then runs in the training process)",
        )
    mesh = comps.strategy.parallel.mesh(planned_world(cfg))
    if not mesh.is_data_parallel_only:
        raise ConfigError(
            f"data.streaming with {mesh.describe()}: the ranks of one model copy must read the same rows, "
            "and the stream gives every rank its own",
            key="data.streaming",
            hint="data.streaming=false, or data parallelism only (tp/sp/pp sizes 1)",
        )
    check_stream_eval(data)


def check_stream_eval(data: Any) -> None:
    """A stream's eval rows: data.eval_path (or the folder's validation split), or its own first rows
    (data.eval_size=N, or the default share); a fraction of a stream of unknown length is refused."""
    layout = data.layout(data.path, data.split)
    if data.eval_path or (layout is not None and layout.eval) or not data.eval_fraction:
        return
    raise ConfigError(
        f"data.eval_fraction={data.eval_fraction} is a share of data.path, and a stream's length is not "
        "known before it is read",
        key="data.eval_fraction",
        hint="data.eval_size=N holds out the stream's first N rows (unset, both hold out 5% of its rows, at "
        "most 1,000), or data.eval_path=<a finite eval file>",
    )


def check_positions(checkpoint: Path, world: int) -> None:
    """A streamed run's checkpoint holds every rank's stream position, written by as many ranks."""
    for rank in range(world):
        path = checkpoint / POSITION_FILE.format(rank=rank)
        if not path.is_file():
            raise ConfigError(
                f"{checkpoint} holds no stream position for rank {rank} ({path.name}): it was not written "
                "by a streaming run of this many processes",
                key="resume",
                hint="resume a data.streaming run with its own launcher.nproc_per_node",
            )
        written = json.loads(path.read_text())["world"]
        if written != world:
            raise ConfigError(
                f"{checkpoint} was written by {written} streaming processes; this run has {world} (each rank "
                "reads its own share of the stream)",
                key="launcher.nproc_per_node",
                hint=f"resume with {written} processes in all",
            )


# --------------------------------------------------------------------------------------------- the load
def load_stream(data: Any, workers: Workers) -> tuple[RowStream, LoadedData]:
    """This rank's stream, and the splits ``prepare_data`` checks as it checks loaded ones: the stream's
    first rows (checked before the model loads) as train, the eval rows (a finite file, loaded whole);
    ``workers`` write them as Arrow."""
    from hydratune.components.data.rows import LoadedData
    from hydratune.components.data.stream import open_stream

    rank, world = rank_and_world()
    stream, report, evals = open_stream(data, rank=rank, world=world, workers=workers)
    if data.eval_path:
        apart = data.layout(data.eval_path, None)
        key = "data.eval_path"
        tables = data.read(data.eval_path, key, report, workers, parts=apart.train if apart else None)
        evals = stream.convert_rows(tables, key, report, workers)
        report.info["eval rows from"] = f"data.eval_path={data.eval_path}"
        report.info.update(apart.info("eval") if apart else {})
    elif (layout := data.layout(data.path, data.split)) is not None and layout.eval:
        tables = data.read(data.path, "data.path", report, workers, parts=layout.eval)
        evals = stream.convert_rows(tables, "data.path", report, workers)
        report.info["eval rows from"] = f"the {layout.eval_split} split of data.path"
    elif evals is None:
        evals = stream.probe.select([])
        report.info["eval rows from"] = "none (data.eval_fraction=0)"
    return stream, LoadedData({"train": stream.probe, "eval": evals}, report)


def as_streamed(
    prepared: Any, stream: RowStream, data: Any, tokenizer: Any, tokens: SFTTokens | None
) -> None:
    """``prepared`` (a PreparedData; its train split: the stream's first rows, checked) on the stream: every
    later row goes through what ``prepare_data`` did to the first ones (the system turn folded or refused
    for a template without one, the length policy), as it is read; with ``tokens``, the train tokens are
    the stream's rows tokenized as they are read (:func:`token_stream`)."""
    from hydratune.components.data.rows import LoadedData
    from hydratune.components.data.tables import batch_lengths
    from hydratune.components.text.chat_template import (
        fold_system,
        is_conversational,
        rejects_system,
        template_label,
    )

    checked = prepared.splits["train"]
    stream = stream.with_probe(checked)
    if tokenizer is not None and "messages" in checked.column_names and rejects_system(tokenizer):
        label = template_label(tokenizer.chat_template)

        def system(row: dict[str, Any]) -> dict[str, Any]:
            if data.fold_system or not is_conversational(row) or row["messages"][0]["role"] != "system":
                return {"messages": fold_system(row["messages"])}
            raise ConfigError(
                f"the chat template ({label}) has no system role, and this row starts with a system turn",
                key="data.fold_system",
                hint="data.fold_system=true folds the system prompt into the first user turn",
            )

        stream = stream.then(system)
    if tokenizer is not None and data.on_overlong != "truncate":

        def length(row: dict[str, Any]) -> dict[str, Any]:
            n = batch_lengths(tokenizer, {k: [v] for k, v in row.items()})[0]
            if n <= data.max_length:
                return {}
            if data.on_overlong == "drop":
                raise Dropped
            raise ConfigError(
                f"{n} tokens > data.max_length={data.max_length}",
                key="data.max_length",
                hint="raise data.max_length, or set data.on_overlong=truncate or drop",
            )

        stream = stream.then(length)
    prepared.splits = LoadedData({"train": stream, "eval": prepared.splits["eval"]}, prepared.splits.report)
    prepared.notes["train rows"] = (
        f"a stream (data.streaming): only its first {len(checked)} rows were read and checked before "
        "training; the others are checked as training reads them"
    )
    if tokens is not None and prepared.tokens is not None:
        prepared.tokens["train"] = token_stream(stream, prepared, tokens, tokenizer)


def token_stream(stream: RowStream, prepared: Any, tokens: SFTTokens, tokenizer: Any) -> RowStream:
    """The stream's rows as the trainer's tokens (``input_ids`` + ``labels``), each row tokenized as it is
    read by what tokenizes loaded rows (``tokenize_batch``: TRL's tokens, the plan's mask): cut at
    data.max_length unless packing (the feed packs whole rows); a row left with no trained token is dropped
    and counted. The first rows' tokens, made before the model loaded (unpacked), are its probe."""
    import dataclasses

    from hydratune.components.data.tokens import token_plan
    from hydratune.components.text.sft_tokens import tokenize_batch

    plan = dataclasses.replace(token_plan(prepared.token_facts), packing=tokens.packing)
    prepared.token_facts["plan"] = dataclasses.asdict(plan)

    def tokenize(row: dict[str, Any]) -> dict[str, Any]:
        try:
            out = tokenize_batch(plan, tokenizer, {k: [v] for k, v in row.items()}, where="", first=0)
        except ConfigError as err:  # the stream names the row by its file and line, not as row 0 of a batch
            message = err.args[0].lstrip().removeprefix("row 0: ")
            raise ConfigError(message, key=err.key, hint=err.hint) from None
        if not out["input_ids"]:
            raise Dropped
        return {"input_ids": out["input_ids"][0], "labels": out["labels"][0]}

    return stream.then(tokenize, remove_columns=stream.column_names).with_probe(prepared.tokens["train"])


def sft_data_args(data: Any) -> dict[str, Any]:
    """SFTConfig's data fields: the tokens are hydratune's, made as TRL makes them (``skip_prepare_dataset``:
    TRL neither tokenizes, cuts nor packs them again); a stream is packed by the feed (its rows are cut at
    max_length unless packing: ``bfd`` cuts, ``bfd_split`` / ``wrapped`` carry the rest over), read in the
    training process, and resumed from its own position (no skipping of batches)."""
    args = {
        "max_length": data.max_length,
        "packing": data.packing,
        "packing_strategy": data.packing_strategy,
        "dataset_kwargs": {"skip_prepare_dataset": True},  # the tokens are TRL's already (sft_tokens)
    }
    if not getattr(data, "streaming", False):
        return args
    return args | {
        "packing": False,
        "max_length": None if data.packing else data.max_length,
        "ignore_data_skip": True,
        "dataloader_num_workers": 0,
        "dataloader_persistent_workers": False,
        "accelerator_config": {"dispatch_batches": False, "split_batches": False},
    }
