"""What a run does with its data before the model loads: eval prompts under the length policy, ``mode=plan``
reading the data as training would, and hub ids that are neither cached nor reachable."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from components.config.errors import ConfigError
from components.generation.evaluation import eval_prompts

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    from components.text.tokenizer import build_tokenizer

    return build_tokenizer(str(REPO / "components" / "assets" / "tiny"))


def chat(question: str, answer: str = "4") -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]}


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_overlong_eval_prompts_are_truncated_to_their_end_dropped_or_named(tokenizer: Any) -> None:
    short = ([{"role": "user", "content": "2+2?"}], "4")
    long = ([{"role": "user", "content": "tell me " * 400 + "2+3?"}], "5")
    full = tokenizer.apply_chat_template(long[0], tokenize=False, add_generation_prompt=True)
    full_ids = tokenizer(full, add_special_tokens=False)["input_ids"]
    assert len(full_ids) > 200

    kept, counts = eval_prompts([short, long], tokenizer, max_length=64, on_overlong="truncate")
    assert [len(p.ids) <= 64 for p in kept] == [True, True]
    assert kept[1].ids == full_ids[-64:]  # the end survives: the question and the generation prompt
    assert (kept[0].truncated, kept[1].truncated) == (False, True)
    assert counts == {"eval prompts truncated": 1}

    kept, counts = eval_prompts([short, long], tokenizer, max_length=64, on_overlong="drop")
    assert [p.answer for p in kept] == ["4"]
    assert counts == {"eval prompts dropped (too long)": 1}

    with pytest.raises(ConfigError, match=r"eval prompt 1 has \d+ tokens > data.max_length=64") as err:
        eval_prompts([short, long], tokenizer, max_length=64, on_overlong="error")
    assert err.value.key == "data.max_length"


def test_session_tokenizes_eval_prompts_within_max_length_before_any_model(
    compose_cfg: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 3,000-token eval row with data.max_length=96 (truncate): the prompt the model will see is cut
    while the data loads, and no model has been built at that point."""
    from components.model import CausalLM
    from components.runtime.checks import check_before_load
    from components.runtime.run import Components, RunContext
    from components.runtime.rundir import RunDir
    from components.runtime.session import Session

    train = write_jsonl(tmp_path / "train.jsonl", [chat(f"{i}+1?", str(i + 1)) for i in range(8)])
    evals = write_jsonl(tmp_path / "eval.jsonl", [chat("1+1?", "2"), chat("x " * 3000 + "1+2?", "3")])
    cfg = compose_cfg(
        "data=jsonl_messages", f"data.path={train}", f"data.eval_path={evals}", "data.max_length=96"
    )
    comps = Components.from_config(cfg)
    device = check_before_load(cfg, comps)
    monkeypatch.setattr(CausalLM, "build", lambda *a, **k: pytest.fail("a model was built"))
    session = Session.start(RunContext(cfg, comps, RunDir(tmp_path / "run"), device))
    session.load_data()
    assert [len(p.ids) <= 96 for p in session.eval_prompts] == [True, True]
    assert [p.truncated for p in session.eval_prompts] == [False, True]
    assert session.report["data"]["eval prompts truncated"] == 1


def hydratune(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "recipes", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
    )


def test_plan_reads_the_data_as_training_would(tmp_path: Path) -> None:
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


def test_plan_checks_the_chat_template_as_training_would(tmp_path: Path) -> None:
    """A template hydratune cannot mask (its generation prompt is not what the history renders) fails in
    plan mode, exit 2, as the training run would before its model loads; its fixed form passes."""
    from components.text.chat_template import CHATML

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


def test_plan_of_a_hub_model_checks_rows_and_says_what_it_skipped(tmp_path: Path) -> None:
    proc = hydratune("mode=plan", "model=qwen2_5_0_5b", cwd=tmp_path, env={"HF_HUB_OFFLINE": "1"})
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
    proc = hydratune("model=qwen2_5_0_5b", "train.max_steps=1", cwd=tmp_path, env={**env, **home})
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if line.startswith("hydratune: error")]
    assert len(errors) == 1, proc.stderr
    assert "[model.name_or_path] 'Qwen/Qwen2.5-0.5B' is not a local directory" in errors[0]
    assert why in errors[0]
    assert "Retrying" not in proc.stderr and "tokenizer" not in proc.stderr
    assert not list(tmp_path.rglob("versions.json"))  # nothing of the run was started


def test_a_cached_hub_id_passes_without_the_network(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from components.modeling import hub

    monkeypatch.setattr(hub, "is_cached", lambda name, filename, revision=None: True)
    monkeypatch.setattr(hub, "probe", lambda *a: pytest.fail("probed the hub for a cached id"))
    hub.check_available("Qwen/Qwen2.5-0.5B", key="model.name_or_path", filename="config.json")
