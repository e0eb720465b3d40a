"""The chunked head's per-token statistics (components/runtime/fused_head.py, ChunkedTokenStats) against
the full logits: log-probs and their gradients, entropy, mean logit, top-1; and what DPO's plan says of its
head (recipe.loss_impl, the fallbacks to TRL's head)."""

from __future__ import annotations

import pytest
import torch

from hydratune.components.runtime.fused_head import ChunkedTokenStats


def test_per_token_statistics_equal_the_full_logits() -> None:
    g = torch.Generator().manual_seed(0)
    h = torch.randn(13, 8, generator=g).requires_grad_()
    head = torch.nn.Linear(8, 40)
    targets = torch.randint(0, 40, (13,), generator=g)
    targets[3] = int((h[3:4] @ head.weight.t() + head.bias).argmax())  # at least one top-1
    logits = head(h).float()
    lp = torch.log_softmax(logits, -1)
    want = lp.gather(1, targets[:, None]).squeeze(1)
    got, stats = ChunkedTokenStats.apply(h, head.weight, head.bias, targets, 5, True)
    assert torch.allclose(got, want, atol=1e-5)
    assert torch.allclose(stats[:, 0], -(lp.exp() * lp).sum(-1), atol=1e-5)  # entropy
    assert torch.allclose(stats[:, 1], logits.mean(-1), atol=1e-6)
    assert torch.equal(stats[:, 2].bool(), logits.argmax(-1) == targets) and bool(stats[3, 2])
    weights = torch.rand(13, generator=g)  # a per-sequence sum's gradient reaches each token
    for a, b in zip(
        torch.autograd.grad((got * weights).sum(), [h, head.weight, head.bias]),
        torch.autograd.grad((want * weights).sum(), [h, head.weight, head.bias]),
        strict=True,
    ):
        assert torch.allclose(a, b, atol=1e-5)
    plain, none = ChunkedTokenStats.apply(h, head.weight, head.bias, targets, 5, False)
    assert torch.allclose(plain, got, atol=1e-6) and none.shape == (0, 3)  # off a log step: no statistics


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        ((), "TRL's fused LM head (recipe.loss_impl=trl)"),
        (("recipe.loss_impl=chunked",), "chunked LM head over the completion tokens"),
        (("recipe.loss_impl=chunked", "strategy=zero3"), "shards the LM head"),
        (("recipe.loss_impl=chunked", "model=gemma2_2b"), "final_logit_softcapping"),
    ],
)
def test_dpos_plan_names_the_head_its_log_probs_go_through(compose_cfg, overrides: tuple, says: str) -> None:
    from hydratune.components.runtime.run import Components

    comps = Components.from_config(compose_cfg("recipe=dpo", *overrides))
    assert says in comps.recipe.plan_lines(None, comps)[0]


def test_an_unknown_dpo_loss_impl_is_refused_naming_the_key(compose_cfg) -> None:
    from hydratune.components.config.errors import ConfigError
    from hydratune.components.runtime.run import Components

    comps = Components.from_config(compose_cfg("recipe=dpo", "recipe.loss_impl=fused"))
    with pytest.raises(ConfigError) as err:
        comps.recipe.check(None, comps)
    assert err.value.key == "recipe.loss_impl"
