"""The mesh of a split model (``strategy.tp_size`` / ``strategy.sp_size``), checked before anything loads:
dp x tp x sp x pp = world, the model's heads and sizes divisible, and every combination the engines cannot
run refused naming the key and the fix (components/distributed/mesh.py, components/runtime/checks.py). The
trained runs are tests/multiproc/test_nd_parallel.py; the layouts docs/matrix.md lists:
tests/unit/test_matrix.py."""

from __future__ import annotations

import re

import pytest

from hydratune.components.config.errors import ConfigError
from hydratune.components.distributed.mesh import Mesh, ModelDims, check_model
from hydratune.components.runtime.checks import check_before_load
from hydratune.components.runtime.run import Components, batch_plan

TWO = "launcher.nproc_per_node=2"
Z1 = "strategy=zero1"


def test_the_mesh_splits_the_world_and_drives_the_global_batch(compose_cfg) -> None:
    cfg = compose_cfg("strategy=zero1", "strategy.tp_size=2", "launcher.nproc_per_node=4")
    comps = Components.from_config(cfg)
    plan = batch_plan(cfg, comps, "cpu")
    assert plan.mesh == Mesh(4, tp=2) and plan.mesh.dp == 2
    assert plan.global_batch_size == 32 * 1 * 2  # micro x accumulation x data-parallel replicas
    described = comps.strategy.describe(plan, "cpu")
    assert described["mesh"] == "dp 2 x tp 2 x sp 1 x pp 1 = 4 processes; 1 node x 4 processes"
    assert described["batch"]["global_batch_size"] == "32 x 1 x 2 data-parallel replicas = 64"
    assert "read the same micro-batch" in described["batch"]["each rank"]
    ds = described["deepspeed.json"]
    assert ds["tensor_parallel"] == {"autotp_size": 2, "vocab_parallel_lm_head": False}
    assert "train_batch_size" not in ds  # DeepSpeed derives it from its own groups
    assert comps.strategy.label == "DeepSpeed (ZeRO-1, AutoTP 2)"


def test_sequence_parallel_hands_accelerate_ulysses_over_the_model_attention(compose_cfg) -> None:
    cfg = compose_cfg("strategy=zero1", "strategy.sp_size=2", TWO)
    comps = Components.from_config(cfg)
    plan = batch_plan(cfg, comps, "cpu")
    config = comps.strategy.training_args("cpu", plan)["parallelism_config"]
    assert (config.sp_size, config.sp_backend, config.data_parallel_size) == (2, "deepspeed", 1)
    assert config.sp_handler.sp_attn_implementation == plan.attention == "varlen_sdpa"


def test_model_dims_divisible_by_each_split() -> None:
    smollm2 = ModelDims(heads=9, kv_heads=3, hidden=576, intermediate=1536, layers=30)
    with pytest.raises(ConfigError) as err:
        check_model(Mesh(2, tp=2), smollm2)
    assert err.value.key == "strategy.tp_size" and "9 attention heads" in str(err.value)
    assert "strategy.tp_size=3" in err.value.hint
    check_model(Mesh(3, tp=3), smollm2)
    check_model(Mesh(6, sp=6), ModelDims(12, 2, 768, 3072, 2))  # KV heads replicated: 6 % 2 == 0
    with pytest.raises(ConfigError, match="key/value heads"):
        check_model(Mesh(4, sp=4), ModelDims(12, 3, 768, 3072, 2))
    with pytest.raises(ConfigError, match="MLP hidden size"):
        check_model(Mesh(4, tp=4), ModelDims(8, 8, 512, 1374, 2))


# (overrides, the key the error names, words it says): all before any model is built
REFUSED = [
    ([Z1, "strategy.tp_size=2", "launcher.nproc_per_node=3"], "strategy.tp_size", "does not divide"),
    (["strategy=zero1", "strategy.sp_size=4", TWO], "strategy.sp_size", "does not divide"),
    (["strategy=zero1", "strategy.tp_size=2", "strategy.sp_size=2", "launcher.nproc_per_node=4"],
     "strategy.sp_size", "together"),
    (["strategy=zero1", "strategy.tp_size=2", TWO, "+model.architecture.num_attention_heads=3",
      "+model.architecture.num_key_value_heads=3", "+model.architecture.head_dim=32"],
     "strategy.tp_size", "3 attention heads"),
    (["strategy=zero1", "strategy.sp_size=2", TWO, "+model.architecture.num_attention_heads=3",
      "+model.architecture.num_key_value_heads=3", "+model.architecture.head_dim=32"],
     "strategy.sp_size", "3 attention heads"),
    (["strategy=zero1", "strategy.sp_size=2", TWO, "data.packing=true", "model.attn_implementation=sdpa"],
     "data.packing", "attend across the documents"),
    (["strategy=zero1", "strategy.sp_size=2", TWO, "model.attn_implementation=eager"],
     "model.attn_implementation", "eager"),
    (["strategy=fsdp", "strategy.tp_size=2", TWO, "strategy.device=cpu"], "strategy.tp_size", "needs GPUs"),
    (["strategy=fsdp", "strategy.sp_size=2", TWO, "strategy.device=cpu"], "strategy.sp_size", "needs GPUs"),
    ([Z1, "strategy.sp_size=2", TWO, "peft=prefix", "data.padding_free=false"], "peft", "virtual"),
    ([Z1, "strategy.tp_size=2", TWO, "peft=lora", "quantization=nf4"], "quantization", "quantized"),
    (["strategy=zero3", "strategy.sp_size=2", TWO], "strategy.stage", "ZeRO-3"),
    (["strategy=zero1", "strategy.tp_size=2", TWO, "recipe=dpo"], "strategy.tp_size", "recipe=dpo"),
    (["strategy=zero1", "strategy.sp_size=2", TWO, "recipe=ppo"], "strategy.sp_size", "own loop"),
    (["strategy=zero1", "strategy.tp_size=2", TWO, "recipe=generate"], "strategy.tp_size", "trains nothing"),
    (["strategy=zero1", "strategy.sp_size=2", TWO, "train.num_workers=2"], "train.num_workers", "gloo"),
    (["strategy=zero1", "strategy.tp_size=0"], "strategy.tp_size", None),
]  # fmt: skip


@pytest.mark.parametrize(("overrides", "key", "words"), REFUSED, ids=[" ".join(o) for o, _, _ in REFUSED])
def test_a_split_the_engines_cannot_run_is_refused_before_load(
    compose_cfg, monkeypatch, overrides, key, words
):
    import hydratune.components.model

    monkeypatch.setattr(
        hydratune.components.model.CausalLM, "build", lambda *a, **k: pytest.fail("a model was loaded")
    )
    cfg = compose_cfg(*overrides)
    with pytest.raises(ConfigError) as err:
        check_before_load(cfg, Components.from_config(cfg), "cpu")
    assert err.value.key == key, err.value
    if words:
        assert words in str(err.value), err.value
    assert err.value.hint, "every refusal names the fix"


def test_plan_prints_the_mesh_and_refuses_with_the_fix(capsys) -> None:
    from hydratune.recipes.cli import main

    main(["mode=plan", "strategy=zero1", "strategy.sp_size=2", TWO])
    out = capsys.readouterr().out
    assert "mesh: dp 1 x tp 1 x sp 2 x pp 1 = 2 processes; 1 node x 2 processes" in out
    assert "global_batch_size: 32 x 1 x 1 data-parallel replicas = 32" in out
    with pytest.raises(SystemExit) as code:
        main(["mode=plan", "strategy=zero1", "strategy.tp_size=2", "launcher.nproc_per_node=3"])
    err = capsys.readouterr().err
    assert code.value.code == 2 and "[strategy.tp_size]" in err and "multiple of 2" in err
    assert "Traceback" not in err


def test_resume_on_another_tp_size_is_refused_naming_both(compose_cfg, tmp_path) -> None:
    from hydratune.components.runtime.resume import resolve
    from tests.support.runs import fake_run

    trained = compose_cfg("strategy=zero1", "strategy.tp_size=2", TWO)
    checkpoint = fake_run(tmp_path / "outputs" / "day" / "tp2", trained)
    cfg = compose_cfg("strategy=zero1", "strategy.tp_size=1", TWO)
    cfg.resume = str(checkpoint)
    with pytest.raises(ConfigError) as err:
        resolve(cfg, tmp_path / "outputs" / "day" / "new")
    assert err.value.key == "resume" and "strategy.tp_size: 2 → 1" in str(err.value)


def test_generation_runs_with_the_attention_ulysses_wrapped() -> None:
    """DeepSpeed's Ulysses wrapper drops the attention mask in eval too; the eval generations run with the
    model's own attention function in its place, and the wrapper is back afterwards."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from hydratune.components.distributed.model_parallel import attention_function, unwrapped_attention

    def original(*args, **kwargs):
        return "own"

    def uattn_wrapper(*args, **kwargs):
        return "wrapped"

    ALL_ATTENTION_FUNCTIONS["test_ulysses"] = original
    saved = attention_function("test_ulysses")
    ALL_ATTENTION_FUNCTIONS["test_ulysses"] = uattn_wrapper  # what register_with_transformers does
    with unwrapped_attention("test_ulysses", saved):
        assert ALL_ATTENTION_FUNCTIONS["test_ulysses"]() == "own"
    assert ALL_ATTENTION_FUNCTIONS["test_ulysses"]() == "wrapped"


def test_ulysses_loader_runs_on_across_epochs() -> None:
    """The Ulysses loader's restart (one StopIteration at an epoch's end) is not an empty optimizer step."""
    from hydratune.components.runtime.trainer_hooks import _DrawOnce

    class Restarting:  # two epochs of two micro-batches, restarting like UlyssesSPDataLoaderAdapter
        def __init__(self) -> None:
            self.items, self.done = iter([1, 2]), False

        def refill(self) -> None: ...

        def __next__(self) -> int:
            try:
                return next(self.items)
            except StopIteration:
                if self.done:
                    raise
                self.items, self.done = iter([3, 4]), True
                raise

    draws = _DrawOnce(Restarting())
    assert [next(draws) for _ in range(4)] == [1, 2, 3, 4]


def test_the_plan_names_the_ranks_of_every_group_and_node() -> None:
    """pp outermost, tp innermost: the groups the pipeline builds (checked live against these by
    ``PipelineGroups.check_groups``) and DeepSpeed's runs of neighbouring tp / sp / ep ranks."""
    mesh = Mesh(8, tp=2, pp=2)
    assert mesh.groups("tp") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert mesh.groups("pp") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert mesh.groups("dp") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert mesh.coordinates(5) == {"tp": 1, "sp": 0, "dp": 0, "pp": 1}
    assert Mesh(4, sp=2).groups("sp") == [[0, 1], [2, 3]] and Mesh(4, sp=2).groups("dp") == [[0, 2], [1, 3]]
    assert Mesh(8, ep=4).groups("ep") == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert mesh.layout(gpus_per_node=4) == {
        "tp groups": "[0, 1] [2, 3] [4, 5] [6, 7]",
        "pp groups": "[0, 4] [1, 5] [2, 6] [3, 7]",
        "dp groups": "[0, 2] [1, 3] [4, 6] [5, 7]",
        "node 0": "ranks 0-3",
        "node 1": "ranks 4-7",
    }
    assert Mesh(2).layout(gpus_per_node=2) == {"dp groups": "[0, 1]", "node 0": "ranks 0-1"}


def test_plan_trains_pp_size_on_zero1_as_the_pipeline_and_refuses_an_offload(capsys) -> None:
    """``strategy=zero1 strategy.pp_size=2`` in mode=plan: the staged engine said, the pipeline's groups and
    stages on their ranks printed; ZeRO-3's parameter offload with pp_size exits 2 naming
    ``strategy.offload_param``."""
    from hydratune.recipes.cli import main

    args = ["strategy=zero1", "strategy.pp_size=2", "launcher.nproc_per_node=4"]
    main(["mode=plan", "plan.config=true", *args])  # the config too: the strategy as typed
    out = capsys.readouterr().out
    assert "DeepSpeed with strategy.pp_size=2 trains as Pipeline (pp 2, 1f1b, ZeRO-1 over the replicas" in out
    assert "_target_: hydratune.components.strategy.DeepSpeed" in out and "pp_size: 2" in out  # as typed
    assert "pp groups: '[0, 2] [1, 3]'" in out and "dp groups: '[0, 1] [2, 3]'" in out
    assert re.search(r"\(471,552 parameters\) on ranks\s+\[0, 1\]", out), out
    with pytest.raises(SystemExit) as code:
        main(["mode=plan", "strategy=zero3", "strategy.pp_size=2", "strategy.offload_param=cpu"])
    err = capsys.readouterr().err
    assert code.value.code == 2 and "[strategy.offload_param]" in err, err
    assert "strategy=zero3 strategy.pp_size=2 with strategy.offload_param left at its default" in err
    assert "Traceback" not in err
