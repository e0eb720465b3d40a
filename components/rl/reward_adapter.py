"""A LoRA reward model on the policy's own base (issue 48): one copy of the base weights carries the policy's
adapter, the reward run's adapter (named ``reward``) and, with adapters off, the reference.

Where :func:`~hydratune.components.reward_placement.placement` said so before load, :class:`AdapterReward`
scores as :class:`~hydratune.components.rewards.RewardModel` does, with the reward adapter switched on under
``no_grad`` and the policy's switched back after; it never changes what requires a gradient.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

#: the reward adapter's name on the policy's PeftModel (the policy's own is peft's ``default``)
REWARD_ADAPTER = "reward"


@contextlib.contextmanager
def active_adapter(model: Any, name: str) -> Iterator[None]:
    """``name`` is the adapter every LoRA layer of ``model`` applies inside the block; what requires a
    gradient is left alone (peft's ``set_adapter`` would make the named adapter trainable)."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    layers = [m for m in model.modules() if isinstance(m, BaseTunerLayer)]
    before = [layer._active_adapter for layer in layers]
    try:
        for layer in layers:
            layer._active_adapter = name
        yield
    finally:
        for layer, active in zip(layers, before, strict=True):
            layer._active_adapter = active


class AdapterReward:
    """A LoRA reward run's adapter on the policy's PeftModel (named ``reward``, frozen) and its score head
    beside it: a reward function scoring as the separately loaded reward model does."""

    def __init__(self, policy: Any, path: str, batch_size: int = 32) -> None:
        import torch
        from peft import PeftConfig, set_peft_model_state_dict
        from safetensors.torch import load_file
        from transformers import AutoTokenizer

        from hydratune.components.rewards import adapter_run

        final = adapter_run(path).final
        self.policy, self.path, self.batch_size = policy, str(final), batch_size
        self.tokenizer = AutoTokenizer.from_pretrained(final)
        self.tokenizer.padding_side = "right"
        config = PeftConfig.from_pretrained(str(final))
        config.task_type, config.modules_to_save, config.inference_mode = "CAUSAL_LM", None, True
        config.lora_dropout = 0.0
        state = load_file(str(final / "adapter_model.safetensors"))
        head = {k.rsplit(".", 1)[-1]: state.pop(k) for k in list(state) if ".score." in k}
        device = next(policy.parameters()).device
        cuda = [device.index or 0] if device.type == "cuda" else []
        # its random init (then overwritten), the head's too, leaves the run's random streams alone
        with torch.random.fork_rng(devices=cuda):
            policy.add_adapter(REWARD_ADAPTER, config)
            weight = head.get("weight")
            self.score = (
                torch.nn.Linear(*reversed(weight.shape), bias="bias" in head) if weight is not None else None
            )
        result = set_peft_model_state_dict(policy, state, adapter_name=REWARD_ADAPTER)
        missing = [k for k in result.missing_keys if f".{REWARD_ADAPTER}." in k]
        if result.unexpected_keys or missing or self.score is None:
            raise RuntimeError(f"{final}: the reward adapter does not fit the policy's base")
        for name, param in policy.named_parameters():
            if f".{REWARD_ADAPTER}." in name:
                param.requires_grad_(False)
        self.score.load_state_dict(head)
        self.score.to(device).requires_grad_(False)
        pad = policy.config.pad_token_id
        self.pad_token_id = self.tokenizer.pad_token_id if pad is None else pad
        self.__name__ = "reward_model"

    def __call__(self, prompts: list[Any], completions: list[Any], **_: Any) -> list[float]:
        from hydratune.components.rewards import batched_scores, chat_texts

        texts = chat_texts(self.tokenizer, prompts, completions)
        device = self.score.weight.device
        return batched_scores(
            self.tokenizer,
            texts,
            self.batch_size,
            device,
            lambda b: self.logits(b["input_ids"], b["attention_mask"]),
        )

    def logits(self, ids: Any, mask: Any) -> Any:
        """The score at each row's last non-pad token, as a sequence classifier pools it."""
        import torch

        base = self.policy.get_base_model()
        trunk = getattr(base, base.base_model_prefix)
        training = self.policy.training
        self.policy.eval()
        try:
            with torch.no_grad(), active_adapter(self.policy, REWARD_ADAPTER):
                hidden = trunk(input_ids=ids, attention_mask=mask).last_hidden_state
                logits = self.score(hidden.to(self.score.weight.dtype))  # a half base: the head in fp32
        finally:
            self.policy.train(training)
        non_pad = (ids != self.pad_token_id).to(torch.int32)
        last = (torch.arange(ids.shape[-1], device=ids.device, dtype=torch.int32) * non_pad).argmax(-1)
        return logits[torch.arange(ids.shape[0], device=ids.device), last, 0]

    def detach(self) -> None:
        """Take the reward adapter off the policy (before its adapter is saved as the run's model)."""
        if REWARD_ADAPTER in self.policy.peft_config:
            self.policy.delete_adapter(REWARD_ADAPTER)
