"""The transformers private methods hydratune overrides (components/runtime/trainer_hooks.py) still exist
with the signatures the overrides were written against, and the installed Trainer still calls each one: an
override that silently stopped being called would lose atomic checkpoints, the deferred token count or the
fp16 scaler knobs, and no other test would notice at once."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from hydratune.components.runtime.checkpoint import COMPLETE
from hydratune.components.runtime.trainer_hooks import PRIVATE_OVERRIDES, hydratune_trainer

MIXINS = hydratune_trainer(object).__mro__[1:-1]  # the hook classes, in the order they are mixed in

VOCAB = 11


@pytest.mark.parametrize("name", sorted(PRIVATE_OVERRIDES))
def test_each_private_method_keeps_its_signature(name: str) -> None:
    from transformers import Trainer

    assert any(name in vars(mixin) for mixin in MIXINS), f"no hook overrides {name}"

    upstream = getattr(Trainer, name, None)
    assert upstream is not None, (
        f"transformers.Trainer.{name} is gone: rewrite its override in trainer_hooks.py"
    )
    params = [p.name for p in inspect.signature(upstream).parameters.values() if p.name != "self"]
    assert tuple(params) == PRIVATE_OVERRIDES[name], f"Trainer.{name}{inspect.signature(upstream)} changed"


class TinyLM(torch.nn.Module):
    """The smallest model a Trainer trains: embeddings and a head, a token-level loss."""

    def __init__(self) -> None:
        super().__init__()
        self.embed, self.head = torch.nn.Embedding(VOCAB, 8), torch.nn.Linear(8, VOCAB)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        logits = self.head(self.embed(input_ids))
        return {"loss": torch.nn.functional.cross_entropy(logits.view(-1, VOCAB), labels.view(-1))}


def test_the_installed_trainer_calls_every_hook(tmp_path: Path) -> None:
    """Two steps, a checkpoint after each: every override ran (counted), the checkpoints are whole and
    renamed out of staging, the token count is every non-padding token, and the scaler handler reached
    accelerate."""
    from accelerate.utils import GradScalerKwargs
    from datasets import Dataset
    from transformers import Trainer, TrainingArguments

    calls: dict[str, int] = dict.fromkeys(PRIVATE_OVERRIDES, 0)

    def counted(name: str):
        def hook(self, *args, **kwargs):
            calls[name] += 1
            return getattr(super(Spy, self), name)(*args, **kwargs)

        return hook

    handler = GradScalerKwargs(init_scale=1024.0)
    Spy = type("Spy", (hydratune_trainer(Trainer, (handler,)),), {n: counted(n) for n in PRIVATE_OVERRIDES})
    rows = {
        "input_ids": [[1, 2, 3, 4], [5, 6, 0, 0], [7, 8, 9, 0], [1, 0, 0, 0]],
        "attention_mask": [[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0], [1, 0, 0, 0]],
        "labels": [[2, 3, 4, 5], [6, 7, 0, 0], [8, 9, 1, 0], [2, 0, 0, 0]],
    }
    args = TrainingArguments(
        str(tmp_path / "checkpoints"),
        per_device_train_batch_size=2,
        max_steps=2,
        save_strategy="steps",
        save_steps=1,
        include_num_input_tokens_seen="non_padding",
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
    )
    trainer = Spy(model=TinyLM(), args=args, train_dataset=Dataset.from_dict(rows))
    assert trainer.accelerator.scaler_handler is handler  # _build_accelerator_args ran with our handler
    trainer.train()
    assert calls == {"_build_accelerator_args": 1, "_track_num_input_tokens": 2, "_save_checkpoint": 2}
    assert trainer.state.num_input_tokens_seen == 4 + 2 + 3 + 1  # the attention masks' ones
    assert "_pending_tokens" in vars(trainer)  # counted on the device by the hook, flushed at the saves
    root = tmp_path / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["checkpoint-1", "checkpoint-2"]  # no .staging left
    marker = json.loads((root / "checkpoint-2" / COMPLETE).read_text())
    assert marker["step"] == 2 and "model.safetensors" in marker["files"]


def logged_rates(trainer_cls: type, tmp_path: Path) -> tuple[dict[int, float], Any]:
    """``{step: learning_rate}`` the Trainer logged over 4 steps of 2 micro-batches (warmup, then linear
    decay), and the trainer."""
    from datasets import Dataset
    from transformers import TrainingArguments

    rows = {"input_ids": [[1, 2, 3], [4, 5, 6]], "attention_mask": [[1, 1, 1]] * 2, "labels": [[2, 3, 4]] * 2}
    args = TrainingArguments(
        str(tmp_path / trainer_cls.__name__),
        per_device_train_batch_size=1,
        gradient_accumulation_steps=2,
        max_steps=4,
        learning_rate=0.1,
        lr_scheduler_type="linear",
        warmup_steps=2,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
    )
    trainer = trainer_cls(model=TinyLM(), args=args, train_dataset=Dataset.from_dict(rows))
    trainer.train()
    return {r["step"]: r["learning_rate"] for r in trainer.state.log_history if "learning_rate" in r}, trainer


def test_the_rate_logged_for_a_step_is_the_one_it_trained_with_when_the_engine_steps_it(tmp_path) -> None:
    """Where DeepSpeed's engine owns the optimizer and the scheduler (expert parallel), it steps both inside
    the step's last backward and accelerate's wrappers make the Trainer's own steps of them no-ops: the
    rate logged for each step is the one its optimizer step used, and one process's (before the fix: the
    next step's, 0.05 at step 1)."""
    from accelerate.utils import DeepSpeedOptimizerWrapper, DeepSpeedSchedulerWrapper
    from transformers import Trainer

    class EngineSteps(Trainer):
        """DeepSpeed's order, as accelerate sets it up when the engine took the optimizer and scheduler."""

        used: dict[int, float]

        def create_scheduler(self, num_training_steps: int, optimizer: Any = None) -> Any:
            scheduler = super().create_scheduler(num_training_steps, optimizer)
            self.engine = (self.optimizer, scheduler)  # the Trainer's steps of them: the engine's now
            self.optimizer = DeepSpeedOptimizerWrapper(self.optimizer.optimizer)
            self.lr_scheduler = DeepSpeedSchedulerWrapper(scheduler, self.optimizer)
            self.used = {}
            return self.lr_scheduler

        def training_step(self, model: Any, inputs: Any, num_items_in_batch: Any = None) -> Any:
            loss = super().training_step(model, inputs, num_items_in_batch)
            if self.accelerator.sync_gradients:  # the engine's step: its optimizer, then its scheduler
                optimizer, scheduler = self.engine
                self.used[self.state.global_step + 1] = optimizer.param_groups[0]["lr"]
                optimizer.step()
                optimizer.zero_grad()
                scheduler.step()
            return loss

    one, _ = logged_rates(hydratune_trainer(Trainer), tmp_path)
    assert one == {1: 0.0, 2: 0.05, 3: 0.1, 4: 0.05}  # warmup from 0, then linear decay
    logged, engine = logged_rates(hydratune_trainer(EngineSteps), tmp_path)
    assert engine.used == one  # the engine stepped with the rates of one process
    assert logged == engine.used


def test_no_deepspeed_installed_means_no_engine_steps_the_scheduler(monkeypatch: pytest.MonkeyPatch) -> None:
    """accelerate.utils exports DeepSpeedSchedulerWrapper only where deepspeed is installed (an extra, not in
    the README's first command): every training step asks, so its absence is "no", never an ImportError (the
    default job died on its first step in a fresh venv without deepspeed)."""
    import accelerate.utils

    from hydratune.components.runtime.trainer_hooks import engine_steps_the_scheduler

    monkeypatch.delattr(accelerate.utils, "DeepSpeedSchedulerWrapper", raising=False)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        torch.optim.SGD([torch.nn.Parameter(torch.ones(1))]), lambda s: 1
    )
    assert engine_steps_the_scheduler(scheduler) is False
