"""``Recipe.check_data`` runs in training as in ``mode=plan``, for every recipe, on the rows it read and
before any model loads: ``Session.load_data`` calls it (training recipes), and so does the inference
recipes' own loading (``components/runtime/inference.py``). Here recipes that never called it themselves
get a check that refuses their rows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hydratune.components.config.errors import ConfigError
from tests.support.cli import in_process


@pytest.mark.parametrize("recipe", ["sft", "dpo", "orpo", "generate"])
def test_training_runs_the_recipes_data_check_before_any_model_loads(
    recipe: str, tmp_path: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hydratune.components.config.registry import RECIPES
    from hydratune.components.model import CausalLM

    seen: list[tuple[str, int, bool]] = []

    def check_data(self: Any, comps: Any, splits: Any, tokenizer: Any) -> None:
        seen.append((self.name, len(splits["train"]), tokenizer is not None))
        raise ConfigError("planted: these rows fail the recipe's own check", key="data")

    def no_model(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a model was built before the recipe's data check")

    monkeypatch.setattr(RECIPES[recipe], "check_data", check_data)
    monkeypatch.setattr(CausalLM, "build", no_model)
    with pytest.raises(SystemExit) as exit_:
        in_process(f"recipe={recipe}", "train.max_steps=1", f"hydra.run.dir={tmp_path / 'run'}")
    err = capsys.readouterr().err
    assert exit_.value.code == 2, err[-2000:]
    assert "planted: these rows fail the recipe's own check" in err
    assert len(seen) == 1 and seen[0][0] == recipe and seen[0][1] > 0 and seen[0][2], seen
