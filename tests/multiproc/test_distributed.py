"""Multi-process training on CPU through the ``local`` launcher (torch elastic, gloo): DDP, DeepSpeed
ZeRO 1/2/3 (+ offload), and PPO's own loop under FSDP2. Each run is the real CLI in a subprocess, two
worker processes sharing one run dir. DeepSpeed is asserted live at the requested stage (accelerate falls
back to DDP silently), FSDP2 as really sharded."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

QUICK = [
    "train.eval_every=0",
    "train.eval_generations=0",
    "train.log_every=1",
    "train.write_plots=false",
]


def hydratune(run_dir: Path, *overrides: str, capsys: pytest.CaptureFixture | None = None) -> str:
    """The CLI, in this process (the launcher spawns the two workers); returns what it printed (with
    ``capfd``: the workers' output too)."""
    from recipes.cli import main

    os.environ["OMP_NUM_THREADS"] = "1"
    main([*QUICK, *overrides, f"hydra.run.dir={run_dir}"])
    return capsys.readouterr().out if capsys else ""


def losses(run_dir: Path) -> list[float]:
    return [r["loss"] for r in map(json.loads, (run_dir / "metrics.jsonl").open()) if "loss" in r]


def result(run_dir: Path) -> dict:
    return json.loads((run_dir / "result.json").read_text())


def records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]


def assert_same_final(run: Path, resumed: Path, *names: str) -> None:
    """The two runs' ``final/<name>`` safetensors hold the same tensors."""
    for name in names:
        a, b = load_file(run / "final" / name), load_file(resumed / "final" / name)
        assert a.keys() == b.keys(), name
        for key in a:
            torch.testing.assert_close(a[key], b[key], atol=1e-6, rtol=1e-5, msg=key)


def assert_resumed_repeats(run: Path, resumed: Path, first: int) -> None:
    """The resumed run logged iterations ``first``… with the uninterrupted run's rewards."""
    done, again = records(run), records(resumed)
    assert [r["step"] for r in again] == [r["step"] for r in done[first - 1 :]]
    assert [r["reward/mean"] for r in again] == pytest.approx([r["reward/mean"] for r in done[first - 1 :]])


def test_ddp_two_processes_match_one_process(tmp_path: Path, capfd: pytest.CaptureFixture) -> None:
    """Two ranks x micro-batch 16 = one process x 32: same batches, same averaged gradients, so the same
    weights (up to float summation order); and both ranks end with identical weights. The data is
    prepared once, by one rank, and reused by the other rank and by the single process (a fresh cache)."""
    common = ["train.max_steps=8", "train.save_every=0", f"data.cache_dir={tmp_path / 'cache'}"]
    two, one = tmp_path / "ddp2", tmp_path / "single"
    out = hydratune(
        two, *common, "strategy=ddp", "launcher.nproc_per_node=2", "train.micro_batch_size=16", capsys=capfd
    )
    single = hydratune(one, *common, "train.micro_batch_size=32", capsys=capfd)
    prepared = [line for line in out.splitlines() if ": preparing the data " in line]
    reused = [line for line in out.splitlines() if ": reusing the prepared data " in line]
    assert len(prepared) == 1 and len(reused) == 1, out
    assert {prepared[0].split(":")[1], reused[0].split(":")[1]} == {" rank 0", " rank 1"}
    assert "this run: reusing the prepared data" in single and "preparing" not in single
    assert result(one)["data"]["data cache"].startswith("hit: reused ")
    assert result(two)["data"]["data cache"].split()[2] == result(one)["data"]["data cache"].split()[2]

    assert result(two)["run"]["live strategy"] == "MULTI_CPU, 2 process(es)"
    assert out.count("run dir:") == 1  # one run dir, printed once
    assert not list(tmp_path.glob("*/outputs"))  # no worker made a run dir of its own
    rank0, rank1 = (json.loads((two / f".rank{r}.weights.json").read_text()) for r in (0, 1))
    assert rank0["sha256"] == rank1["sha256"]
    a, b = load_file(two / "final" / "model.safetensors"), load_file(one / "final" / "model.safetensors")
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=2e-5, rtol=1e-4, msg=name)
    first_two, first_one = losses(two)[0], losses(one)[0]
    assert abs(first_two - first_one) < 1e-4  # the same first batch


@pytest.mark.parametrize(
    ("strategy", "stage", "extra"),
    [
        ("zero1", 1, []),
        ("zero2", 2, []),
        ("zero3", 3, ["peft=lora"]),  # ZeRO-3 + LoRA: the adapter must be gathered, not saved empty
        ("zero2_offload", 2, []),
        ("zero3_offload", 3, []),
    ],
)
def test_deepspeed_two_processes_train_save_and_resume(tmp_path: Path, strategy, stage, extra) -> None:
    run, resumed = tmp_path / "run", tmp_path / "resumed"
    common = [f"strategy={strategy}", "launcher.nproc_per_node=2", "train.micro_batch_size=8", *extra]
    common += ["train.max_steps=6", "train.save_every=3", "train.keep_last=2"]
    hydratune(run, *common)

    live = result(run)["run"]["live strategy"]
    assert live == f"DEEPSPEED, ZeRO stage {stage}, 2 process(es)"
    if stage == 3:  # zero.Init was live: rank 0 never held the whole model, only its half
        built = result(run)["run"]["zero.Init"]
        tensors, of = built["partitioned tensors"].split(" of ")
        assert tensors == of and int(of) > 0, built
        assert built["elements held whole"] == 0 and 0.45 < built["this rank's share"] < 0.55, built
    assert json.loads((run / "deepspeed.json").read_text())["zero_optimization"]["stage"] == stage
    curve = losses(run)
    assert sum(curve[-2:]) / 2 < curve[0]  # loss falls
    checkpoint = run / "checkpoints" / "checkpoint-6"
    assert (checkpoint / "hydratune_complete.json").is_file()
    assert any(checkpoint.glob("global_step6/*optim_states.pt"))  # DeepSpeed's sharded optimizer state

    final = run / "final"
    if "peft=lora" in extra:
        adapter = load_file(final / "adapter_model.safetensors")
        assert adapter and all(t.numel() > 0 for t in adapter.values())  # gathered, not empty shards
        assert any(float(t.abs().sum()) > 0 for n, t in adapter.items() if "lora_B" in n)  # trained
    else:
        weights = load_file(final / "model.safetensors")
        assert all(t.numel() > 0 for t in weights.values())

    # resumed from step 3 (DeepSpeed's sharded optimizer, the schedule, RNG and data order restored): the
    # same steps 4-6 and the same final weights as the run that never stopped
    hydratune(resumed, *common, f"resume={run / 'checkpoints' / 'checkpoint-3'}")
    info = result(resumed)
    assert info["run"]["resumed from"].endswith("checkpoint-3")
    assert info["run"]["train_loss covers"].startswith("steps 4 to 6 (resumed after step 3")
    state = json.loads((resumed / "checkpoints" / "checkpoint-6" / "trainer_state.json").read_text())
    assert state["global_step"] == 6
    assert [r["step"] for r in records(resumed) if "loss" in r] == [4, 5, 6]
    assert losses(resumed) == pytest.approx(losses(run)[3:], abs=1e-6)
    weights = "adapter_model.safetensors" if "peft=lora" in extra else "model.safetensors"
    assert_same_final(run, resumed, weights)


def test_dpo_under_zero3_loads_its_own_reference(tmp_path: Path) -> None:
    """ZeRO-3 partitions the policy as it loads: a copy of it would be empty shards (DeepSpeed asserts on
    the first reference forward). The reference is loaded again into its own engine; at the first step
    policy == reference, so DPO's implicit rewards are 0 (a wrong or empty reference would not give 0)."""
    run = tmp_path / "dpo"
    common = ["recipe=dpo", "strategy=zero3", "launcher.nproc_per_node=2", "train.micro_batch_size=4"]
    hydratune(run, *common, "train.max_steps=3", "train.save_every=0")
    info = result(run)
    assert info["run"]["live strategy"] == "DEEPSPEED, ZeRO stage 3, 2 process(es)"
    # the training-pairs probe runs after training on every rank (evaluate() gathers the shards)
    after = next(v for k, v in info.items() if k.endswith("(after)"))
    assert any(m.endswith("rewards/margins") for m in after), after
    first, _, third = (r for r in records(run) if "rewards/chosen" in r)
    assert first["step"] == 1
    for key in ("rewards/chosen", "rewards/rejected", "rewards/margins"):
        assert first[key] == pytest.approx(0.0, abs=1e-5), (key, first)
    assert third["rewards/chosen"] != 0.0  # step 1 had lr 0 (warm-up); after step 2 the policy moved
    weights = load_file(run / "final" / "model.safetensors")
    assert weights and all(t.numel() > 0 for t in weights.values())


def test_grpo_under_zero3_gathers_the_random_init_reference(tmp_path: Path) -> None:
    """GRPO with a KL term saves a random-init policy for TRL to load as the reference: under ZeRO-3 the
    shards are gathered first (saved as they were, the files held empty tensors). KL at step 1 is 0."""
    run = tmp_path / "grpo"
    hydratune(
        run, "recipe=grpo", "strategy=zero3", "launcher.nproc_per_node=2", "recipe.beta=0.1",
        "recipe.reward_funcs=[tests.support.rewards.brevity]", "data.eval_path=null",
        "train.micro_batch_size=8", "recipe.num_generations=4", "train.max_steps=2", "train.save_every=0",
    )  # fmt: skip
    assert result(run)["run"]["live strategy"] == "DEEPSPEED, ZeRO stage 3, 2 process(es)"
    saved = load_file(run / "reference" / "model.safetensors")
    assert saved and all(t.numel() > 0 for t in saved.values())
    first = next(r for r in records(run) if "kl" in r)
    assert first["step"] == 1 and first["kl"] == pytest.approx(0.0, abs=1e-5), first


PPO = [
    "recipe=ppo",
    "train.micro_batch_size=8",
    "launcher.nproc_per_node=2",
    "recipe.rollout_batch_size=16",
    "recipe.mini_batch_size=8",
    "recipe.reward._target_=tests.support.rewards.brevity",
    "recipe.missing_eos_penalty=0",
]


@pytest.mark.parametrize(
    ("strategy", "live"),
    [("ddp", "MULTI_CPU, 2 process(es)"), ("zero2", "DEEPSPEED, ZeRO stage 2, 2 process(es)")],
)
def test_ppo_on_two_processes(tmp_path: Path, strategy: str, live: str) -> None:
    """Our PPO loop on 2 CPU ranks: each rank samples its own shard of the prompts, gradients are
    all-reduced (DDP) or reduce-scattered (ZeRO-2, one engine for policy + value head), metrics
    gathered from both, rank 0 writes; both ranks end with identical weights."""
    run = tmp_path / "ppo"
    hydratune(run, *PPO, f"strategy={strategy}", "recipe.num_iterations=10")
    assert result(run)["run"]["live strategy"] == live
    rank0, rank1 = (json.loads((run / f".rank{r}.weights.json").read_text()) for r in (0, 1))
    assert rank0["sha256"] == rank1["sha256"]
    done = records(run)
    assert [r["step"] for r in done] == list(range(1, 11))  # one record per iteration, rank 0 only
    # the policy moved away from the reference, and every rank's 16 rollouts were counted
    assert done[-1]["kl"] > 0.1 and all(math.isfinite(r["kl"]) for r in done)
    assert all(0 < r["response_length"] <= 8 for r in done)
    assert (run / "final" / "model.safetensors").is_file()
    # one schedule step per optimizer step on every rank (accelerate's prepared scheduler would step
    # once per process: the cosine would end at iteration 5 and climb back): it decays to 0 at the end
    lrs = [r["lr"] for r in done]
    assert lrs == sorted(lrs, reverse=True) and lrs[-1] == pytest.approx(0.0, abs=1e-12), lrs


def test_ppo_under_zero3_samples_from_shards_saves_and_resumes(tmp_path: Path) -> None:
    """ZeRO-3 on 2 CPU ranks: policy + value head sharded in one engine, responses sampled from the
    shards (synced generation), the reference a separate ZeRO-3 inference engine built like the policy
    (so KL starts at 0, then grows); the final weights are gathered and load; resumed from the
    iteration-3 engine checkpoint (sharded weights + optimizer, RNG of both ranks) the run ends with the
    same weights."""
    run, resumed = tmp_path / "ppo", tmp_path / "resumed"
    common = [*PPO, "strategy=zero3", "recipe.num_iterations=6", "train.save_every=3"]
    hydratune(run, *common)
    assert result(run)["run"]["live strategy"] == "DEEPSPEED, ZeRO stage 3, 2 process(es)"
    assert_sharded_ppo_run(run, iterations=6)
    checkpoint = run / "checkpoints" / "checkpoint-3"
    assert any(checkpoint.glob("engine/*optim_states.pt"))  # the engine's sharded optimizer state
    hydratune(resumed, *common, f"resume={checkpoint}")
    assert_resumed_repeats(run, resumed, first=4)
    assert_same_final(run, resumed, "model.safetensors", "value.safetensors")


def test_ppo_with_lora_under_zero3_scores_with_a_sharded_reward_model(tmp_path: Path) -> None:
    """LoRA policy under ZeRO-3 on 2 CPU ranks, scored by a trained reward model that runs as the second
    (inference) ZeRO-3 engine: the reference is the adapter-free policy (KL 0 at first), the scores are
    real-valued, and the gathered adapter is trained."""
    reward_model = tmp_path / "rm"
    hydratune(reward_model, "recipe=reward", "train.max_steps=2", "train.save_every=0")
    run = tmp_path / "ppo"
    common = [p for p in PPO if "reward._target_" not in p]
    hydratune(run, *common, "strategy=zero3", "peft=lora", f"recipe.reward.model={reward_model}",
              "recipe.num_iterations=3")  # fmt: skip
    assert result(run)["run"]["live strategy"] == "DEEPSPEED, ZeRO stage 3, 2 process(es)"
    done = records(run)
    assert [r["step"] for r in done] == [1, 2, 3] and abs(done[0]["kl"]) < 1e-4
    assert all(r["reward/std"] > 0 and math.isfinite(r["reward/mean"]) for r in done)  # model scores, not 0/1
    adapter = load_file(run / "final" / "adapter_model.safetensors")
    assert any(float(t.abs().sum()) > 0 for n, t in adapter.items() if "lora_B" in n)  # gathered, trained


def assert_sharded_ppo_run(run: Path, iterations: int) -> None:
    """One record per iteration; KL 0 at first (the reference is the initial policy), then > 0.1; the
    final weights gathered (not empty shards), loadable, the value head trained."""
    from transformers import AutoModelForCausalLM

    done = records(run)
    assert [r["step"] for r in done] == list(range(1, iterations + 1))
    assert abs(done[0]["kl"]) < 1e-4 < 0.1 < done[-1]["kl"]
    model = AutoModelForCausalLM.from_pretrained(run / "final")
    assert all(p.numel() > 0 for p in model.parameters())
    value = load_file(run / "final" / "value.safetensors")
    assert value["weight"].shape == (1, model.config.hidden_size) and value["weight"].abs().sum() > 0


FSDP2 = "FSDP2 (fully_shard), 2 process(es)"


def assert_policy_sharded(run: Path) -> None:
    """Rank 0 held about half of the policy's parameters (DTensor shards), not a whole copy."""
    shards = result(run)["sharding"]
    assert 0 < shards["policy parameters on rank 0"] < 0.6 * shards["policy parameters in all"]


def test_ppo_under_fsdp_shards_samples_saves_and_resumes(tmp_path: Path) -> None:
    """FSDP2 on 2 CPU ranks: the loop calls fully_shard itself (accelerate's FSDP plugin cannot run on CPU);
    each rank holds half of the policy, responses are sampled from the shards (synced generation), the
    reference is a sharded frozen model built like the policy (KL starts at 0, then grows), the final
    weights are gathered on rank 0; resumed from the iteration-3 checkpoint (weights and optimizer state
    gathered whole, broadcast back into the shards) the run repeats the rewards and ends with the same
    weights."""
    run, resumed = tmp_path / "ppo", tmp_path / "resumed"
    common = [*PPO, "strategy=fsdp", "recipe.num_iterations=6", "train.save_every=3"]
    hydratune(run, *common)
    assert result(run)["run"]["live strategy"] == FSDP2
    assert_policy_sharded(run)
    assert_sharded_ppo_run(run, iterations=6)
    checkpoint = run / "checkpoints" / "checkpoint-3"
    assert {"gathered.safetensors", "optimizer.pt"} <= {p.name for p in checkpoint.iterdir()}
    hydratune(resumed, *common, f"resume={checkpoint}")
    assert_resumed_repeats(run, resumed, first=4)
    assert_same_final(run, resumed, "model.safetensors", "value.safetensors")


def test_ppo_under_fsdp_with_lora_and_a_separate_critic_resumes(tmp_path: Path) -> None:
    """FSDP2 + LoRA on 2 CPU ranks: the reference is the sharded policy with its adapter disabled (no copy),
    the critic a second sharded model (its score head its own unit); the gathered adapter is trained, the
    critic saved whole; a resumed run (adapter + critic + optimizer gathered) ends with the same weights."""
    run, resumed = tmp_path / "ppo", tmp_path / "resumed"
    common = [*PPO, "strategy=fsdp", "peft=lora", "recipe.value_model=separate"]
    common += ["recipe.num_iterations=4", "train.save_every=2"]
    hydratune(run, *common)
    assert result(run)["run"]["live strategy"] == FSDP2
    assert_policy_sharded(run)
    done = records(run)
    assert [r["step"] for r in done] == [1, 2, 3, 4] and abs(done[0]["kl"]) < 1e-4
    adapter = load_file(run / "final" / "adapter_model.safetensors")
    assert any(float(t.abs().sum()) > 0 for n, t in adapter.items() if "lora_B" in n)  # gathered, trained
    critic = load_file(run / "final" / "value.safetensors")
    assert all(t.numel() > 0 for t in critic.values()) and critic["score.weight"].abs().sum() > 0
    hydratune(resumed, *common, f"resume={run / 'checkpoints' / 'checkpoint-2'}")
    assert_resumed_repeats(run, resumed, first=3)
    assert_same_final(run, resumed, "adapter_model.safetensors", "value.safetensors")
