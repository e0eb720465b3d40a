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


def test_lmbda_below_one_is_refused_until_built(compose_cfg) -> None:
    from hydratune.components.runtime.run import Components

    with pytest.raises(ConfigError) as err:  # its declared range: 1 only, for now
        Components.from_config(compose_cfg("recipe=distill", "recipe.lmbda=0.5"))
    assert err.value.key == "recipe.lmbda" and "recipe.lmbda=1" in str(err.value)


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
