"""Which LM head a recipe's log-probabilities go through (``recipe.loss_impl``): hydratune's chunked head
(``components/runtime/lm_loss.py``: SFT's loss; ``components/runtime/fused_head.py``: DPO's and KTO's
per-token log-probs) or TRL's fused head, decided from the config alone, before the model loads. The built
model's head is checked again at run time (``lm_loss.head_refusal``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hydratune.components.config.errors import ConfigError

if TYPE_CHECKING:
    from hydratune.components.runtime.run import Components

LOSS_IMPLS = ("chunked", "trl")
#: config.json keys that change the logits after the head (Gemma 2's soft-capping, Cohere's / Granite's scale)
LOGIT_TRANSFORMS = (
    "final_logit_softcapping",
    "logit_scale",
    "output_multiplier",
    "lm_head_multiplier",
    "logits_scaling",
)


def check_loss_impl(loss_impl: str) -> None:
    """Refuse an unknown ``recipe.loss_impl`` (before load, naming the key)."""
    if loss_impl not in LOSS_IMPLS:
        raise ConfigError(f"unknown '{loss_impl}'", key="recipe.loss_impl", hint=f"one of {LOSS_IMPLS}")


def head_path(loss_impl: str, comps: Components) -> tuple[str, str]:
    """``("chunked" | "trl", why)``: TRL's head where the chunked one would not be exact or would not see
    the whole head (a sharded or split model, virtual tokens, a VLM, transformed logits, a mixture of
    experts, whose loss adds the router's auxiliary loss)."""
    if loss_impl == "trl":
        return "trl", "recipe.loss_impl=trl"
    p = comps.strategy.parallel
    if comps.strategy.shards_parameters:
        return "trl", f"strategy={comps.strategy.label} shards the LM head (TRL's head gathers it)"
    if max(p.tp, p.sp, p.pp, p.ep) > 1:
        return "trl", "the model is split over ranks (strategy.tp/sp/pp/ep_size)"
    if comps.peft.adds_virtual_tokens:
        return "trl", "a prompt-learning adapter's virtual tokens"
    config = comps.model.config_dict()
    if "vision_config" in config:
        return "trl", "a vision-language model (its text head not checked against the chunked loss)"
    config = {**config, **config.get("text_config", {})}
    found = [k for k in LOGIT_TRANSFORMS if config.get(k) not in (None, 1, 1.0)]
    if found:
        return "trl", f"the model transforms its logits ({', '.join(found)}), which TRL's head applies"
    if "router_aux_loss_coef" in config or "output_router_logits" in config:
        return "trl", "a mixture of experts: TRL's loss adds the router's auxiliary loss"
    return "chunked", "recipe.loss_impl=chunked"


def chunked_head_line(metrics: tuple[str, ...]) -> str:
    """What the plan and the summary say of the chunked head of a preference recipe whose ``metrics`` come
    from the head's per-token statistics."""
    return (
        "hydratune's chunked LM head over the completion tokens (no full logits); "
        f"{', '.join(metrics)} at log steps only"
    )


def head_plan_line(recipe: str, loss_impl: str, comps: Components, metrics: tuple[str, ...]) -> str:
    """The plan's line of a preference recipe (``recipe``) on the head its log-probs go through."""
    impl, why = head_path(loss_impl, comps)
    if impl == "chunked":
        return f"# {recipe}: log-probs {chunked_head_line(metrics)} (recipe.loss_impl=trl: TRL's fused head)"
    return f"# {recipe}: log-probs TRL's fused LM head ({why})"
