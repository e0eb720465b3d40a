"""After training, through the command: `hydratune export`, recipe=generate's output file, recipe=eval's
refusals, and `hydratune chat` on a pseudo-terminal."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hydratune.components.config.errors import ConfigError
from hydratune.components.modeling.trained import TrainedRun
from tests.integration.test_after_training import EVAL
from tests.support.cli import Warm
from tests.support.data import ASSETS
from tests.support.runs import read_jsonl


def yaml_task(name: str, data_files: dict[str, str]) -> str:
    return json.dumps(
        {
            "task": name,
            "dataset_path": "json",
            "dataset_kwargs": {"data_files": data_files},
            "output_type": "generate_until",
            "test_split": "test",
            "doc_to_text": "{{ question }}",
            "doc_to_target": "{{ answer }}",
            "metric_list": [{"metric": "exact_match"}],
        }
    )


def _run_eval(compose_cfg, root: Path, *overrides: str) -> None:
    from tests.conftest import _run_in

    _run_in(root, compose_cfg, *EVAL, *overrides, name="eval_refused")


def test_export_cli_writes_the_folder_and_names_errors_with_exit_2(hydratune, sft_runs, tmp_path) -> None:
    out = tmp_path / "cli"
    ok = hydratune("export", str(sft_runs["full"]), f"out={out}", "dtype=bfloat16", cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr[-2000:]
    config = json.loads((out / "config.json").read_text())
    assert config.get("dtype", config.get("torch_dtype")) == "bfloat16"
    bad = hydratune("export", str(tmp_path / "nope"), cwd=tmp_path)
    assert bad.returncode == 2 and "[export]" in bad.stderr and "Traceback" not in bad.stderr


def test_generate_writes_every_prompt_in_input_order_with_tokens_and_finish_reasons(
    sft_runs, greedy_one_process
) -> None:
    from transformers import AutoTokenizer

    prompts = read_jsonl(ASSETS / "demo/prompts_eval.jsonl")
    out = greedy_one_process
    assert [r["index"] for r in out] == list(range(len(prompts)))  # batches were sorted by length: undone
    assert [r["prompt"] for r in out] == [p["prompt"][-1]["content"] for p in prompts]
    assert [r["reference"] for r in out] == [p["answer"] for p in prompts]
    tok = AutoTokenizer.from_pretrained(sft_runs["full"] / "final")
    for r in out:
        assert 1 <= r["tokens"] <= 6
        assert r["finish_reason"] in ("stop", "length")
        if r["finish_reason"] == "length":  # cut: exactly max_new_tokens, none of them a stop token
            assert r["tokens"] == 6
        assert r["completion"] == tok.decode(tok(r["completion"], add_special_tokens=False)["input_ids"])


def test_eval_refuses_what_it_cannot_do_before_load(
    hydratune, compose_cfg, sft_runs, tmp_path, monkeypatch
) -> None:
    import importlib.util

    from hydratune.components.model import CausalLM
    from hydratune.components.runtime.checks import check_before_load
    from hydratune.components.runtime.run import Components

    def no_load(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(CausalLM, "build", no_load)
    monkeypatch.setattr(TrainedRun, "load", no_load)
    cases = [
        (["recipe.tasks=[hydratune_prompt]"], "recipe.tasks", "close: hydratune_prompts"),
        (["recipe.include_path=/nonexistent/tasks"], "recipe.include_path", "not a folder"),
        (["recipe.tasks=[]"], "recipe.tasks", "no task"),
        (["recipe.limit=0"], "recipe.limit", "> 0"),
        (["peft=lora"], "peft", "trains nothing"),
        (["launcher.nproc_per_node=2"], "launcher.nproc_per_node", "one process"),
        (["strategy=zero3"], "strategy", "one whole model"),
        (["data=demo_dpo"], "data", "prompt/answer rows"),
    ]
    for overrides, key, needle in cases:
        cfg = compose_cfg(*EVAL, f"model.from_run={sft_runs['full']}", *overrides)
        with pytest.raises(ConfigError) as err:
            check_before_load(cfg, Components.from_config(cfg))
        assert err.value.key == key and needle in str(err.value), str(err.value)
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "lm_eval" else find_spec(n, *a)
    )
    cfg = compose_cfg(*EVAL)
    with pytest.raises(ConfigError, match=r'pip install "hydratune\[lm-eval\]"') as err:
        check_before_load(cfg, Components.from_config(cfg))
    assert err.value.key == "recipe"
    monkeypatch.undo()
    # a task whose data cannot be had fails when the tasks are built, still before any weight is read
    (tmp_path / "tasks").mkdir()
    task = yaml_task("mine", {"test": str(tmp_path / "missing.jsonl")})
    (tmp_path / "tasks" / "mine.yaml").write_text(task)
    monkeypatch.setattr(CausalLM, "build", no_load)
    with pytest.raises(ConfigError) as err:
        _run_eval(compose_cfg, tmp_path, "recipe.tasks=[mine]", f"recipe.include_path={tmp_path / 'tasks'}")
    assert err.value.key == "recipe.tasks" and "missing.jsonl" in str(err.value)
    (tmp_path / "cli").mkdir()
    bad = hydratune(*EVAL, "recipe.include_path=/nonexistent/tasks", cwd=tmp_path / "cli")
    assert bad.returncode == 2 and "[recipe.include_path]" in bad.stderr and "Traceback" not in bad.stderr
    assert not (tmp_path / "cli" / "outputs").exists(), "the refused run left its run dir behind"


# ---- hydratune chat -------------------------------------------------------------------------------------
class Terminal:
    """``hydratune chat`` on a pseudo-terminal: type a line, read what the screen shows until a marker. The
    command is forked from the warm server (``hydratune``), the terminal its stdin, stdout and stderr: how it
    starts is not the point."""

    def __init__(self, hydratune: Warm, *args: str, cwd: Path) -> None:
        import os
        import pty

        # the slave stays open here until the command ends: the forked command opens it by name, and a master
        # read while no slave is open fails with EIO (a race CI lost once)
        self.master, self.slave = pty.openpty()
        self.proc = hydratune.start("chat", *args, cwd=cwd, tty=os.ttyname(self.slave))
        self.screen = ""

    def read_until(self, marker: str, timeout: float = 120.0) -> str:
        import os
        import select
        import time

        start, seen = time.monotonic(), len(self.screen)
        while marker not in self.screen[seen:]:
            assert time.monotonic() - start < timeout, f"no {marker!r} on screen:\n{self.screen[-2000:]}"
            ready, _, _ = select.select([self.master], [], [], 1.0)
            if ready:
                self.screen += os.read(self.master, 4096).decode(errors="replace").replace("\r\n", "\n")
        shown = self.screen[seen:]
        return shown[: shown.index(marker)]

    def type(self, line: str) -> None:
        import os

        os.write(self.master, (line + "\n").encode())

    def wait(self, timeout: float = 30.0) -> int:
        """The command's exit code, once it has ended; the terminal closed."""
        import os

        try:
            self.proc.communicate(timeout=timeout)
        finally:
            os.close(self.slave)
            os.close(self.master)
        return self.proc.returncode


def test_chat_streams_answers_keeps_the_conversation_and_resets(hydratune, partial_sft, tmp_path) -> None:
    """On the session's partly trained demo model (it answers sums): what the terminal shows is the greedy
    answer under the chat template saved with the model."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hydratune.components.text.masking import stop_token_ids

    final = partial_sft / "final"
    term = Terminal(hydratune, str(final), "temperature=0", "max_new_tokens=8", "system=Add.", cwd=tmp_path)
    term.read_until("you> ")
    term.type("What is 12 + 30?")
    first = term.read_until("you> ")
    term.type("What is 4 + 4?")
    term.read_until("you> ")
    term.type("/history")
    history = term.read_until("you> ")
    term.type("/reset")
    assert "(conversation cleared)" in term.read_until("you> ")
    term.type("/history")
    assert "(0 turns)" in term.read_until("you> ")
    term.type("/exit")
    assert term.wait() == 0
    tok, model = AutoTokenizer.from_pretrained(final), AutoModelForCausalLM.from_pretrained(final)
    messages = [{"role": "system", "content": "Add."}, {"role": "user", "content": "What is 12 + 30?"}]
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = model.generate(
        **ids,
        max_new_tokens=8,
        do_sample=False,
        eos_token_id=sorted(stop_token_ids(tok)),
        pad_token_id=tok.pad_token_id,
    )
    expected = tok.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True).strip()
    assert expected and first.split("assistant> ", 1)[1].strip() == expected
    assert (
        "(4 turns)" in history and "user: What is 12 + 30?" in history and "user: What is 4 + 4?" in history
    )
    assert "system: Add." in history


def test_chat_refuses_a_bad_path_before_loading(hydratune, tmp_path) -> None:
    bad = hydratune("chat", str(tmp_path), cwd=tmp_path)
    assert bad.returncode == 2 and "[chat]" in bad.stderr and "Traceback" not in bad.stderr
