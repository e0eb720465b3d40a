"""PPO's critic as an adapter (``recipe.value_model=adapter``, issue 48): a second LoRA adapter (named
``critic``) on the policy's own PeftModel, so on the same frozen base weights, and a value head on its last
hidden state. The policy's forward runs with the policy's adapter alone, the critic's with the critic's alone
(:func:`~hydratune.components.rl.reward_adapter.active_adapter`): the policy loss reaches only the policy's
adapter, the value loss only the critic's adapter and head, neither the base.

Its state dict is the head's (``head.*``) and the critic adapter's (``adapter.*``, peft's keys): checkpoints
and ``final/value.safetensors`` hold both; before ``final/`` is written the adapter comes off the policy
(:meth:`AdapterCritic.detach`), so ``final/`` is the policy's adapter alone.
"""

from __future__ import annotations

import contextlib
import copy
import functools
from collections.abc import Iterator
from typing import Any

import torch

from hydratune.components.rl.ppo_parts import value_head
from hydratune.components.rl.reward_adapter import active_adapter

#: the critic's adapter name on the policy's PeftModel (the policy's own is peft's ``default``)
CRITIC_ADAPTER = "critic"


class AdapterCritic(torch.nn.Module):
    """The value function on the policy's base: the ``critic`` LoRA adapter (its parameters are the policy
    PeftModel's, trained by the loop's one optimizer) and a value head (this module's only parameters)."""

    def __init__(self, policy: Any) -> None:
        super().__init__()
        # the head first, drawing from the run's random stream as recipe.value_model=head's does
        self.head = value_head(policy)
        config = copy.deepcopy(policy.peft_config[policy.active_adapter])
        # its own LoRA: no dropout (PPO compares two forwards), B = 0 (V starts at the head's 0), nothing
        # trained in full beside it, and no init that rewrites the shared base (pissa, olora)
        config.inference_mode, config.lora_dropout, config.modules_to_save = False, 0.0, None
        config.init_lora_weights = True
        device = next(policy.parameters()).device
        cuda = [device.index or 0] if device.type == "cuda" else []
        with torch.random.fork_rng(devices=cuda):  # its random A leaves the run's streams alone
            policy.add_adapter(CRITIC_ADAPTER, config)
        for name, param in policy.named_parameters():  # peft leaves an inactive adapter frozen
            if f".{CRITIC_ADAPTER}." in name:
                param.requires_grad_(True)
        self.head.to(device)
        self.__dict__["policy"] = policy  # not a submodule: its parameters are the policy module's
        self._detached: dict[str, torch.Tensor] | None = None
        self._lora_layers = tuner_layers(policy)
        recompute_with_forward_adapters(policy, self._lora_layers)

    def adapter_parameters(self) -> list[torch.nn.Parameter]:
        """The critic adapter's parameters (they live in the policy's PeftModel)."""
        return [p for n, p in self.policy.named_parameters() if f".{CRITIC_ADAPTER}." in n]

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, response_length: int) -> Any:
        """Per-token values of the last ``response_length`` tokens: the base with the critic's adapter alone,
        the head on each position's last hidden state (positions as the policy's forward counts them)."""
        base = self.policy.get_base_model()
        trunk = getattr(base, base.base_model_prefix)
        position_ids = (attention_mask.cumsum(1) - 1).clamp(min=0)
        with active_adapter(self.policy, CRITIC_ADAPTER):
            out = trunk(
                input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
            )
        hidden = out.last_hidden_state[:, -response_length - 1 : -1]
        return self.head(hidden.to(self.head.weight.dtype)).squeeze(-1).float()

    def adapter_state(self) -> dict[str, torch.Tensor]:
        """The critic adapter's weights, peft's keys (the snapshot taken by :meth:`detach` after it)."""
        if self._detached is not None:
            return self._detached
        from peft import get_peft_model_state_dict

        return get_peft_model_state_dict(self.policy, adapter_name=CRITIC_ADAPTER)

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Any]:  # type: ignore[override]
        state = super().state_dict(*args, **kwargs)
        prefix = kwargs.get("prefix", "")
        state.update({f"{prefix}adapter.{k}": v for k, v in self.adapter_state().items()})
        return state

    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False) -> Any:
        from peft import set_peft_model_state_dict

        adapter = {k.removeprefix("adapter."): v for k, v in state_dict.items() if k.startswith("adapter.")}
        head = {k: v for k, v in state_dict.items() if not k.startswith("adapter.")}
        result = set_peft_model_state_dict(self.policy, adapter, adapter_name=CRITIC_ADAPTER)
        missing = [k for k in result.missing_keys if f".{CRITIC_ADAPTER}." in k]
        if strict and (missing or result.unexpected_keys or not adapter):
            raise RuntimeError(
                f"the critic adapter's state does not fit: missing {missing[:3]}, "
                f"unexpected {list(result.unexpected_keys)[:3]}"
            )
        return super().load_state_dict(head, strict=strict, assign=assign)

    def detach(self) -> None:
        """Keep the adapter's weights here and take the adapter off the policy (before ``final/``)."""
        if CRITIC_ADAPTER in self.policy.peft_config:
            self._detached = {k: v.detach().clone() for k, v in self.adapter_state().items()}
            self.policy.delete_adapter(CRITIC_ADAPTER)


def tuner_layers(model: Any) -> list[Any]:
    """Every peft adapter layer of ``model``."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    return [m for m in model.modules() if isinstance(m, BaseTunerLayer)]


def recompute_with_forward_adapters(model: Any, layers: list[Any]) -> None:
    """Under gradient checkpointing each checkpointed layer's forward is run again during backward, after
    the critic's adapter context has ended: recompute it with the adapters that were active (or disabled)
    when it ran forward (torch's non-reentrant checkpoint ``context_fn``), else the value loss's recomputed
    graph would be the policy adapter's."""
    from torch.utils.checkpoint import checkpoint

    def context() -> tuple[Any, Any]:
        at_forward = [(layer._active_adapter, layer._disable_adapters) for layer in layers]
        return contextlib.nullcontext(), _adapters_as(layers, at_forward)

    for module in model.modules():
        if getattr(module, "gradient_checkpointing", False) and hasattr(
            module, "_gradient_checkpointing_func"
        ):
            func = module._gradient_checkpointing_func
            kwargs = dict(getattr(func, "keywords", {}))
            kwargs.update(use_reentrant=False, context_fn=context)  # context_fn: the non-reentrant one only
            module._gradient_checkpointing_func = functools.partial(checkpoint, **kwargs)


@contextlib.contextmanager
def _adapters_as(layers: list[Any], states: list[tuple[Any, bool]]) -> Iterator[None]:
    """Each layer's active adapter and disabled flag set to ``states`` inside the block, restored after."""
    before = [(layer._active_adapter, layer._disable_adapters) for layer in layers]
    try:
        for layer, (active, disabled) in zip(layers, states, strict=True):
            layer._active_adapter, layer._disable_adapters = active, disabled
        yield
    finally:
        for layer, (active, disabled) in zip(layers, before, strict=True):
            layer._active_adapter, layer._disable_adapters = active, disabled
