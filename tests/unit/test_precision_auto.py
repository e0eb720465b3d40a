"""``precision=auto`` on a CPU (components/precision.py): bf16 autocast only with native bf16 matmuls and a
model at least the measured threshold; the plan and the run say which and why."""

from __future__ import annotations

import pytest

from hydratune.components import precision as precision_module
from hydratune.components.precision import CPU_BF16_MIN_PARAMS, Precision

BIG, SMALL = CPU_BF16_MIN_PARAMS, CPU_BF16_MIN_PARAMS - 1


def fake_cpu(monkeypatch, flags: set[str], capability: str = "AVX512") -> None:
    monkeypatch.setattr(precision_module, "cpu_flags", lambda: flags)
    monkeypatch.setattr("torch.backends.cpu.get_cpu_capability", lambda: capability)


@pytest.mark.parametrize(
    ("flags", "capability", "params", "dtype", "said"),
    [
        ({"avx512f", "avx512_bf16"}, "AVX512", BIG, "bf16", "avx512_bf16"),
        ({"amx_bf16", "avx512_bf16"}, "AMX", BIG, "bf16", "amx_bf16"),  # AMX named first
        ({"avx512_bf16"}, "AVX512", SMALL, "fp32", "less than a fifth"),  # below the measured threshold
        ({"avx512_bf16"}, "AVX512", None, "fp32", "unknown"),  # no config: the safe choice
        ({"avx2"}, "AVX2", BIG, "fp32", "no amx_bf16"),  # emulated bf16
        ({"avx512_bf16"}, "AVX2", BIG, "fp32", "no amx_bf16"),  # torch does not use the flag
    ],
)
def test_auto_on_cpu_reads_the_flags_and_the_model_size(
    monkeypatch, flags, capability, params, dtype, said
) -> None:
    fake_cpu(monkeypatch, flags, capability)
    chosen, why = Precision(dtype="auto").choose("cpu", params)
    assert chosen == dtype and said in why, why
    assert Precision(dtype="auto").resolve("cpu", params) == dtype


def test_explicit_choices_are_kept_whatever_the_cpu(monkeypatch) -> None:
    fake_cpu(monkeypatch, {"avx512_bf16"})
    assert Precision(dtype="fp32").choose("cpu", BIG) == ("fp32", "precision=fp32")
    assert Precision(dtype="bf16").choose("cpu", 1) == ("bf16", "precision=bf16")


def test_the_plan_and_the_run_carry_the_choice_and_why(monkeypatch, compose_cfg) -> None:
    from hydratune.components.runtime.run import Components, batch_plan

    fake_cpu(monkeypatch, {"avx512_bf16"})
    monkeypatch.setattr(precision_module, "CPU_BF16_MIN_PARAMS", 600_000)  # the tiny model: 0.67 M
    cfg = compose_cfg("precision=auto")
    plan = batch_plan(cfg, Components.from_config(cfg), "cpu")
    assert plan.dtype == "bf16" and "0.67 M parameters >= 0.6 M" in plan.dtype_reason
    monkeypatch.setattr(precision_module, "CPU_BF16_MIN_PARAMS", 700_000)
    plan = batch_plan(cfg, Components.from_config(cfg), "cpu")
    assert plan.dtype == "fp32" and "0.67 M parameters < 0.7 M" in plan.dtype_reason


def test_plan_prints_the_resolved_precision_and_why(monkeypatch, capsys) -> None:
    from hydratune.recipes.cli import main

    fake_cpu(monkeypatch, {"avx512_bf16"})
    monkeypatch.setattr(precision_module, "CPU_BF16_MIN_PARAMS", 600_000)
    main(["mode=plan", "precision=auto"])
    out = capsys.readouterr().out
    assert "# precision: bf16 (auto: the CPU has avx512_bf16 and 0.67 M parameters >= 0.6 M)" in out


def test_auto_falls_back_to_fp32_where_the_strategy_takes_no_bf16(monkeypatch, compose_cfg) -> None:
    from hydratune.components.runtime.run import Components, batch_plan

    fake_cpu(monkeypatch, {"avx512_bf16"})
    monkeypatch.setattr(precision_module, "CPU_BF16_MIN_PARAMS", 600_000)
    cfg = compose_cfg("precision=auto", "strategy=zero2")  # DeepSpeed on a CPU: fp32 only
    plan = batch_plan(cfg, Components.from_config(cfg), "cpu")
    assert plan.dtype == "fp32" and "trains in fp32 only" in plan.dtype_reason, plan.dtype_reason
