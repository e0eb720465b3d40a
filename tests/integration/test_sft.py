"""SFT end to end on the tiny model: it learns, PEFT methods touch only their parameters, resume is exact."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from hydratune.components.runtime.run import Components

# Short runs on small batches. Two optimizer steps are enough for what these tests check: AdamW's first
# step moves every parameter that has a gradient (by about lr, whatever the gradient's size), so a weight
# that should stay frozen and moves, or a trainable one that stays put, shows after one; lora_B (zero at the
# start) has a gradient from the first step, lora_A being random.
SHORT = ["train.max_steps=2", "train.micro_batch_size=8", "data.max_samples=128", "train.eval_generations=0"]


def initial_state(ctx) -> dict[str, torch.Tensor]:
    """The weights the run started from: same seed, same random init."""
    ctx.seed_everything()
    return {k: v.detach().clone() for k, v in ctx.components.model.build().state_dict().items()}


def final_weights(ctx) -> dict[str, torch.Tensor]:
    return load_file(ctx.run_dir.final / "model.safetensors")


def losses(ctx) -> list[float]:
    return [r["loss"] for r in ctx.run_dir.read_metrics() if "loss" in r]


def changed(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> set[str]:
    return {k for k, v in after.items() if not torch.equal(before[k], v)}


def test_full_finetune_learns_and_writes_the_run_dir(run_recipe) -> None:
    ctx, metrics = run_recipe(*SHORT, "train.max_steps=30", "train.eval_generations=8")
    run = ctx.run_dir.path
    curve = losses(ctx)
    assert len(curve) >= 10
    assert sum(curve[-3:]) / 3 < 0.7 * sum(curve[:3]) / 3, curve
    # the end-of-run evaluation once: not also the Trainer's own at the last step (train.eval_every=200)
    assert [r["step"] for r in ctx.run_dir.read_metrics() if "eval_loss" in r] == [30]
    for item in ("versions.json", "metrics.jsonl", "summary.md", "generations.jsonl", "result.json"):
        assert (run / item).is_file(), item
    assert (run / "final" / "model.safetensors").is_file()
    assert (run / "final" / "tokenizer_config.json").is_file()
    saved_template = json.loads((run / "final" / "tokenizer_config.json").read_text()).get(
        "chat_template"
    ) or ((run / "final" / "chat_template.jinja").read_text())
    assert "generation" in saved_template
    versions = json.loads((run / "versions.json").read_text())
    assert versions["torch"] and versions["trl"] and versions["transformers"]
    summary = (run / "summary.md").read_text()
    assert "exact match" in summary and "tokens/s" in summary
    # the resolved precision and why; every pass outside the training steps with its seconds
    assert "| precision | fp32 (auto: " in summary  # the default precision=auto: fp32 for the tiny model
    assert "| cpu threads | " in summary and "OMP_WAIT_POLICY" in summary
    cost = json.loads((run / "result.json").read_text())["cost"]
    for row in ("eval generations before (s)", "eval generations after (s)", "end-of-run eval (s)"):
        assert row in cost, (row, cost)
    assert "eval_loss" in metrics


def test_lora_changes_only_adapter_weights(run_recipe) -> None:
    # and generates with the adapter before and after training (the eval generations in the summary)
    ctx, _ = run_recipe(*SHORT, "peft=lora", "train.eval_generations=4", name="lora")
    final = ctx.run_dir.final
    assert (final / "adapter_model.safetensors").is_file()
    assert not (final / "model.safetensors").exists()
    adapter = load_file(final / "adapter_model.safetensors")
    assert adapter and all("lora_" in k for k in adapter)
    assert any(v.abs().sum() > 0 for k, v in adapter.items() if "lora_B" in k), "lora_B is still zero"
    # the trained model in memory: every base weight is bit-identical to the seeded init
    trained = {
        k.replace(".base_layer", ""): v
        for k, v in ctx.model.get_base_model().state_dict().items()
        if "lora_" not in k
    }
    before = initial_state(ctx)
    assert trained.keys() == before.keys()
    assert not changed(before, trained)


def test_bitfit_changes_only_biases(run_recipe) -> None:
    ctx, _ = run_recipe(*SHORT, "peft=bitfit", name="bitfit")
    diff = changed(initial_state(ctx), final_weights(ctx))
    assert diff and all(k.endswith(".bias") for k in diff), diff
    # train.eval_generations=0 (SHORT): the pass is off, so no seconds of it in the cost
    cost = json.loads((ctx.run_dir.path / "result.json").read_text())["cost"]
    assert not [row for row in cost if row.startswith("eval generations")], cost


def test_freeze_changes_only_the_unfrozen_layers(run_recipe) -> None:
    ctx, _ = run_recipe(*SHORT, "peft=freeze", "peft.last_n_layers=1", name="freeze")
    last = ctx.components.model.load_config().num_hidden_layers - 1
    diff = changed(initial_state(ctx), final_weights(ctx))
    assert diff and all(f"layers.{last}." in k for k in diff), diff


def test_bitfit_on_a_model_without_biases_fails_clearly(run_recipe) -> None:
    from hydratune.components.config.errors import ConfigError

    with pytest.raises(ConfigError, match=r"(?i)bitfit"):
        run_recipe(*SHORT, "peft=bitfit", "+model.architecture.attention_bias=false", name="nobias")


def test_resumed_run_matches_uninterrupted_run(run_recipe) -> None:
    # two steps after the checkpoint: the restored optimizer moments, schedule position and data order each
    # decide a step the resumed run must take exactly as the uninterrupted one did
    steps = ["train.max_steps=4", "train.save_every=2", "train.keep_last=3", "train.eval_generations=0"]
    full, _ = run_recipe(*SHORT, *steps, name="full")
    checkpoint = full.run_dir.checkpoints / "checkpoint-2"
    assert (checkpoint / "trainer_state.json").is_file()
    resumed, _ = run_recipe(*SHORT, *steps, f"resume={checkpoint}", name="resumed")
    a, b = final_weights(full), final_weights(resumed)
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=1e-6, msg=key)
    # the resumed run logged only steps 3..4, and they match the uninterrupted run's
    tail = {r["step"]: r["loss"] for r in full.run_dir.read_metrics() if "loss" in r and r["step"] > 2}
    again = {r["step"]: r["loss"] for r in resumed.run_dir.read_metrics() if "loss" in r}
    assert again and set(again) <= set(tail)
    for step, loss in again.items():
        assert loss == pytest.approx(tail[step], abs=1e-5)


def test_merge_writes_a_merged_model(run_recipe) -> None:
    """merged/ is the trained adapter folded into its base: no adapter keys, the adapter model's logits."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    ctx, _ = run_recipe(*SHORT, "peft=lora", "merge=true", name="merge")
    merged = load_file(ctx.run_dir.final / "merged" / "model.safetensors")
    assert merged and not any("lora_" in k for k in merged)
    assert (ctx.run_dir.final / "adapter_model.safetensors").is_file()
    ids = torch.randint(0, 600, (2, 12), generator=torch.Generator().manual_seed(0))
    ctx.seed_everything()
    base = ctx.components.model.build().eval()
    with torch.no_grad():
        before = base(input_ids=ids).logits
        adapted = PeftModel.from_pretrained(base, ctx.run_dir.final).eval()(input_ids=ids).logits
        merged_model = AutoModelForCausalLM.from_pretrained(ctx.run_dir.final / "merged").eval()
        folded = merged_model(input_ids=ids).logits
    assert not torch.allclose(adapted, before, atol=1e-4), "the adapter did nothing"
    torch.testing.assert_close(folded, adapted, atol=1e-5, rtol=1e-5)


def test_bf16_mixed_precision_trains(run_recipe) -> None:
    from torch.nn.modules.module import register_module_forward_hook

    computed = set()  # the dtypes the Linear layers computed in while training (autocast: bf16)

    def note(module, args, output) -> None:
        if module.training and isinstance(module, torch.nn.Linear):
            computed.add(output.dtype)

    hook = register_module_forward_hook(note)
    try:
        ctx, _ = run_recipe(*SHORT, "precision=bf16", name="bf16")
    finally:
        hook.remove()
    assert computed == {torch.bfloat16}, computed
    assert ctx.run_dir.final.joinpath("model.safetensors").is_file()
    assert all(v.dtype == torch.float32 for v in final_weights(ctx).values())  # fp32 master weights
    assert "bf16" in (ctx.run_dir.path / "summary.md").read_text()


def test_auto_precision_autocasts_to_bf16_where_the_cpu_and_the_model_make_it_pay(
    run_recipe, monkeypatch
) -> None:
    from torch.nn.modules.module import register_module_forward_hook

    from hydratune.components import precision

    monkeypatch.setattr(precision, "cpu_flags", lambda: {"avx512_bf16"})  # whatever this machine has
    monkeypatch.setattr("torch.backends.cpu.get_cpu_capability", lambda: "AVX512")
    monkeypatch.setattr(precision, "CPU_BF16_MIN_PARAMS", 600_000)  # the tiny model: 0.67 M
    computed = set()
    hook = register_module_forward_hook(
        lambda module, args, output: (
            computed.add(output.dtype) if module.training and isinstance(module, torch.nn.Linear) else None
        )
    )
    try:
        ctx, _ = run_recipe(*SHORT, "precision=auto", name="auto")
    finally:
        hook.remove()
    assert computed == {torch.bfloat16}, computed  # the plan's choice reached the trainer's autocast
    assert (
        "| precision | bf16 (auto: the CPU has avx512_bf16 and 0.67 M"
        in (ctx.run_dir.path / "summary.md").read_text()
    )


def test_tensorboard_tracker_writes_the_loss_series(run_recipe) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ctx, _ = run_recipe(*SHORT, "tracker=tensorboard", "train.max_steps=3", name="tb")
    events = EventAccumulator(str(ctx.run_dir.path / "tensorboard")).Reload()
    tags = events.Tags()["scalars"]
    assert "train/loss" in tags, tags
    assert len(events.Scalars("train/loss")) >= 3


def test_progress_without_a_terminal_is_plain_lines(run_recipe, capsys) -> None:
    """stdout is a file (capsys: not a TTY), as in a SLURM job: a line every train.log_every steps with
    step/total, loss, lr, tokens/s and ETA."""
    import re

    run_recipe(*SHORT, "train.max_steps=6", "train.log_every=2", "train.eval_every=0")
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("sft step ")]
    pattern = r"sft step (\d+)/6  loss [\d.]+  lr [\d.]+e[-+]\d+  tok/s [\d,]+  eta \d+:\d\d:\d\d"
    steps = [int(m.group(1)) for line in lines if (m := re.fullmatch(pattern, line))]
    assert steps == [1, 2, 4, 6], lines


def test_components_still_equal_their_config_after_a_run(run_recipe) -> None:
    """A component is its config: after training (SFT with an adapter, a tracker) and after generating from
    that run (which reads every row of its data), each group's component equals one built afresh from the
    run's config. Frozen dataclasses refuse assignment; this catches a list or dict changed in place."""
    import dataclasses

    from hydratune.components.config.registry import REGISTRY

    assert all(c.__dataclass_params__.frozen for classes in REGISTRY.values() for c in classes.values())
    sft, _ = run_recipe(*SHORT, "peft=lora", "tracker=jsonl", "merge=true", name="sft")
    generate, _ = run_recipe(
        "recipe=generate", f"model.from_run={sft.run_dir.path}", "recipe.max_new_tokens=2",
        "data.max_samples=8", name="generate",
    )  # fmt: skip
    for ctx in (sft, generate):
        fresh = Components.from_config(ctx.cfg)
        for (group, component), (_, again) in zip(ctx.components.items(), fresh.items(), strict=True):
            assert component == again, group
            with pytest.raises(dataclasses.FrozenInstanceError):
                setattr(component, next(iter(vars(component)), "x"), None)


def test_qlora_trains_only_the_adapter_on_cpu(run_recipe) -> None:
    """bitsandbytes quantizes the tiny model to NF4 on CPU; LoRA steps run and the base stays 4-bit."""
    ctx, _ = run_recipe(*SHORT, "quantization=nf4", "peft=lora", "train.save_every=0", name="qlora")
    bnb_layers = [m for m in ctx.model.modules() if type(m).__name__ == "Linear4bit"]
    assert bnb_layers, "no 4-bit layers in the trained model"
    trainable = {n for n, p in ctx.model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    assert (ctx.run_dir.final / "adapter_model.safetensors").is_file()
