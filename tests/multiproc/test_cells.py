"""The support matrix's multi-process cells, trained on CPU through the ``local`` launcher (torch elastic,
gloo, 2 ranks sharing one run dir): DDP, DeepSpeed ZeRO 1/2/3 (+ offload), DPO / GRPO under ZeRO-3, and PPO's
own loop under DDP, ZeRO-2/3 and FSDP2. ``components/commands/matrix.py``'s ``RUN_IN_TESTS`` drives it: each
cell is launched once (``tests/support/cells.py``, on first use) and there is one test per thing the table
says the cell shows, each reading that run dir; a second launch resumes the cell where the table says so, a
one-process run is the oracle where it names one. DeepSpeed is asserted live at the requested stage
(accelerate falls back to DDP silently), FSDP2 as really sharded."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable

import pytest
import torch
from safetensors.torch import load_file

from hydratune.components.commands.matrix import RUN_IN_TESTS, Cell
from tests.support.cells import CellRun, Cells, losses, name, records, result

#: what each strategy's run must report as live (not what was asked: what accelerate / the loop prepared)
LIVE = {
    "ddp": "MULTI_CPU, 2 process(es)",
    "zero1": "DEEPSPEED, ZeRO stage 1, 2 process(es)",
    "zero2": "DEEPSPEED, ZeRO stage 2, 2 process(es)",
    "zero2_offload": "DEEPSPEED, ZeRO stage 2, 2 process(es)",
    "zero3": "DEEPSPEED, ZeRO stage 3, 2 process(es)",
    "zero3_offload": "DEEPSPEED, ZeRO stage 3, 2 process(es)",
    "fsdp": "FSDP2 (fully_shard), 2 process(es)",
}
CHECKS: dict[str, Callable[[CellRun], None]] = {}


def shows(what: str) -> Callable[[Callable[[CellRun], None]], Callable[[CellRun], None]]:
    """The check of one thing a cell shows (``RUN_IN_TESTS``' ``shows`` names it)."""

    def register(check: Callable[[CellRun], None]) -> Callable[[CellRun], None]:
        CHECKS[what] = check
        return check

    return register


CASES = [(cell, what) for cell, trained in RUN_IN_TESTS.items() for what in trained.shows]


def case_id(cell: Cell, what: str) -> str:
    return f"{name(cell)}:{re.sub(r'[^0-9A-Za-z.]+', '_', what)}"


@pytest.mark.parametrize(("cell", "what"), CASES, ids=[case_id(c, w) for c, w in CASES])
def test_cell(cells: Cells, cell: Cell, what: str) -> None:
    CHECKS[what](cells[cell])


def test_every_thing_a_cell_shows_has_its_check() -> None:
    named = {what for trained in RUN_IN_TESTS.values() for what in trained.shows}
    assert named == set(CHECKS), (named - set(CHECKS), set(CHECKS) - named)


# ---- every cell ------------------------------------------------------------------------------------------
@shows("live strategy")
def live_strategy(cell: CellRun) -> None:
    assert result(cell.run)["run"]["live strategy"] == LIVE[cell.cell.strategy]


def final_files(cell: CellRun) -> list[str]:
    """The files of ``final/`` a resumed run must reproduce: the weights or the adapter, and PPO's value
    head or critic."""
    files = ["adapter_model.safetensors" if cell.cell.peft == "lora" else "model.safetensors"]
    return files + (["value.safetensors"] if cell.cell.recipe == "ppo" else [])


@shows("exact resume")
def exact_resume(cell: CellRun) -> None:
    """Resumed from the table's checkpoint (the sharded optimizer, the schedule, RNG and data order
    restored): the same steps after it as the run that never stopped, and the same final weights."""
    run, resumed, step = cell.run, cell.resumed, cell.trained.resume
    if cell.cell.recipe == "ppo":  # the resumed run logged iterations step+1… with the same rewards
        done, again = records(run), records(resumed)
        assert [r["step"] for r in again] == [r["step"] for r in done[step:]]
        assert [r["reward/mean"] for r in again] == pytest.approx([r["reward/mean"] for r in done[step:]])
    else:
        last = cell.config("train.max_steps")
        info = result(resumed)
        assert info["run"]["resumed from"].endswith(f"checkpoint-{step}")
        covers = info["run"]["train_loss covers"]
        assert covers.startswith(f"steps {step + 1} to {last} (resumed after step {step}"), covers
        state = resumed / "checkpoints" / f"checkpoint-{last}" / "trainer_state.json"
        assert json.loads(state.read_text())["global_step"] == last
        assert [r["step"] for r in records(resumed) if "loss" in r] == list(range(step + 1, last + 1))
        assert losses(resumed) == pytest.approx(losses(run)[step:], abs=1e-6)
    for file in final_files(cell):
        a, b = load_file(run / "final" / file), load_file(resumed / "final" / file)
        assert a.keys() == b.keys(), file
        for key in a:
            torch.testing.assert_close(a[key], b[key], atol=1e-6, rtol=1e-5, msg=key)


@shows("non-empty weights")
def non_empty_weights(cell: CellRun) -> None:
    """The final weights were gathered: no empty shards."""
    weights = load_file(cell.run / "final" / "model.safetensors")
    assert weights and all(t.numel() > 0 for t in weights.values())


@shows("adapter gathered and trained")
def adapter_gathered_and_trained(cell: CellRun) -> None:
    adapter = load_file(cell.run / "final" / "adapter_model.safetensors")
    assert adapter and all(t.numel() > 0 for t in adapter.values())  # gathered, not empty shards
    assert any(float(t.abs().sum()) > 0 for n, t in adapter.items() if "lora_B" in n)  # trained


@shows("identical ranks")
def identical_ranks(cell: CellRun) -> None:
    """Both ranks ended with the same weights (each wrote the hash of its own)."""
    rank0, rank1 = (json.loads((cell.run / f".rank{r}.weights.json").read_text()) for r in (0, 1))
    assert rank0["sha256"] == rank1["sha256"]


# ---- DDP against one process -----------------------------------------------------------------------------
@shows("data prepared once")
def data_prepared_once(cell: CellRun) -> None:
    """The data is prepared once, by one rank, and reused by the other rank and by the one-process run (a
    fresh cache, the cell's own)."""
    one, single = cell.one_process
    lines = cell.out.splitlines()
    prepared = [line for line in lines if ": preparing the data " in line]
    reused = [line for line in lines if ": reusing the prepared data " in line]
    assert len(prepared) == 1 and len(reused) == 1, cell.out
    assert {prepared[0].split(":")[1], reused[0].split(":")[1]} == {" rank 0", " rank 1"}
    assert "this run: reusing the prepared data" in single and "preparing" not in single
    assert result(one)["data"]["data cache"].startswith("hit: reused ")
    assert result(cell.run)["data"]["data cache"].split()[2] == result(one)["data"]["data cache"].split()[2]


@shows("one run dir")
def one_run_dir(cell: CellRun) -> None:
    assert cell.out.count("run dir:") == 1  # one run dir, printed once
    assert not (cell.root / "outputs").exists()  # no worker made a run dir of its own
    assert not list(cell.root.glob("*/outputs"))


@shows("equal to one process")
def equal_to_one_process(cell: CellRun) -> None:
    """Two ranks x micro-batch 8 = one process x 16: the same batches and averaged gradients, so the same
    weights (up to float summation order) and the same first loss."""
    one, _ = cell.one_process
    a, b = load_file(cell.run / "final" / "model.safetensors"), load_file(one / "final" / "model.safetensors")
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], atol=2e-5, rtol=1e-4, msg=key)
    assert abs(losses(cell.run)[0] - losses(one)[0]) < 1e-4  # the same first batch


# ---- DeepSpeed SFT ----------------------------------------------------------------------------------------
@shows("ZeRO stage in deepspeed.json")
def zero_stage_in_deepspeed_json(cell: CellRun) -> None:
    stage = int(LIVE[cell.cell.strategy].split("stage ")[1][0])
    assert json.loads((cell.run / "deepspeed.json").read_text())["zero_optimization"]["stage"] == stage


@shows("zero.Init: rank 0 held half")
def zero_init_shares(cell: CellRun) -> None:
    """zero.Init was live: rank 0 never held the whole model, only its half."""
    built = result(cell.run)["run"]["zero.Init"]
    tensors, of = built["partitioned tensors"].split(" of ")
    assert tensors == of and int(of) > 0, built
    assert built["elements held whole"] == 0 and 0.45 < built["this rank's share"] < 0.55, built


@shows("loss falls")
def loss_falls(cell: CellRun) -> None:
    curve = losses(cell.run)
    assert sum(curve[-2:]) / 2 < curve[0]


@shows("DeepSpeed's sharded optimizer state")
def deepspeed_optimizer_state(cell: CellRun) -> None:
    last = cell.config("train.max_steps")
    checkpoint = cell.run / "checkpoints" / f"checkpoint-{last}"
    assert (checkpoint / "hydratune_complete.json").is_file()
    assert any(checkpoint.glob(f"global_step{last}/*optim_states.pt"))


# ---- DPO, GRPO --------------------------------------------------------------------------------------------
@shows("rewards 0 at step 1")
def dpo_rewards_zero_at_first(cell: CellRun) -> None:
    """ZeRO-3 partitions the policy as it loads: a copy of it would be empty shards (DeepSpeed asserts on the
    first reference forward). The reference is loaded again into its own engine; at the first step policy ==
    reference, so DPO's implicit rewards are 0 (a wrong or empty reference would not give 0)."""
    first, _, third = (r for r in records(cell.run) if "rewards/chosen" in r)
    assert first["step"] == 1
    for key in ("rewards/chosen", "rewards/rejected", "rewards/margins"):
        assert first[key] == pytest.approx(0.0, abs=1e-5), (key, first)
    assert third["rewards/chosen"] != 0.0  # step 1 had lr 0 (warm-up); after step 2 the policy moved


@shows("pairs probe after training")
def pairs_probe_after_training(cell: CellRun) -> None:
    """The training-pairs probe runs after training on every rank (evaluate() gathers the shards)."""
    after = next(v for k, v in result(cell.run).items() if k.endswith("(after)"))
    assert any(m.endswith("rewards/margins") for m in after), after


@shows("reference gathered")
def reference_gathered(cell: CellRun) -> None:
    """GRPO with a KL term saves the random-init policy for TRL to load as the reference: under ZeRO-3 the
    shards are gathered first (saved as they were, the files held empty tensors)."""
    saved = load_file(cell.run / "reference" / "model.safetensors")
    assert saved and all(t.numel() > 0 for t in saved.values())


@shows("KL 0 at step 1")
def kl_zero_at_first(cell: CellRun) -> None:
    """The reference is the initial policy (GRPO, PPO; with LoRA the adapter-free policy): KL 0 at first."""
    first = next(r for r in records(cell.run) if "kl" in r)
    tolerance = 1e-5 if cell.cell.recipe == "grpo" else 1e-4
    assert first["step"] == 1 and abs(first["kl"]) < tolerance, first


# ---- PPO ---------------------------------------------------------------------------------------------------
@shows("one record per iteration")
def one_record_per_iteration(cell: CellRun) -> None:
    """Metrics gathered from both ranks, written by rank 0 only: one record per iteration."""
    iterations = cell.config("recipe.num_iterations")
    assert [r["step"] for r in records(cell.run)] == list(range(1, iterations + 1))


@shows("policy moved")
def policy_moved(cell: CellRun) -> None:
    """The policy moved away from the reference."""
    done = records(cell.run)
    assert done[-1]["kl"] > 0.1 and all(math.isfinite(r["kl"]) for r in done)


@shows("response lengths")
def response_lengths(cell: CellRun) -> None:
    """Every rank's 16 rollouts were counted: mean lengths within (0, max_new_tokens]."""
    assert all(0 < r["response_length"] <= 8 for r in records(cell.run))


@shows("lr decays to 0")
def lr_decays_to_zero(cell: CellRun) -> None:
    """One schedule step per optimizer step on every rank (accelerate's prepared scheduler would step once
    per process: the cosine would end half way and climb back): it decays to 0 at the end."""
    lrs = [r["lr"] for r in records(cell.run)]
    assert lrs == sorted(lrs, reverse=True) and lrs[-1] == pytest.approx(0.0, abs=1e-12), lrs


@shows("final weights")
def final_weights(cell: CellRun) -> None:
    """final/ is gathered (not empty shards) and loads with transformers."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(cell.run / "final")
    assert all(p.numel() > 0 for p in model.parameters())


@shows("value head trained")
def value_head_trained(cell: CellRun) -> None:
    value = load_file(cell.run / "final" / "value.safetensors")
    hidden = json.loads((cell.run / "final" / "config.json").read_text())["hidden_size"]
    assert value["weight"].shape == (1, hidden) and value["weight"].abs().sum() > 0


@shows("the engine's sharded optimizer state")
def engine_optimizer_state(cell: CellRun) -> None:
    """ZeRO-3: policy + value head sharded in one engine; its checkpoint holds the sharded optimizer."""
    checkpoint = cell.run / "checkpoints" / f"checkpoint-{cell.config('train.save_every')}"
    assert any(checkpoint.glob("engine/*optim_states.pt"))


@shows("reward model scores")
def reward_model_scores(cell: CellRun) -> None:
    """Scored by a trained reward model run as the second (inference) ZeRO-3 engine: real-valued scores."""
    done = records(cell.run)
    assert all(r["reward/std"] > 0 and math.isfinite(r["reward/mean"]) for r in done)  # not 0/1


@shows("policy sharded")
def policy_sharded(cell: CellRun) -> None:
    """FSDP2 (the loop calls fully_shard itself): rank 0 held about half of the policy's parameters (DTensor
    shards), not a whole copy."""
    shards = result(cell.run)["sharding"]
    assert 0 < shards["policy parameters on rank 0"] < 0.6 * shards["policy parameters in all"]


@shows("FSDP checkpoint gathered")
def fsdp_checkpoint_gathered(cell: CellRun) -> None:
    """Weights and optimizer state gathered whole into the checkpoint (broadcast back into the shards on
    resume)."""
    checkpoint = cell.run / "checkpoints" / f"checkpoint-{cell.config('train.save_every')}"
    assert {"gathered.safetensors", "optimizer.pt"} <= {p.name for p in checkpoint.iterdir()}


@shows("critic saved whole")
def critic_saved_whole(cell: CellRun) -> None:
    """The separate critic (a second sharded model, its score head its own unit) saved whole, trained."""
    critic = load_file(cell.run / "final" / "value.safetensors")
    assert all(t.numel() > 0 for t in critic.values()) and critic["score.weight"].abs().sum() > 0
