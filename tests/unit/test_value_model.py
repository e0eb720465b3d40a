"""``recipe.value_model=adapter`` (issue 48) refused before load where a critic adapter cannot sit beside the
policy's, naming the key and the fix; the plan says where the value function is."""

from __future__ import annotations

import pytest


def test_the_critic_adapter_is_refused_before_load_where_it_cannot_sit(compose_cfg) -> None:
    from hydratune.components.config.errors import ConfigError
    from hydratune.components.runtime.checks import check_before_load
    from hydratune.components.runtime.run import Components

    for overrides, said in (
        ([], "needs peft=lora"),
        (["peft=lora", "peft.bias=all"], "peft.bias"),
        (["peft=lora", "strategy=zero3"], "shards the base"),
        (["peft=lora", "strategy=fsdp"], "shards the base"),
    ):
        cfg = compose_cfg("recipe=ppo", "recipe.value_model=adapter", *overrides)
        with pytest.raises(ConfigError) as info:
            check_before_load(cfg, Components.from_config(cfg))
        assert info.value.key == "recipe.value_model" and said in str(info.value), overrides
    cfg = compose_cfg("recipe=ppo", "recipe.value_model=adapter", "peft=lora")
    comps = Components.from_config(cfg)
    check_before_load(cfg, comps)
    assert comps.recipe.plan_lines(cfg, comps) == [
        "# ppo: value model: a value LoRA adapter + value head on the policy's own base (no second copy)"
    ]


def test_the_estimate_counts_a_critic_adapter_and_head_instead_of_a_critic_copy(compose_cfg) -> None:
    """The value row: a head's hidden + 1 or an adapter's (the policy's LoRA shape) + a head's parameters in
    fp32 with their gradients and Adam moments (16 B each), a separate critic's whole model trained; the
    critic's own forward's activations beside the policy's."""
    from hydratune.components.memory.arch import param_counts
    from hydratune.components.memory.estimate import estimate
    from hydratune.components.memory.spec import spec_from_config
    from hydratune.components.runtime.run import Components

    common = ["recipe=ppo", "peft=lora", "precision=bf16"]
    rows = {}
    for kind in ("head", "adapter", "separate"):
        cfg = compose_cfg(*common, f"recipe.value_model={kind}")
        rows[kind] = estimate(spec_from_config(cfg))
    spec = rows["head"].spec
    head, lora = spec.arch.hidden_size + 1, spec.trainable
    peft = Components.from_config(compose_cfg(*common)).peft
    assert lora == peft.trainable_params(spec.arch) > 0
    assert rows["head"].row("value model (trained)") == head * 16
    assert rows["adapter"].row("value model (trained)") == (lora + head) * 16
    whole, w = param_counts(spec.arch).total, spec.weight_bytes
    assert rows["separate"].row("value model (trained)") == whole * (w + w + 2 * w)  # AdamW's two moments
    # the critic adapter's forward is a second pass over the base: its activations are the policy's; a head
    # reads the policy's own hidden states
    act = rows["adapter"].row("activations")
    assert rows["adapter"].row("value model activations") == act > 0
    assert rows["head"].row("value model activations") == 0 < rows["separate"].row("value model activations")
    assert rows["adapter"].total - rows["head"].total == pytest.approx(
        (lora * 16 + act) * 1.05
    )  # + fragmentation
    assert rows["adapter"].row("value model (trained)") < rows["separate"].row("value model (trained)")
    sft = estimate(spec_from_config(compose_cfg("peft=lora", "precision=bf16")))
    assert sft.row("value model (trained)") == 0  # nothing for a recipe without a value function
