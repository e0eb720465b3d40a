"""PPO's loop on accelerate (the driver's ``Loop``, ``components/runtime/driver.py``): built from a run's
components through the strategy's loop hooks (its ``OwnLoop`` extension, ``components/strategy/core.py``),
one iteration at a time (an iteration is the driver's step), checkpointed and restored whole.
``recipes/ppo.py`` builds it and hands it to the driver; the algorithm's pieces are the small functions of
``components/rl/ppo_parts.py``.

Whatever the strategy: the trained modules are sharded (``shard_trained``: FSDP2) before the optimizer is
built over them, the live layout is verified, then ``prepare_loop`` wraps them (DDP, or one DeepSpeed
engine around policy and value head) and the frozen models (reference, reward model) come from
``prepare_frozen`` (a whole copy per process, a ZeRO-3 inference engine, or FSDP2 shards).
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydratune.components.config.errors import ServerError
from hydratune.components.rl import ppo_parts
from hydratune.components.runtime.driver import AfterStep, Final


@dataclass
class PPOLoop:
    """One PPO run's live objects. ``knobs`` is the recipe (its fields are PPO's knobs)."""

    knobs: Any
    ctx: Any  # the RunContext
    session: Any  # the Session (tokenizer, report, model builders)
    data: Any  # the prompt rows
    texts: list[str]  # the prompts rendered with the chat template's generation prompt
    accelerator: Any
    model: ppo_parts.ActorCritic
    loop: Any  # the strategy's PreparedLoop: modules as the loop calls them, optimizer, DeepSpeed engine
    scheduler: Any
    reward: Any
    kl: Any  # the KL controller
    moments: ppo_parts.RunningMoments | None
    sampler: ppo_parts.PromptSampler
    iterations: int
    start: float = field(default_factory=time.time)
    tokens: int = 0
    done: int = 0  # the last iteration that finished
    evaluates = False  # PPO scores its rollouts, not a held-out split

    @property
    def max_steps(self) -> int:
        return self.iterations

    @classmethod
    def build(cls, knobs: Any, ctx: Any, session: Any, policy: Any, data: Any) -> PPOLoop:
        """The value function (a head on the policy's trunk, a separate critic or an adapter on its base), the
        accelerator, the optimizer and schedule, the reference and the reward, all as the strategy shapes
        them."""
        from hydratune.components.rewards import RewardModel, reward_model_path
        from hydratune.components.rl.reward_adapter import AdapterReward

        c, t, tok = ctx.components, ctx.train, session.tokenizer
        texts = [
            tok.apply_chat_template(p, tokenize=False, add_generation_prompt=True) for p in data["prompt"]
        ]
        # recipe.reward_url, else recipe.reward: a LoRA reward run on the policy's own base where it fits
        shared = reward_on_policy_base(knobs, c, session.report["run"])
        session.report["run"]["value model"] = knobs.value_placement()
        reward = AdapterReward(policy, shared) if shared else knobs.reward_function(ctx.device)
        ppo_parts.disable_dropout(policy)
        # the reference: None under PEFT (the adapter-free policy), else a frozen copy, or where the
        # policy is sharded its own sharded model (built below)
        reference = (
            None if c.peft.is_adapter or c.strategy.shards_parameters else ppo_parts.frozen_copy(policy)
        )
        if knobs.value_model == "head":
            value = ppo_parts.value_head(policy)
        elif knobs.value_model == "adapter":  # a second LoRA + head on the policy's base (issue 48)
            from hydratune.components.rl.value_adapter import AdapterCritic

            value = AdapterCritic(policy)
        else:
            load = c.quantization.load_kwargs(ctx.plan.dtype, ctx.device)
            value = ppo_parts.separate_critic(policy, c.model, reward_model_path(knobs.reward), load)
        iterations = iterations_of(knobs, t, len(data))
        steps = iterations * knobs.ppo_epochs * (knobs.rollout_batch_size // knobs.mini_batch_size)
        # one optimizer step per mini-batch: an engine's accumulation = mini-batch / micro-batch
        micro = knobs.micro_batch_size(t.micro_batch_size)
        plan = dataclasses.replace(
            ctx.plan, micro_batch_size=micro, gradient_accumulation_steps=knobs.mini_batch_size // micro
        )
        hooks = c.strategy.loop_hooks  # a strategy without them was refused before load
        acc = hooks.loop_accelerator(ctx.device, plan)
        # FSDP2 turns the parameters into DTensor shards: before the optimizer is built over them
        policy, value = (hooks.shard_trained(acc, m) for m in (policy, value))
        hooks.verify_loop(acc, ctx.plan.world_size, [policy, value])
        session.report["run"]["live strategy"] = hooks.loop_description(acc)
        optimizer = hooks.loop_optimizer(
            c.optimizer, [*policy.parameters(), *value.parameters()], ctx.device, plan
        )
        loop = hooks.prepare_loop(
            acc, {"policy": policy, "value": value}, optimizer, ppo_parts.PolicyAndValue.of
        )
        # the schedule stays ours, stepped once per optimizer step on every rank: accelerate's prepared
        # scheduler steps once per process (and hands DeepSpeed only DeepSpeed's own scheduler types)
        scheduler = c.scheduler.build(loop.optimizer, steps)
        if reference is not None:
            reference = reference.to(acc.device)
        elif not c.peft.is_adapter:  # built like the policy, sharded (a ZeRO-3 inference engine, FSDP2)
            reference = hooks.prepare_frozen(acc, session.build_frozen)
        if isinstance(reward, RewardModel):  # sharded too where the policy is; else a whole copy per process
            reward.model = hooks.prepare_frozen(acc, lambda: reward.model)
        sharding = hooks.loop_report(loop.modules)  # FSDP: this rank's shards
        if sharding:
            session.report["sharding"] = sharding
        policy, value = loop.modules["policy"], loop.modules["value"]
        model = ppo_parts.ActorCritic(
            policy, value, knobs.value_model, reference, acc, knobs.temperature, loop.engine
        )
        kl = (
            ppo_parts.AdaptiveKLController(knobs.kl_coef, knobs.target_kl, knobs.kl_horizon)
            if knobs.adaptive_kl
            else ppo_parts.FixedKLController(knobs.kl_coef)
        )
        moments = ppo_parts.RunningMoments() if knobs.reward_normalization else None
        sampler = ppo_parts.PromptSampler(len(data), t.data_seed if t.data_seed is not None else t.seed)
        return cls(
            knobs,
            ctx,
            session,
            data,
            texts,
            acc,
            model,
            loop,
            scheduler,
            reward,
            kl,
            moments,
            sampler,
            iterations,
        )

    # ---- state --------------------------------------------------------------------------------------
    @property
    def stateful(self) -> dict[str, Any]:
        """What a checkpoint holds besides weights, optimizer, schedule and RNG states."""
        return {"kl": self.kl, "sampler": self.sampler, **({"moments": self.moments} if self.moments else {})}

    @property
    def unwrapped(self) -> dict[str, Any]:
        return {name: self.accelerator.unwrap_model(m) for name, m in self.loop.modules.items()}

    def resume(self, checkpoint: str | None) -> int:
        """Restore ``checkpoint`` if given; the last iteration done (the summary says which this run runs)."""
        self.done = self.restore(checkpoint) - 1 if checkpoint else 0
        earlier = f" (1 to {self.done} are in {checkpoint})" if checkpoint else ""
        self.session.report["run"]["iterations run"] = (
            f"iterations {self.done + 1} to {self.iterations}{earlier}"
        )
        return self.done

    def train(self, done: int, after_step: AfterStep) -> dict[str, Any]:
        """Iterations ``done + 1`` to the last, each logged (metrics.jsonl, the trackers, the progress line)
        and followed by the driver's decision (a checkpoint, the stop). A reward server failing mid-iteration
        leaves the prompt sampler where the iteration found it (its checkpoint is the last finished one)."""
        record: dict[str, Any] = {}
        for it in range(done + 1, self.iterations + 1):
            drawn = self.sampler.state_dict()
            try:
                record = self.iteration(it)  # rollouts, rewards, advantages, updates (every rank)
            except ServerError:
                self.sampler.load_state_dict(drawn)
                raise
            self.done = it
            self.session.log_metrics(record)  # metrics.jsonl + the configured trackers, rank 0
            self.progress(it, done + 1, record)
            decision = after_step(it)
            if decision.save:
                self.save(it)
            if decision.stop:
                break
        return {"train_runtime": self.elapsed(), "iterations": self.iterations, **record}

    def last_step(self) -> int:
        return self.done

    def restore(self, checkpoint: str) -> int:
        """Load ``checkpoint`` (last: it restores the random generators too); the next iteration."""
        from hydratune.components.runtime.checkpoint import load_loop_checkpoint

        state = load_loop_checkpoint(
            Path(checkpoint),
            modules=self.unwrapped,
            optimizer=self.loop.optimizer,
            scheduler=self.scheduler,
            engine=self.loop.engine,
        )
        for name, part in self.stateful.items():
            part.load_state_dict(state[name])
        return int(state["iteration"]) + 1

    def save(self, iteration: int) -> Path:
        """``checkpoints/checkpoint-<iteration>`` (a collective call: every rank takes part)."""
        from hydratune.components.runtime.checkpoint import save_loop_checkpoint

        state = {"iteration": iteration, **{k: v.state_dict() for k, v in self.stateful.items()}}
        t = self.ctx.train
        return save_loop_checkpoint(
            self.ctx.run_dir, iteration, accelerator=self.accelerator, modules=self.unwrapped,
            optimizer=self.loop.optimizer, scheduler=self.scheduler, state=state, keep_last=t.keep_last,
            engine=self.loop.engine,
        )  # fmt: skip

    # ---- one iteration --------------------------------------------------------------------------------
    def iteration(self, it: int) -> dict[str, Any]:
        """Sample responses to a batch of prompts and score them; old log-probs and values, the KL to the
        reference, per-token rewards and advantages; clipped policy and value updates. The record of
        the iteration, every rank's rollouts counted (a collective call)."""
        import torch

        k, acc, c, tok = self.knobs, self.accelerator, self.ctx.components, self.session.tokenizer
        policy = self.loop.modules["policy"]
        # 1. sample responses to a batch of prompts and score them
        idx = self.sampler.take_shard(k.rollout_batch_size, acc.process_index, acc.num_processes)
        rows = self.data[idx]
        with c.strategy.loop_hooks.generation(policy):
            ro = ppo_parts.rollout(
                acc.unwrap_model(policy).eval(), tok, [self.texts[i] for i in idx],
                max_new_tokens=k.response_length, temperature=k.temperature, top_k=k.top_k, top_p=k.top_p,
                max_prompt_length=c.data.max_prompt_length,
                synced_gpus=c.strategy.shards_parameters and acc.num_processes > 1,
            )  # fmt: skip
        acc.unwrap_model(policy).train()
        completions = tok.batch_decode(ro.response, skip_special_tokens=True)
        columns = {name: v for name, v in rows.items() if name != "prompt"}
        scores = self.reward(prompts=rows["prompt"], completions=completions, **columns)  # by keyword, as TRL
        raw = torch.tensor(scores, device=acc.device)
        score = ppo_parts.shape_scores(
            raw.float(), ro.has_eos, missing_eos_penalty=k.missing_eos_penalty, moments=self.moments,
            clip=k.reward_clip,
        )  # fmt: skip
        # 2. old log-probs and values, KL to the reference, per-token rewards, advantages
        ids, mask, n, rmask = ro.input_ids, ro.attention_mask, ro.response.shape[1], ro.response_mask
        with torch.no_grad():
            old_logp, entropy, old_values = self.model.forward(ids, mask, n)
        reference = self.model.reference_logprobs(ids, mask, n)
        kl = ppo_parts.kl_penalty(old_logp, reference, k.kl_estimator) * rmask
        rewards = ppo_parts.per_token_rewards(score, kl, rmask, self.kl.value)
        adv, returns = ppo_parts.gae(rewards, old_values, rmask, k.gamma, k.lam)
        # the baseline's part, before whitening: advantages = returns - values (GAE)
        means = {"values/mean": old_values, "returns/mean": returns, "advantages/mean": adv}
        means = {
            name: acc.reduce(ppo_parts.masked_mean(v, rmask), "mean").item() for name, v in means.items()
        }
        adv = ppo_parts.whiten(adv, rmask) if k.whiten_advantages else adv
        # 3. clipped policy and value updates
        t = self.ctx.train
        stats = ppo_parts.update(
            self.model, ppo_parts.Experience(ids, mask, rmask, old_logp, old_values, adv, returns),
            self.loop.optimizer, self.scheduler, epochs=k.ppo_epochs, mini_batch_size=k.mini_batch_size,
            micro_batch_size=k.micro_batch_size(t.micro_batch_size), clip_ratio=k.clip_ratio,
            value_clip=k.value_clip, vf_coef=k.vf_coef, entropy_coef=k.entropy_coef,
            max_grad_norm=t.max_grad_norm, generator=self.sampler.generator,
        )  # fmt: skip
        # every rank's rollout counts: gather the per-sequence numbers, average the losses
        raw_all, kl_all = acc.gather(raw.float()), acc.gather(kl.sum(1))
        stats = {
            name: acc.reduce(torch.tensor(v, device=acc.device), "mean").item() for name, v in stats.items()
        }
        seq_kl = kl_all.mean().item()
        record = {
            "step": it, "time": round(time.time() - self.start, 3),
            "reward/mean": raw_all.mean().item(),
            "reward/std": raw_all.std().item() if len(raw_all) > 1 else 0.0,
            "score/mean": acc.gather(score).mean().item(), "kl": seq_kl, "kl_coef": self.kl.value,
            "entropy": acc.reduce(ppo_parts.masked_mean(entropy, rmask), "mean").item(),
            "response_length": acc.gather(rmask.sum(1).float()).mean().item(),
            "eos_fraction": acc.gather(ro.has_eos.float()).mean().item(),
            "lr": self.scheduler.get_last_lr()[0], **means, **stats,
        }  # fmt: skip
        self.kl.update(seq_kl, len(idx) * acc.num_processes)
        self.tokens += int(mask.sum()) * acc.num_processes  # every rank samples an equal batch
        return record

    def progress(self, it: int, first: int, record: dict[str, Any]) -> None:
        """The progress line on rank 0, every ``train.log_every`` iterations and at the first and last."""
        from hydratune.components.runtime.callbacks import progress_line

        if not self.accelerator.is_main_process:
            return
        if it % self.ctx.train.log_every and it not in (first, self.iterations):
            return
        elapsed = self.elapsed()
        values = {
            "loss": record.get("loss"), "lr": record["lr"], "tok/s": self.tokens / max(elapsed, 1e-9),
            "reward": record["reward/mean"], "kl": record["kl"], "len": record["response_length"],
        }  # fmt: skip
        print(progress_line("ppo", it, self.iterations, elapsed, it - first + 1, values), flush=True)

    def elapsed(self) -> float:
        return round(time.time() - self.start, 2)

    def finish(self, metrics: dict[str, Any]) -> Final:
        """The policy for ``final/``, the value head beside it and, where the weights are sharded, the state
        dicts gathered on rank 0 (a collective call)."""
        acc, hooks = self.accelerator, self.ctx.components.strategy.loop_hooks
        if hasattr(self.reward, "detach"):  # the reward adapter is not the run's model
            self.reward.detach()
        engine = self.loop.engine
        trained = engine if engine is not None else ppo_parts.PolicyAndValue.of(self.loop.modules)
        gathered = ppo_parts.split_gathered(hooks.gather_loop_weights(acc, trained)) or {}
        unwrapped = self.unwrapped
        if hasattr(unwrapped["value"], "detach"):  # the critic adapter: final/value.safetensors, not final/
            unwrapped["value"].detach()
        return Final(unwrapped["policy"], gathered, extra={"value": unwrapped["value"]})


def reward_on_policy_base(knobs: Any, comps: Any, report: dict[str, Any]) -> str | None:
    """The reward run to put on the policy's base as an adapter (``recipe.reward.model`` when
    :func:`~hydratune.components.reward_placement.placement` says so), else None; the run's report says
    where the reward model went and why."""
    from hydratune.components.reward_placement import placement
    from hydratune.components.rewards import reward_model_path

    path = None if knobs.reward_url else reward_model_path(knobs.reward)
    if not path:
        return None
    placed = placement(path, comps)
    report["reward model"] = placed.describe(path)
    return path if placed.shared else None


def iterations_of(knobs: Any, train: Any, rows: int) -> int:
    """``num_iterations``, else ``train.max_steps``, else ``train.epochs`` passes over the prompts."""
    if knobs.num_iterations:
        return int(knobs.num_iterations)
    return (
        train.max_steps if train.max_steps > 0 else math.ceil(train.epochs * rows / knobs.rollout_batch_size)
    )
