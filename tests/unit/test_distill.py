"""recipe=distill before any model loads: the teacher's checks, the plan, the estimate; and its loss, TRL's
generalized JSD as the recipe configures it, against one written out by hand on small tensors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from hydratune.components.config.errors import ConfigError
from tests.support.data import tiny_export


@pytest.fixture(scope="module")
def teachers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny teacher (random weights), one with a token more, one whose chat template differs."""
    from transformers import AutoTokenizer

    root = tmp_path_factory.mktemp("teachers")
    good = tiny_export(root / "good", seed=1)
    extra = Path(shutil.copytree(good, root / "extra_token"))
    tok = AutoTokenizer.from_pretrained(extra)
    tok.add_tokens(["<teacher_only>"])
    tok.save_pretrained(extra)
    template = Path(shutil.copytree(good, root / "template"))
    tok = AutoTokenizer.from_pretrained(template)
    tok.chat_template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    tok.save_pretrained(template)
    return {"good": good, "extra_token": extra, "template": template}


def checked(compose_cfg, *overrides: str) -> None:
    from hydratune.components.runtime.checks import check_before_load
    from hydratune.components.runtime.run import Components

    cfg = compose_cfg("recipe=distill", *overrides)
    check_before_load(cfg, Components.from_config(cfg))


def refusal(compose_cfg, *overrides: str) -> ConfigError:
    with pytest.raises(ConfigError) as err:
        checked(compose_cfg, *overrides)
    return err.value


def test_a_tiny_teacher_passes_and_the_demo_data_is_prompts(compose_cfg, teachers) -> None:
    cfg = compose_cfg("recipe=distill", f"recipe.teacher={teachers['good']}")
    assert cfg.data._target_.endswith("PromptDataset")  # data=demo_distill, picked by the recipe
    checked(compose_cfg, f"recipe.teacher={teachers['good']}")


def test_the_demo_teacher_is_bundled_and_yours_is_asked_for(compose_cfg, tmp_path) -> None:
    from hydratune.components.config.resolvers import asset

    assert compose_cfg("recipe=distill").recipe.teacher == asset("tiny_teacher")
    checked(compose_cfg)  # the demo: the bundled teacher, a random student of its tokenizer
    yours = tmp_path / "yours.jsonl"
    shutil.copy(asset("demo/prompts_train.jsonl"), yours)
    err = refusal(compose_cfg, f"data.path={yours}")  # your data: no demo teacher
    assert err.key == "recipe.teacher"


def test_a_missing_teacher_is_refused_naming_the_key(compose_cfg, tmp_path) -> None:
    err = refusal(compose_cfg, "recipe.teacher=null")
    assert err.key == "recipe.teacher" and "needs a teacher" in str(err) and "run dir" in err.hint
    err = refusal(compose_cfg, f"recipe.teacher={tmp_path / 'nope'}")
    assert err.key == "recipe.teacher" and "not found" in str(err)
    (tmp_path / "empty").mkdir()
    err = refusal(compose_cfg, f"recipe.teacher={tmp_path / 'empty'}")
    assert err.key == "recipe.teacher" and "neither a run dir" in str(err)


def test_a_teacher_without_weights_is_refused(compose_cfg) -> None:
    from hydratune.components.config.resolvers import asset

    err = refusal(compose_cfg, f"recipe.teacher={asset('tiny')}")
    assert err.key == "recipe.teacher" and "no weight file" in str(err)


def test_a_model_option_is_a_teacher_when_it_has_weights(compose_cfg, tmp_path) -> None:
    """recipe.teacher=<model option>: built as model=<option> builds it; the bundled tiny option has no
    weights (random init), so it teaches nothing and is refused; an unknown name is not found."""
    err = refusal(compose_cfg, "recipe.teacher=tiny")
    assert err.key == "recipe.teacher" and "needs trained weights" in str(err)
    err = refusal(compose_cfg, "recipe.teacher=no_such_option")
    assert err.key == "recipe.teacher" and "not found" in str(err) and "model option" in err.hint


def test_the_student_itself_is_refused(compose_cfg, teachers) -> None:
    good = teachers["good"]
    err = refusal(compose_cfg, f"recipe.teacher={good}", f"model.name_or_path={good}")
    assert err.key == "recipe.teacher" and "the student itself" in str(err)
    # the fix the hint gives: a student built at random from the same config
    checked(compose_cfg, f"recipe.teacher={good}", f"model.name_or_path={good}", "model.init=random")


@pytest.mark.parametrize(
    ("teacher", "said"),
    [("extra_token", "tokenizers differ: teacher"), ("template", "chat templates give different ids")],
)
def test_tokenizers_must_agree(compose_cfg, teachers, teacher: str, said: str) -> None:
    err = refusal(compose_cfg, f"recipe.teacher={teachers[teacher]}")
    assert err.key == "recipe.teacher" and said in str(err)
    assert str(teachers[teacher]) in str(err) and "student" in str(err)  # names both
    assert f"model.name_or_path={teachers[teacher]} model.init=random" in err.hint


def test_tokenizer_fix_in_the_hint_works(compose_cfg, teachers) -> None:
    """The hint's student (random, from the teacher's own dir) passes the check the default student fails."""
    extra = teachers["extra_token"]
    checked(compose_cfg, f"recipe.teacher={extra}", f"model.name_or_path={extra}", "model.init=random")


def test_lmbda_below_one_needs_the_datasets_completions(compose_cfg) -> None:
    """Prompt-only data has no completion to train on: refused naming recipe.lmbda and chat data; the demo's
    chats pass; k1 / k3 read the student's samples, so they refuse lmbda < 1 (naming recipe.loss)."""
    err = refusal(compose_cfg, "recipe.lmbda=0.5")  # data=demo_distill: prompts (the combination: key data)
    assert err.key == "data" and "recipe.lmbda=0.5 trains on the dataset's completions" in str(err)
    assert "prompts only" in str(err) and "data=demo_sft" in err.hint and "recipe.lmbda=1" in err.hint
    checked(compose_cfg, "recipe.lmbda=0.5", "data=demo_sft")
    checked(compose_cfg, "recipe.lmbda=0", "data=demo_sft", "recipe.loss=topk_forward_kl")
    err = refusal(compose_cfg, "recipe.lmbda=0.5", "data=demo_sft", "recipe.loss=k3")
    assert err.key == "recipe.loss" and "recipe.lmbda=1" in err.hint


def test_a_bad_loss_is_refused_naming_the_choices(compose_cfg) -> None:
    err = refusal(compose_cfg, "recipe.loss=kl")
    assert err.key == "recipe.loss" and "jsd, topk_forward_kl, k1, k3" in err.hint


def test_a_knob_the_loss_does_not_read_is_said(compose_cfg) -> None:
    from hydratune.components.runtime.run import Components

    def said(*overrides: str) -> list[str]:
        cfg = compose_cfg("recipe=distill", *overrides)
        comps = Components.from_config(cfg)
        return comps.recipe.warnings(cfg, comps)

    assert said("recipe.beta=0") == [] and said("recipe.loss=k3") == []
    assert said("recipe.loss=k3", "recipe.beta=0") == ["recipe.beta=0.0 is not used by recipe.loss=k3"]
    assert said("recipe.top_k=5") == ["recipe.top_k=5 is not used by recipe.loss=jsd"]


@pytest.mark.parametrize("peft", ["prefix", "ptuning"])
def test_prompt_learning_is_refused_before_load(compose_cfg, peft: str) -> None:
    """TRL's trainer refuses it only once the model is loaded; here it is a ConfigError before (the hint's
    peft=lora passes: tests/unit/test_matrix.py's distill cells)."""
    err = refusal(compose_cfg, f"peft={peft}")
    assert err.key == "peft" and err.hint.startswith("peft=lora")


def test_beta_outside_zero_one_is_refused(compose_cfg, teachers) -> None:
    from hydratune.components.runtime.run import Components

    cfg = compose_cfg("recipe=distill", f"recipe.teacher={teachers['good']}", "recipe.beta=1.5")
    with pytest.raises(ConfigError) as err:
        Components.from_config(cfg)
    assert err.value.key == "recipe.beta"


def teacher_params(path: Path) -> int:
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path))
    return sum(p.numel() for p in model.parameters())


def test_the_estimate_counts_the_teacher(compose_cfg, teachers) -> None:
    """Its parameters (those the model built from its config holds) x the compute dtype's bytes, whole on
    each rank; under ZeRO-3 sharded over the ranks; nothing for other recipes."""
    from hydratune.components.memory.estimate import estimate
    from hydratune.components.memory.spec import spec_from_config

    good = f"recipe.teacher={teachers['good']}"
    n = teacher_params(teachers["good"])
    one = estimate(spec_from_config(compose_cfg("recipe=distill", good, "precision=bf16")))
    assert one.row("teacher (frozen)") == n * 2
    zero3 = compose_cfg("recipe=distill", good, "precision=bf16", "strategy=zero3", "estimate.num_gpus=2")
    assert estimate(spec_from_config(zero3)).row("teacher (frozen)") == n * 2 / 2
    alone = estimate(spec_from_config(compose_cfg("recipe=distill", "precision=bf16", "recipe.teacher=null")))
    assert alone.row("teacher (frozen)") == 0
    assert one.total - alone.total == pytest.approx(n * 2 * 1.05)  # + the allocator's fragmentation
    sft = estimate(spec_from_config(compose_cfg("recipe=sft", "precision=bf16")))
    assert sft.row("teacher (frozen)") == 0 and "teacher (frozen)" not in [r.name for r in sft.rows]


def test_a_teacher_too_big_for_what_the_student_leaves_is_refused(compose_cfg, teachers) -> None:
    from hydratune.components.memory.estimate import estimate
    from hydratune.components.memory.spec import spec_from_config

    good = f"recipe.teacher={teachers['good']}"
    total = estimate(spec_from_config(compose_cfg("recipe=distill", good))).total
    kib = total / 0.9 / 1024  # the GPU the estimate just fits in (10% margin)
    checked(compose_cfg, good, f"estimate.gpu_memory={int(kib) + 1}KiB")
    err = refusal(compose_cfg, good, f"estimate.gpu_memory={int(kib) - 4}KiB")
    assert err.key == "recipe.teacher" and "the teacher needs" in str(err) and "strategy=zero3" in err.hint


def test_plan_names_student_teacher_loss_and_memory(compose_cfg, teachers) -> None:
    from hydratune.components.runtime.run import Components

    cfg = compose_cfg("recipe=distill", f"recipe.teacher={teachers['good']}", "recipe.beta=0")
    comps = Components.from_config(cfg)
    text = "\n".join(comps.recipe.plan_lines(cfg, comps))
    assert "student random init" in text and f"teacher loaded from {teachers['good']}" in text
    assert "forward KL(teacher || student)" in text and "memory per rank (estimate)" in text
    assert "on the student's own samples (lmbda=1)" in text
    cfg = compose_cfg(
        "recipe=distill",
        f"recipe.teacher={teachers['good']}",
        "recipe.loss=topk_forward_kl",
        "recipe.top_k=5",
    )
    text = "\n".join(Components.from_config(cfg).recipe.plan_lines(cfg, Components.from_config(cfg)))
    assert "over the teacher's top-5 tokens, renormalised" in text
    assert json.loads((teachers["good"] / "config.json").read_text())["vocab_size"] == 602


# ---- the loss: TRL's generalized JSD as the recipe hands it beta, against the definition -------------------
def reference_divergence(student: torch.Tensor, teacher: torch.Tensor, beta: float, t: float) -> torch.Tensor:
    """Generalized JSD per token (Agarwal et al. 2024, as TRL documents it), from the logits, by hand: beta 0
    is KL(teacher || student), 1 is KL(student || teacher), else with the mixture m = (1-beta) p_s + beta p_t,
    beta KL(p_t || m) + (1-beta) KL(p_s || m)."""
    p_s, p_t = torch.softmax(student / t, -1), torch.softmax(teacher / t, -1)

    def kl(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        return (p * (p.log() - q.log())).sum(-1)

    if beta == 0:
        return kl(p_t, p_s)
    if beta == 1:
        return kl(p_s, p_t)
    m = (1 - beta) * p_s + beta * p_t
    return beta * kl(p_t, m) + (1 - beta) * kl(p_s, m)


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0, 0.2])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_the_loss_is_the_generalized_jsd(beta: float, temperature: float) -> None:
    """What DistillationTrainer computes (its chunked divergence over hidden states and both heads) with the
    recipe's knobs equals the hand-written divergence, masked mean over the completion tokens, within 1e-6."""
    from trl.trainer.distillation_trainer import _chunked_divergence_loss

    from hydratune.recipes.distill import Distill

    args = Distill(beta=beta, temperature=temperature).loss_args()
    g = torch.Generator().manual_seed(0)
    batch, length, hidden, vocab = 2, 5, 8, 11
    h_s = torch.randn(batch, length, hidden, generator=g, dtype=torch.float64)
    h_t = torch.randn(batch, length, hidden, generator=g, dtype=torch.float64)
    w_s = torch.randn(vocab, hidden, generator=g, dtype=torch.float64)
    w_t = 2 * torch.randn(vocab, hidden, generator=g, dtype=torch.float64)  # a sharper teacher
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    loss, _, n = _chunked_divergence_loss(
        h_s, h_t, w_s, w_t, mask, args["beta"], temperature=args["temperature"]
    )
    per_token = reference_divergence(h_s @ w_s.T, h_t @ w_t.T, beta, temperature)
    expected = (per_token * mask).sum() / mask.sum()
    assert int(n) == 8
    assert abs(float(loss) - float(expected)) < 1e-6
    assert float(expected) > 1e-2  # the two distributions differ: a swapped direction would show


# ---- recipe.loss's estimators against their definitions ---------------------------------------------------
def reference_estimator(
    loss: str, student: torch.Tensor, teacher: torch.Tensor, tokens, k: int
) -> torch.Tensor:
    """Per position, from the logits, by hand: the top-k forward KL with both distributions renormalised over
    the teacher's k most likely tokens (NeMo-RL's convention); Schulman's k1, k3 at the sampled token."""
    out = []
    for s_row, t_row, y in zip(student, teacher, tokens.tolist(), strict=True):
        p_s, p_t = torch.softmax(s_row, -1), torch.softmax(t_row, -1)
        if loss == "topk_forward_kl":
            top = sorted(range(len(t_row)), key=lambda i: -float(t_row[i]))[:k]
            z_s, z_t = sum(p_s[i] for i in top), sum(p_t[i] for i in top)
            out.append(sum(p_t[i] / z_t * torch.log((p_t[i] / z_t) / (p_s[i] / z_s)) for i in top))
        elif loss == "k1":
            out.append(torch.log(p_s[y]) - torch.log(p_t[y]))
        else:
            ratio = p_t[y] / p_s[y]
            out.append(ratio - 1 - torch.log(ratio))
    return torch.stack(out)


def estimator_case(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    batch, length, hidden, vocab = 2, 5, 8, 11
    h_s = torch.randn(batch, length, hidden, generator=g, dtype=torch.float64)
    h_t = torch.randn(batch, length, 6, generator=g, dtype=torch.float64)  # a narrower teacher
    head_s = torch.nn.Linear(hidden, vocab, bias=False).double()
    head_t = torch.nn.Linear(6, vocab).double()
    with torch.no_grad():
        head_t.weight.mul_(4)  # a sharper teacher
    tokens = torch.randint(0, vocab, (batch, length), generator=g)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    return h_s, h_t, head_s, head_t, tokens, mask


@pytest.mark.parametrize("loss", ["topk_forward_kl", "k1", "k3"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_the_estimators_equal_their_definitions(loss: str, temperature: float) -> None:
    """What the trainer's loss computes (hidden states through both heads, in chunks, masked mean) equals the
    hand-written estimator within 1e-6 (float64); positions under the mask change nothing."""
    from hydratune.components.runtime.distill_trainer import estimator_loss

    h_s, h_t, head_s, head_t, tokens, mask = estimator_case()
    got, _, n = estimator_loss(
        loss, h_s, h_t, head_s, head_t, tokens, mask, temperature=temperature, top_k=4, chunk=3
    )
    valid = mask.reshape(-1) != 0
    with torch.no_grad():
        student = (head_s(h_s) / temperature).reshape(-1, 11)[valid]
        teacher = (head_t(h_t) / temperature).reshape(-1, 11)[valid]
    expected = reference_estimator(loss, student, teacher, tokens.reshape(-1)[valid], 4).mean()
    assert int(n) == 8 and abs(float(got.detach()) - float(expected)) < 1e-6
    assert float(expected) > 1e-2 if loss != "k1" else abs(float(expected)) > 1e-2
    other = tokens.clone()
    other[0, 3:] = (other[0, 3:] + 1) % 11  # under the mask: the same loss
    h_masked = h_s.clone()
    h_masked[0, 3:] += 5
    again, _, _ = estimator_loss(
        loss, h_masked, h_t, head_s, head_t, other, mask, temperature=temperature, top_k=4, chunk=3
    )
    assert abs(float(again.detach()) - float(got.detach())) < 1e-12


@pytest.mark.parametrize("loss", ["k1", "k3"])
def test_the_sampled_estimators_gradients(loss: str) -> None:
    """k1's gradient is the score function k1 * grad log p_s(y) (its own derivative averages to 0 over the
    student's samples); k3's is its derivative, (1 - p_t/p_s) grad log p_s(y). By hand, on the student's
    logits: grad log p_s(y) = onehot(y) - p_s."""
    from hydratune.components.runtime.distill_trainer import estimator_loss

    h_s, h_t, head_s, head_t, tokens, mask = estimator_case(1)
    loss_value, _, n = estimator_loss(loss, h_s, h_t, head_s, head_t, tokens, mask)
    loss_value.backward()
    valid = mask.reshape(-1) != 0
    with torch.no_grad():
        hs = h_s.reshape(-1, 8)[valid]
        p_s = torch.softmax(head_s(hs), -1)
        p_t = torch.softmax(head_t(h_t.reshape(-1, 6)[valid]), -1)
        y = tokens.reshape(-1)[valid]
        ps_y, pt_y = p_s.gather(-1, y[:, None]), p_t.gather(-1, y[:, None])
        weight = (ps_y.log() - pt_y.log()) if loss == "k1" else (1 - pt_y / ps_y)
        d_logits = weight * (torch.nn.functional.one_hot(y, 11) - p_s) / int(n)
        expected = d_logits.T @ hs  # the head's weight gradient
    assert torch.allclose(head_s.weight.grad, expected, atol=1e-10)


# ---- the metrics of the student's samples ------------------------------------------------------------------
def test_the_sample_metrics_are_the_log_probs_and_the_agreement_by_hand() -> None:
    from hydratune.components.runtime.distill_trainer import means, sample_sums

    g = torch.Generator().manual_seed(1)
    h_s, h_t = torch.randn(2, 3, 4, generator=g), torch.randn(2, 3, 6, generator=g)  # a wider teacher
    head_s, head_t = torch.nn.Linear(4, 7, bias=False), torch.nn.Linear(6, 7)
    tokens = torch.tensor([[1, 5, 0], [2, 2, 6]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    got = means(sample_sums(h_s, h_t, head_s, head_t, tokens, mask, temperature=0.5, chunk=2))
    want: dict[str, list[float]] = {"student_logp": [], "teacher_logp": [], "teacher_agreement": []}
    with torch.no_grad():
        for b, k in [(0, 0), (0, 1), (1, 0), (1, 1), (1, 2)]:
            tok = int(tokens[b, k])
            p_s = torch.softmax(head_s(h_s[b, k]).double() / 0.5, -1)
            p_t = torch.softmax(head_t(h_t[b, k]).double() / 0.5, -1)
            want["student_logp"].append(float(p_s[tok].log()))
            want["teacher_logp"].append(float(p_t[tok].log()))
            want["teacher_agreement"].append(float(int(p_t.argmax()) == tok))
    assert got.keys() == want.keys()
    for name, values in want.items():
        assert got[name] == pytest.approx(sum(values) / len(values), abs=1e-6), name  # fp32 heads
    assert means(sample_sums(h_s, h_t, head_s, head_t, tokens, torch.zeros_like(mask))) == {}


def test_the_wrapped_private_trl_methods_are_there() -> None:
    """The installed TRL still has the methods MeasuredDistillationTrainer wraps, with these parameters."""
    import inspect

    from trl import DistillationTrainer

    from hydratune.components.runtime.distill_trainer import PRIVATE_METHODS

    for name, params in PRIVATE_METHODS.items():
        signature = list(inspect.signature(getattr(DistillationTrainer, name)).parameters)[1:]
        assert signature[: len(params)] == list(params), name


def test_the_on_policy_draw_is_lmbda_and_a_function_of_seed_and_step() -> None:
    """Every rank, and a resumed run, draws alike: the same (seed, step) gives the same answer; the share of
    on-policy steps is lmbda; 1 always, 0 never."""
    from hydratune.components.runtime.distill_trainer import on_policy

    draws = [on_policy(0.3, 42, step) for step in range(4000)]
    assert draws == [on_policy(0.3, 42, step) for step in range(4000)]
    assert abs(sum(draws) / len(draws) - 0.3) < 0.03 and draws != [on_policy(0.3, 7, s) for s in range(4000)]
    assert all(on_policy(1.0, 42, s) for s in range(50)) and not any(on_policy(0.0, 42, s) for s in range(50))


def test_chat_rows_must_end_with_the_assistants_answer(compose_cfg) -> None:
    from datasets import Dataset

    from hydratune.components.runtime.run import Components

    comps = Components.from_config(compose_cfg("recipe=distill", "data=demo_sft", "recipe.lmbda=0"))
    turn = {"role": "user", "content": "2 + 2?"}
    good = Dataset.from_list([{"messages": [turn, {"role": "assistant", "content": "4"}]}])
    comps.recipe.check_data(comps, {"train": good, "eval": good}, None)
    bad = Dataset.from_list([good[0], {"messages": [turn]}])
    with pytest.raises(ConfigError) as err:
        comps.recipe.check_data(comps, {"train": bad, "eval": good}, None)
    assert err.value.key == "data.path" and "row 1 of" in str(err.value)
    text = Dataset.from_list([{"text": "2 + 2 = 4"}])
    with pytest.raises(ConfigError) as err:
        comps.recipe.check_data(comps, {"train": text}, None)
    assert err.value.key == "data.format"
    tok = comps.model.build_tokenizer()  # the student's: its prompt is the start of the whole conversation
    comps.recipe.check_data(comps, {"train": good, "eval": good}, tok)
    tok.chat_template = (  # the generation prompt says "assistant", the answer's turn "bot"
        "{% for m in messages %}{{ ('bot' if m['role'] == 'assistant' else m['role']) }}: "
        "{{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}"
    )
    with pytest.raises(ConfigError) as err:
        comps.recipe.check_data(comps, {"train": good, "eval": good}, tok)
    assert err.value.key == "model.chat_template" and "row 0 of" in str(err.value)


def test_a_quantized_teacher_is_counted_and_refused_where_it_cannot_load(compose_cfg, teachers) -> None:
    """recipe.teacher_quantization: the estimate holds the decoder's linear weights at nf4's bytes (the rest
    whole); ZeRO-3 / FSDP (which shard the teacher) and an unknown value are refused before load."""
    from hydratune.components.memory.estimate import estimate
    from hydratune.components.memory.spec import spec_from_config
    from hydratune.components.memory.states import quantized_bytes_per_param

    good = f"recipe.teacher={teachers['good']}"
    whole = estimate(spec_from_config(compose_cfg("recipe=distill", good, "precision=bf16")))
    nf4 = estimate(
        spec_from_config(
            compose_cfg("recipe=distill", good, "precision=bf16", "recipe.teacher_quantization=nf4")
        )
    )
    n = teacher_params(teachers["good"])
    linear = sum(  # the decoder layers' linear weights (the tiny model's head is tied to its embedding)
        p.numel()
        for name, p in meta_model(teachers["good"]).named_parameters()
        if "layers" in name and "proj.weight" in name
    )
    saved = linear * (2 - quantized_bytes_per_param(4, double_quant=True))
    assert whole.row("teacher (frozen)") - nf4.row("teacher (frozen)") == pytest.approx(saved)
    assert 0 < linear < n
    checked(compose_cfg, good, "recipe.teacher_quantization=int8")
    for strategy in ("zero3", "zero3_offload"):
        err = refusal(compose_cfg, good, "recipe.teacher_quantization=nf4", f"strategy={strategy}")
        assert err.key == "recipe.teacher_quantization" and "recipe.teacher_quantization=none" in err.hint
    err = refusal(compose_cfg, good, "recipe.teacher_quantization=q4")
    assert err.key == "recipe.teacher_quantization" and "none, nf4, fp4, int8" in err.hint


def meta_model(path: Path):
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path))
