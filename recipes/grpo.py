"""Group Relative Policy Optimization (Shao et al. 2024) on TRL's GRPOTrainer: critic-free.

For every prompt ``num_generations`` completions are sampled; each one's advantage is its reward minus
its group's mean (divided by the group's std with ``scale_rewards=group``). Rewards come from Python
functions (``recipe.reward_funcs``, resolved before load), a server (``recipe.reward_url``) and a trained
reward model (``recipe.reward_model``), in that order.
The reference for the KL term (``beta`` > 0) is the adapter-free policy under PEFT, else a frozen copy.
Prompts with images (a vision-language model, ``data.images``) go with the model's processor to the trainer,
which renders them with their images for generation and for the policy's log-probabilities.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from omegaconf import DictConfig

from hydratune.components.config.errors import ConfigError
from hydratune.components.config.ranges import AT_LEAST_ONE, FINITE, NON_NEGATIVE, POSITIVE, Range, knob
from hydratune.components.recipe import Recipe, recipe
from hydratune.components.rewards_http import RewardURL
from hydratune.components.runtime.run import Components, RunContext

LOSS_TYPES = ("grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo")
SCALE_REWARDS = ("group", "batch", "none")


def default_reward_funcs() -> list[Any]:
    return [{"_target_": "hydratune.components.rewards.exact_match", "_partial_": True}]


@recipe
@dataclass(frozen=True)
class GRPO(Recipe, RewardURL):
    """GRPO on TRL's GRPOTrainer: critic-free, advantages relative to a group of sampled completions."""

    title: ClassVar[str] = "GRPO"
    data_kinds: ClassVar[tuple[str, ...]] = ("prompts",)
    image_rows: ClassVar[bool] = True  # prompts with images: TRL's GRPOTrainer takes the processor

    # optimizer steps unless train.max_steps > 0; null = train.epochs
    steps: int | None = knob(100, AT_LEAST_ONE)
    num_generations: int = knob(8, Range(2), hint="a group needs >= 2 completions")  # per prompt (the group)
    max_completion_length: int = knob(8, AT_LEAST_ONE)  # tokens
    temperature: float = knob(1.0, POSITIVE)
    beta: float = knob(0.0, NON_NEGATIVE)  # KL to the reference (0 = no reference model at all)
    epsilon: float = knob(0.2, Range(0, 1, low_open=True, high_open=True))  # clipping of the importance ratio
    loss_type: str = "dapo"  # grpo | dr_grpo | dapo | bnpo | cispo | sapo
    scale_rewards: str = "group"  # group | batch | none
    num_iterations: int = knob(1, AT_LEAST_ONE)  # updates per generation batch (mu in the paper)
    mask_truncated_completions: bool = False
    reward_funcs: list[Any] = field(
        default_factory=default_reward_funcs
    )  # _target_ callables or dotted paths
    # one per reward (reward_funcs, reward_url, reward_model)
    reward_weights: list[float] | None = knob(None, FINITE)
    reward_model: str | None = None  # a reward run dir / model dir, scored after reward_funcs
    # functions the policy may call while it generates (dotted paths or _target_ nodes, _partial_: true)
    tools: list[Any] = field(default_factory=list)
    max_tool_calls: int | None = knob(None, AT_LEAST_ONE)  # tool-calling rounds per episode; null: no limit
    tool_timeout: float = knob(10.0, POSITIVE)  # seconds a tool call may take before the model reads an error
    # a class with reset(**row) and tool methods (dotted path or _target_ node, _partial_: true): a fresh one
    # per rollout; its get_reward(), if any, is a reward
    environment: Any = None

    def check(self, cfg: DictConfig, comps: Components) -> None:
        if self.loss_type not in LOSS_TYPES:
            raise ConfigError(
                f"unknown '{self.loss_type}'", key="recipe.loss_type", hint=f"one of {LOSS_TYPES}"
            )
        if str(self.scale_rewards) not in SCALE_REWARDS:
            raise ConfigError(
                f"unknown '{self.scale_rewards}'", key="recipe.scale_rewards", hint=f"one of {SCALE_REWARDS}"
            )
        batch = cfg.train.micro_batch_size * cfg.train.gradient_accumulation_steps
        if batch % self.num_generations:
            raise ConfigError(
                f"train.micro_batch_size * gradient_accumulation_steps ({batch}) must be a multiple of "
                f"num_generations ({self.num_generations})",
                key="recipe.num_generations",
            )
        trusted = bool(cfg.get("trust_targets", False))
        environment = self.environment_factory(trusted=trusted)
        env_reward = environment is not None and callable(
            getattr(environment_class(environment), "get_reward", None)
        )
        if not self.reward_funcs and not self.reward_model and not self.reward_url and not env_reward:
            raise ConfigError(
                "no reward: give reward_funcs, reward_url or reward_model",
                key="recipe.reward_funcs",
                hint="recipe.reward_funcs=[hydratune.components.rewards.exact_match], "
                "recipe.reward_url=http://…, "
                "recipe.reward_model=<run dir>, or an environment with get_reward()",
            )
        for i, spec in enumerate(self.reward_funcs or []):
            if not spec:
                raise ConfigError(
                    f"reward {i} is {spec!r}",
                    key="recipe.reward_funcs",
                    hint="each entry a function: a dotted path or a _target_ node with _partial_: true",
                )
        self.reward_functions(trusted=bool(cfg.get("trust_targets", False)))  # imported and checked
        self.check_reward_url()
        self.tool_functions(trusted=trusted)  # imported, trusted, described
        n_rewards = len(self.reward_funcs) + bool(self.reward_url) + bool(self.reward_model) + env_reward
        if self.reward_weights is not None and len(self.reward_weights) != n_rewards:
            raise ConfigError(f"one weight per reward ({n_rewards})", key="recipe.reward_weights")
        if self.reward_model:
            from hydratune.components.rewards import reward_model_dir

            reward_model_dir(self.reward_model, key="recipe.reward_model")

    def reward_functions(self, *, trusted: bool = True) -> list[tuple[str, Any]]:
        """``(key, function)`` of every reward function, resolved and checked (before load)."""
        from hydratune.components.rewards import check_reward

        keyed = [(f"recipe.reward_funcs[{i}]", spec) for i, spec in enumerate(self.reward_funcs or [])]
        functions = [(key, check_reward(spec, key, trusted=trusted)) for key, spec in keyed]
        return [(key, f) for key, f in functions if f is not None]

    def tool_functions(self, *, trusted: bool = True) -> list[Any]:
        """Every ``recipe.tools[i]``, resolved and checked (before load: components/tools.py)."""
        from hydratune.components.tools import resolve_tools

        return resolve_tools(self.tools or [], trusted=trusted)

    def environment_factory(self, *, trusted: bool = True) -> Any:
        """``recipe.environment``'s factory, resolved and checked (before load: components/environment.py)."""
        from hydratune.components.environment import resolve_environment

        return (
            None if self.environment in (None, "") else resolve_environment(self.environment, trusted=trusted)
        )

    def plan_lines(self, cfg: DictConfig, comps: Components) -> list[str]:
        """Where a reward model loads (an adapter on the policy's base or a separate model, and why); the
        tools (the environment's methods too) and the schemas the model is shown."""
        import functools

        from hydratune.components.environment import tool_methods
        from hydratune.components.reward_placement import placement
        from hydratune.components.tools import describe, plan_lines

        reward = (
            [f"# grpo: {placement(self.reward_model, comps).describe(self.reward_model)}"]
            if self.reward_model
            else []
        )
        factory = self.environment_factory()
        methods = [] if factory is None else tool_methods(environment_class(factory))
        if not self.tools and not methods:
            return reward
        count = len(self.tools) + len(methods)
        lines = [*reward, *plan_lines(self.tool_functions(), self.max_tool_calls, self.tool_timeout, count)]
        if factory is not None:
            name = environment_class(factory).__name__
            lines += [f"# environment {name} (a fresh one per rollout), its methods:"]
            lines += describe([functools.partial(m, None) for _, m in methods])
        return lines

    def check_data(self, comps: Components, splits: Any, tokenizer: Any) -> None:
        """The columns the reward functions read are in the rows (``answer`` for exact_match); no prompt
        over data.max_prompt_length left to cut (TRL renders each prompt whole: it cannot); with tools, a
        chat template that renders tool calls and results (components/tools.py)."""
        from hydratune.components.data.promptlength import OVERLONG
        from hydratune.components.rewards import check_columns

        if self.tools or self.environment:
            from hydratune.components.tools import check_template

            check_template(tokenizer)
            first = splits["train"][0] if len(splits["train"]) else {}
            factory = self.environment_factory()
            if factory is not None and first:
                from hydratune.components.environment import check_reset

                check_reset(factory, dict(first), str(comps.data.path))
            prompt = first.get("prompt", [])
            if isinstance(prompt, str):  # TRL parses tool calls out of chat completions only
                raise ConfigError(
                    f"recipe.tools needs chat prompts (a list of messages), and {comps.data.path}'s are text",
                    key="recipe.tools",
                    hint='prompts as messages: {"prompt": [{"role": "user", "content": "..."}], ...}',
                )
            self.check_prompt_with_tools(comps, prompt, tokenizer)

        columns = splits["train"].column_names
        check_columns(self.reward_functions(), columns, str(comps.data.path))
        over = splits.info.get(OVERLONG)
        limit, _, policy = comps.data.prompt_limit()
        if over and policy == "truncate":
            raise ConfigError(
                f"{OVERLONG}={limit}: {over.split(':')[0]}, and GRPO cannot cut a prompt (TRL renders each "
                "one whole)",
                key="data.on_overlong",
                hint="data.on_overlong=drop (counted) or error, or raise data.max_prompt_length",
            )

    def check_prompt_with_tools(self, comps: Components, prompt: Any, tokenizer: Any) -> None:
        """The first row's prompt with the schemas of every tool (the environment's methods too) the chat
        template adds must fit data.max_prompt_length and the model's context (components/tools.py
        check_prompt_fits)."""
        import functools

        from hydratune.components.environment import tool_methods
        from hydratune.components.tools import check_prompt_fits, model_context, schema

        factory = self.environment_factory()
        methods = [] if factory is None else tool_methods(environment_class(factory))
        bound = [functools.partial(m, None) for _, m in methods]
        schemas = [schema(f) for f in [*self.tool_functions(), *bound]]
        check_prompt_fits(comps.data, prompt, tokenizer, schemas, model_context(comps))

    def warnings(self, cfg: DictConfig, comps: Components) -> list[str]:
        """Your data.path with the knobs left at the tiny demo's values (tuned for its 8-token sums)."""
        from hydratune.components.config.resolvers import is_demo_asset

        if is_demo_asset(str(comps.data.path)):
            return []
        kept = {
            "optimizer.lr": (comps.optimizer.lr, 1e-3),
            "train.micro_batch_size": (cfg.train.micro_batch_size, 32),
            "recipe.max_completion_length": (self.max_completion_length, 8),
        }
        same = [f"{k}={v:g}" for k, (v, demo) in kept.items() if v == demo]
        if not same:
            return []
        prompts = cfg.train.micro_batch_size * cfg.train.gradient_accumulation_steps // self.num_generations
        return [
            f"recipe=grpo on your data.path keeps the demo's {', '.join(same)} (tuned for the tiny demo: "
            f"{prompts} prompts x {self.num_generations} completions a step); real models usually want "
            "optimizer.lr=1e-6..1e-5 and completions of hundreds of tokens (recipe.max_completion_length)"
        ]

    def run(self, ctx: RunContext) -> dict[str, Any]:
        from trl import GRPOConfig, GRPOTrainer

        from hydratune.components.rewards import RewardModel, resolve_reward
        from hydratune.components.runtime.session import Session
        from hydratune.components.runtime.trainer_loop import TrainerLoop

        c, t = ctx.components, ctx.train
        session = Session.start(ctx)
        data = session.load_data()  # and check_data: the reward columns, no prompt left to cut
        images = data.has_images  # prompts with images: the trainer gets the processor
        model = session.build_model()
        session.evaluate_generations("before")
        rewards = [resolve_reward(spec) for spec in self.reward_funcs]
        if self.reward_url:
            rewards.append(self.http_reward())
        shared = None
        if self.reward_model:  # a LoRA reward run on the policy's own base where it fits (issue 48)
            from hydratune.components.reward_placement import placement
            from hydratune.components.rl.reward_adapter import AdapterReward

            placed = placement(self.reward_model, c)
            session.report["run"]["reward model"] = placed.describe(self.reward_model)
            shared = AdapterReward(model, self.reward_model) if placed.shared else None
            rewards.append(shared or RewardModel(self.reward_model, ctx.device))
        if self.beta > 0 and not c.peft.is_adapter and c.model.init == "random":
            # TRL builds the reference from config._name_or_path (a loaded model's own dir or hub id); a
            # random-init policy has none, so its starting weights are saved for TRL to load from.
            reference = ctx.run_dir.path / "reference"
            save_whole(model, reference, ctx)
            model.config._name_or_path = str(reference)
        # train.epochs (32) is tuned for the SFT demo: RL runs are counted in steps unless told otherwise
        steps = t.max_steps if t.max_steps > 0 or self.steps is None else self.steps
        args = GRPOConfig(
            **ctx.training_args(
                max_steps=steps,
                num_generations=self.num_generations,
                max_completion_length=self.max_completion_length,
                temperature=self.temperature,
                beta=self.beta,
                epsilon=self.epsilon,
                loss_type=self.loss_type,
                scale_rewards=self.scale_rewards,
                num_iterations=self.num_iterations,
                mask_truncated_completions=self.mask_truncated_completions,
                reward_weights=self.reward_weights,
                generation_kwargs={"use_cache": True},
                max_tool_calling_iterations=self.max_tool_calls,
                disable_dropout=True,
                include_num_input_tokens_seen="no",
                remove_unused_columns=False,
            )
        )
        extra: dict[str, Any] = {"processing_class": session.processor} if images else {}
        stats = None
        if self.tools or self.environment:
            from hydratune.components.environment import fresh_factory
            from hydratune.components.tools import ToolStats, wrap

            stats = ToolStats()
            extra["tools"] = wrap(self.tool_functions(), self.tool_timeout, stats)
            factory = self.environment_factory()
            if factory is not None:
                extra["environment_factory"] = fresh_factory(factory, self.tool_timeout, stats)
        trainer = session.trainer(GRPOTrainer, args, data, reward_funcs=rewards, **extra)
        if shared is not None:  # off the policy before final/ is saved (checkpoints carry it, unused)
            from hydratune.components.runtime.callbacks import AtTrainEnd

            trainer.add_callback(AtTrainEnd(shared.detach))
        if stats is not None:
            from hydratune.components.runtime.callbacks import MetricsCallback, ToolMetrics

            callbacks = trainer.callback_handler.callbacks
            at = next(i for i, cb in enumerate(callbacks) if isinstance(cb, MetricsCallback))
            # before MetricsCallback: it writes what this adds
            callbacks.insert(at, ToolMetrics(stats, trainer.accelerator))
            observe_episodes(trainer, session, self.max_tool_calls, stats)
        return session.run(TrainerLoop(session, trainer))


def observe_episodes(trainer: Any, session: Any, limit: int | None, stats: Any) -> None:
    """The summary's ``tools`` section, from what TRL's tool loop returns each generation batch (on several
    ranks, gathered from all of them: every rank runs the loop on its share of each batch)."""
    from hydratune.components.tools import Episodes

    gather = None
    if trainer.accelerator.num_processes > 1:
        from accelerate.utils import gather_object as gather
    episodes = Episodes(session.tokenizer, limit, stats, gather)
    session.report["tools"] = episodes.section
    loop = trainer._tool_call_loop

    def observed(*args: Any, **kwargs: Any) -> Any:
        result = loop(*args, **kwargs)
        tool_mask, completions, completion_ids = result[:3]
        episodes.observe(tool_mask, completions, completion_ids)
        return result

    trainer._tool_call_loop = observed


def environment_class(factory: Any) -> Any:
    from hydratune.components.environment import environment_class as of

    return of(factory)


def save_whole(model: Any, path: Any, ctx: RunContext) -> None:
    """``save_pretrained`` of the whole weights (every rank writes the same files, as before). Under ZeRO-3
    each rank holds a shard (saving would write empty tensors): all gather, rank 0 writes, all wait."""
    if not ctx.components.strategy.partitions_at_load:
        model.save_pretrained(path, safe_serialization=True)
        return
    import deepspeed
    import torch.distributed as dist

    with deepspeed.zero.GatheredParameters(list(model.parameters())):
        if ctx.is_main_process:
            model.save_pretrained(path, safe_serialization=True)
    dist.barrier()  # zero.Init made the process group; TRL loads the reference from these files
