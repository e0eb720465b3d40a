"""What the inference-only recipes share (``recipe=generate``, ``recipe=best_of_n``): the sampling knobs and
their checks, and every prompt of the data generated from the model as trained: length-sorted batches
dealt to the processes (components/generation/sampling.py), the records merged in input order on rank 0."""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from hydratune.components.config.errors import ConfigError
from hydratune.components.config.ranges import AT_LEAST_ONE, NON_NEGATIVE, Range, knob
from hydratune.components.generation.sampling import Sampling, complete, length_batches
from hydratune.components.recipe import Recipe

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from hydratune.components.runtime.run import Components, RunContext

log = logging.getLogger("hydratune")


def refuse_peft(recipe: str, comps: Components) -> None:
    """An inference recipe trains nothing, so ``peft=`` would only add an untrained adapter: an adapter
    comes from the run it was trained in (``model.from_run``)."""
    if comps.peft.enabled:
        raise ConfigError(
            f"recipe={recipe} trains nothing: an adapter comes from the run it was trained in",
            key="peft",
            hint="drop peft and pass model.from_run=<the adapter run's dir>",
        )


@dataclass(frozen=True)
class BatchedGeneration(Recipe):
    """Sampling knobs; prompts come from ``data``, the model from ``model`` (``model.from_run``). The base
    of the inference-only recipes, which add their ``run``."""

    #: one whole model per process (no optimizer, no sharding); adapter runs load as trained
    inference_only: ClassVar[bool] = True
    periodic_eval: ClassVar[bool] = False  # no training, so no eval split to check
    produces_causal_lm: ClassVar[bool] = False  # it writes generations, not a model
    data_kinds: ClassVar[tuple[str, ...]] = ("chat", "prompts")

    max_new_tokens: int = knob(256, AT_LEAST_ONE)
    temperature: float = knob(0.0, NON_NEGATIVE)  # 0 = greedy
    top_p: float = knob(1.0, Range(0, 1, low_open=True))
    top_k: int = knob(0, NON_NEGATIVE)  # 0 = no top-k cut
    num_return_sequences: int = knob(1, AT_LEAST_ONE)
    batch_size: int = knob(16, AT_LEAST_ONE)  # prompts per generate() call (sorted by length: little padding)
    output: str = "generations.jsonl"  # in the run dir

    def check(self, cfg: DictConfig, comps: Components) -> None:
        if comps.strategy.wraps_model:
            raise ConfigError(
                f"recipe={self.name} runs one whole model per process, not {comps.strategy.label}",
                key="strategy",
                hint="drop strategy (launcher.nproc_per_node=N still deals the prompts to N processes)",
            )
        refuse_peft(self.name, comps)
        if self.temperature == 0 and self.num_return_sequences > 1:
            raise ConfigError(
                "greedy decoding (temperature=0) gives the same completion every time",
                key="recipe.num_return_sequences",
                hint="set recipe.temperature>0 to sample several completions per prompt",
            )
        if "/" in self.output or not self.output.endswith(".jsonl"):
            raise ConfigError("a .jsonl file name in the run dir", key="recipe.output")

    def sampling(self) -> Sampling:
        return Sampling(
            self.max_new_tokens, self.temperature, self.top_p, self.top_k, self.num_return_sequences
        )

    def agent(self, tokenizer: Any) -> Any:
        """The prompts' tool loop (``ToolLoop``, components/tool_loop.py); None: one completion each."""
        return None

    def generate_all(self, ctx: RunContext) -> tuple[Any, list[dict[str, Any]], list[dict[str, Any]], float]:
        """(session, prompt rows, every record in input order on rank 0 (``[]`` elsewhere), seconds): the
        length-sorted batches dealt to the processes, generated, merged and written to ``output``."""
        from hydratune.components.runtime.session import Session

        c = ctx.components
        rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
        session = Session.start(ctx)
        loaded = c.data.whole().load()  # every row, in file order (no eval split)
        self.check_data(c, loaded, session.tokenizer)  # the recipe's own check, as in mode=plan
        agent = self.agent(session.tokenizer)  # recipe.tools: the tool loop (its schemas in every prompt)
        template = agent.template if agent is not None else None
        rows, info, images = prompt_rows(c.data, session.tokenizer, loaded, template)
        if images and not self.image_rows:  # before the model loads, as in plan
            raise ConfigError(
                f"recipe={self.name} does not generate for image rows (recipe=generate does)",
                key="recipe",
                hint="recipe=generate, or data.images=false for text-only rows",
            )
        # every row is generated for (no eval split): the prompt count is in the final metrics
        session.report["data"] = {"path": c.data.path, **info}
        model = load_model(c, ctx.device)
        sampling = self.sampling()
        session.report["generation"] = {**vars(sampling), "output": self.output}  # processes: under run
        batches = length_batches([len(r["ids"]) for r in rows], self.batch_size)[rank::world]
        start, generated, records = time.perf_counter(), 0, []
        for b, batch in enumerate(batches, 1):
            ctx.seed_everything()  # each batch draws the same samples whichever process runs it
            outs = complete_rows(model, session, [rows[i] for i in batch], sampling, agent)
            for i, completions in zip(batch, outs, strict=True):
                for k, done in enumerate(completions):
                    records.append(record(rows[i], i, k, done))
                    generated += done.tokens
            rate = generated / max(time.perf_counter() - start, 1e-9)
            log.info(
                "generate: batch %d/%d on rank %d, %d tokens, %.1f tokens/s",
                b,
                len(batches),
                rank,
                generated,
                rate,
            )
        seconds = time.perf_counter() - start
        return session, rows, merge_ranks(ctx, records, rank, world, self.output), seconds


def prompt_rows(
    data: Any, tokenizer: Any, splits: Any, template: dict[str, Any] | None = None
) -> tuple[list[dict[str, Any]], dict[str, Any], bool]:
    """Every row of ``splits`` (``data.whole().load()``: ``data.path`` in file order, no eval split): the
    prompt turns, tokenized with the chat template's generation prompt (``template``: more keywords for it,
    a tool loop's schemas) under the data's length policy, and the reference if any; how the data was read
    (the format, what the length policy cut), for the summary; and whether the rows carry images
    (``LoadedData.has_images``)."""
    from hydratune.components.data.prepare import eval_images
    from hydratune.components.generation.evaluation import eval_prompts

    pairs = data.pairs(splits, "train")
    if not pairs:
        raise ConfigError(
            "raw text rows have no prompt to complete",
            key="data.format",
            hint="use chat, instruction or prompt data",
        )
    limit, key, policy = data.prompt_limit()
    pairs = [(turns, answer or "") for turns, answer in pairs]
    images = eval_images(splits, pairs, "train")  # image rows: the processor expands them as they generate
    prompts, counts = eval_prompts(
        pairs, tokenizer, max_length=limit, on_overlong=policy, key=key, images=images, template=template
    )
    info = {k: v for k, v in splits.info.items() if k != "eval rows from"}
    rows = [
        {
            "ids": p.ids,
            "prompt": p.question,
            "reference": p.answer,
            "truncated": p.truncated,
            "conversation": p.conversation,
            "images": p.images,
            "text": p.text,
        }
        for p in prompts
    ]
    return rows, {**info, **counts}, splits.has_images


def complete_rows(
    model: Any, session: Any, rows: list[dict[str, Any]], sampling: Any, agent: Any = None
) -> list[Any]:
    """The completions of a batch of prompt rows: text rows batched, an image row on its own through the
    model's processor (its images expanded to their image tokens, with the pixels); with ``agent`` (a
    ``ToolLoop``) each one an episode of the tool loop."""
    from hydratune.components.generation.sampling import complete_images

    if agent is not None:
        return episodes(model, session.tokenizer, rows, sampling, agent)
    texts = [i for i, r in enumerate(rows) if not r.get("images")]
    out: list[Any] = [None] * len(rows)
    if texts:
        found = complete(model, session.tokenizer, [rows[i]["ids"] for i in texts], sampling)
        for i, done in zip(texts, found, strict=True):
            out[i] = done
    for i, row in enumerate(rows):
        if row.get("images"):
            if session.processor is None:
                raise ConfigError(
                    "the prompt rows have images, and the model has no processor (not a vision-language "
                    "model)",
                    key="data.images",
                    hint="a vision-language model (model.from_run of a VLM run), or data.images=false",
                )
            out[i] = complete_images(model, session.processor, row["text"], row["images"], sampling)
    return out


def episodes(model: Any, tokenizer: Any, rows: list[dict[str, Any]], sampling: Any, agent: Any) -> list[Any]:
    """``num_return_sequences`` episodes of the tool loop per row (each its own conversation, as TRL's
    loop continues each sample alone), every turn up to ``max_new_tokens``, within the model's context."""
    import dataclasses

    n, one = sampling.num_return_sequences, dataclasses.replace(sampling, num_return_sequences=1)
    expanded = [row for row in rows for _ in range(n)]

    def generate(prompts: list[list[int]]) -> list[Any]:
        return [done for [done] in complete(model, tokenizer, prompts, one)]

    context = getattr(model.config, "max_position_embeddings", None)
    found = agent.run(
        [r["conversation"] for r in expanded], [r["ids"] for r in expanded], generate, context=context
    )
    return [found[i * n : (i + 1) * n] for i in range(len(rows))]


def load_model(comps: Components, device: str) -> Any:
    """The model as trained: an adapter run's adapter on its base (quantized if it was), else the model
    dir (quantized on load if ``quantization`` asks)."""
    from hydratune.components.modeling.trained import TrainedRun

    model, precision = comps.model, comps.precision.resolve(device)
    if model.adapter:
        run = TrainedRun.open(model.from_run, trust_remote_code=model.trust_remote_code)
        loaded, _ = run.load(dtype=model.weight_dtype(precision))
    else:
        quantized = comps.quantization.enabled
        loaded = model.build(**(comps.quantization.load_kwargs(precision, device) if quantized else {}))
    if not comps.quantization.enabled and not getattr(loaded, "is_quantized", False):
        loaded = loaded.to(device)
    return loaded.eval()


def record(row: dict[str, Any], index: int, sample: int, done: Any) -> dict[str, Any]:
    out = {
        "index": index,
        "sample": sample,
        "prompt": row["prompt"],
        "completion": done.text,
        "tokens": done.tokens,
        "finish_reason": done.finish_reason,
    }
    if hasattr(done, "messages"):  # an episode of the tool loop: its transcript
        out.update(messages=done.messages, tool_calls=done.calls, tool_errors=dict(done.errors))
    if row["reference"]:
        out["reference"] = row["reference"]
    if row["truncated"]:
        out["prompt_truncated"] = True
    return out


def merge_ranks(ctx: RunContext, records: list[dict[str, Any]], rank: int, world: int, name: str) -> list:
    """Every process's records in input order, written by rank 0 as ``name`` (atomically)."""
    out = ctx.run_dir.path / name
    if world > 1:
        import torch.distributed as dist

        if not dist.is_initialized():
            dist.init_process_group("gloo")
        shard = ctx.run_dir.path / f".{name}.rank{rank}"
        shard.write_text("".join(json.dumps(r) + "\n" for r in records))
        dist.barrier()
        if rank == 0:
            records = [
                json.loads(line)
                for r in range(world)
                for line in (ctx.run_dir.path / f".{name}.rank{r}").read_text().splitlines()
            ]
        dist.barrier()
        shard.unlink()
        dist.destroy_process_group()
    if rank != 0:
        return []
    records.sort(key=lambda r: (r["index"], r["sample"]))
    write_jsonl(out, records)
    return records


def write_jsonl(path: Path, rows: list[dict[str, Any]], default: Any = None) -> None:
    """``rows`` as JSON lines, written atomically (a temporary file renamed into place); ``default``
    converts what JSON cannot hold (``json.dumps``'s)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(json.dumps(r, default=default) + "\n" for r in rows))
    tmp.replace(path)
