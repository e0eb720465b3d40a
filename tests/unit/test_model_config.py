"""``CausalLM.load_config`` and ``module_names`` read a model once a process (the pre-load checks ask a
dozen times a run), hand out copies, and read again when config.json changes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from hydratune.components.model import CausalLM
from tests.support.data import TINY


def test_a_config_is_read_once_handed_out_as_a_copy_and_read_again_when_it_changes(tmp_path: Path) -> None:
    model_dir = tmp_path / "model"
    shutil.copytree(TINY, model_dir)
    model = CausalLM(name_or_path=str(model_dir))
    first, second = model.load_config(), model.load_config()
    assert first is not second and first.to_dict() == second.to_dict()
    first.num_hidden_layers = 99  # a caller's change stays its own
    assert model.load_config().num_hidden_layers != 99
    layers = len([n for n in model.module_names() if n.endswith("self_attn")])
    assert layers == second.num_hidden_layers

    config = json.loads((model_dir / "config.json").read_text())
    config["num_hidden_layers"] += 1  # an edited config.json (another size): read again
    (model_dir / "config.json").write_text(json.dumps(config, indent=1))
    assert model.load_config().num_hidden_layers == second.num_hidden_layers + 1
    assert len([n for n in model.module_names() if n.endswith("self_attn")]) == layers + 1
    # the YAML's numbers are part of what is read
    fewer = CausalLM(name_or_path=str(model_dir), architecture={"num_hidden_layers": 1})
    assert fewer.load_config().num_hidden_layers == 1 and model.load_config().num_hidden_layers == layers + 1
