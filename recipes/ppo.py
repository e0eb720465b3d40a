"""PPO with a learned value function (Ziegler et al. 2019), our own loop on accelerate.

Each iteration: sample responses to ``rollout_batch_size`` prompts → score them (a reward function or a
trained reward model) → log-probs of policy and reference, values → per-token rewards (score - KL
penalty) → GAE → ``ppo_epochs`` passes of clipped policy + value updates in mini-batches. The pieces are
the small functions of ``components/ppo.py``; the reference is the adapter-free policy under PEFT (no
second copy of the weights), else a frozen copy (under ZeRO-3 a separate inference engine, under FSDP a
sharded frozen model). Under FSDP the modules are sharded with ``fully_shard`` itself (accelerate's FSDP
plugin cannot run on CPU), before the optimizer is built. Metrics go to ``metrics.jsonl`` and the trackers
each iteration; checkpoints every ``train.save_every`` iterations hold everything ``resume`` needs to
continue at the next iteration.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig

from components.checks import require_prompts
from components.errors import ConfigError
from components.registry import component
from components.rewards import default_reward, reward_model_path
from components.run import Components, RunContext


@component("recipe")
@dataclass
class PPO:
    """Knobs of PPO; the optimizer, schedule, precision, PEFT, seed and clipping come from the groups."""

    num_iterations: int | None = 100  # rollout + update rounds; None = from train.max_steps / train.epochs
    rollout_batch_size: int = 32  # prompts per process per iteration
    ppo_epochs: int = 2  # passes over each rollout
    mini_batch_size: int = 16  # sequences per optimizer step
    response_length: int = 8  # max new tokens
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    gamma: float = 1.0
    lam: float = 0.95
    clip_ratio: float = 0.2
    value_clip: float = 0.2
    vf_coef: float = 0.1
    entropy_coef: float = 0.0
    kl_coef: float = 0.05
    kl_estimator: str = "k1"  # k1 | k3
    adaptive_kl: bool = False
    target_kl: float = 6.0  # adaptive: sequence-level KL the controller aims at
    kl_horizon: int = 10000  # adaptive: samples over which the coefficient may move by 20%
    whiten_advantages: bool = True
    reward_normalization: bool = False  # divide scores by running std after subtracting the running mean
    reward_clip: float = 10.0
    missing_eos_penalty: float | None = -1.0  # added to the score of responses cut off before EOS
    value_model: str = "head"  # head (on the policy's trunk) | separate (critic from reward model / policy)
    reward: Any = field(default_factory=default_reward)  # _target_ callable, or model=<dir or run dir>

    periodic_eval = False  # its loop does not evaluate every train.eval_every steps
    shards_with_fully_shard = True  # its loop shards with FSDP2 itself: strategy=fsdp runs on CPU too

    def check(self, cfg: DictConfig, comps: Components) -> None:
        require_prompts("ppo", comps)
        rules = {
            "num_iterations": self.num_iterations is None or self.num_iterations >= 1,
            "rollout_batch_size": self.rollout_batch_size >= 1,
            "ppo_epochs": self.ppo_epochs >= 1,
            "mini_batch_size": self.mini_batch_size >= 1
            and self.rollout_batch_size % self.mini_batch_size == 0,
            "response_length": self.response_length >= 1,
            "temperature": self.temperature > 0,
            "gamma": 0 < self.gamma <= 1,
            "lam": 0 < self.lam <= 1,
            "clip_ratio": 0 < self.clip_ratio < 1,
            "value_clip": self.value_clip > 0,
            "vf_coef": self.vf_coef >= 0,
            "entropy_coef": self.entropy_coef >= 0,
            "kl_coef": self.kl_coef >= 0,
            "kl_estimator": self.kl_estimator in ("k1", "k3"),
            "target_kl": self.target_kl > 0,
            "kl_horizon": self.kl_horizon >= 1,
            "reward_clip": self.reward_clip > 0,
            "value_model": self.value_model in ("head", "separate"),
        }
        for key, ok in rules.items():
            if not ok:
                hint = "a divisor of rollout_batch_size" if key == "mini_batch_size" else None
                raise ConfigError(f"invalid value {getattr(self, key)!r}", key=f"recipe.{key}", hint=hint)
        from components.strategy import DDP, FSDP, DeepSpeed, Single

        if not isinstance(comps.strategy, (Single, DDP, DeepSpeed, FSDP)):
            raise ConfigError(
                f"recipe=ppo runs under single, ddp, fsdp and DeepSpeed ZeRO 0-3, not "
                f"{type(comps.strategy).__name__}",
                key="strategy",
                hint="strategy=fsdp or strategy=zero3 (or zero2) with launcher.nproc_per_node=N",
            )
        gathers = getattr(comps.strategy, "stage3_gather_16bit_weights_on_model_save", True)
        if isinstance(comps.strategy, FSDP):
            self.check_fsdp(cfg, comps)
        elif comps.strategy.shards_parameters and not gathers:
            raise ConfigError(
                "PPO under ZeRO-3 gathers the final weights on rank 0",
                key="strategy.stage3_gather_16bit_weights_on_model_save",
                hint="leave it true",
            )
        if isinstance(comps.strategy, DeepSpeed):
            if self.value_model != "head":
                raise ConfigError(
                    "under DeepSpeed PPO trains one engine: the value function must be the policy's head",
                    key="recipe.value_model",
                    hint="recipe.value_model=head",
                )
            if self.mini_batch_size % self.micro_batch_size(cfg.train.micro_batch_size):
                raise ConfigError(
                    "under DeepSpeed the mini-batch must be whole micro-batches (its accumulation steps)",
                    key="recipe.mini_batch_size",
                    hint=f"a multiple of train.micro_batch_size={cfg.train.micro_batch_size}",
                )
        check_reward(self.reward)
        if reward_model_path(self.reward):
            from components.rewards import reward_model_dir

            reward_model_dir(reward_model_path(self.reward))  # raises naming recipe.reward.model

    def micro_batch_size(self, micro: int) -> int:
        """Sequences per forward/backward: ``train.micro_batch_size``, at most one mini-batch."""
        return min(micro, self.mini_batch_size)

    def check_fsdp(self, cfg: DictConfig, comps: Components) -> None:
        """What the loop's own FSDP2 sharding does not do (rather than ignore the knob): fp16 (its loss
        scaling would need a sharded gradient scaler), FSDP's activation checkpointing and sharded
        checkpoints (accelerate's plugin only)."""
        from components.strategy import detect_device

        s = comps.strategy
        refused = {
            "precision": (
                comps.precision.resolve(detect_device(s.device)) == "fp16",
                "PPO under FSDP trains in fp32 or bf16: fp16 loss scaling is not wired into its loop",
                "precision=bf16 (FSDP2 computes in bf16 and reduces gradients in fp32)",
            ),
            "strategy.activation_checkpointing": (
                s.activation_checkpointing,
                "PPO's FSDP2 loop does not apply FSDP's activation checkpointing",
                "strategy.activation_checkpointing=false, model.gradient_checkpointing=true (the model's)",
            ),
            "strategy.state_dict_type": (
                s.state_dict_type != "FULL_STATE_DICT",
                "PPO's FSDP2 loop checkpoints weights and optimizer state gathered whole on rank 0",
                "strategy.state_dict_type=FULL_STATE_DICT",
            ),
        }
        for key, (bad, message, hint) in refused.items():
            if bad:
                raise ConfigError(message, key=key, hint=hint)

    def iterations(self, ctx: RunContext, rows: int) -> int:
        """``num_iterations``, else ``train.max_steps``, else ``train.epochs`` passes over the prompts."""
        t = ctx.train
        if self.num_iterations:
            return self.num_iterations
        return t.max_steps if t.max_steps > 0 else math.ceil(t.epochs * rows / self.rollout_batch_size)

    def run(self, ctx: RunContext) -> dict[str, Any]:
        import dataclasses
        import time
        from pathlib import Path

        import torch
        from accelerate.utils import DistributedType

        from components import ppo
        from components.callbacks import progress_line
        from components.checkpoint import load_loop_checkpoint, save_loop_checkpoint
        from components.resume import pinned
        from components.rewards import RewardModel, resolve_reward
        from components.session import Session
        from components.startup import training_starts

        c, t = ctx.components, ctx.train
        session = Session.start(ctx)
        resume = pinned(ctx.cfg)  # resolved and checked before load (components/resume.py)
        splits = session.load_data()
        data, tok = splits["train"], session.tokenizer
        policy = session.build_model()
        session.evaluate_generations("before")
        texts = [
            tok.apply_chat_template(p, tokenize=False, add_generation_prompt=True) for p in data["prompt"]
        ]
        reward_fn = resolve_reward(self.reward, ctx.device)
        # the models: value head on the trunk or a separate critic; the reference: None under PEFT (the
        # adapter-free policy), else a frozen copy, or under ZeRO-3 its own inference engine (built below)
        sharded = c.strategy.shards_parameters
        ppo.disable_dropout(policy)
        reference = None if c.peft.is_adapter or sharded else ppo.frozen_copy(policy)
        if self.value_model == "head":
            value = ppo.value_head(policy)
        else:
            load = c.quantization.load_kwargs(c.precision.resolve(ctx.device), ctx.device)
            value = ppo.separate_critic(policy, c.model, reward_model_path(self.reward), load)
        iterations = self.iterations(ctx, len(data))
        steps = iterations * self.ppo_epochs * (self.rollout_batch_size // self.mini_batch_size)
        # one optimizer step per mini-batch: DeepSpeed's accumulation = mini-batch / micro-batch
        micro = self.micro_batch_size(t.micro_batch_size)
        plan = dataclasses.replace(
            ctx.plan, micro_batch_size=micro, gradient_accumulation_steps=self.mini_batch_size // micro
        )
        acc = c.strategy.loop_accelerator(ctx.device, plan)
        # FSDP2 turns the parameters into DTensor shards: before the optimizer is built over them
        policy, value = (c.strategy.shard_trained(acc, m) for m in (policy, value))
        c.strategy.verify_loop(acc, ctx.plan.world_size, [policy, value])
        session.report["run"]["live strategy"] = c.strategy.loop_description(acc)
        params = [*policy.parameters(), *value.parameters()]
        optimizer = c.strategy.loop_optimizer(
            c.optimizer, params, ctx.device, plan
        )  # DeepSpeed: maybe its own
        engine = None
        if acc.distributed_type == DistributedType.DEEPSPEED:  # one engine for policy + value head
            engine, optimizer = acc.prepare(ppo.PolicyAndValue(policy, value), optimizer)
            policy, value = engine.module.policy, engine.module.value
        else:
            policy, value, optimizer = c.strategy.prepare_loop(acc, policy, value, optimizer)
        # the schedule stays ours, stepped once per optimizer step on every rank: accelerate's prepared
        # scheduler steps once per process (and hands DeepSpeed only DeepSpeed's own scheduler types)
        scheduler = c.scheduler.build(optimizer, steps)
        if reference is not None:
            reference = reference.to(acc.device)
        elif not c.peft.is_adapter:  # built like the policy, sharded (a ZeRO-3 inference engine, FSDP2)
            reference = c.strategy.prepare_frozen(acc, session.build_frozen)
        if isinstance(reward_fn, RewardModel):  # ZeRO-3 / FSDP: sharded too; else a whole copy per process
            reward_fn.model = c.strategy.prepare_frozen(acc, lambda: reward_fn.model)
        sharding = c.strategy.loop_report({"policy": policy, "value": value})  # FSDP: this rank's shards
        if sharding:
            session.report["sharding"] = sharding
        model = ppo.ActorCritic(
            policy, value, self.value_model == "separate", reference, acc, self.temperature, engine
        )
        kl_ctl = (
            ppo.AdaptiveKLController(self.kl_coef, self.target_kl, self.kl_horizon)
            if self.adaptive_kl
            else ppo.FixedKLController(self.kl_coef)
        )
        moments = ppo.RunningMoments() if self.reward_normalization else None
        sampler = ppo.PromptSampler(len(data), t.data_seed if t.data_seed is not None else t.seed)
        # what a checkpoint holds besides weights, optimizer, schedule and RNG states
        stateful = {"kl": kl_ctl, "sampler": sampler, **({"moments": moments} if moments else {})}
        modules = {"policy": acc.unwrap_model(policy), "value": acc.unwrap_model(value)}
        first = 1
        if resume:  # last: it restores the random generators too
            state = load_loop_checkpoint(
                Path(resume), modules=modules, optimizer=optimizer, scheduler=scheduler, engine=engine,
            )  # fmt: skip
            for name, part in stateful.items():
                part.load_state_dict(state[name])
            first = state["iteration"] + 1
            session.report["run"]["resumed from"] = resume
        earlier = f" (1 to {first - 1} are in {resume})" if resume else ""
        session.report["run"]["iterations run"] = f"iterations {first} to {iterations}{earlier}"
        start, record, tokens = time.time(), {}, 0
        training_starts()  # everything is built: the collector's start-up pause ends here
        session.interrupt.install()
        try:
            for it in range(first, iterations + 1):
                # 1. sample responses to a batch of prompts and score them
                idx = sampler.take_shard(self.rollout_batch_size, acc.process_index, acc.num_processes)
                rows = data[idx]
                with c.strategy.generation(policy):
                    ro = ppo.rollout(
                        acc.unwrap_model(policy).eval(), tok, [texts[i] for i in idx],
                        max_new_tokens=self.response_length, temperature=self.temperature, top_k=self.top_k,
                        top_p=self.top_p, max_prompt_length=c.data.max_prompt_length,
                        synced_gpus=sharded and acc.num_processes > 1,
                    )  # fmt: skip
                acc.unwrap_model(policy).train()
                completions = tok.batch_decode(ro.response, skip_special_tokens=True)
                columns = {k: v for k, v in rows.items() if k != "prompt"}
                raw = torch.tensor(reward_fn(rows["prompt"], completions, **columns), device=acc.device)
                score = ppo.shape_scores(
                    raw.float(), ro.has_eos, missing_eos_penalty=self.missing_eos_penalty, moments=moments,
                    clip=self.reward_clip,
                )  # fmt: skip
                # 2. old log-probs and values, KL to the reference, per-token rewards, advantages
                ids, mask, n, rmask = ro.input_ids, ro.attention_mask, ro.response.shape[1], ro.response_mask
                with torch.no_grad():
                    old_logp, entropy, old_values = model.forward(ids, mask, n)
                kl = (
                    ppo.kl_penalty(old_logp, model.reference_logprobs(ids, mask, n), self.kl_estimator)
                    * rmask
                )
                rewards = ppo.per_token_rewards(score, kl, rmask, kl_ctl.value)
                adv, returns = ppo.gae(rewards, old_values, rmask, self.gamma, self.lam)
                # the baseline's part, before whitening: advantages = returns - values (GAE)
                means = {"values/mean": old_values, "returns/mean": returns, "advantages/mean": adv}
                means = {k: acc.reduce(ppo.masked_mean(v, rmask), "mean").item() for k, v in means.items()}
                adv = ppo.whiten(adv, rmask) if self.whiten_advantages else adv
                # 3. clipped policy and value updates
                stats = ppo.update(
                    model, ppo.Experience(ids, mask, rmask, old_logp, old_values, adv, returns), optimizer,
                    scheduler, epochs=self.ppo_epochs, mini_batch_size=self.mini_batch_size,
                    micro_batch_size=micro, clip_ratio=self.clip_ratio,
                    value_clip=self.value_clip, vf_coef=self.vf_coef, entropy_coef=self.entropy_coef,
                    max_grad_norm=t.max_grad_norm, generator=sampler.generator,
                )  # fmt: skip
                # every rank's rollout counts: gather the per-sequence numbers, average the losses
                raw_all, kl_all = acc.gather(raw.float()), acc.gather(kl.sum(1))
                stats = {
                    k: acc.reduce(torch.tensor(v, device=acc.device), "mean").item() for k, v in stats.items()
                }
                seq_kl = kl_all.mean().item()
                record = {
                    "step": it, "time": round(time.time() - start, 3),
                    "reward/mean": raw_all.mean().item(),
                    "reward/std": raw_all.std().item() if len(raw_all) > 1 else 0.0,
                    "score/mean": acc.gather(score).mean().item(), "kl": seq_kl, "kl_coef": kl_ctl.value,
                    "entropy": acc.reduce(ppo.masked_mean(entropy, rmask), "mean").item(),
                    "response_length": acc.gather(rmask.sum(1).float()).mean().item(),
                    "eos_fraction": acc.gather(ro.has_eos.float()).mean().item(),
                    "lr": scheduler.get_last_lr()[0], **means, **stats,
                }  # fmt: skip
                kl_ctl.update(seq_kl, len(idx) * acc.num_processes)
                session.log_metrics(record)  # metrics.jsonl + the configured trackers, rank 0
                tokens += int(mask.sum()) * acc.num_processes  # every rank samples an equal batch
                if acc.is_main_process and (it % t.log_every == 0 or it in (1, iterations)):
                    elapsed = time.time() - start
                    values = {
                        "loss": stats.get("loss"), "lr": record["lr"], "tok/s": tokens / elapsed,
                        "reward": record["reward/mean"], "kl": seq_kl, "len": record["response_length"],
                    }  # fmt: skip
                    print(progress_line("ppo", it, iterations, elapsed, it - first + 1, values), flush=True)
                stop = session.interrupt.agreed()  # collective: every rank stops after the same iteration
                if (t.save_every and it % t.save_every == 0) or stop:
                    loop_state = {"iteration": it, **{k: v.state_dict() for k, v in stateful.items()}}
                    saved = save_loop_checkpoint(
                        ctx.run_dir, it, accelerator=acc, modules=modules, optimizer=optimizer,
                        scheduler=scheduler, state=loop_state, keep_last=t.keep_last, engine=engine,
                    )  # fmt: skip
                if stop:
                    metrics = {"train_runtime": round(time.time() - start, 2), **record}
                    raise session.stopped("PPO", it, str(saved), metrics)
        finally:
            session.interrupt.uninstall()
            c.tracker.finish()
        metrics = {"train_runtime": round(time.time() - start, 2), "iterations": iterations, **record}
        unwrap = acc.unwrap_model
        # ZeRO-3 / FSDP: the weights gathered on rank 0 (a collective call)
        trained = engine if engine is not None else ppo.PolicyAndValue(policy, value)
        gathered = ppo.split_gathered(c.strategy.gather_loop_weights(acc, trained))
        return session.finish_loop(
            unwrap(policy), title="PPO", metrics=metrics, extra={"value": unwrap(value)}, gathered=gathered
        )


def check_reward(spec: Any) -> None:
    """The reward node must name a function or a reward model (``recipe.reward=null`` names neither)."""
    if reward_model_path(spec) or callable(spec) or (isinstance(spec, str) and spec):
        return
    if isinstance(spec, dict) and spec.get("_target_"):
        return
    raise ConfigError(
        f"no reward: recipe.reward is {spec!r}",
        key="recipe.reward",
        hint="recipe.reward._target_=<module.function> (default components.rewards.exact_match), or "
        "recipe.reward.model=<reward run dir or model dir>",
    )
