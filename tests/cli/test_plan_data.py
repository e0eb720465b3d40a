"""What a run does with its data before the model loads: eval prompts under the length policy, ``mode=plan``
reading the data as training would, and hub ids that are neither cached nor reachable."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.slurm.test_slurm import DDP, SCRIPT
from tests.support.cli import fresh
from tests.support.data import chat, write_jsonl
from tests.unit.test_columns import KTO, write
from tests.unit.test_data_layout import jsonl, put, rows
from tests.unit.test_data_mixture import alpaca, chats

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    from hydratune.components.text.tokenizer import build_tokenizer

    return build_tokenizer(str(REPO / "components" / "assets" / "tiny"))


def test_plan_reads_the_data_as_training_would(hydratune, tmp_path: Path) -> None:
    good = write_jsonl(tmp_path / "good.jsonl", [chat(f"{i}+1?", str(i + 1)) for i in range(20)])
    bad = write_jsonl(tmp_path / "bad.jsonl", [chat("1+1?", "2"), {"messages": [{"role": "user"}]}])
    long = write_jsonl(tmp_path / "long.jsonl", [chat("1+1?", "2"), chat("x " * 400, "3")] * 3)

    ok = hydratune("mode=plan", "data=jsonl_messages", f"data.path={good}", cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert "# data: train rows: 19" in ok.stdout and "# data: eval rows: 1" in ok.stdout

    broken = hydratune("mode=plan", "data=jsonl_messages", f"data.path={bad}", cwd=tmp_path)
    assert broken.returncode == 2
    assert f"{bad}:2 (row 2)" in broken.stderr and "checks passed" not in broken.stdout
    assert "Traceback" not in broken.stderr

    overlong = hydratune(
        "mode=plan",
        "data=jsonl_messages",
        f"data.path={long}",
        "data.max_length=64",
        "data.on_overlong=error",
        cwd=tmp_path,
    )
    assert overlong.returncode == 2
    assert "[data.max_length]" in overlong.stderr and "tokens > data.max_length=64" in overlong.stderr


def test_plan_checks_the_chat_template_as_training_would(hydratune, tmp_path: Path) -> None:
    """A template hydratune cannot mask (its generation prompt is not what the history renders) fails in
    plan mode, exit 2, as the training run would before its model loads; its fixed form passes."""
    from hydratune.components.text.chat_template import CHATML

    broken = tmp_path / "r1_like.jinja"
    broken.write_text(
        CHATML.replace(
            "'<|im_start|>assistant\\n' }}{% endif %}", "'<|im_start|>assistant\\n<think>\\n' }}{% endif %}"
        )
    )
    assert broken.read_text() != CHATML
    proc = hydratune("mode=plan", f"model.chat_template={broken}", cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout[-500:]
    assert "[model.chat_template]" in proc.stderr and "not prefix-preserving" in proc.stderr
    ok = hydratune("mode=plan", "model.chat_template=chatml", cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr


def test_plan_of_a_hub_model_checks_rows_and_says_what_it_skipped(hydratune, tmp_path: Path) -> None:
    proc = hydratune("mode=plan", "model=qwen2_5_0_5b", cwd=tmp_path)  # HF_HUB_OFFLINE=1 (child_env)
    assert proc.returncode == 0, proc.stderr
    assert "# data: train rows: 936" in proc.stdout
    assert "# data: token lengths not checked: 'Qwen/Qwen2.5-0.5B'" in proc.stdout


@pytest.mark.parametrize(
    ("env", "why"),
    [
        ({"HF_HUB_OFFLINE": "1"}, "offline mode is on (HF_HUB_OFFLINE)"),
        ({"HF_HUB_OFFLINE": "0", "HF_ENDPOINT": "http://127.0.0.1:9"}, "the hub is unreachable"),
    ],
)
def test_uncached_unreachable_hub_id_fails_once_before_anything(
    tmp_path: Path, env: dict[str, str], why: str
) -> None:
    home = {"HF_HOME": str(tmp_path / "hf")}  # an empty cache
    # a new interpreter: huggingface_hub reads HF_HOME / HF_HUB_OFFLINE / HF_ENDPOINT as it is imported
    proc = fresh("model=qwen2_5_0_5b", "train.max_steps=1", cwd=tmp_path, env={**env, **home})
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if line.startswith("hydratune: error")]
    assert len(errors) == 1, proc.stderr
    assert "[model.name_or_path] 'Qwen/Qwen2.5-0.5B' is not a local directory" in errors[0]
    assert why in errors[0]
    assert "Retrying" not in proc.stderr and "tokenizer" not in proc.stderr
    assert not list(tmp_path.rglob("versions.json"))  # nothing of the run was started


def test_plan_stops_on_unpaired_feedback_and_lists_the_columns(hydratune, tmp_path: Path) -> None:
    path = write(tmp_path / "kto.jsonl", [{**r, "id": i} for i, r in enumerate(KTO * 4)])
    stopped = hydratune("mode=plan", "data=jsonl_messages", f"data.path={path}", cwd=tmp_path)
    assert stopped.returncode == 2 and "Traceback" not in stopped.stderr
    assert "[data.ignore_columns]" in stopped.stderr and "recipe=kto" in stopped.stderr
    ok = hydratune(
        "mode=plan", "data=jsonl_messages", f"data.path={path}", "data.ignore_columns=[label]", cwd=tmp_path
    )
    assert ok.returncode == 0, ok.stderr
    assert "# data: columns used: prompt, completion" in ok.stdout
    assert "# data: columns ignored: label (data.ignore_columns), id" in ok.stdout


def test_the_readme_form_of_data_columns_on_the_cli(hydratune, tmp_path: Path) -> None:
    turns = [[{"from": "human", "value": f"q{i}"}, {"from": "gpt", "value": f"a{i}"}] for i in range(20)]
    path = write_jsonl(tmp_path / "sharegpt.jsonl", [{"conversations": t} for t in turns])
    proc = hydratune(
        "mode=plan",
        "data=jsonl_messages",
        f"data.path={path}",
        "data.columns={messages: conversations}",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "checks passed" in proc.stdout and "not in struct" not in proc.stdout + proc.stderr


def test_plan_reports_which_files_train_which_evaluate_and_which_are_not_read(
    hydratune, tmp_path: Path
) -> None:
    folder = tmp_path / "hub"
    put(folder, "data/train.jsonl", jsonl(rows("train", 8)))
    put(folder, "data/test.jsonl", jsonl(rows("test", 2)))
    put(folder, "LICENSE", b"MIT\n")
    proc = hydratune("mode=plan", "data=jsonl_messages", f"data.path={folder}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "# data: train rows: 8" in proc.stdout and "# data: eval rows: 2" in proc.stdout
    assert "# data: train files: data/train.jsonl (splits from file names)" in proc.stdout
    assert "# data: eval files: data/test.jsonl" in proc.stdout
    assert "# data: files not read: LICENSE (not a data file type)" in proc.stdout


def test_the_command_line_mixture_in_mode_plan(hydratune, tmp_path: Path) -> None:
    a, b = alpaca(tmp_path, 20), chats(tmp_path, 40)
    mixture = f"data.mixture=[{{path: {a}, weight: 0.7}},{{path: {b}, rows: 10, eval_fraction: 0.1}}]"
    done = hydratune("mode=plan", "data=jsonl_messages", mixture, cwd=tmp_path)  # data.path left unset
    assert done.returncode == 0, done.stderr
    assert f"# data: data.mixture[0] {a}: 13 of 19 train rows (weight 0.7)" in done.stdout  # 5%: 1 held out
    assert f"# data: data.mixture[1] {b}: 10 of 36 train rows (rows=10), 4 eval rows" in done.stdout
    assert "# data: train rows: 23" in done.stdout
    bad = hydratune(
        "mode=plan", "data=jsonl_messages", f"data.mixture=[{{path: {a}, weight: 0.7, lr: 1}}]", cwd=tmp_path
    )
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "[data.mixture[0].lr] unknown key 'lr'" in bad.stderr


def test_plan_prints_the_job_script_and_writes_none(hydratune, tmp_path: Path) -> None:
    proc = hydratune(*SCRIPT, "launcher.nproc_per_node=2", *DDP, "mode=plan", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "checks passed" in proc.stdout and "#SBATCH --ntasks-per-node=2" in proc.stdout
    assert not list(tmp_path.glob("outputs/*/*/slurm.sbatch"))
