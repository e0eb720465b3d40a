"""PPO with a learned value function (Ziegler et al. 2019), our own loop on accelerate.

Each iteration: sample responses to ``rollout_batch_size`` prompts → score them (a reward function or a
trained reward model) → log-probs of policy and reference, values → per-token rewards (score - KL
penalty) → GAE → ``ppo_epochs`` passes of clipped policy + value updates in mini-batches. The pieces are
the small functions of ``components/rl/ppo_parts.py``; the reference is the adapter-free policy under PEFT (no
second copy of the weights), else a frozen copy (under ZeRO-3 a separate inference engine, under FSDP a
sharded frozen model). Under FSDP the modules are sharded with ``fully_shard`` itself (accelerate's FSDP
plugin cannot run on CPU), before the optimizer is built. Metrics go to ``metrics.jsonl`` and the trackers
each iteration; checkpoints every ``train.save_every`` iterations hold everything ``resume`` needs to
continue at the next iteration.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from omegaconf import DictConfig

from hydratune.components.config.errors import ConfigError
from hydratune.components.config.ranges import AT_LEAST_ONE, FINITE, NON_NEGATIVE, POSITIVE, Range, knob
from hydratune.components.recipe import Recipe, recipe
from hydratune.components.rewards import reward_model_path
from hydratune.components.rewards_http import OneReward
from hydratune.components.runtime.run import Components, RunContext


@recipe
@dataclass(frozen=True)
class PPO(Recipe, OneReward):
    """PPO with a value function, our own loop on accelerate: rollouts, reward - KL, GAE, clipped updates."""

    title: ClassVar[str] = "PPO"
    data_kinds: ClassVar[tuple[str, ...]] = ("prompts",)
    periodic_eval: ClassVar[bool] = False  # its loop does not evaluate every train.eval_every steps
    owns_loop: ClassVar[bool] = True  # the strategy's loop hooks: FSDP2 by fully_shard, so on CPU too

    # rollout + update rounds; None = from train.max_steps / train.epochs
    num_iterations: int | None = knob(100, AT_LEAST_ONE)
    rollout_batch_size: int = knob(32, AT_LEAST_ONE)  # prompts per process per iteration
    ppo_epochs: int = knob(2, AT_LEAST_ONE)  # passes over each rollout
    mini_batch_size: int = knob(16, AT_LEAST_ONE)  # sequences per optimizer step; divides rollout_batch_size
    response_length: int = knob(8, AT_LEAST_ONE)  # max new tokens
    temperature: float = knob(1.0, POSITIVE)
    top_k: int | None = knob(None, NON_NEGATIVE)
    top_p: float | None = knob(None, Range(0, 1, low_open=True))
    gamma: float = knob(1.0, Range(0, 1, low_open=True))  # GAE's discount
    lam: float = knob(0.95, Range(0, 1, low_open=True))  # GAE's lambda
    clip_ratio: float = knob(0.2, Range(0, 1, low_open=True, high_open=True))  # of the policy's ratio
    value_clip: float = knob(0.2, POSITIVE)
    vf_coef: float = knob(0.1, NON_NEGATIVE)
    entropy_coef: float = knob(0.0, NON_NEGATIVE)
    kl_coef: float = knob(0.05, NON_NEGATIVE)
    kl_estimator: str = "k1"  # k1 | k3
    adaptive_kl: bool = False
    target_kl: float = knob(6.0, POSITIVE)  # adaptive: sequence-level KL the controller aims at
    kl_horizon: int = knob(10000, AT_LEAST_ONE)  # adaptive: samples over which the coefficient moves by 20%
    whiten_advantages: bool = True
    reward_normalization: bool = False  # divide scores by running std after subtracting the running mean
    reward_clip: float = knob(10.0, POSITIVE)
    missing_eos_penalty: float | None = knob(-1.0, FINITE)  # added to the score of a response cut before EOS
    value_model: str = (
        "head"  # head (on the policy's trunk) | separate (a critic model) | adapter (LoRA + head)
    )

    def check(self, cfg: DictConfig, comps: Components) -> None:
        rules = {  # (each knob's range is declared on its field and checked before this)
            "mini_batch_size": self.rollout_batch_size % self.mini_batch_size == 0,
            "kl_estimator": self.kl_estimator in ("k1", "k3"),
            "value_model": self.value_model in VALUE_MODELS,
        }
        for key, ok in rules.items():
            if not ok:
                hint = "a divisor of rollout_batch_size" if key == "mini_batch_size" else None
                hint = " | ".join(VALUE_MODELS) if key == "value_model" else hint
                raise ConfigError(f"invalid value {getattr(self, key)!r}", key=f"recipe.{key}", hint=hint)
        if self.value_model == "adapter":
            check_value_adapter(comps)
        # (what the strategy's own loop hooks refuse is checked for every loop-owning recipe before load)
        hooks = comps.strategy.loop_hooks  # None: refused by the pre-load checks (own_loop_refusal)
        if hooks is not None and hooks.loop_engine:  # one engine, which accumulates micro-batches itself
            if self.value_model != "head":
                raise ConfigError(
                    f"under {comps.strategy.label} PPO trains one engine: the value function must be the "
                    "policy's head",
                    key="recipe.value_model",
                    hint="recipe.value_model=head",
                )
            if self.mini_batch_size % self.micro_batch_size(cfg.train.micro_batch_size):
                raise ConfigError(
                    f"under {comps.strategy.label} the mini-batch must be whole micro-batches (its "
                    "accumulation steps)",
                    key="recipe.mini_batch_size",
                    hint=f"a multiple of train.micro_batch_size={cfg.train.micro_batch_size}",
                )
        if self.reward_url is None:
            check_reward(self.reward)
        self.check_one_reward(cfg)
        if reward_model_path(self.reward):
            from hydratune.components.rewards import reward_model_dir

            reward_model_dir(reward_model_path(self.reward))  # raises naming recipe.reward.model

    def plan_lines(self, cfg: DictConfig, comps: Components) -> list[str]:
        """Where a reward model loads (an adapter on the policy's base or a separate model, and why) and
        where the value function is."""
        from hydratune.components.reward_placement import placement

        path = None if self.reward_url else reward_model_path(self.reward)
        reward = [f"# ppo: {placement(path, comps).describe(path)}"] if path else []
        return [*reward, f"# ppo: value model: {self.value_placement()}"]

    def value_placement(self) -> str:
        """Where the value function is (plan and summary say it)."""
        return VALUE_PLACES[self.value_model]

    def check_data(self, comps: Components, splits: Any, tokenizer: Any) -> None:
        self.check_columns(comps, splits)

    def micro_batch_size(self, micro: int) -> int:
        """Sequences per forward/backward: ``train.micro_batch_size``, at most one mini-batch."""
        return min(micro, self.mini_batch_size)

    def run(self, ctx: RunContext) -> dict[str, Any]:
        from hydratune.components.rl.loop import PPOLoop
        from hydratune.components.runtime.session import Session

        session = Session.start(ctx)
        data = session.load_data()["train"]  # and check_data: the reward's columns, before the model loads
        policy = session.build_model()
        session.evaluate_generations("before")
        # the driver resumes, iterates, checkpoints and stops it; ZeRO-3 / FSDP: gathered on rank 0 for final/
        return session.run(PPOLoop.build(self, ctx, session, policy, data))


#: recipe.value_model's options, and where each puts the value function
VALUE_PLACES = {
    "head": "a value head on the policy's last hidden state (the value loss trains the policy too)",
    "separate": "a separate critic, a whole trainable model (from the reward model, else the policy)",
    "adapter": "a value LoRA adapter + value head on the policy's own base (no second copy)",
}
VALUE_MODELS = tuple(VALUE_PLACES)


def check_value_adapter(comps: Components) -> None:
    """``recipe.value_model=adapter`` puts a second LoRA adapter on the policy's PeftModel: the policy must
    train a LoRA adapter with no bias of the base (the two adapters share the base's weights), on whole
    weights (no engine that shards them)."""
    why = None
    if not comps.peft.lora_adapter:
        why = "needs peft=lora: the critic is a second LoRA adapter beside the policy's, on its base"
        hint = "peft=lora, or recipe.value_model=head"
    elif comps.peft.trains_base_biases:
        why = "shares the base's biases, which peft.bias trains"
        hint = "peft.bias=none, or recipe.value_model=head"
    elif comps.strategy.shards_parameters:
        why = f"switches adapters on whole weights; {comps.strategy.label} shards the base"
        hint = "strategy=ddp (or single), or recipe.value_model=head"
    if why:
        raise ConfigError(f"recipe.value_model=adapter {why}", key="recipe.value_model", hint=hint)


def check_reward(spec: Any) -> None:
    """The reward node must name a function or a reward model (``recipe.reward=null`` names neither)."""
    if reward_model_path(spec) or callable(spec) or (isinstance(spec, str) and spec):
        return
    if isinstance(spec, dict) and spec.get("_target_"):
        return
    raise ConfigError(
        f"no reward: recipe.reward is {spec!r}",
        key="recipe.reward",
        hint="recipe.reward._target_=<module.function> (default "
        "hydratune.components.rewards.exact_match), or "
        "recipe.reward.model=<reward run dir or model dir>",
    )
