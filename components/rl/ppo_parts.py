"""The pieces of PPO for language models (Ziegler et al. 2019; Ouyang et al. 2022), one function each.

Shapes: ``B`` sequences, ``R`` response tokens. Every per-token tensor is ``(B, R)`` and comes with a
``mask`` that is 1 on real response tokens (up to and including the first EOS) and 0 after it.
``recipes/ppo.py`` strings them together; nothing here owns a model or an optimizer.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


# ---- rollouts ---------------------------------------------------------------------------------------
@dataclass
class Rollout:
    """One batch of sampled responses. Queries are left-padded, responses right-padded after EOS."""

    query: torch.Tensor  # (B, Q) token ids, left padding
    query_mask: torch.Tensor  # (B, Q)
    response: torch.Tensor  # (B, R) token ids; pad after the first EOS
    response_mask: torch.Tensor  # (B, R) 1 up to and including the first EOS
    has_eos: torch.Tensor  # (B,) bool: the response ended with EOS (not truncated)

    @property
    def input_ids(self) -> torch.Tensor:
        return torch.cat([self.query, self.response], dim=1)

    @property
    def attention_mask(self) -> torch.Tensor:
        return torch.cat([self.query_mask, self.response_mask], dim=1)


def truncate_after_eos(response: torch.Tensor, eos_ids: list[int], pad_id: int) -> tuple[torch.Tensor, ...]:
    """Mask and pad everything after the first EOS; returns (response, mask, has_eos)."""
    is_eos = torch.isin(response, torch.tensor(eos_ids, device=response.device))
    # position of the first EOS, or R when there is none
    first = torch.where(
        is_eos.any(1),
        is_eos.int().argmax(1),
        torch.full_like(is_eos[:, 0], response.shape[1], dtype=torch.long),
    )
    positions = torch.arange(response.shape[1], device=response.device)
    mask = (positions[None, :] <= first[:, None]).long()
    return response.masked_fill(mask == 0, pad_id), mask, is_eos.any(1)


@torch.no_grad()
def rollout(
    model: Any,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[str],
    *,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    max_prompt_length: int | None = None,
    synced_gpus: bool = False,
) -> Rollout:
    """Sample one response per (already chat-templated) prompt: left padding, stop at EOS; prompts
    longer than ``max_prompt_length`` tokens keep their end. ``synced_gpus``: the weights are sharded
    (ZeRO-3, FSDP), so every rank keeps stepping until the last rank's sequences are done."""
    sides = tokenizer.padding_side, tokenizer.truncation_side
    tokenizer.padding_side = tokenizer.truncation_side = "left"  # generation continues from the last position
    try:
        batch = tokenizer(
            prompts,
            return_tensors="pt",
            padding=True,
            add_special_tokens=False,
            truncation=max_prompt_length is not None,
            max_length=max_prompt_length,
        )
    finally:
        tokenizer.padding_side, tokenizer.truncation_side = sides
    device = next(model.parameters()).device
    query, query_mask = batch["input_ids"].to(device), batch["attention_mask"].to(device)
    eos_ids = [tokenizer.eos_token_id]
    out = model.generate(
        input_ids=query,
        attention_mask=query_mask,
        max_new_tokens=max_new_tokens,
        do_sample=True,
        temperature=temperature,
        top_k=top_k or 0,
        top_p=top_p or 1.0,
        eos_token_id=eos_ids,
        pad_token_id=tokenizer.pad_token_id,
        use_cache=True,
        synced_gpus=synced_gpus,
    )
    response, mask, has_eos = truncate_after_eos(out[:, query.shape[1] :], eos_ids, tokenizer.pad_token_id)
    return Rollout(query, query_mask, response, mask, has_eos)


# ---- forward passes ---------------------------------------------------------------------------------
def sequence_logprobs(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_length: int,
    *,
    temperature: float = 1.0,
    value_head: torch.nn.Module | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Per-token log-probs and entropies of the last ``response_length`` tokens of ``input_ids``
    (logits divided by the sampling temperature), and the value head's estimates when one is given.

    Position ids follow the attention mask, so left padding does not shift the positions."""
    position_ids = (attention_mask.cumsum(1) - 1).clamp(min=0)
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        output_hidden_states=value_head is not None,
        use_cache=False,
    )
    # the logits at position t predict token t + 1
    logits = out.logits[:, -response_length - 1 : -1].float() / temperature
    targets = input_ids[:, -response_length:]
    logp_all = torch.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    values = None
    if value_head is not None:
        hidden = out.hidden_states[-1][:, -response_length - 1 : -1]
        dtype = next(value_head.parameters()).dtype  # value_head may be DDP-wrapped
        values = value_head(hidden.to(dtype)).squeeze(-1).float()
    return logp, entropy, values


def critic_values(
    critic: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, response_length: int
) -> torch.Tensor:
    """Per-token values from a separate critic (a sequence-classification model with one label):
    its score head applied to every position's last hidden state."""
    position_ids = (attention_mask.cumsum(1) - 1).clamp(min=0)
    out = critic(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        output_hidden_states=True,
        use_cache=False,
    )
    hidden = out.hidden_states[-1][:, -response_length - 1 : -1]
    return critic.score(hidden).squeeze(-1).float()


# ---- rewards and KL ---------------------------------------------------------------------------------
def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    mask = mask.to(x.dtype)
    if dim is None:
        return (x * mask).sum() / mask.sum().clamp(min=1)
    return (x * mask).sum(dim) / mask.sum(dim).clamp(min=1)


def whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8) -> torch.Tensor:
    """Normalise ``x`` to unit (unbiased) variance over the masked entries; mean 0 with ``shift_mean``.
    Entries outside the mask do not enter the statistics and come back as 0."""
    mask = mask.to(x.dtype)
    n = mask.sum()
    mean = (x * mask).sum() / n.clamp(min=1)
    var = ((x - mean) ** 2 * mask).sum() / (n - 1).clamp(min=1)
    out = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return out * mask


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str = "k1") -> torch.Tensor:
    """Per-token estimate of KL(policy || reference) from samples of the policy (Schulman, "Approximating
    KL divergence"): ``k1 = log p - log q`` (unbiased, can be negative), ``k3 = (r - 1) - log r`` with
    ``r = q / p`` (unbiased, always >= 0, lower variance)."""
    log_ratio = logp - ref_logp
    if estimator == "k1":
        return log_ratio
    if estimator == "k3":
        return torch.expm1(-log_ratio) + log_ratio
    raise ValueError(f"unknown KL estimator {estimator!r} (k1 or k3)")


def apply_missing_eos_penalty(
    scores: torch.Tensor, has_eos: torch.Tensor, penalty: float | None
) -> torch.Tensor:
    """Add ``penalty`` (e.g. -1.0) to the score of every response that was cut off before its EOS."""
    if not penalty:
        return scores
    return torch.where(has_eos, scores, scores + penalty)


def per_token_rewards(
    score: torch.Tensor, kl: torch.Tensor, mask: torch.Tensor, kl_coef: float
) -> torch.Tensor:
    """``-kl_coef * kl`` on every response token, plus the sequence's score on its last real token."""
    rewards = -kl_coef * kl * mask
    last = (mask.sum(1) - 1).clamp(min=0).long()
    return rewards.scatter_add(1, last[:, None], score[:, None].to(rewards.dtype))


def gae(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0, lam: float = 0.95
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016): ``delta_t = r_t + gamma V_{t+1} - V_t``,
    ``A_t = delta_t + gamma lam A_{t+1}``, with ``V`` and ``A`` zero past the last real token.
    Returns (advantages, returns = advantages + values), both zero outside ``mask``."""
    mask = mask.to(values.dtype)
    values = values * mask
    advantages = torch.zeros_like(rewards)
    next_value = torch.zeros_like(rewards[:, 0])
    next_advantage = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[1])):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        next_advantage = (delta + gamma * lam * next_advantage) * mask[:, t]
        advantages[:, t] = next_advantage
        next_value = values[:, t]
    return advantages, (advantages + values) * mask


# ---- losses -----------------------------------------------------------------------------------------
def policy_loss(
    new_logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_ratio: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's clipped surrogate: ``mean max(-A r, -A clip(r, 1-eps, 1+eps))`` with ``r = pi / pi_old``.
    Returns (loss, fraction of tokens where the clipped term was the one used)."""
    ratio = torch.exp(new_logp - old_logp)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1 - clip_ratio, 1 + clip_ratio)
    loss = masked_mean(torch.maximum(unclipped, clipped), mask)
    return loss, masked_mean((clipped > unclipped).float(), mask)


def value_loss(
    new_values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    value_clip: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``0.5 * mean max((V - G)^2, (V_clip - G)^2)`` with ``V_clip`` kept within ``value_clip`` of the
    rollout's values. Returns (loss, fraction of tokens where the clipped error was the larger)."""
    clipped_values = old_values + (new_values - old_values).clamp(-value_clip, value_clip)
    error, clipped_error = (new_values - returns) ** 2, (clipped_values - returns) ** 2
    loss = 0.5 * masked_mean(torch.maximum(error, clipped_error), mask)
    return loss, masked_mean((clipped_error > error).float(), mask)


# ---- controllers and statistics ---------------------------------------------------------------------
class FixedKLController:
    """A constant KL coefficient."""

    def __init__(self, kl_coef: float) -> None:
        self.value = kl_coef

    def update(self, current_kl: float, n_steps: int) -> None:
        pass

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.value = state["value"]


class AdaptiveKLController:
    """Ziegler et al. (2019): move the coefficient so the measured KL approaches ``target``, by at most
    ``0.2 * n_steps / horizon`` (relative) per update."""

    def __init__(self, kl_coef: float, target: float, horizon: int) -> None:
        self.value, self.target, self.horizon = kl_coef, target, horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        error = min(max(current_kl / self.target - 1, -0.2), 0.2)
        self.value *= 1 + error * n_steps / self.horizon

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.value = state["value"]


class RunningMoments:
    """Running mean and standard deviation of every value seen so far (Chan et al.'s parallel update)."""

    def __init__(self) -> None:
        self.mean, self.var, self.count = 0.0, 1.0, 1e-24

    def update(self, x: torch.Tensor) -> None:
        x = x.double()
        n, batch_mean = x.numel(), x.mean().item()
        batch_var = x.var(unbiased=False).item() if n > 1 else 0.0
        total = self.count + n
        delta = batch_mean - self.mean
        m2 = self.var * self.count + batch_var * n + delta**2 * self.count * n / total
        self.mean, self.var, self.count = self.mean + delta * n / total, m2 / total, total

    @property
    def std(self) -> float:
        return math.sqrt(self.var)

    def state_dict(self) -> dict[str, float]:
        return {"mean": self.mean, "var": self.var, "count": self.count}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.mean, self.var, self.count = state["mean"], state["var"], state["count"]

    def normalise(self, x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
        return (x - self.mean) / (self.std + eps)


# ---- models around the policy -----------------------------------------------------------------------
def frozen_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A frozen deep copy (the reference of full fine-tuning)."""
    import copy

    return copy.deepcopy(model).eval().requires_grad_(False)


def disable_dropout(model: torch.nn.Module) -> None:
    """PPO compares log-probs of the rollout and of the update: both must come from the same function."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0


def value_head(policy: Any) -> torch.nn.Linear:
    """A one-output linear layer on the policy's last hidden state, starting at V = 0."""
    head = torch.nn.Linear(policy.config.get_text_config().hidden_size, 1)
    torch.nn.init.zeros_(head.weight)
    torch.nn.init.zeros_(head.bias)
    return head


class PolicyAndValue(torch.nn.Module):
    """The policy and its value head as one module: DeepSpeed's engine wraps exactly one model, and FSDP's
    full state dict is gathered from one (``split_gathered`` takes either apart)."""

    def __init__(self, policy: Any, value: torch.nn.Module) -> None:
        super().__init__()
        self.policy, self.value = policy, value

    @classmethod
    def of(cls, modules: dict[str, Any]) -> PolicyAndValue:
        """From a loop's trained modules by name (the strategy's ``prepare_loop`` combines them so)."""
        return cls(modules["policy"], modules["value"])

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        response_length: int,
        temperature: float = 1.0,
        reference: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """``sequence_logprobs`` with the value head, called through the engine (whose ZeRO-3 hooks gather
        each layer's shards); ``reference``: the policy with its adapter disabled, no values."""
        if reference:
            with self.policy.disable_adapter():
                return sequence_logprobs(
                    self.policy, input_ids, attention_mask, response_length, temperature=temperature
                )
        return sequence_logprobs(
            self.policy,
            input_ids,
            attention_mask,
            response_length,
            temperature=temperature,
            value_head=self.value,
        )


def split_gathered(state: dict[str, Any] | None) -> dict[str, dict[str, Any]] | None:
    """A gathered ``PolicyAndValue`` state dict → ``{"model": policy's, "value": value head's}``
    (None on the ranks that receive nothing)."""
    if state is None:
        return None
    parts: dict[str, dict[str, Any]] = {"model": {}, "value": {}}
    for key, tensor in state.items():
        prefix, _, rest = key.partition(".")
        parts["model" if prefix == "policy" else "value"][rest] = tensor
    return parts


def separate_critic(policy: Any, model_component: Any, reward_model: str | None, build_kwargs: dict) -> Any:
    """A critic with its own trunk: the reward model's weights when there is one, else the policy's
    (its score head starts at zero either way when built from the policy)."""
    if reward_model:
        from hydratune.components.rewards import load_reward_model

        critic, _ = load_reward_model(reward_model, merge=True)  # a LoRA reward run: folded into its base
        critic.requires_grad_(True)  # (an adapter's base comes frozen)
    else:
        critic = model_component.build(task="seq_cls", **build_kwargs)
        base = policy.get_base_model() if hasattr(policy, "get_base_model") else policy
        trunk = {
            k.replace(".base_layer", ""): v
            for k, v in base.state_dict().items()
            if k.startswith(base.base_model_prefix + ".") and "lora_" not in k
        }
        critic.load_state_dict(trunk, strict=False)
        torch.nn.init.zeros_(critic.score.weight)
    critic.config.pad_token_id = policy.config.pad_token_id
    disable_dropout(critic)
    return critic.train()


# ---- the loop's parts -------------------------------------------------------------------------------
class PromptSampler:
    """Row indices in a fresh seeded shuffle per pass over the data."""

    def __init__(self, n_rows: int, seed: int) -> None:
        self.n_rows, self.generator, self.queue = n_rows, torch.Generator().manual_seed(seed), []

    def take(self, k: int) -> list[int]:
        while len(self.queue) < k:
            self.queue += torch.randperm(self.n_rows, generator=self.generator).tolist()
        out, self.queue = self.queue[:k], self.queue[k:]
        return out

    def state_dict(self) -> dict[str, Any]:
        """Where the shuffle stands: the generator (it also shuffles the mini-batches) and the queue."""
        return {"generator": self.generator.get_state(), "queue": list(self.queue)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.generator.set_state(state["generator"])
        self.queue = list(state["queue"])

    def take_shard(self, k: int, rank: int, world_size: int) -> list[int]:
        """This rank's ``k`` prompts of the ``k * world_size`` drawn (the same draw on every rank)."""
        return self.take(k * world_size)[rank::world_size]


@dataclass
class ActorCritic:
    """The trained modules (policy + value head, a separate critic, or the critic adapter on the policy's
    base) and the reference.

    ``reference`` is None under PEFT: the reference is then the policy with its adapter disabled."""

    policy: Any
    value: Any  # a value head (nn.Linear), a critic (sequence classifier) or an AdapterCritic
    value_model: str  # recipe.value_model: head | separate | adapter
    reference: Any
    accelerator: Any
    temperature: float = 1.0
    engine: Any = None  # DeepSpeed's engine: it scales, accumulates, clips and steps by itself

    def parameters(self) -> list[torch.nn.Parameter]:
        return [*self.policy.parameters(), *self.value.parameters()]

    def forward(self, ids: torch.Tensor, mask: torch.Tensor, n: int) -> tuple[torch.Tensor, ...]:
        """Policy log-probs, entropies and values of the last ``n`` tokens, under the run's autocast."""
        with self.accelerator.autocast():
            if self.engine is not None:
                return self.engine(ids, mask, n, self.temperature)
            head = self.value if self.value_model == "head" else None
            logp, entropy, values = sequence_logprobs(
                self.policy, ids, mask, n, temperature=self.temperature, value_head=head
            )
            if self.value_model == "separate":
                values = critic_values(self.value, ids, mask, n)
            elif self.value_model == "adapter":  # the base with the critic's adapter alone
                values = self.value(ids, mask, n)
        return logp, entropy, values

    @torch.no_grad()
    def reference_logprobs(self, ids: torch.Tensor, mask: torch.Tensor, n: int) -> torch.Tensor:
        """The reference's log-probs, under the same autocast and temperature as the policy's."""
        with self.accelerator.autocast():
            if self.reference is not None:
                return sequence_logprobs(self.reference, ids, mask, n, temperature=self.temperature)[0]
            if self.engine is not None:
                return self.engine(ids, mask, n, self.temperature, True)[0]
            policy = self.accelerator.unwrap_model(self.policy)
            # peft's disable_adapter leaves only the active adapter trainable on exit: the critic's (a second
            # adapter on the same model) would stop receiving gradients
            with kept_requires_grad(policy), policy.disable_adapter():
                return sequence_logprobs(self.policy, ids, mask, n, temperature=self.temperature)[0]


@contextlib.contextmanager
def kept_requires_grad(module: torch.nn.Module) -> Iterator[None]:
    """What requires a gradient in ``module`` is as it was before the block, after it."""
    params = list(module.parameters())
    before = [p.requires_grad for p in params]
    try:
        yield
    finally:
        for param, requires in zip(params, before, strict=True):
            param.requires_grad_(requires)


@dataclass
class Experience:
    """A scored rollout with what the updates need: old log-probs and values, advantages, returns."""

    ids: torch.Tensor
    mask: torch.Tensor
    response_mask: torch.Tensor
    old_logp: torch.Tensor
    old_values: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor

    def __len__(self) -> int:
        return self.ids.shape[0]


def update(
    model: ActorCritic,
    exp: Experience,
    optimizer: Any,
    scheduler: Any,
    *,
    epochs: int,
    mini_batch_size: int,
    micro_batch_size: int,
    clip_ratio: float,
    value_clip: float,
    vf_coef: float,
    entropy_coef: float,
    max_grad_norm: float,
    generator: torch.Generator,
) -> dict[str, float]:
    """``epochs`` passes over ``exp`` in shuffled mini-batches, one optimizer step each (gradients of
    micro-batches accumulated); returns the mean of each loss statistic."""
    n, stats = exp.response_mask.shape[1], {}
    for _ in range(epochs):
        for mb in torch.randperm(len(exp), generator=generator).split(mini_batch_size):
            for micro in mb.split(micro_batch_size):
                logp, entropy, values = model.forward(exp.ids[micro], exp.mask[micro], n)
                m, old_logp = exp.response_mask[micro], exp.old_logp[micro]
                pl, pcf = policy_loss(logp, old_logp, exp.advantages[micro], m, clip_ratio)
                vl, vcf = value_loss(values, exp.old_values[micro], exp.returns[micro], m, value_clip)
                loss = pl + vf_coef * vl - entropy_coef * masked_mean(entropy, m)
                if model.engine is not None:  # divides by its accumulation steps (mini / micro)
                    model.engine.backward(loss)
                    model.engine.step()  # steps the optimizer and schedule at the mini-batch boundary
                else:
                    model.accelerator.backward(loss * len(micro) / len(mb))
                approx_kl = 0.5 * masked_mean((logp - old_logp) ** 2, m)
                named = {"loss": loss, "loss/policy": pl, "loss/value": vl, "clipfrac/policy": pcf}
                named.update({"clipfrac/value": vcf, "approx_kl": approx_kl})
                for key, value in named.items():
                    stats.setdefault(key, []).append(value.item())
            if model.engine is not None:  # the engine stepped the optimizer; the schedule is ours
                scheduler.step()
                continue
            if max_grad_norm > 0:
                model.accelerator.clip_grad_norm_(model.parameters(), max_grad_norm)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
    return {k: sum(v) / len(v) for k, v in stats.items()}


def shape_scores(
    raw: torch.Tensor,
    has_eos: torch.Tensor,
    *,
    missing_eos_penalty: float | None,
    moments: RunningMoments | None,
    clip: float,
) -> torch.Tensor:
    """Reward-function scores → PPO scores: missing-EOS penalty, running normalisation, clipping."""
    score = apply_missing_eos_penalty(raw, has_eos, missing_eos_penalty)
    if moments is not None:
        moments.update(score)
        score = moments.normalise(score)
    return score.clamp(-clip, clip)
