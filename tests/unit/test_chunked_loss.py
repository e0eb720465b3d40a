"""hydratune's chunked LM head + cross-entropy (components/runtime/lm_loss.py) against ``F.cross_entropy`` on
the full logits: the loss, its gradients (hidden states, head weight and bias), the metrics TRL logs, and
the choice of loss per setup (recipe.loss_impl, the fallbacks to TRL's head)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hydratune.components.runtime.lm_loss import token_log_probs


def batch(seed: int, rows: int = 3, length: int = 17, hidden: int = 8, vocab: int = 50, bias: bool = True):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(rows, length, hidden, generator=g, dtype=torch.float64)
    head = torch.nn.Linear(hidden, vocab, bias=bias, dtype=torch.float64)
    with torch.no_grad():
        head.weight.copy_(torch.randn(vocab, hidden, generator=g))
        if bias:
            head.bias.copy_(torch.randn(vocab, generator=g))
    labels = torch.randint(0, vocab, (rows, length), generator=g)
    labels[torch.rand(rows, length, generator=g) < 0.3] = -100  # prompt / padding positions
    labels[0, :5] = -100
    return h.float().requires_grad_(), head.float(), labels


def reference(h: torch.Tensor, head: torch.nn.Linear, labels: torch.Tensor) -> torch.Tensor:
    """transformers' causal-LM loss: full logits, shifted, summed over the labelled positions."""
    logits = head(h).float()[:, :-1]
    targets = labels[:, 1:].reshape(-1)
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets, ignore_index=-100, reduction="sum")


def grads(loss: torch.Tensor, h: torch.Tensor, head: torch.nn.Linear) -> list[torch.Tensor]:
    return list(torch.autograd.grad(loss, [h, head.weight, head.bias]))


@pytest.mark.parametrize("chunk", [1, 5, 16, 1000])
def test_loss_and_gradients_equal_cross_entropy_on_full_logits(chunk: int) -> None:
    h, head, labels = batch(chunk)
    want = reference(h, head, labels)
    want_g = grads(want, h, head)
    out = token_log_probs(h, labels, head, chunk=chunk)
    got = -out["log_probs"].sum()
    assert int(out["num_valid"]) == int((labels[:, 1:] != -100).sum())
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-6), (got, want)
    for a, b in zip(grads(got, h, head), want_g, strict=True):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-5)


def test_the_forward_forms_gradients_only_when_they_are_wanted(monkeypatch) -> None:
    """The forward's gradients (the backward then only scales them) are formed under grad mode alone: an
    eval batch under ``torch.no_grad`` pays for the loss only; the gradients equal the recomputed ones."""
    from hydratune.components.runtime import lm_loss

    added = []
    real_add = lm_loss._UnitGrads.add
    monkeypatch.setattr(lm_loss._UnitGrads, "add", lambda self, *a: added.append(1) or real_add(self, *a))
    h, head, labels = batch(3)
    with torch.no_grad():
        token_log_probs(h, labels, head, chunk=5)
    assert added == []
    got = -token_log_probs(h, labels, head, chunk=5)["log_probs"].mean()
    assert added
    want = reference(h, head, labels) / int((labels[:, 1:] != -100).sum())
    for a, b in zip(grads(got, h, head), grads(want, h, head), strict=True):
        assert torch.allclose(a, b, atol=1e-6, rtol=1e-5)


def test_a_weighted_loss_backpropagates_per_token_weights() -> None:
    """loss_type=dft weights each token's loss by its probability: the per-token gradient path."""
    h, head, labels = batch(7, bias=False)
    logits = head(h).float()[:, :-1]
    lp = torch.log_softmax(logits, -1)
    shifted = labels[:, 1:]
    mask = shifted != -100
    want_lp = lp[mask].gather(1, shifted[mask][:, None]).squeeze(1)
    want = -(want_lp * want_lp.exp().detach()).sum()
    gw = torch.autograd.grad(want, [h, head.weight])
    got_lp = token_log_probs(h, labels, head, chunk=4)["log_probs"]
    got = -(got_lp * got_lp.exp().detach()).sum()
    assert torch.allclose(got, want, atol=1e-5)
    for a, b in zip(torch.autograd.grad(got, [h, head.weight]), gw, strict=True):
        assert torch.allclose(a, b, atol=1e-5)


def test_metrics_are_trls_entropy_and_top1_over_the_labelled_positions() -> None:
    h, head, labels = batch(3)
    logits = head(h).float()[:, :-1]
    mask = labels[:, 1:] != -100
    p = torch.softmax(logits, -1)
    entropy = -(p * torch.log_softmax(logits, -1)).sum(-1)[mask].sum()
    correct = (logits.argmax(-1) == labels[:, 1:])[mask].sum()
    out = token_log_probs(h, labels, head, chunk=7, metrics=True)
    assert torch.allclose(out["entropy_sum"], entropy, atol=1e-4)
    assert int(out["num_correct"]) == int(correct)
    plain = token_log_probs(h, labels, head, chunk=7)
    assert "entropy_sum" not in plain  # not computed off log steps
    assert torch.allclose(out["log_probs"], plain["log_probs"], atol=1e-6)  # the same loss on a log step


def test_no_labelled_position_gives_a_differentiable_zero() -> None:
    h, head, labels = batch(1)
    labels[:] = -100
    out = token_log_probs(h, labels, head)
    loss = -out["log_probs"].sum()
    loss.backward()
    assert float(loss.detach()) == 0.0 and h.grad is not None and float(h.grad.abs().sum()) == 0.0


def test_bf16_autocast_matches_the_full_logits_under_autocast() -> None:
    """Under bf16 autocast the head projects in bf16, as the model's own head would, the softmax in fp32."""
    h, head, labels = batch(5, length=33, hidden=16, vocab=64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = reference(h, head, labels)
        got = -token_log_probs(h, labels, head, chunk=8)["log_probs"].sum()
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-4), (got, want)


@pytest.mark.parametrize(
    ("overrides", "impl", "why"),
    [
        ((), "chunked", "recipe.loss_impl=chunked"),
        (("recipe.loss_impl=trl",), "trl", "recipe.loss_impl=trl"),
        (("model=tiny_moe",), "trl", "router's auxiliary loss"),
        (("model=gemma2_2b",), "trl", "final_logit_softcapping"),
        (("strategy=zero3",), "trl", "shards the LM head"),
        (("peft=prefix",), "trl", "virtual tokens"),
        (("model=tiny_vlm",), "trl", "vision-language model"),
    ],
)
def test_the_loss_path_falls_back_to_trls_head_where_the_chunked_one_is_not_exact(
    compose_cfg, overrides: tuple[str, ...], impl: str, why: str
) -> None:
    from hydratune.components.runtime.run import Components

    comps = Components.from_config(compose_cfg(*overrides))
    got, reason = comps.recipe.loss_path(comps)
    assert got == impl and why in reason, (got, reason)
    assert ("chunked LM head" if impl == "chunked" else why) in comps.recipe.plan_lines(None, comps)[0]


def test_an_unknown_loss_impl_is_refused_naming_the_key(compose_cfg) -> None:
    from hydratune.components.config.errors import ConfigError
    from hydratune.components.runtime.run import Components

    comps = Components.from_config(compose_cfg("recipe.loss_impl=fused"))
    with pytest.raises(ConfigError) as err:
        comps.recipe.check(None, comps)
    assert err.value.key == "recipe.loss_impl"
