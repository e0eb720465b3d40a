"""A refusal's fix must fix (issue 49): each hint below is applied as the user would (its ``key=value``
words after the others, each alternative alone), and the checks ``mode=plan`` runs then pass. In process,
no model loaded: ``check_before_load`` with the device plan plans for."""

from __future__ import annotations

import re
from typing import Any

import pytest

from hydratune.components.config.errors import ConfigError
from hydratune.components.runtime.checks import check_before_load
from hydratune.components.runtime.run import Components
from hydratune.recipes.cli import plan_device

#: (what the user asked, the key refused): LoRA under tensor parallel with and without pipeline stages,
#: under an option that cannot train sequence parallel instead, and expert parallel on single / ddp
REFUSED = {
    "lora tp zero1": (
        ["peft=lora", "strategy=zero1", "strategy.tp_size=2", "launcher.nproc_per_node=2"],
        "peft",
    ),
    "lora tp zero3": (
        ["peft=lora", "strategy=zero3", "strategy.tp_size=2", "launcher.nproc_per_node=2"],
        "peft",
    ),
    "lora pp x tp": (
        [
            "peft=lora",
            "strategy=pipeline",
            "strategy.pp_size=2",
            "strategy.tp_size=2",
            "launcher.nproc_per_node=4",
        ],
        "peft",
    ),
    "ep single": (["model=tiny_moe", "strategy=single", "strategy.ep_size=2"], "strategy.ep_size"),
    "ep ddp": (
        ["model=tiny_moe", "strategy=ddp", "strategy.ep_size=2", "launcher.nproc_per_node=2"],
        "strategy.ep_size",
    ),
}
WORD = re.compile(r"(?<![\w.+])\+{0,2}[a-z_]+(?:\.[a-z_]+)*=[\w.]+")


def plan_checks(compose_cfg: Any, overrides: list[str]) -> None:
    cfg = compose_cfg("recipe=sft", "mode=plan", *overrides)
    comps = Components.from_config(cfg)
    check_before_load(cfg, comps, plan_device(cfg, comps))


@pytest.mark.parametrize("case", REFUSED)
def test_each_alternative_of_the_hint_passes_the_plan_checks(compose_cfg: Any, case: str) -> None:
    asked, key = REFUSED[case]
    with pytest.raises(ConfigError) as info:
        plan_checks(compose_cfg, asked)
    assert info.value.key == key, str(info.value)
    alternatives = [WORD.findall(alt) for alt in (info.value.hint or "").split(", or ")]
    assert len(alternatives) == 2 and all(alternatives), info.value.hint
    for words in alternatives:
        assert not any(w.startswith("+") for w in words), info.value.hint  # the knobs exist: no + needed
        plan_checks(compose_cfg, [*asked, *words])  # passes
