"""Which modules and parameters of a model a PEFT option names: the decoder layers, names matched by glob,
suffix or regex (peft's rules), the checks that a pattern matches something, ``requires_grad`` set from a
name filter, and the trainable-parameter count. Nothing here imports torch or peft at module level.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from hydratune.components.config.errors import ConfigError

if TYPE_CHECKING:
    from torch import nn

#: heads of sequence-classification (reward) models: freshly initialised, so they must train and be saved
CLASSIFIER_HEADS = ("score", "classifier")
_LAYER_LIST = re.compile(r"^(?:(?P<prefix>.*)\.)?(?:layers|h|blocks)\.(?P<index>\d+)$")
_NOT_LINEAR = re.compile(r"norm|emb|act|drop|rotary|pool", re.IGNORECASE)


def trainable_summary(model: nn.Module) -> str:
    """'trainable 12,345 / 1,234,567 params (1.00%)'."""

    def size(p: nn.Parameter) -> int:
        return int(getattr(p, "ds_numel", p.numel()))  # ZeRO-3 partitions leave an empty local tensor

    total = sum(size(p) for p in model.parameters())
    trainable = sum(size(p) for p in model.parameters() if p.requires_grad)
    return f"trainable {trainable:,} / {total:,} params ({100 * trainable / max(total, 1):.2f}%)"


def decoder_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The decoder blocks as (qualified name, module): the longest ModuleList named layers / h / blocks, a
    vision-language model's image encoder passed over."""
    from torch import nn

    from hydratune.components.modeling.vision import in_vision_part

    lists = [
        (name, module)
        for name, module in model.named_modules()
        if isinstance(module, nn.ModuleList)
        and re.search(r"(^|\.)(layers|h|blocks)$", name)
        and not in_vision_part(name)
    ]
    if not lists:
        raise ConfigError(
            f"cannot find the decoder layers of {type(model).__name__} (no ModuleList named layers/h/blocks)",
            key="peft.last_n_layers",
            hint="set peft.last_n_layers=0 and list what should train in peft.modules",
        )
    name, layers = max(lists, key=lambda item: len(item[1]))
    return [(f"{name}.{i}", layer) for i, layer in enumerate(layers)]


def count_layers(module_names: list[str]) -> int | None:
    """Number of decoder layers judged from module names alone (None if there is no layer list)."""
    from hydratune.components.modeling.vision import in_vision_part

    counts: dict[str, int] = {}
    for name in module_names:
        m = _LAYER_LIST.match(name)
        if m and in_vision_part(name):  # a vision-language model's image encoder is not the decoder
            continue
        if m:
            prefix = m.group("prefix") or ""
            counts[prefix] = max(counts.get(prefix, 0), int(m.group("index")) + 1)
    return max(counts.values()) if counts else None


def matches(name: str, pattern: str) -> bool:
    """A parameter/module name matches a glob pattern as a whole dotted segment run anywhere in it.

    ``lm_head`` matches ``lm_head.weight``; ``norm`` matches ``model.norm.weight`` but not
    ``model.layers.0.input_layernorm.weight``; ``*layernorm*`` matches every layernorm.
    """
    return any(
        fnmatch.fnmatchcase(name, p) for p in (pattern, f"*.{pattern}", f"{pattern}.*", f"*.{pattern}.*")
    )


def linear_leaf_names(module_names: list[str]) -> list[str]:
    """Short names of the leaf modules that look like linear layers (for error messages)."""
    names = set(module_names)
    parents = {n.rsplit(".", 1)[0] for n in names if "." in n}
    leaves = {n.rsplit(".", 1)[-1] for n in names if n and n not in parents}
    return sorted(x for x in leaves if not x.isdigit() and not _NOT_LINEAR.search(x))


def as_targets(value: Any) -> str | list[str]:
    """A bare module name becomes a one-item list (peft would full-match a string against whole names);
    ``all-linear`` and regexes stay strings."""
    if isinstance(value, str):
        return [value] if value != "all-linear" and re.fullmatch(r"\w+", value) else value
    return [str(x) for x in value]


def module_matches(module_names: list[str], target: str) -> bool:
    """peft's rule for a list entry: the module's name equals ``target`` or ends with ``.target``."""
    return any(n == target or n.endswith(f".{target}") for n in module_names)


def _is_seq_cls(model: nn.Module) -> bool:
    return type(model).__name__.endswith("ForSequenceClassification")


def set_trainable(model: nn.Module, keep: Callable[[str], bool], what: str, key: str, hint: str) -> nn.Module:
    """Set ``requires_grad`` from ``keep(name)``; refuse to train nothing.

    Tied parameters (``lm_head.weight`` is ``embed_tokens.weight``) train if any of their names is kept;
    a sequence classifier's fresh head always trains (it would stay random otherwise).
    """
    heads = tuple(f"{h}." for h in CLASSIFIER_HEADS) if _is_seq_cls(model) else ()
    wanted: dict[int, bool] = {}
    params: dict[int, nn.Parameter] = {}
    head_ids: set[int] = set()
    for name, p in model.named_parameters(remove_duplicate=False):
        params[id(p)] = p
        wanted[id(p)] = wanted.get(id(p), False) or bool(keep(name))
        if name.startswith(heads):
            head_ids.add(id(p))
    if not any(want for pid, want in wanted.items() if pid not in head_ids):
        raise ConfigError(
            f"{what} leaves no parameter of {type(model).__name__} to train", key=key, hint=hint
        )
    for pid, p in params.items():
        p.requires_grad_(wanted[pid] or pid in head_ids)
    return model


def check_patterns(patterns: list[str], module_names: list[str], key: str) -> None:
    """Each glob pattern must match a module or one of its weight/bias parameters."""
    candidates = [c for n in module_names if n for c in (n, f"{n}.weight", f"{n}.bias")]
    for pattern in patterns:
        if not any(matches(c, pattern) for c in candidates):
            raise ConfigError(
                f"'{pattern}' matches no module or parameter of the model",
                key=key,
                hint=f"use names such as {', '.join(linear_leaf_names(module_names)[:20])}, lm_head or norm",
            )
