"""KTO, ORPO and SimPO: the trainers' losses against the papers' formulas on a hand-computed batch, the
pinned ``trl.experimental`` surface, the unpaired data kind, the recipes' pre-load checks, and one short
tiny-model run per recipe (checkpoint, resume, export).

The loss tests build each recipe's TRL trainer with the arguments the recipe gives it (from its conf/
YAML), then score a fixed batch with a stand-in language model whose next-token log-probabilities are a
fixed table ``L[current token, next token]``: the paper's loss is then a few lines over the rows' token
ids, computed here without TRL.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from hydratune.components.config.errors import ConfigError
from hydratune.components.runtime.run import Components

TINY = Path(__file__).resolve().parents[2] / "components" / "assets" / "tiny"
SUMS = [(1, 2), (3, 4), (2, 5), (4, 4)]  # one-digit sums: every chosen sequence has the same length


class TableLM(torch.nn.Module):
    """A language model whose log-probability of the next token depends only on the current one:
    ``log_softmax(table)[current, next]``. Answers both the plain call (logits) and TRL's fused head
    (``fused_lm_head=True``: per-token log-probs of the labels, 0 where a label is -100)."""

    def __init__(self, table: torch.Tensor) -> None:
        super().__init__()
        self.table = table

    def forward(self, input_ids: torch.Tensor, *args: Any, labels: Any = None, **kwargs: Any) -> Any:
        logits = self.table[input_ids]
        if not kwargs.get("fused_lm_head"):
            return SimpleNamespace(logits=logits)
        targets = labels[:, 1:]
        logps = logits[:, :-1].log_softmax(-1).gather(-1, targets.clamp(min=0)[..., None])[..., 0]
        zeros = torch.zeros_like(logps)
        return SimpleNamespace(log_probs=logps * (targets != -100), entropy=zeros, mean_logits=zeros)


def table(seed: int) -> torch.Tensor:
    """Random next-token logits over the tiny vocabulary."""
    from transformers import AutoConfig

    vocab = AutoConfig.from_pretrained(TINY).vocab_size
    return torch.randn(vocab, vocab, generator=torch.Generator().manual_seed(seed))


def token_logps(logits: torch.Tensor, ids: list[int], start: int) -> torch.Tensor:
    """``log p(ids[t] | ids[t-1])`` under ``logits`` for every position t >= ``start`` (t >= 1)."""
    logp = logits.log_softmax(-1)
    return torch.stack([logp[ids[t - 1], ids[t]] for t in range(max(start, 1), len(ids))])


def recipe_of(compose_cfg: Any, name: str, *overrides: str) -> Any:
    """The recipe component as conf/ composes it (so the YAML's defaults are what is tested)."""
    return Components.from_config(compose_cfg(f"recipe={name}", *overrides)).recipe


def trainer_for(
    recipe: Any, config_cls: type, trainer_cls: type, rows: list[dict], tmp: Path, *, reference: bool = False
) -> Any:
    """The recipe's TRL trainer on the tiny model and ``rows``, with the arguments the recipe gives it (and
    a frozen copy as the reference)."""
    import copy

    from datasets import Dataset
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(TINY))
    args = config_cls(
        output_dir=str(tmp),
        report_to=[],
        use_cpu=True,
        bf16=False,
        per_device_train_batch_size=len(rows),
        **recipe.trainer_args(64),
    )
    tokenizer = AutoTokenizer.from_pretrained(TINY)
    return trainer_cls(
        model=model,
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        **({"ref_model": copy.deepcopy(model)} if reference else {}),
    )


def user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def assistant(text: str) -> list[dict[str, str]]:
    return [{"role": "assistant", "content": text}]


def pairs() -> list[dict]:
    """Conversational pairs; the rejected answers have two digits, the chosen one (lengths differ)."""
    return [
        {
            "prompt": user(f"What is {a} + {b}?"),
            "chosen": assistant(str(a + b)),
            "rejected": assistant(f"1{a}"),
        }
        for a, b in SUMS
    ]


def paired_batch(trainer: Any) -> tuple[dict[str, Any], list[dict]]:
    """The collated batch of every training row, and the rows (token ids, labels) it was made from."""
    rows = [trainer.train_dataset[i] for i in range(len(trainer.train_dataset))]
    return trainer.data_collator(rows), rows


def response_logps(logits: torch.Tensor, row: dict, side: str) -> torch.Tensor:
    """The log-probs of the response tokens of ``side`` (chosen / rejected): where the labels are not -100."""
    ids, labels = row[f"{side}_input_ids"], row[f"{side}_labels"]
    start = next(t for t, label in enumerate(labels) if label != -100)
    return token_logps(logits, ids, start)


# ---- ORPO (Hong et al. 2024) -------------------------------------------------------------------------


def orpo_by_hand(logits: torch.Tensor, rows: list[dict], lam: float) -> torch.Tensor:
    """L_SFT + lambda * L_OR (Eqs. 6-7): L_OR = -log sigmoid(log odds(y_w) - log odds(y_l)), odds(y) =
    P / (1 - P) with P = exp(mean log-prob of the response tokens) (Eq. 4); L_SFT the chosen sequence's
    mean NLL (as the paper's code: over prompt and response)."""
    nll = torch.stack([-token_logps(logits, r["chosen_input_ids"], 1).mean() for r in rows]).mean()

    def log_odds(row: dict, side: str) -> torch.Tensor:
        p = response_logps(logits, row, side).mean().exp()
        return torch.log(p / (1 - p))

    l_or = torch.stack([-F.logsigmoid(log_odds(r, "chosen") - log_odds(r, "rejected")) for r in rows])
    return nll + lam * l_or.mean()


def test_orpo_loss_is_the_papers_odds_ratio_loss(compose_cfg, tmp_path) -> None:
    from hydratune.components.runtime.trl_experimental import experimental

    recipe = recipe_of(compose_cfg, "orpo", "recipe.beta=0.5")  # a large lambda: the OR term weighs
    trainer = trainer_for(recipe, *experimental("orpo", "ORPOConfig", "ORPOTrainer"), pairs(), tmp_path)
    batch, rows = paired_batch(trainer)
    logits = table(1)
    assert len({len(r["chosen_input_ids"]) for r in rows}) == 1  # the paper's per-row mean = TRL's token mean
    loss, _ = trainer.get_batch_loss_metrics(TableLM(logits), batch)
    torch.testing.assert_close(loss, orpo_by_hand(logits, rows, lam=0.5))


# ---- SimPO (Meng et al. 2024) ------------------------------------------------------------------------


def simpo_by_hand(logits: torch.Tensor, rows: list[dict], beta: float, gamma: float) -> torch.Tensor:
    """-log sigmoid(beta/|y_w| log pi(y_w|x) - beta/|y_l| log pi(y_l|x) - gamma) (Eq. 6), averaged."""
    losses = [
        -F.logsigmoid(
            beta * response_logps(logits, r, "chosen").mean()
            - beta * response_logps(logits, r, "rejected").mean()
            - gamma
        )
        for r in rows
    ]
    return torch.stack(losses).mean()


def test_simpo_loss_is_the_papers_length_normalised_margin_loss(compose_cfg, tmp_path) -> None:
    from hydratune.components.runtime.trl_experimental import experimental

    recipe = recipe_of(compose_cfg, "simpo")
    trainer = trainer_for(recipe, *experimental("cpo", "CPOConfig", "CPOTrainer"), pairs(), tmp_path)
    batch, rows = paired_batch(trainer)
    logits = table(2)
    assert {len(r["chosen_input_ids"]) for r in rows} != {len(r["rejected_input_ids"]) for r in rows}
    loss, _ = trainer.get_batch_loss_metrics(TableLM(logits), batch)
    torch.testing.assert_close(loss, simpo_by_hand(logits, rows, beta=recipe.beta, gamma=recipe.gamma))


# ---- KTO (Ethayarajh et al. 2024) --------------------------------------------------------------------


def kto_rows() -> list[dict]:
    """Two desirable and two undesirable completions, alternating (the KL pairs mix the labels)."""
    return [
        {
            "prompt": user(f"What is {a} + {b}?"),
            "completion": assistant(str(a + b if good else a + b + 1)),
            "label": good,
        }
        for (a, b), good in zip(SUMS, (True, False, True, False), strict=True)
    ]


def kto_by_hand(policy: torch.Tensor, ref: torch.Tensor, rows: list[dict], recipe: Any) -> tuple[Any, Any]:
    """Eq. 8: r = log pi(y|x) / pi_ref(y|x); z0 = max(0, mean KL estimate over mismatched pairs (x_i, y_j),
    here each prompt with the previous row's completion), not back-propagated; the loss per row
    w_D (1 - sigmoid(beta (r - z0))) if desirable, w_U (1 - sigmoid(beta (z0 - r))) if not, averaged.
    Returns (loss, z0)."""

    def log_ratio(prompt: list[int], completion: list[int]) -> torch.Tensor:
        ids = prompt + completion
        return (token_logps(policy, ids, len(prompt)) - token_logps(ref, ids, len(prompt))).sum()

    n = len(rows)
    z0 = torch.stack(
        [log_ratio(rows[i]["prompt_ids"], rows[(i - 1) % n]["completion_ids"]) for i in range(n)]
    ).mean()
    z0 = z0.clamp(min=0)
    beta = recipe.beta
    losses = []
    for row in rows:
        r = log_ratio(row["prompt_ids"], row["completion_ids"])
        if row["label"]:
            losses.append(recipe.desirable_weight * (1 - torch.sigmoid(beta * (r - z0))))
        else:
            losses.append(recipe.undesirable_weight * (1 - torch.sigmoid(beta * (z0 - r))))
    return torch.stack(losses).mean(), z0


def test_kto_loss_is_the_papers_loss_with_its_kl_estimate(compose_cfg, tmp_path) -> None:
    from trl import KTOConfig, KTOTrainer

    weights = ("recipe.desirable_weight=1.5", "recipe.undesirable_weight=0.7", "recipe.beta=0.5")
    recipe = recipe_of(compose_cfg, "kto", *weights)
    trainer = trainer_for(recipe, KTOConfig, KTOTrainer, kto_rows(), tmp_path, reference=True)
    rows = [trainer.train_dataset[i] for i in range(len(trainer.train_dataset))]
    batch = trainer.data_collator(rows)
    policy, ref = table(3), table(4)
    trainer.ref_model = TableLM(ref)
    loss = trainer.compute_loss(TableLM(policy), batch)
    by_hand, z0 = kto_by_hand(policy, ref, rows, recipe)
    assert z0 > 0.5  # the KL estimate is not clamped away: the test sees it
    torch.testing.assert_close(loss, by_hand)


# ---- the pinned trl.experimental surface -------------------------------------------------------------


def test_the_trl_experimental_surface_the_recipes_use_is_there() -> None:
    """ORPO and CPO live in trl.experimental (no deprecation promised): a class, a method's parameters or
    a config field the recipes set that changed upstream fails here, by name."""
    import dataclasses

    from hydratune.components.runtime.trl_experimental import FIELDS, METHODS, experimental

    for module, classes in METHODS.items():
        for cls_name, methods in classes.items():
            (cls,) = experimental(module.rsplit(".", 1)[-1], cls_name)
            for method, params in methods.items():
                got = tuple(inspect.signature(getattr(cls, method)).parameters)[1:]
                assert got == params, f"{module}.{cls_name}.{method}{got}: written against {params}"
    for module, configs in FIELDS.items():
        for cls_name, fields in configs.items():
            (cls,) = experimental(module.rsplit(".", 1)[-1], cls_name)
            names = {f.name for f in dataclasses.fields(cls)}
            assert not set(fields) - names, f"{module}.{cls_name} lost {set(fields) - names}"


# ---- the unpaired data kind and the pre-load checks --------------------------------------------------


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def unpaired(tmp_path: Path, rows: list[dict], compose_cfg: Any) -> Any:
    path = write_rows(tmp_path / "unpaired.jsonl", rows)
    cfg = compose_cfg("recipe=kto", f"data.path={path}", "data.eval_fraction=0")
    return Components.from_config(cfg).data


def test_unpaired_data_takes_text_and_conversations(compose_cfg, tmp_path) -> None:
    rows = [
        {"prompt": "What is 1 + 2?", "completion": "3", "label": True},
        {"prompt": user("What is 1 + 3?"), "completion": assistant("5"), "label": False},
    ]
    train = unpaired(tmp_path, rows, compose_cfg).load()["train"]
    assert train[0] == {"prompt": user("What is 1 + 2?"), "completion": assistant("3"), "label": True}
    assert train[1] == {"prompt": user("What is 1 + 3?"), "completion": assistant("5"), "label": False}


@pytest.mark.parametrize("label", ["yes", 1, None])
def test_a_label_that_is_not_a_boolean_is_refused_naming_the_row(compose_cfg, tmp_path, label) -> None:
    rows = [{"prompt": f"What is {i} + 1?", "completion": str(i + 1), "label": True} for i in range(6)]
    rows[3]["label"] = label
    with pytest.raises(ConfigError, match=r"unpaired.jsonl:4 \(row 4\).*'label' should be true or false"):
        unpaired(tmp_path, rows, compose_cfg).load()


def test_kto_refuses_preference_free_data_and_a_one_row_batch_before_load(run_recipe, monkeypatch) -> None:
    from hydratune.components.model import CausalLM

    def no_load(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(CausalLM, "build", no_load)
    with pytest.raises(ConfigError) as info:
        run_recipe("recipe=kto", "data=demo_sft")
    assert info.value.key == "data" and "demo_kto" in str(info.value)
    with pytest.raises(ConfigError) as info:
        run_recipe("recipe=kto", "train.micro_batch_size=1")
    assert info.value.key == "train.micro_batch_size"


@pytest.mark.parametrize(
    ("recipe", "override", "key"),
    [
        ("kto", "recipe.undesirable_weight=0", "recipe.undesirable_weight"),
        ("kto", "recipe.loss_type=dpo", "recipe.loss_type"),
        ("orpo", "recipe.beta=0", "recipe.beta"),
        ("simpo", "recipe.gamma=-1", "recipe.gamma"),
    ],
)
def test_bad_knobs_fail_before_load_naming_the_key(compose_cfg, recipe, override, key) -> None:
    from hydratune.components.runtime.checks import check_before_load

    cfg = compose_cfg(f"recipe={recipe}", override)
    with pytest.raises(ConfigError) as info:
        check_before_load(cfg, Components.from_config(cfg), "cpu")
    assert info.value.key == key


# ---- one short run per recipe: train, checkpoint, resume, export -------------------------------------
