"""The transformers private methods hydratune overrides (components/runtime/trainer_hooks.py) still exist
with the signatures the overrides were written against, and the installed Trainer still calls each one: an
override that silently stopped being called would lose atomic checkpoints, the deferred token count or the
fp16 scaler knobs, and no other test would notice at once."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

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
