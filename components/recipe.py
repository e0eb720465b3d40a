"""The recipe contract (``recipe=<name>``): what every recipe declares, and the decorator that registers one.

A recipe is a module ``recipes/<name>.py`` holding one ``@recipe`` dataclass that extends :class:`Recipe`:
its fields are its knobs, its class variables the facts the rest of hydratune reads (the checks, the run
dir's summary, ``export``, the support matrix) instead of its class name, and :meth:`Recipe.run` trains
(or generates, or evaluates). Its identity is its option name, the module's name: ``recipe=best_of_n``,
``${latest_run:best_of_n}``, the ``recipe`` the run dir's summary records.

``@recipe`` is the whole registration: ``hydratune.recipes.register_all()`` imports every module of the
package, and the decorator stores the schema; a module without ``conf/recipe/<name>.yaml`` also gets its
option (and, when it declares ``demo_data``, ``data=demo_<name>`` as that data option), so a new recipe is one
module. Modelled on torchtune's ``FTRecipeInterface`` and NeMo-RL's declared interfaces.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from hydratune.components.runtime.run import Components, RunContext

R = TypeVar("R", bound=type)

#: what each data component ``kind`` holds, for messages (``components/data/``'s options set the kinds)
DATA_KINDS = {
    "chat": "chat / instruction / text data",
    "preference": "preference pairs (prompt, chosen, rejected)",
    "unpaired": "unpaired preference rows (prompt, completion, label: true/false)",
    "prompts": "prompts (and reference answers)",
}


@dataclass(frozen=True)
class Recipe:
    """The contract of a recipe. Subclasses add their knobs as fields and override what they declare."""

    #: the option name (``recipe=<name>``); ``@recipe`` sets it from the module's name
    name: ClassVar[str] = ""
    #: the heading of the run's summary (``summary.md``)
    title: ClassVar[str] = ""
    #: the data components it reads, by their ``kind`` (``components/data/``): checked before load
    data_kinds: ClassVar[tuple[str, ...]] = ("chat",)
    #: the data option of its demo; empty: ``demo_<name>`` (``conf/config.yaml`` picks ``data=demo_<recipe>``)
    demo_data: ClassVar[str] = ""
    #: trains nothing (generates or scores): one whole model per process, no optimizer, no adapter of its own
    inference_only: ClassVar[bool] = False
    #: its trainer evaluates every ``train.eval_every`` steps (so the eval split must not be empty)
    periodic_eval: ClassVar[bool] = True
    #: its ``final/`` is a causal language model (``hydratune export`` and ``chat`` take it)
    produces_causal_lm: ClassVar[bool] = True
    #: runs its own loop on accelerate through the strategy's loop hooks (FSDP2 by ``fully_shard``, so on
    #: CPU too) instead of a transformers Trainer
    owns_loop: ClassVar[bool] = False
    #: the axes of a model split over ranks (``components/strategy/parallelism.py`` ``AXES``: tp, sp, pp,
    #: ep) it was verified with, each against one process; another axis above 1 is refused before load
    #: (``components/runtime/split_checks.py``). Pipeline stages (pp) train through the staged loop, whose
    #: loss is the causal-LM cross-entropy on its prepared data's labels
    splits: ClassVar[frozenset[str]] = frozenset()
    #: trains on ``data.streaming``'s rows as they are read (no whole data set up front)
    streams_data: ClassVar[bool] = False
    #: what its trainer does with a preference row past data.max_length: "truncate" (cut, the start kept:
    #: TRL's DPO, CPO, KTO trainers) or "drop" (the pair left out: its RewardTrainer); counted before load
    overlong_pairs: ClassVar[str] = "truncate"
    #: trains on (or generates for) image rows: its trainer takes a vision-language model's processor (SFT,
    #: DPO); another recipe is refused on rows with images once they are read, before the model loads
    image_rows: ClassVar[bool] = False

    @classmethod
    def demo(cls) -> str:
        """The data option of this recipe's demo."""
        return cls.demo_data or f"demo_{cls.name}"

    def validate(self) -> None:
        """Checks of the knobs alone (cheap, before anything else); ``check`` sees the whole run."""

    def check(self, cfg: DictConfig, comps: Components) -> None:
        """The recipe's own checks before any model loads (its knobs; the shared checks run anyway)."""

    def check_data(self, comps: Components, splits: Any, tokenizer: Any) -> None:
        """``mode=plan``: what the recipe checks of the loaded rows before training."""

    def plan_lines(self, cfg: DictConfig, comps: Components) -> list[str]:
        """``mode=plan``: what the recipe adds to the plan (lines starting with ``#``); none by default."""
        return []

    def warnings(self, cfg: DictConfig, comps: Components) -> list[str]:
        """Legal but suspicious settings of this recipe (said at start and in ``mode=plan``, never fatal)."""
        return []

    def tokens(self, comps: Components) -> Any:
        """What makes the tokens its trainer reads, when the recipe has them made with the data (cached
        with it, every row checked before the model loads): an object with ``key()`` and
        ``prepare(splits, tokenizer, workers)`` (SFT: ``components/data/tokens.py``). Preference data
        (reward, DPO, ORPO, SimPO, KTO): the trainer tokenizes, and what data.max_length does to the rows is
        measured and counted first (``components/data/pair_lengths.py``; not with images, whose tokens only
        the processor counts). None: the trainer tokenizes the rows itself."""
        if comps.data.kind in ("preference", "unpaired") and not comps.data.images:
            from hydratune.components.data.pair_lengths import PairLengths

            return PairLengths(comps.data.max_length, self.overlong_pairs)
        return None

    def run(self, ctx: RunContext) -> dict[str, Any]:
        """Build the data and the model, train (or generate / evaluate), save, report; the metrics."""
        raise NotImplementedError(f"recipe {self.name} has no run()")


def recipe(cls: R | None = None, *, name: str | None = None) -> R | Callable[[R], R]:
    """Class decorator: register ``cls`` as recipe ``name`` (default: its module's name)."""

    def register(cls: R) -> R:
        from hydratune.components.config.options import CONF, describe
        from hydratune.components.config.registry import RECIPES, component, open_dicts, store_option

        if not (isinstance(cls, type) and issubclass(cls, Recipe)):
            raise TypeError(f"@recipe needs a subclass of hydratune.components.recipe.Recipe, got {cls!r}")
        cls.name = name or cls.__module__.rsplit(".", 1)[-1]
        cls.title = cls.__dict__.get("title") or cls.name
        component("recipe")(cls)
        if not (CONF / "recipe" / f"{cls.name}.yaml").is_file():
            summary = (cls.__doc__ or cls.name).strip().splitlines()[0]
            store_option("recipe", cls.name, open_dicts(cls.__schema__), summary)  # type: ignore[attr-defined]
        demo = CONF / "data" / f"demo_{cls.name}.yaml"
        if cls.demo() != f"demo_{cls.name}" and not demo.is_file():
            source = CONF / "data" / f"{cls.demo()}.yaml"
            text = describe(source) if source.is_file() else cls.demo()
            store_option("data", f"demo_{cls.name}", {"defaults": [cls.demo(), "_self_"]}, text)
        RECIPES[cls.name] = cls
        return cls

    return register if cls is None else register(cls)
