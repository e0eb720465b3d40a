"""Evaluation with lm-evaluation-harness, on a trained run's model or any model.

``hydratune recipe=eval model.from_run=<run dir> 'recipe.tasks=[hydratune_prompts,gsm8k]'`` loads the model
as trained (full, merged, or an adapter on its base: recipe=generate's loader), wraps it in lm-eval's
``HFLM`` (batched by ``recipe.batch_size``) and runs ``lm_eval.simple_evaluate`` with the model's chat
template. The run dir gets lm-eval's results (``lm_eval_results.json``), every scored sample
(``lm_eval_samples.jsonl``), a task / metric / value / stderr table in ``summary.md``, and the scores in
``metrics.jsonl`` and the trackers. Without ``model.from_run`` it scores the configured model (before
training). ``hydratune_prompts`` is hydratune's own task: the prompt/answer rows of ``data.path``.

With ``recipe.tools`` or ``recipe.environment`` it scores episodes instead
(components/runtime/episodes.py): every prompt of ``data.path`` run through GRPO's tool loop and scored with
GRPO's rewards (``recipe.reward_funcs``, the environment's ``get_reward()``); lm-eval does not run.
"""

from __future__ import annotations

import difflib
import functools
import importlib.util
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar
from unittest import mock

from omegaconf import DictConfig

from hydratune.components.config.errors import ConfigError
from hydratune.components.config.ranges import AT_LEAST_ONE, NON_NEGATIVE, POSITIVE, knob
from hydratune.components.recipe import DATA_KINDS, Recipe, recipe
from hydratune.components.runtime.episodes import EpisodeScoring
from hydratune.components.runtime.run import Components, RunContext

#: hydratune's own lm-eval tasks (package data); each reads the rows of ``data.path``
TASKS_DIR = Path(__file__).resolve().parent.parent / "components" / "assets" / "lm_eval_tasks"
DATA_TASKS = {p.stem for p in TASKS_DIR.glob("*.yaml")}
RESULTS, SAMPLES, DATA = "lm_eval_results.json", "lm_eval_samples.jsonl", "lm_eval_data.jsonl"
INSTALL = 'pip install "hydratune[lm-eval]"'
#: the knobs of lm-eval's tasks, and those of episodes (``recipe.tools`` / ``recipe.environment`` on)
LM_EVAL_KNOBS = ("tasks", "include_path", "num_fewshot", "apply_chat_template")
EPISODE_KNOBS = (
    "max_tool_calls",
    "tool_timeout",
    "reward_funcs",
    "max_new_tokens",
    "temperature",
    "num_return_sequences",
)


@recipe
@dataclass(frozen=True)
class Eval(Recipe, EpisodeScoring):
    """lm-evaluation-harness on a run's model (model.from_run=<run dir>) or the configured model; with
    recipe.tools / recipe.environment, episodes of the tool loop scored by GRPO's rewards."""

    title: ClassVar[str] = "Eval"
    #: lm-eval's own tasks read no data; hydratune_prompts needs prompt/answer rows (checked in ``check``)
    data_kinds: ClassVar[tuple[str, ...]] = ("chat", "prompts", "preference")
    #: one whole model per process (no optimizer, no sharding); adapter runs load as trained
    inference_only: ClassVar[bool] = True
    periodic_eval: ClassVar[bool] = False  # no training, so no eval split to check
    produces_causal_lm: ClassVar[bool] = False  # it writes scores, not a model

    # lm-eval task / group / tag names, globs, or task YAML files
    tasks: list[str] = field(default_factory=lambda: ["hydratune_prompts"])
    include_path: str | None = None  # a folder of your own task YAMLs
    # rows per task (episodes: rows of data.path): N, or a fraction < 1 (null = every row)
    limit: float | None = knob(None, POSITIVE)
    num_fewshot: int | None = knob(None, NON_NEGATIVE)  # null = each task's default (hydratune_prompts: 0)
    batch_size: int = knob(16, AT_LEAST_ONE)  # prompts (episodes) per forward / generate() call
    apply_chat_template: bool = True  # render prompts with the model's chat template (few-shot as turns)

    def check(self, cfg: DictConfig, comps: Components) -> None:
        from hydratune.components.runtime.inference import refuse_peft
        from hydratune.components.runtime.run import world_size

        lm_eval_knobs = self.changed(LM_EVAL_KNOBS)
        if self.scores_episodes and lm_eval_knobs:
            raise ConfigError(
                f"recipe.{lm_eval_knobs[0]} is an lm-eval knob, and recipe.tools / recipe.environment score "
                "episodes of data.path's prompts instead of lm-eval's tasks",
                key=f"recipe.{lm_eval_knobs[0]}",
                hint=f"drop recipe.{lm_eval_knobs[0]} (lm-eval's tasks run in a recipe=eval without tools)",
            )
        if not self.scores_episodes and importlib.util.find_spec("lm_eval") is None:
            raise ConfigError(
                "recipe=eval runs lm-evaluation-harness, which is not installed", key="recipe", hint=INSTALL
            )
        if comps.strategy.wraps_model or world_size(comps) > 1:
            raise ConfigError(
                "recipe=eval runs one whole model in one process",
                key="strategy" if comps.strategy.wraps_model else "launcher.nproc_per_node",
                hint="drop strategy and launcher.nproc_per_node (recipe.batch_size batches the prompts)",
            )
        refuse_peft("eval", comps)
        if self.scores_episodes:
            self.check_episodes(cfg, comps)
            return
        if not self.tasks:
            raise ConfigError(
                "no task to run", key="recipe.tasks", hint="e.g. 'recipe.tasks=[hydratune_prompts]'"
            )
        if self.include_path and not Path(self.include_path).expanduser().is_dir():
            raise ConfigError(
                f"{self.include_path} is not a folder",
                key="recipe.include_path",
                hint="a folder of lm-eval task YAMLs (searched recursively), or null",
            )
        ours = DATA_TASKS & set(expand(self.task_manager(), self.tasks))  # unknown task names fail here
        if ours and comps.data.kind not in ("chat", "prompts"):
            raise ConfigError(
                f"{min(ours)} scores prompt/answer rows of data.path, got {DATA_KINDS[comps.data.kind]}",
                key="data",
                hint="data=demo_eval, a prompt/answer file, or chat data whose last turn is the answer",
            )

    def check_data(self, comps: Components, splits: Any, tokenizer: Any) -> None:
        """Episodes: the template, the prompts with the schemas, the environment's reset, the rewards'
        columns (components/runtime/episodes.py); hydratune's lm-eval tasks read the rows in ``task_rows``."""
        if self.scores_episodes:
            self.check_episode_data(comps, splits, tokenizer)

    def plan_lines(self, cfg: DictConfig, comps: Components) -> list[str]:
        return self.episode_plan_lines() if self.scores_episodes else []

    def warnings(self, cfg: DictConfig, comps: Components) -> list[str]:
        """The knobs of episodes set without recipe.tools / recipe.environment: unused (lm-eval runs)."""
        unused = [] if self.scores_episodes else self.changed(EPISODE_KNOBS)
        if not unused:
            return []
        knobs = ", ".join(f"recipe.{k}" for k in unused)
        return [f"{knobs}: not used: lm-eval's tasks run; episodes need recipe.tools or recipe.environment"]

    def task_manager(self) -> Any:
        """lm-eval's ``TaskManager`` over hydratune's tasks and ``include_path``; lm-eval's own ~15k tasks
        are indexed (~10 s) only when a name is not found there. Unknown names fail, naming close ones."""
        paths = (str(TASKS_DIR), *([str(Path(self.include_path).expanduser())] if self.include_path else []))
        return task_manager_for(paths, tuple(self.tasks))

    def run(self, ctx: RunContext) -> dict[str, Any]:
        from hydratune.components.runtime.session import Session

        session = Session.start(ctx)
        try:
            if self.scores_episodes:
                return self.score_episodes(ctx, session, self.limit, self.batch_size)
            return self.evaluate(ctx, session)
        finally:
            session.finish_trackers()

    def evaluate(self, ctx: RunContext, session: Any) -> dict[str, Any]:
        """Data for hydratune's tasks (before the model loads), the model, lm-eval, the run dir's files."""
        import lm_eval
        from lm_eval.models.huggingface import HFLM

        from hydratune.components.runtime.inference import load_model, write_jsonl

        c, out = ctx.components, ctx.run_dir.path
        specs: list[Any] = expand(self.task_manager(), self.tasks)
        if DATA_TASKS & set(specs):
            loaded = c.data.whole().load()
            self.check_data(c, loaded, session.tokenizer)  # the recipe's own check, as in mode=plan
            rows, info = task_rows(c.data, loaded)
            write_jsonl(out / DATA, rows)
            report = {"path": c.data.path, "rows": len(rows), **info, "as read by lm-eval": DATA}
            session.report["data"] = report
            specs = [data_task(s, out / DATA) if s in DATA_TASKS else s for s in specs]
        default = None
        if self.apply_chat_template and not session.tokenizer.chat_template:
            from hydratune.components.text.chat_template import default_template

            session.tokenizer.chat_template, default = default_template(session.tokenizer)
        session.report_chat_template(default)
        build_tasks(self.task_manager(), specs)  # a dataset that cannot be had fails before the model loads
        model = load_model(c, ctx.device)
        lm = HFLM(pretrained=model, tokenizer=session.tokenizer, batch_size=self.batch_size)
        seed = ctx.cfg.train.seed
        start = time.perf_counter()
        # lm-eval records the git hash of the working dir, and git prints "fatal: not a git repository"
        # outside one; hydratune's own versions are in versions.json
        with mock.patch("lm_eval.evaluator.get_git_commit_hash", return_value=None):
            results = lm_eval.simple_evaluate(
                model=lm,
                tasks=specs,
                num_fewshot=self.num_fewshot,
                limit=int(self.limit) if self.limit and self.limit >= 1 else self.limit,
                apply_chat_template=self.apply_chat_template,
                fewshot_as_multiturn=self.apply_chat_template,
                task_manager=self.task_manager(),
                log_samples=True,
                random_seed=seed,
                numpy_random_seed=seed,
                torch_random_seed=seed,
                fewshot_random_seed=seed,
            )
        seconds = time.perf_counter() - start
        samples = results.pop("samples", {})
        ctx.run_dir.write_json(RESULTS, json.loads(json.dumps(results, default=_plain)))
        write_jsonl(out / SAMPLES, [{"task": t, **s} for t, rows in samples.items() for s in rows], _plain)
        table = score_table(results)
        scores = {f"lm_eval/{r['task']}/{r['metric']}/{r['filter']}": r["value"] for r in table}
        session.log_metrics({"step": 0, **scores})
        session.report["lm-eval"] = {
            "tasks": ", ".join(self.tasks),
            "limit": self.limit if self.limit is not None else "every row",
            "chat template": "applied" if self.apply_chat_template else "not applied",
            "batch size": self.batch_size,
            "lm-eval": lm_eval.__version__,
            "outputs": f"{RESULTS}, {SAMPLES}",
        }
        session.report["scores"] = table
        session.write_report({}, cost={"evaluation time (s)": round(seconds, 1)})
        return scores


@functools.cache
def task_manager_for(paths: tuple[str, ...], tasks: tuple[str, ...]) -> Any:
    """The ``TaskManager`` that knows ``tasks``: hydratune's and ``paths``' tasks, plus lm-eval's own only
    when a name is not among those. Unknown names fail, naming close ones. Built once per process."""
    manager = task_index(paths, with_lm_eval_tasks=False)
    if unknown_tasks(manager, list(tasks)):
        manager = task_index(paths, with_lm_eval_tasks=True)
    unknown = unknown_tasks(manager, list(tasks))
    if unknown:
        close = difflib.get_close_matches(unknown[0], manager.all_tasks, n=5, cutoff=0.6)
        raise ConfigError(
            f"unknown lm-eval task '{unknown[0]}'",
            key="recipe.tasks",
            hint=(f"close: {', '.join(close)}; " if close else "")
            + "`lm_eval ls tasks` lists lm-eval's; recipe.include_path=<dir> adds your own YAMLs",
        )
    return manager


@functools.cache
def task_index(paths: tuple[str, ...], *, with_lm_eval_tasks: bool) -> Any:
    """lm-eval's ``TaskManager`` over ``paths`` (and lm-eval's own tasks), built once per process."""
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=list(paths), include_defaults=with_lm_eval_tasks)


def build_tasks(manager: Any, specs: list[Any]) -> None:
    """Build every task once (lm-eval downloads or opens its dataset); ``simple_evaluate`` builds them
    again from the datasets cache. A dataset neither cached nor reachable is a ConfigError."""
    try:
        manager.load(specs)
    except (ConnectionError, FileNotFoundError) as err:
        raise ConfigError(
            f"lm-eval cannot load a task's dataset: {err}",
            key="recipe.tasks",
            hint="lm-eval tasks download their data from the Hugging Face hub: run once with network access "
            "(the datasets cache keeps it), or use tasks with local data_files (recipe.include_path)",
        ) from None


def unknown_tasks(manager: Any, names: list[str]) -> list[str]:
    """The names that are neither a task, group or tag ``manager`` knows (globs allowed) nor a YAML file."""
    return [n for n in names if not expand(manager, [n])]


def expand(manager: Any, names: list[str]) -> list[str]:
    """Task names, globs matched against ``manager``'s index (as lm-eval's CLI does), YAML files as given."""
    out: list[str] = []
    for name in names:
        if name in manager.all_tasks or (name.endswith(".yaml") and Path(name).is_file()):
            out.append(name)
        else:
            out += [m for m in manager.match_tasks([name]) if m not in out]
    return out


def task_rows(data: Any, loaded: Any) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Every row of ``loaded`` (``data.whole().load()``: ``data.path`` in file order) as ``{"prompt": turns,
    "answer": text}`` (what hydratune's tasks read: the whole conversation before the answer, system prompt
    included), and how the load read the file (format, columns used and ignored); rows without an answer
    cannot be scored."""
    pairs = data.pairs(loaded, "train")  # every row, in order
    if pairs and any(answer is None for _, answer in pairs):
        raise ConfigError(
            f"{data.path} has no answer column: hydratune_prompts scores answers",
            key="data.path",
            hint="rows with a prompt and an answer, or data.columns='{answer: <your column>}'",
        )
    if not pairs:
        raise ConfigError(f"no prompt/answer rows in {data.path}", key="data.path")
    return [{"prompt": list(turns), "answer": answer} for turns, answer in pairs], dict(loaded.info)


def data_task(name: str, rows: Path) -> dict[str, Any]:
    """Hydratune's task ``name`` as an lm-eval config dict whose test split is the file ``rows``, each row's
    prompt rendered as the whole conversation (``conversation_task``)."""
    import yaml

    config = yaml.safe_load((TASKS_DIR / f"{name}.yaml").read_text())
    config["dataset_kwargs"] = {"data_files": {"test": str(rows)}}
    config["class"] = conversation_task()
    return config


def with_history(messages: list[dict[str, Any]], turns: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """lm-eval's chat ``messages`` (its system message, few-shot turns, the question) with a row's earlier
    ``turns``: their system turns joined at the front of the system message, the rest before the question."""
    system = "\n\n".join(t["content"] for t in turns if t["role"] == "system")
    history = [{"role": t["role"], "content": t["content"]} for t in turns if t["role"] != "system"]
    out = [*messages[:-1], *history, messages[-1]]
    if system and out[0]["role"] == "system":
        out[0] = {"role": "system", "content": f"{system}\n\n{out[0]['content']}"}
    elif system:
        out.insert(0, {"role": "system", "content": system})
    return out


@functools.cache
def conversation_task() -> type:
    """lm-eval's ``ConfigurableTask`` whose prompt is the row's whole conversation: the task's
    ``doc_to_text`` is the last turn, and the turns before it (the system prompt, earlier exchanges) go
    into the chat history (without a chat template: before the question, as text)."""
    from lm_eval.api.task import ConfigurableTask

    class ConversationTask(ConfigurableTask):  # type: ignore[misc]
        def __init__(self, config: dict[str, Any], **kwargs: Any) -> None:
            super().__init__(config={k: v for k, v in config.items() if k != "class"}, **kwargs)

        def fewshot_context(  # type: ignore[override]
            self,
            doc: dict[str, Any],
            num_fewshot: int,
            system_instruction: str | None = None,
            apply_chat_template: bool = False,
            fewshot_as_multiturn: bool = False,
            chat_template: Any = None,
            gen_prefix: str | None = None,
        ) -> Any:
            turns = list(doc["prompt"])[:-1]
            if turns and apply_chat_template and chat_template:
                render = chat_template

                def chat_template(messages: list[dict[str, Any]], **kwargs: Any) -> Any:
                    return render(with_history(messages, turns), **kwargs)

            elif turns:
                text = "\n\n".join(t["content"] for t in turns)
                system_instruction = f"{system_instruction}\n\n{text}" if system_instruction else text
            return super().fewshot_context(
                doc,
                num_fewshot,
                system_instruction=system_instruction,
                apply_chat_template=apply_chat_template,
                fewshot_as_multiturn=fewshot_as_multiturn,
                chat_template=chat_template,
                gen_prefix=gen_prefix,
            )

    return ConversationTask


def score_table(results: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per task and metric (with its filter) of lm-eval's results: value, stderr, shots, rows."""
    rows = []
    for task, metrics in results["results"].items():
        for key, value in metrics.items():
            metric, _, filt = key.partition(",")  # "exact_match,strip": metric and filter
            if not filt or metric.endswith("_stderr") or not isinstance(value, (int, float)):
                continue  # alias, sample_len, stderrs (beside their metric)
            stderr = metrics.get(f"{metric}_stderr,{filt}")
            rows.append(
                {
                    "task": task,
                    "metric": metric,
                    "filter": filt,
                    "value": float(value),
                    "stderr": float(stderr) if isinstance(stderr, (int, float)) else "",
                    "shots": results.get("n-shot", {}).get(task, ""),
                    "rows": results.get("n-samples", {}).get(task, {}).get("effective", ""),
                }
            )
    return rows


def _plain(value: Any) -> Any:
    """What ``json`` cannot write: numpy scalars as numbers, anything else as text."""
    item = getattr(value, "item", None)
    return item() if callable(item) else str(value)
