"""Reward functions for on-policy RL (``recipe=ppo``, ``recipe=grpo``).

A reward function takes the prompts, the completions and every other column of the rows as keyword
lists (``answer=[...]``) and returns one float per completion. Name one in a config with
``recipe.reward._target_=hydratune.components.rewards.exact_match`` (PPO) or in ``recipe.reward_funcs``
(GRPO). Completions arrive as text (PPO) or as assistant messages (GRPO on chat data); both are accepted.

User functions resolve before any model loads (:func:`check_reward`): a module in the working directory,
next to the experiment file or beside the command line's ``data.path`` imports without ``PYTHONPATH``; a
misspelt name is a ``ConfigError`` with the close matches. Every recipe calls a reward by keyword, so it
needs a ``completions`` parameter (and ``prompts`` or ``**kwargs``). Unless ``trust_targets=true`` a reward
must be a plain function of hydratune's or of the user's own modules (not of an installed package or the
standard library, e.g. ``torch.hub.load``), and its bound keywords plain data (no callables).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from hydratune.components.generation.evaluation import normalise


def text_of(completion: Any) -> str:
    """The text of a completion: a string, or the content of the last of a list of messages."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content", ""))
    return str(completion)


def exact_match(prompts: list[Any], completions: list[Any], answer: list[str], **_: Any) -> list[float]:
    """1.0 where the completion equals the row's ``answer`` (modulo white space and case), else 0.0."""
    return [float(normalise(text_of(c)) == normalise(a)) for c, a in zip(completions, answer, strict=True)]


def length_penalty(
    prompts: list[Any], completions: list[Any], target: int = 4, scale: float = 0.1, **_: Any
) -> list[float]:
    """``-scale * |len(completion) - target|`` in characters: an example of a shaping reward."""
    return [-scale * abs(len(text_of(c).strip()) - target) for c in completions]


# ---- reward models and config nodes -----------------------------------------------------------------
def default_reward() -> dict[str, Any]:
    """The ``recipe.reward`` node of PPO and Best-of-N: exact match, unless a reward model is named."""
    return {"_target_": "hydratune.components.rewards.exact_match", "_partial_": True, "model": None}


def reward_model_path(spec: Any) -> str | None:
    """The reward model named by the reward node, if any."""
    import functools

    if isinstance(spec, functools.partial):
        return spec.keywords.get("model")
    if isinstance(spec, dict):
        return spec.get("model")
    return None


def reward_model_dir(path: str, key: str = "recipe.reward.model") -> str:
    """A model dir (holding config.json) or a run dir whose ``final/`` holds a trained reward model: a whole
    one, or a LoRA adapter (``recipe=reward peft=lora``) whose base the run's saved model node names (a hub
    id, a dir, or through its own ``model.from_run`` an earlier run's final model), checked before load."""
    from hydratune.components.config.errors import ConfigError
    from hydratune.components.modeling.trained import final_model_dir

    p = Path(path).expanduser()
    if (p / "config.json").is_file():
        return str(p)
    try:
        final = final_model_dir(str(p), adapter_ok=True)
        if not (final / "config.json").is_file():  # an adapter alone: its base must be rebuildable
            adapter_run(str(p), key).base_component()
        return str(final)
    except ConfigError as err:
        raise ConfigError(str(err).split("\n")[0].split("] ", 1)[-1], key=key, hint=err.hint) from None


def adapter_run(path: str, key: str = "recipe.reward.model") -> Any:
    """The run dir ``path`` as a :class:`TrainedRun` when its ``final/`` holds an adapter alone, else None."""
    from hydratune.components.modeling.trained import TrainedRun

    run = Path(path).expanduser()
    if (run / "config.json").is_file() or not (run / "final" / "adapter_config.json").is_file():
        return None
    if (run / "final" / "merged" / "config.json").is_file():
        return None
    return TrainedRun.open(run, key=key)


def load_reward_model(path: str, *, merge: bool = False, key: str = "recipe.reward.model") -> tuple[Any, Any]:
    """(one-logit sequence classifier, tokenizer) of a reward model dir or run dir: a LoRA reward run's
    adapter and score head on its rebuilt base (folded into it with ``merge``). Loading draws no random
    number of the run's (a head initialised, then overwritten): the rollouts are the same whether the
    reward model loads separately or as an adapter on the policy's base (components/rl/reward_adapter.py)."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    run = adapter_run(path, key)
    with torch.random.fork_rng(devices=[]):
        if run is not None:
            return run.load(task="seq_cls", merge=merge)
        folder = reward_model_dir(path, key)
        model = AutoModelForSequenceClassification.from_pretrained(folder, num_labels=1)
    return model, AutoTokenizer.from_pretrained(folder)


class RewardModel:
    """A trained one-logit sequence classifier (``recipe=reward``'s ``final/``), frozen, as a reward
    function: it scores the chat-templated prompt + completion, as RewardTrainer trained it."""

    def __init__(self, path: str, device: str = "cpu", batch_size: int = 32) -> None:
        self.path = reward_model_dir(path)
        self.model, self.tokenizer = load_reward_model(path, merge=True)  # a plain model for every strategy
        self.tokenizer.padding_side = "right"
        self.model.to(device).eval().requires_grad_(False)
        if self.model.config.pad_token_id is None:
            self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.batch_size = batch_size
        self.__name__ = "reward_model"

    def __call__(self, prompts: list[Any], completions: list[Any], **_: Any) -> list[float]:
        texts = chat_texts(self.tokenizer, prompts, completions)
        device = next(self.model.parameters()).device
        return batched_scores(
            self.tokenizer, texts, self.batch_size, device, lambda b: self.model(**b).logits[:, 0]
        )


def batched_scores(
    tokenizer: Any, texts: list[str], batch_size: int, device: Any, score: Callable[[Any], Any]
) -> list[float]:
    """``score`` (a tokenized batch → one score per row) over ``texts`` in batches of ``batch_size``, padded
    as the tokenizer pads, without gradients: the scoring loop of a reward model loaded separately and of one
    on the policy's base (components/rl/reward_adapter.py)."""
    import torch

    scores: list[float] = []
    for start in range(0, len(texts), batch_size):
        batch = tokenizer(
            texts[start : start + batch_size], return_tensors="pt", padding=True, add_special_tokens=False
        ).to(device)
        with torch.no_grad():
            scores += score(batch).float().tolist()
    return scores


def chat_texts(tokenizer: Any, prompts: list[Any], completions: list[Any]) -> list[str]:
    """Each prompt + completion chat-templated, as RewardTrainer trained the reward model on them."""
    texts = []
    for prompt, completion in zip(prompts, completions, strict=True):
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        messages.append({"role": "assistant", "content": text_of(completion)})
        texts.append(tokenizer.apply_chat_template(messages, tokenize=False))
    return texts


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
        return RewardModel(spec, device) if Path(spec).expanduser().exists() else import_reward(spec)
    if callable(spec):
        return spec
    raise ValueError(f"cannot make a reward function of {spec!r}")


# ---- resolving user functions before load ----------------------------------------------------------------
#: keywords TRL passes to a reward function that are not columns of the rows
CALL_KEYWORDS = ("prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric")


def user_module_dirs(args: Sequence[str] = ()) -> list[Path]:
    """Where a user's reward module may sit: the working directory, next to each experiment file the
    command line names (``+experiment=x`` in conf/ or a ``--config-dir``), and beside the data the command
    line names (``data.path=<file>``: its folder; ``data.path=<folder>``: that folder)."""
    from hydratune.components.config.trust import experiment_files

    return [Path.cwd(), *(f.parent for f in experiment_files(list(args))), *data_dirs(args)]


def data_dirs(args: Sequence[str]) -> list[Path]:
    """The folder of a local ``data.path=`` typed on the command line (only there: a file's path grants
    nothing)."""
    found = []
    for arg in args:
        key, sep, value = arg.lstrip("+~").partition("=")
        path = Path(value.strip("'\"")).expanduser()
        if key == "data.path" and sep and value and path.exists():
            found.append(path if path.is_dir() else path.parent)
    return found


def add_user_module_dirs(args: Sequence[str] = ()) -> None:
    """Append :func:`user_module_dirs` to ``sys.path`` (after installed packages: a user module shadows
    nothing) and to ``PYTHONPATH`` (launched worker processes import the same modules)."""
    import os

    for folder in user_module_dirs(args):
        path = str(folder.resolve())
        if path not in sys.path:
            sys.path.append(path)
        paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        if path not in paths:
            os.environ["PYTHONPATH"] = os.pathsep.join([*paths, path])


def close_matches(word: str, candidates: Sequence[str]) -> str:
    """``"; did you mean a, b?"`` for the candidates close to ``word``, else ``""``."""
    import difflib

    close = difflib.get_close_matches(word, sorted(set(candidates)), n=3, cutoff=0.6)
    return f"; did you mean {', '.join(close)}?" if close else ""


def module_names(parent: str) -> list[str]:
    """The importable modules beside a missing one: ``parent``'s submodules, or the top-level ones."""
    import importlib
    import pkgutil

    if not parent:
        return [m.name for m in pkgutil.iter_modules()]
    try:
        package = importlib.import_module(parent)
    except ImportError:
        return []
    found = pkgutil.iter_modules(getattr(package, "__path__", []))
    return [f"{parent}.{m.name}" for m in found]


def import_reward(dotted: str, key: str = "recipe.reward_funcs") -> Callable[..., Any]:
    """The function ``module.function`` names: the module imported from the working directory, next to the
    experiment file or the installed packages; a missing module or function is a ConfigError naming the
    close matches."""
    import importlib

    from hydratune.components.config.errors import ConfigError

    add_user_module_dirs(sys.argv[1:])
    module_name, _, name = dotted.rpartition(".")
    where = "the working directory, next to the experiment file, beside data.path, or an installed package"
    fix = f"put {module_name or '<module>'}.py holding def {name}(prompts, completions, **columns) in {where}"
    if not module_name:
        raise ConfigError(f"'{dotted}' is not module.function", key=key, hint=fix)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if not err.name or not (module_name + ".").startswith(err.name + "."):
            raise ConfigError(f"importing {module_name} failed: {err}", key=key) from None
        parent = module_name.rpartition(".")[0]
        near = close_matches(module_name, module_names(parent))
        raise ConfigError(f"no module '{module_name}' in {where}{near}", key=key, hint=fix) from None
    except Exception as err:  # the user's module itself fails to import: say so before load
        raise ConfigError(f"importing {module_name} failed: {type(err).__name__}: {err}", key=key) from None
    function = getattr(module, name, None)
    if not callable(function):
        public = [n for n, v in vars(module).items() if callable(v) and not n.startswith("_")]
        near = close_matches(name, public)
        raise ConfigError(f"{module_name} has no function '{name}'{near}", key=key, hint=fix)
    return function


def check_trusted(
    function: Any,
    key: str,
    what: str = "reward",
    hint: str | None = None,
    accepts: Callable[[Any], bool] | None = None,
    plain: str = "a plain function",
) -> None:
    """Refuse (without ``trust_targets=true``) what a shared config could turn into code it should not
    run: a ``what`` (a reward; a tool, an environment: components/tools.py, environment.py) that is not
    ``plain`` (``accepts``: a plain function) of hydratune's or the user's own modules, or a partial
    binding a callable."""
    import functools
    import inspect

    from hydratune.components.config.errors import ConfigError
    from hydratune.components.config.trust import installed_module

    hint = hint or (
        "a plain def in your own module (or hydratune.components.rewards); if you trust the config: "
        "trust_targets=true"
    )
    bound = function.keywords if isinstance(function, functools.partial) else {}
    if isinstance(function, functools.partial):
        if function.args or any(callable(v) for v in bound.values()):
            raise ConfigError(
                f"{what} {function.func!r} binds arguments that are calls, not data", key=key, hint=hint
            )
        function = function.func
    qualified = f"{getattr(function, '__module__', '?')}.{getattr(function, '__qualname__', function)}"
    if not (accepts or inspect.isfunction)(function):
        raise ConfigError(f"{what} {qualified} is not {plain}", key=key, hint=hint)
    if installed_module(function.__module__):
        raise ConfigError(
            f"{what} {qualified} comes from an installed package or the standard library, not from your code",
            key=key,
            hint=hint,
        )


def check_reward(spec: Any, key: str, *, trusted: bool) -> Callable[..., Any] | None:
    """Before load: the reward function ``spec`` names (a dotted path is imported), checked as
    :func:`check_trusted` says; None for a reward model (checked as a directory elsewhere)."""
    if reward_model_path(spec) or (isinstance(spec, str) and Path(spec).expanduser().exists()):
        return None
    if isinstance(spec, str):
        function: Any = import_reward(spec, key)
    elif isinstance(spec, dict) and spec.get("_target_"):
        import_reward(str(spec["_target_"]), f"{key}._target_")
        function = resolve_reward(spec)
    else:
        function = spec
    if not trusted:  # trust_targets=true: the user vouches for whatever the config names
        check_trusted(function, key)
        check_signature(function, key)
    return function


def check_signature(function: Any, key: str) -> None:
    """A plain function the recipes could not call by keyword (``f(prompts=…, completions=…,
    <column>=…)``) is refused before load, naming its parameters (``trust.signature_refusal``)."""
    import functools
    import inspect

    from hydratune.components.config.errors import ConfigError
    from hydratune.components.config.trust import signature_refusal

    inner = function.func if isinstance(function, functools.partial) else function
    why = signature_refusal(inner) if inspect.isfunction(inner) else None
    if why:
        name = f"{inner.__module__}.{inner.__qualname__}"
        raise ConfigError(
            f"reward {name} {why}",
            key=key,
            hint="name the completions parameter: def f(prompts, completions, **columns) -> list[float]",
        )


def required_columns(function: Any) -> list[str]:
    """The columns a reward function cannot do without: its keyword parameters with no default, beyond
    the prompts and completions (``exact_match`` needs ``answer``)."""
    import functools
    import inspect

    bound = function.keywords if isinstance(function, functools.partial) else {}
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return []
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [
        p.name
        for p in parameters
        if p.kind in kinds and p.default is p.empty and p.name not in (*CALL_KEYWORDS, *bound)
    ]


def check_columns(functions: Sequence[tuple[str, Any]], columns: Sequence[str], path: str) -> None:
    """Before load: every reward function's required columns are in the loaded rows of ``path``."""
    from hydratune.components.config.errors import ConfigError

    for key, function in functions:
        missing = [c for c in required_columns(function) if c not in columns]
        if missing:
            name = getattr(function, "__name__", None) or getattr(function, "func", function).__name__
            raise ConfigError(
                f"reward {name} reads column '{missing[0]}', which {path} does not have (columns: "
                f"{', '.join(columns)})",
                key=key,
                hint=f"add a '{missing[0]}' column to the data, or name a reward that does not read it",
            )
