"""Adversarial value probes (issue 24, classes 4 and 5): each refused before load, exit 2, by name.

Every numeric knob of every schema is probed with nan / inf / a value below its range by calling the check
itself (no subprocess per knob); the rest probe one entry point each, ``mode=plan`` where a subprocess is
needed, in-process otherwise.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hydratune.components.config.errors import ConfigError


def schemas() -> Iterator[tuple[str, type]]:
    """(group, schema) of the shared nodes and every registered component and recipe (the schema Hydra
    composes with, which carries the ranges its class's fields declare)."""
    from hydratune import recipes
    from hydratune.components.config.options import groups, options
    from hydratune.components.config.registry import REGISTRY
    from hydratune.components.config.schema import EstimateConfig, TrainConfig

    recipes.register_all()
    for group in groups():
        options(group)  # imports every component module conf/ names
    yield "train", TrainConfig
    yield "estimate", EstimateConfig
    for group, classes in REGISTRY.items():
        for cls in classes.values():
            yield group, cls.__schema__


def knobs() -> list[tuple[str, type, str, Any]]:
    """(group, schema, knob, type hint) of every numeric knob of every schema."""
    from hydratune.components.config.ranges import numeric_fields

    return [(g, s, n, h) for g, s in schemas() for n, h in numeric_fields(s)]


KNOBS = knobs()
IDS = [f"{g}.{s.__name__}.{n}" for g, s, n, _ in KNOBS]


def floats(hint: Any) -> bool:
    return "float" in str(hint)


@pytest.mark.parametrize(("group", "schema", "name", "hint"), KNOBS, ids=IDS)
def test_every_numeric_knob_has_a_declared_range(group: str, schema: type, name: str, hint: Any) -> None:
    from hydratune.components.config.ranges import range_of

    assert range_of(schema, name) is not None, (
        f"declare {group}.{name}'s range on its field in {schema.__name__}: "
        f"{name}: ... = knob(<default>, <Range>) (components/config/ranges.py)"
    )


@pytest.mark.parametrize(("group", "schema", "name", "hint"), KNOBS, ids=IDS)
def test_non_finite_and_below_range_refused(group: str, schema: type, name: str, hint: Any) -> None:
    """nan / ±inf for a float knob, a value just below the range for any knob: a ConfigError naming it."""
    from hydratune.components.config.ranges import check_knobs, range_of

    allowed = range_of(schema, name)
    bad: list[float] = [math.nan, math.inf, -math.inf] if floats(hint) else []
    if allowed is not None and allowed.low is not None:
        below = allowed.low if allowed.low_open else allowed.low - (0.5 if floats(hint) else 1)
        bad += [v for v in (below, -1) if v not in allowed.also and (v < allowed.low or v == below)]
    for value in bad:
        with pytest.raises(ConfigError) as info:
            check_knobs(schema, {name: value}, group)
        assert info.value.key == f"{group}.{name}" and "must be" in str(info.value), value


@pytest.mark.parametrize(("group", "schema", "name", "hint"), KNOBS, ids=IDS)
def test_defaults_are_in_range(group: str, schema: type, name: str, hint: Any) -> None:
    from hydratune.components.config.ranges import check_knobs

    (f,) = [f for f in dataclasses.fields(schema) if f.name == name]
    default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
    check_knobs(schema, {name: default}, group)


# ---- each range declared once: on its field, nowhere else ----------------------------------------------


def test_a_component_schema_carries_the_ranges_its_class_declares() -> None:
    """What ``check_values`` reads (the composed node's schema) is what the class's fields declare; a
    subclass that redeclares a field for another default (Adafactor's lr) keeps its base's range."""
    from hydratune.components.config.ranges import declared, numeric_fields, range_of
    from hydratune.components.config.registry import REGISTRY
    from hydratune.components.optimizer import Adafactor, Optimizer

    for group, classes in REGISTRY.items():
        for cls in classes.values():
            for name, _ in numeric_fields(cls.__schema__):
                expected = declared(cls, name)
                assert expected, f"{group}.{cls.__name__}.{name}: no range declared on the class's field"
                assert declared(cls.__schema__, name) == expected, f"{group}.{cls.__name__}.{name}"
    assert range_of(Adafactor, "lr") is range_of(Optimizer, "lr") is not None
    assert Adafactor.__dataclass_fields__["lr"].default == 1e-3


def test_no_module_but_the_fields_holds_a_range_table() -> None:
    """No dict of knob names to ranges anywhere in components/ or recipes/, ranges.py included (the old
    ``RANGES`` table, where one bare name governed unrelated knobs, and the strategy table that outlived
    it): every range is on its field."""
    import ast

    from hydratune.components.config import ranges
    from hydratune.components.config.ranges import Range

    tables = [
        k
        for k, v in vars(ranges).items()
        if isinstance(v, dict) and any(isinstance(r, Range) for r in v.values())
    ]
    assert tables == []
    constants = {k for k, v in vars(ranges).items() if isinstance(v, Range)}
    root = Path(__file__).resolve().parents[2]
    for path in [*(root / "components").rglob("*.py"), *(root / "recipes").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Dict):
                held = [ast.unparse(v) for v in node.values if v is not None]
                ranged = [v for v in held if v in constants or v.startswith(("Range(", "one_of("))]
                assert not ranged, f"{path.relative_to(root)}:{node.lineno}: a table of ranges ({ranged})"


def boundaries(allowed: Any, hint: Any) -> list[float]:
    """Values at the edges of ``allowed``, inside it (its sentinels too)."""
    step = 1e-6 if floats(hint) else 1
    if allowed.only:
        return list(allowed.only)
    found = list(allowed.also)
    if allowed.low is not None:
        found.append(allowed.low + step if allowed.low_open else allowed.low)
    if allowed.high is not None:
        found.append(allowed.high - step if allowed.high_open else allowed.high)
    return found


def in_range_values(schema: type, name: str, hint: Any, default: Any) -> list[Any]:
    """The boundary values of knob ``name`` of ``schema`` as the knob takes them (a list: each element)."""
    from hydratune.components.config.ranges import range_of

    values = boundaries(range_of(schema, name), hint)
    if "list" in str(hint):
        return [[v] * max(len(default or []), 1) for v in values]
    return [int(v) if not floats(hint) else v for v in values]


#: (group, option, overrides) whose component each check below is built from, one per registered class
#: (data: the demo data of its kind; tracker and strategy=auto: no numeric knob; strategy: every option, each
#: a combination of its class's knobs), the overrides those a combination needs (peft=freeze: last_n_layers=0
#: trains the modules alone; zero3_nvme: its required swap dir)
BUILT_FROM = [
    ("data", "demo_sft"), ("data", "demo_dpo"), ("data", "demo_kto"), ("data", "demo_ppo"),
    ("peft", "freeze", "peft.modules=[lm_head]"),
    ("peft", "lora"), ("peft", "dora"), ("peft", "prefix"), ("peft", "ptuning"),
    ("optimizer", "adamw"), ("optimizer", "adafactor"), ("optimizer", "sgd"), ("optimizer", "adamw_8bit"),
    ("precision", "fp16"), ("quantization", "int8"), ("scheduler", "cosine"),
    ("strategy", "single"), ("strategy", "ddp"), ("strategy", "fsdp"), ("strategy", "pipeline"),
    ("strategy", "zero0"), ("strategy", "zero1"), ("strategy", "zero2"), ("strategy", "zero2_offload"),
    ("strategy", "zero3"), ("strategy", "zero3_offload"), ("strategy", "zero3pp"),
    ("strategy", "zero3_nvme", "strategy.nvme_path=/local_nvme"),
    ("launcher", "local"), ("launcher", "slurm"), ("launcher", "deepspeed"),
]  # fmt: skip
#: (group, option) -> knobs whose range edge the option refuses in combination with its own other knobs,
#: not by a second range: ZeRO++ (zero3pp's quantized weights and gradients) is ZeRO-3 only
COMBINED = {("strategy", "zero3pp"): {"stage"}}
# the pipeline's knobs schedule stages: with strategy.pp_size 1 (every option but pipeline) any is refused
STAGELESS = [b[:2] for b in BUILT_FROM if b[0] == "strategy" and b[1] != "pipeline"]
COMBINED |= {option: {"split"} | COMBINED.get(option, set()) for option in STAGELESS}


def refusals_of(check: Any, key: str) -> list[str]:
    """The refusal naming ``key`` that ``check()`` raises, if any (others: a combination, not this knob)."""
    try:
        check()
    except ConfigError as err:
        return [str(err)] if err.key == key else []
    return []


@pytest.mark.parametrize("built_from", BUILT_FROM, ids=[f"{b[0]}={b[1]}" for b in BUILT_FROM])
def test_no_component_check_refuses_what_its_declared_range_allows(compose_cfg, built_from) -> None:
    """The declared range is the whole rule: at each edge of it (and each sentinel) the component's own
    ``validate`` does not refuse the knob (a re-check with another range would)."""
    from hydratune.components.config.ranges import numeric_fields
    from hydratune.components.runtime.run import Components

    group, option, *overrides = built_from
    built = getattr(Components.from_config(compose_cfg(f"{group}={option}", *overrides)), group)
    refused = []
    for name, hint in numeric_fields(type(built).__schema__):
        if name in COMBINED.get((group, option), set()):
            continue
        for value in in_range_values(type(built).__schema__, name, hint, getattr(built, name)):
            changed = dataclasses.replace(built, **{name: value})
            refused += refusals_of(changed.validate, f"{group}.{name}")
    assert not refused, refused


def recipe_names() -> list[str]:
    from hydratune import recipes
    from hydratune.components.config.registry import RECIPES

    recipes.register_all()
    return sorted(RECIPES)


@pytest.mark.parametrize("recipe", recipe_names())
def test_no_recipe_check_refuses_what_its_declared_range_allows(compose_cfg, recipe) -> None:
    """Each recipe's ``check`` (its combinations; the knobs' ranges are on its fields) passes every knob at
    the edges of its declared range: PPO's gamma at 1, SimPO's at 0, DPO's label_smoothing just below 0.5."""
    from hydratune.components.config.ranges import numeric_fields
    from hydratune.components.runtime.run import Components

    cfg = compose_cfg(f"recipe={recipe}")
    comps = Components.from_config(cfg)
    refused = []
    schema = type(comps.recipe).__schema__
    for name, hint in numeric_fields(schema):
        for value in in_range_values(schema, name, hint, getattr(comps.recipe, name)):
            changed = dataclasses.replace(comps.recipe, **{name: value})
            refused += refusals_of(lambda r=changed: r.check(cfg, comps), f"recipe.{name}")
    assert not refused, refused


def test_the_train_checks_refuse_nothing_the_train_ranges_allow(compose_cfg) -> None:
    from hydratune.components.config.ranges import numeric_fields
    from hydratune.components.config.schema import TrainConfig
    from hydratune.components.runtime.checks import check_train

    refused = []
    for name, hint in numeric_fields(TrainConfig):
        for value in in_range_values(TrainConfig, name, hint, None):
            cfg = compose_cfg("train.max_steps=10", f"train.{name}={value}")  # epochs=0 with max_steps
            refused += refusals_of(lambda c=cfg: check_train(c), f"train.{name}")
    assert not refused, refused


def test_no_recipe_compares_a_declared_knob_with_a_number() -> None:
    """A recipe's ``check`` holds combinations only: no ``self.<knob> < 0`` beside the knob's range."""
    import ast
    import inspect
    import textwrap

    from hydratune.components.config.ranges import numeric_fields, range_of
    from hydratune.components.config.registry import RECIPES

    found = []
    for cls in RECIPES.values():
        ranged = {n for n, _ in numeric_fields(cls) if range_of(cls, n) is not None}
        check = cls.__dict__.get("check")
        if check is None:
            continue
        tree = ast.parse(textwrap.dedent(inspect.getsource(check)))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Compare):
                continue
            sides = [node.left, *node.comparators]
            knob = [s.attr for s in sides if isinstance(s, ast.Attribute) and ast.unparse(s.value) == "self"]
            number = [s for s in sides if isinstance(s, ast.Constant) and isinstance(s.value, int | float)]
            if number and set(knob) & ranged:
                found.append(f"{cls.__name__}.check: {ast.unparse(node)}")
    assert not found, found


def test_simpo_takes_the_papers_gamma_and_ppo_refuses_a_discount_above_one(tmp_path, monkeypatch, capsys):
    """One bare name (``gamma``) no longer governs unrelated knobs: SimPO's target margin takes the paper's
    0.5-1.6, PPO's discount stays in (0, 1] (``hydratune ... mode=plan`` in-process)."""
    from hydratune.recipes.cli import main

    monkeypatch.chdir(tmp_path)
    main(["recipe=simpo", "recipe.gamma=1.4", "mode=plan", "plan.config=true"])
    out = capsys.readouterr().out
    assert "gamma: 1.4" in out and "checks passed" in out, out[-2000:]
    with pytest.raises(SystemExit) as code:
        main(["recipe=ppo", "recipe.gamma=1.4", "mode=plan"])
    err = capsys.readouterr().err
    assert code.value.code == 2 and "Traceback" not in err, err
    assert "[recipe.gamma] must be a finite number > 0 and <= 1, got 1.4" in err, err


def test_dpo_label_smoothing_is_what_trl_takes(compose_cfg) -> None:
    """[0, 0.5): 0.5 itself divides by zero in TRL's robust loss, and TRL refuses it."""
    from hydratune.components.runtime.run import Components

    Components.from_config(compose_cfg("recipe=dpo", "recipe.label_smoothing=0.49"))
    with pytest.raises(ConfigError) as info:
        Components.from_config(compose_cfg("recipe=dpo", "recipe.label_smoothing=0.5"))
    assert info.value.key == "recipe.label_smoothing" and "< 0.5" in str(info.value)


def test_a_mixture_entry_knob_is_checked_against_its_declared_range(tmp_path: Path) -> None:
    from hydratune.components.data.chats import ChatDataset

    path = tmp_path / "a.jsonl"
    path.write_text(ROW + "\n")
    data = ChatDataset(path="", mixture=[{"path": str(path), "weight": 1.0, "eval_fraction": 1.5}])
    with pytest.raises(ConfigError) as info:
        data.validate()
    assert info.value.key == "data.mixture[0].eval_fraction" and "must be" in str(info.value)


@pytest.mark.parametrize(
    "override",
    [
        "train.epochs=nan",
        "train.epochs=inf",
        "optimizer.weight_decay=nan",
        "optimizer.eps=-1",
        "train.seed=-1",
        "train.max_steps=0",
        "scheduler.min_lr_ratio=nan",
    ],
)
def test_reported_values_refused_before_build(compose_cfg, override: str) -> None:
    """The reported probes, through the composed config and ``Components.from_config`` (before any
    component is built, so before any model)."""
    from hydratune.components.runtime.run import Components

    cfg = compose_cfg(override)
    with pytest.raises(ConfigError) as info:
        Components.from_config(cfg)
    assert info.value.key == override.split("=")[0]


@pytest.mark.parametrize(
    ("override", "key", "suggested"),
    [
        ("+lr=1e-5", "lr", "optimizer.lr"),
        ("+unknown.key=1", "unknown", None),
        ("+optimizer.learning_rat=1", "optimizer.learning_rat", None),
        ("+train.max_step=3", "train.max_step", "train.max_steps"),
    ],
)
def test_unknown_forced_keys_refused_with_close_matches(
    compose_cfg, override: str, key: str, suggested: str | None
) -> None:
    from hydratune.components.config.registry import check_known_keys

    with pytest.raises(ConfigError) as info:
        check_known_keys(compose_cfg(override), set())
    assert info.value.key == key
    if suggested:
        assert f"did you mean {suggested}" in str(info.value)


def test_a_group_the_user_added_is_allowed(compose_cfg) -> None:
    """A top-level node composed from a config group of the job (``+mygroup=x`` from a --config-dir)."""
    from hydratune.components.config.registry import check_known_keys

    check_known_keys(compose_cfg("+mygroup.knob=1"), {"mygroup"})


def test_warmup_longer_than_the_run_is_warned(compose_cfg) -> None:
    from hydratune.components.runtime.checks import schedule_warnings
    from hydratune.components.runtime.run import Components

    cfg = compose_cfg("train.max_steps=3", "scheduler.warmup_steps=100000")
    (note,) = schedule_warnings(cfg, Components.from_config(cfg))
    assert "scheduler.warmup_steps=100000 >= train.max_steps=3" in note
    cfg = compose_cfg("train.max_steps=300", "scheduler.warmup_steps=10")
    assert schedule_warnings(cfg, Components.from_config(cfg)) == []


# ---- files: JSON nested too deeply, malformed YAML ----------------------------------------------------

DEEP = "[" * 100_000 + "]" * 100_000
ROW = json.dumps({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]})


@pytest.mark.parametrize(
    "lines",
    [[ROW, DEEP, ROW], [ROW, '{"messages": ' + DEEP + "}", ROW], [DEEP, ROW]],
    ids=["bare", "in", "first"],
)
@pytest.mark.parametrize("suffix", [".jsonl", ".json"])
def test_brackets_nested_too_deep_are_a_named_row_error(
    tmp_path: Path, lines: list[str], suffix: str
) -> None:
    from hydratune.components.data.json_files import read_json
    from hydratune.components.data.rows import scratch_workers

    path = tmp_path / f"deep{suffix}"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ConfigError) as info:
        read_json(path, key="data.path", skip=False, stats={}, workers=scratch_workers())
    assert "nested too deeply" in str(info.value) and info.value.key == "data.path"


def test_brackets_nested_too_deep_skipped_with_on_error_skip(tmp_path: Path) -> None:
    from hydratune.components.data.json_files import read_json
    from hydratune.components.data.rows import scratch_workers

    path = tmp_path / "deep.jsonl"
    path.write_text("\n".join([ROW, DEEP, ROW]) + "\n")
    stats: dict[str, int] = {}
    assert read_json(path, key="data.path", skip=True, stats=stats, workers=scratch_workers()).rows == 2
    assert stats == {"skipped rows": 1}


def test_malformed_yaml_names_file_and_line(tmp_path: Path) -> None:
    from hydratune.components.config.trust import check_file

    path = tmp_path / "bad.yaml"
    path.write_text("# @package _global_\noptimizer:\n  lr: [1e-5\n  foo: 2\n")
    with pytest.raises(ConfigError) as info:
        check_file(path)
    assert f"malformed YAML in {path}, line 4" in str(info.value)


# ---- disk space: before load, before each save, a write that runs out anyway ---------------------------


def test_disk_full_before_load(compose_cfg, monkeypatch, tmp_path: Path) -> None:
    from hydratune.components.runtime import diskspace
    from hydratune.components.runtime.checks import check_before_load
    from hydratune.components.runtime.run import Components

    cfg = compose_cfg()
    comps = Components.from_config(cfg)
    total, _ = diskspace.planned_bytes(cfg, comps)
    monkeypatch.setattr(diskspace, "free_bytes", lambda path: total - 1)
    with pytest.raises(diskspace.DiskFull) as info:
        check_before_load(cfg, comps)
    assert "checkpoint and final model needs about" in str(info.value)
    monkeypatch.setattr(diskspace, "free_bytes", lambda path: total)
    diskspace.check_room_before_load(cfg, comps, tmp_path)


def test_file_size_limit_before_load(compose_cfg, monkeypatch) -> None:
    from hydratune.components.runtime import diskspace
    from hydratune.components.runtime.run import Components

    cfg = compose_cfg()
    comps = Components.from_config(cfg)
    _, largest = diskspace.planned_bytes(cfg, comps)
    monkeypatch.setattr(diskspace, "file_size_limit", lambda: largest - 1)
    with pytest.raises(diskspace.DiskFull, match="ulimit -f"):
        diskspace.check_room_before_load(cfg, comps, Path.cwd())


def test_disk_full_before_a_checkpoint_and_the_final_save(monkeypatch, tmp_path: Path) -> None:
    import torch

    from hydratune.components.runtime import diskspace

    model = torch.nn.Linear(64, 64)  # 4,160 fp32 parameters: 16,640 bytes (x3 with Adam; x2 merged)
    monkeypatch.setattr(diskspace, "free_bytes", lambda path: 30_000)
    with pytest.raises(diskspace.DiskFull, match="the next checkpoint needs about"):
        diskspace.ensure_room_for_checkpoint(model, tmp_path / "checkpoints", tmp_path)
    diskspace.ensure_room_for_final(model, tmp_path / "final")
    with pytest.raises(diskspace.DiskFull, match="the final model needs about"):
        diskspace.ensure_room_for_final(model, tmp_path / "final", merge=True)


def whole_checkpoint(run_dir: Path, step: int) -> Path:
    from hydratune.components.runtime.checkpoint import mark_complete

    checkpoint = run_dir / "checkpoints" / f"checkpoint-{step}"
    checkpoint.mkdir(parents=True)
    mark_complete(checkpoint, step)
    return checkpoint


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EFBIG, errno.EDQUOT])
def test_a_write_that_runs_out_is_a_named_error(monkeypatch, tmp_path: Path, code: int) -> None:
    from hydratune.components.runtime.diskspace import DiskFull, disk_errors

    checkpoint = whole_checkpoint(tmp_path, 3)

    def full(self: Path, data: bytes) -> int:
        raise OSError(code, os.strerror(code), str(self))

    monkeypatch.setattr(Path, "write_bytes", full)
    with pytest.raises(DiskFull) as info, disk_errors(tmp_path):
        (tmp_path / "checkpoints" / "checkpoint-4" / "model.safetensors").write_bytes(b"x")
    text = str(info.value)
    assert "checkpoint-4/model.safetensors" in text and f"last whole checkpoint is {checkpoint}" in text


@pytest.mark.parametrize("writer", ["torch.save", "safetensors", "open"])
def test_a_real_file_size_limit_during_a_save_is_a_named_error(tmp_path: Path, writer: str) -> None:
    """``ulimit -f`` for real (this process, a moment): each writer's own error becomes DiskFull."""
    import resource

    import torch
    from safetensors.torch import save_file

    from hydratune.components.runtime.diskspace import DiskFull, disk_errors

    tensor = torch.zeros(1 << 18)  # 1 MiB
    write = {
        "torch.save": lambda: torch.save({"t": tensor}, tmp_path / "a.pt"),
        "safetensors": lambda: save_file({"t": tensor}, str(tmp_path / "a.safetensors")),
        "open": lambda: (tmp_path / "a.bin").write_bytes(bytes(1 << 20)),
    }[writer]
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 16, hard))
    try:
        with pytest.raises(DiskFull, match=r"ulimit -f|no space"), disk_errors(tmp_path):
            write()
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


# ---- the CLI: exit 2, one paragraph, no traceback (mode=plan: nothing is loaded) ------------------------


def test_unset_environment_variable_refused_before_build(compose_cfg, monkeypatch) -> None:
    from hydratune.components.runtime.run import Components

    monkeypatch.delenv("HT_PROBE_UNSET", raising=False)
    with pytest.raises(ConfigError) as info:
        Components.from_config(compose_cfg("run_name=${oc.env:HT_PROBE_UNSET}"))
    assert info.value.key == "run_name" and "Environment variable 'HT_PROBE_UNSET' not found" in str(
        info.value
    )


def test_hydra_writing_the_run_dir_on_a_full_disk_is_a_named_error() -> None:
    """What Hydra raises itself (outside the job: its .hydra/ files) reaches the CLI's startup_error."""
    from hydratune.components.commands.argv import startup_error
    from hydratune.components.runtime.diskspace import DiskFull

    full = startup_error(OSError(errno.ENOSPC, "No space left on device", "outputs/x/.hydra/config.yaml"))
    assert isinstance(full, DiskFull) and "outputs/x/.hydra/config.yaml" in str(full)
    assert startup_error(OSError(errno.EACCES, "Permission denied")) is None
