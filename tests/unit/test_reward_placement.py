"""Where a LoRA reward run loads for PPO (components/reward_placement.py, issue 48), decided before load:
under an engine that shards the base (ZeRO-3, FSDP) never on the policy's base, and the plan says why; where
ranks hold whole replicas (DDP, ZeRO-2) the sharding is no reason (the bases' digests decide)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest


@pytest.mark.parametrize(
    ("strategy", "sharded"),
    [("zero3", True), ("zero3_offload", True), ("fsdp", True), ("ddp", False), ("zero2", False)],
)
def test_a_sharded_base_never_carries_the_reward_adapter(
    compose_cfg, tmp_path: Path, monkeypatch, strategy: str, sharded: bool
) -> None:
    from hydratune.components import rewards
    from hydratune.components.reward_placement import placement
    from hydratune.components.runtime.run import Components

    final = tmp_path / "rm" / "final"
    final.mkdir(parents=True)
    (final / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA"}))
    cfg = compose_cfg("recipe=ppo", "peft=lora", f"strategy={strategy}")
    comps = Components.from_config(cfg)
    # a LoRA reward run whose base is the policy's own model component (the demo's random init: no files)
    run = SimpleNamespace(final=final, quantized=False, base_component=lambda: comps.model)
    monkeypatch.setattr(rewards, "adapter_run", lambda path, key="recipe.reward.model": run)
    placed = placement(str(tmp_path / "rm"), comps)
    assert not placed.shared
    if sharded:
        assert (
            placed.why
            == f"under {comps.strategy.label} the base is sharded and its adapters are not switched there; "
            "strategy=zero2 or ddp shares it"
        )  # the fix named
        assert f"a separate model (under {comps.strategy.label} the base is sharded" in placed.describe("rm")
    else:  # past the sharding rule: the bases' weight files decide (a random init has none)
        assert "has no weight files on disk" in placed.why, placed.why
