"""Reward functions for on-policy RL (``recipe=ppo``, ``recipe=grpo``).

A reward function takes the prompts, the completions and every other column of the rows as keyword
lists (``answer=[...]``) and returns one float per completion. Name one in a config with
``recipe.reward._target_=components.rewards.exact_match`` (PPO) or in ``recipe.reward_funcs`` (GRPO).
Completions arrive as text (PPO) or as assistant messages (GRPO on chat data); both are accepted.
"""

from __future__ import annotations

from typing import Any

from components.generation.evaluation import normalise


def text_of(completion: Any) -> str:
    """The text of a completion: a string, or the content of the last of a list of messages."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content", ""))
    return str(completion)


def exact_match(
    prompts: list[Any], completions: list[Any], answer: list[str] | None = None, **_: Any
) -> list[float]:
    """1.0 where the completion equals the row's ``answer`` (modulo white space and case), else 0.0."""
    if answer is None:
        raise ValueError("exact_match needs an 'answer' column in the prompt data")
    return [float(normalise(text_of(c)) == normalise(a)) for c, a in zip(completions, answer, strict=True)]


def length_penalty(
    prompts: list[Any], completions: list[Any], target: int = 4, scale: float = 0.1, **_: Any
) -> list[float]:
    """``-scale * |len(completion) - target|`` in characters: an example of a shaping reward."""
    return [-scale * abs(len(text_of(c).strip()) - target) for c in completions]


# ---- reward models and config nodes -----------------------------------------------------------------
def default_reward() -> dict[str, Any]:
    """The ``recipe.reward`` node of PPO and Best-of-N: exact match, unless a reward model is named."""
    return {"_target_": "components.rewards.exact_match", "_partial_": True, "model": None}


def reward_model_path(spec: Any) -> str | None:
    """The reward model named by the reward node, if any."""
    import functools

    if isinstance(spec, functools.partial):
        return spec.keywords.get("model")
    if isinstance(spec, dict):
        return spec.get("model")
    return None


def reward_model_dir(path: str, key: str = "recipe.reward.model") -> str:
    """A model dir (holding config.json) or a run dir whose ``final/`` holds a trained reward model."""
    from pathlib import Path

    from components.config.errors import ConfigError
    from components.modeling.trained import final_model_dir

    p = Path(path).expanduser()
    if (p / "config.json").is_file():
        return str(p)
    try:
        return str(final_model_dir(str(p)))
    except ConfigError as err:
        raise ConfigError(str(err).split("\n")[0].split("] ", 1)[-1], key=key, hint=err.hint) from None


class RewardModel:
    """A trained one-logit sequence classifier (``recipe=reward``'s ``final/``), frozen, as a reward
    function: it scores the chat-templated prompt + completion, as RewardTrainer trained it."""

    def __init__(self, path: str, device: str = "cpu", batch_size: int = 32) -> None:
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        self.path = reward_model_dir(path)
        self.tokenizer = AutoTokenizer.from_pretrained(self.path)
        self.tokenizer.padding_side = "right"
        self.model = AutoModelForSequenceClassification.from_pretrained(self.path, num_labels=1)
        self.model.to(device).eval().requires_grad_(False)
        if self.model.config.pad_token_id is None:
            self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.batch_size = batch_size
        self.__name__ = "reward_model"

    def __call__(self, prompts: list[Any], completions: list[Any], **_: Any) -> list[float]:
        import torch

        texts = []
        for prompt, completion in zip(prompts, completions, strict=True):
            messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
            messages.append({"role": "assistant", "content": text_of(completion)})
            texts.append(self.tokenizer.apply_chat_template(messages, tokenize=False))
        scores: list[float] = []
        device = next(self.model.parameters()).device
        for start in range(0, len(texts), self.batch_size):
            batch = self.tokenizer(
                texts[start : start + self.batch_size],
                return_tensors="pt",
                padding=True,
                add_special_tokens=False,
            ).to(device)
            with torch.no_grad():
                scores += self.model(**batch).logits[:, 0].float().tolist()
        return scores


def resolve_reward(spec: Any, device: str = "cpu") -> Any:
    """A reward function from a config value: a callable (an instantiated ``_target_`` node with
    ``_partial_: true``), a dotted path to one, or a reward model given as ``{model: <dir or run dir>}``
    / a ``_target_`` partial whose ``model`` keyword is set (a reward model then wins over ``_target_``)."""
    import functools

    from hydra.utils import get_method

    if isinstance(spec, functools.partial):
        kwargs = dict(spec.keywords)
        model = kwargs.pop("model", None)
        if model:
            return RewardModel(model, device)
        return functools.partial(spec.func, *spec.args, **kwargs)
    if isinstance(spec, dict):
        if spec.get("model"):
            return RewardModel(spec["model"], device)
        target = spec.get("_target_")
        if target:
            kwargs = {k: v for k, v in spec.items() if not k.startswith("_") and k != "model"}
            return functools.partial(get_method(target), **kwargs)
    if isinstance(spec, str):
        from pathlib import Path

        return RewardModel(spec, device) if Path(spec).expanduser().exists() else get_method(spec)
    if callable(spec):
        return spec
    raise ValueError(f"cannot make a reward function of {spec!r}")
