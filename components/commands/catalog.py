"""``hydratune ls`` / ``--help``: the recipes, every config group with its options, and the shared experiments
(``components/config/options.py`` lists them: the YAML files of conf/ and the recipe modules without one)."""

from __future__ import annotations

from pathlib import Path

from hydratune.components.config.options import groups, options


def catalog(conf: Path | None = None) -> dict[str, dict[str, str]]:
    """{group: {option: description}} for every group of ``conf``."""
    return {
        group: {name: o.description for name, o in options(group, conf).items()} for group in groups(conf)
    }


def ordered_groups(cat: dict[str, dict[str, str]]) -> list[str]:
    """The groups of ``cat`` as listed to users: recipes first, then the others sorted, experiments last."""
    order = ["recipe", *sorted(g for g in cat if g not in ("recipe", "experiment")), "experiment"]
    return [group for group in order if group in cat]


def render(conf: Path | None = None) -> str:
    """A plain-text listing: recipes first, then the groups, experiments last."""
    cat = catalog(conf)
    lines = []
    for group in ordered_groups(cat):
        lines.append(f"{group}:" if group != "experiment" else "experiment:  (use with +experiment=<name>)")
        width = max((len(o) for o in cat[group]), default=0)
        lines += [f"  {opt:<{width}}  {desc}" for opt, desc in cat[group].items()]
        lines.append("")
    return "\n".join(lines)


USAGE = """\
hydratune: declarative LLM fine-tuning (SFT, reward model, DPO, PPO, GRPO), composed from config groups.

usage:
  hydratune [group=option ...] [key=value ...]   train (default: SFT of the tiny demo model, CPU, offline)
  hydratune -m optimizer.lr=1e-4,3e-4 peft=none,lora   a sweep: one run per combination
  hydratune +experiment=<name> [overrides]       a shared recipe file (conf/experiment)
  hydratune mode=plan [overrides]                check, print the config and generated files; load nothing
  hydratune estimate [overrides]                 memory per GPU before launch (strategy=auto picks one)
  hydratune replay <run dir> [overrides]         run a finished run's exact config again
  hydratune report <multirun dir>                a sweep's table and plot
  hydratune export <run dir> [out=<dir>]         merged safetensors + tokenizer + model card, ready to serve
  hydratune chat <run dir | model dir>           an interactive chat with the model, tokens streamed
  hydratune ls                                   every option of every group, with a line on each
  hydratune matrix [--markdown]                  the support matrix: what runs where (docs/matrix.md)
  hydratune docs [--check]                       regenerate the tables of README.md, docs/, ARCHITECTURE.md
  hydratune cache ls | clear [key ...]           the prepared-data cache (~/.cache/hydratune/data): list, free
  hydratune [overrides] --cfg job                print the composed config
  hydratune --hydra-help                         Hydra's own flags (--info, --shell-completion, ...)

config groups (group=option):
"""


def help_text(conf: Path | None = None) -> str:
    """``hydratune --help``: usage and the groups' options, from the conf folder alone (Hydra's own
    help composes every group, schemas included: ~2 s)."""
    cat = catalog(conf)
    rows = [f"  {group}: {', '.join(cat[group])}" for group in ordered_groups(cat)]
    pages = "examples: README.md; the run dir and every knob: docs/ (README.md lists the pages)"
    return USAGE + "\n".join(rows) + "\n\n" + pages
