"""The rows accelerate repeats to complete an epoch's last micro-batches on data-parallel ranks
(``even_batches``) are found by arithmetic (``epoch_rows``, checked against accelerate's own
``BatchSamplerShard``) and masked out of the loss in the batches the collators make (``mask_rows_from``:
dense and padding-free); the DDP step then equals one process's smaller last step
(tests/multiproc/test_image_rows_ddp.py, 60 rows)."""

from __future__ import annotations

import pytest
import torch

from hydratune.components.distributed.model_parallel import epoch_rows
from hydratune.components.runtime.trainer_hooks import mask_rows_from


@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("micro", [1, 3, 4])
@pytest.mark.parametrize("rows", [1, 5, 20, 23, 24, 37])
def test_the_epochs_own_rows_of_each_micro_batch_are_accelerates(rows: int, micro: int, world: int) -> None:
    from accelerate.data_loader import BatchSamplerShard
    from torch.utils.data import BatchSampler, SequentialSampler

    for rank in range(world):
        sampler = BatchSampler(SequentialSampler(range(rows)), micro, drop_last=False)
        for k, batch in enumerate(BatchSamplerShard(sampler, world, rank, even_batches=True)):
            first = (k * world + rank) * micro  # in a sequential epoch, the own rows are these indices
            own = sum(1 for j, index in enumerate(batch) if index == first + j and index < rows)
            assert len(batch) == micro and batch[:own] == list(range(first, first + own))
            assert epoch_rows(rows, micro, world, rank, k) == own, (rank, k, batch)


def examples() -> list[dict[str, list[int]]]:
    return [{"input_ids": [5, 6, 7]}, {"input_ids": [8, 9]}, {"input_ids": [10, 11, 12, 13]}]


def test_the_rows_after_the_epochs_own_are_out_of_the_loss_in_a_dense_batch() -> None:
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    batch = DataCollatorForLanguageModeling(pad_token_id=0)(examples())
    trained = batch["labels"].clone()
    assert mask_rows_from(batch, 1, 3) == 2
    assert torch.equal(batch["labels"][0], trained[0]) and (batch["labels"][1:] == -100).all()


def test_the_rows_after_the_epochs_own_are_out_of_the_loss_in_a_padding_free_row() -> None:
    """One row of 9 tokens (3 + 2 + 4), the second document's first token at 3: from there on, -100."""
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    batch = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)(examples())
    assert batch["labels"].shape == (1, 9) and batch["position_ids"][0].tolist()[3] == 0
    trained = batch["labels"].clone()
    assert mask_rows_from(batch, 1, 3) == 2
    assert torch.equal(batch["labels"][0, :3], trained[0, :3]) and (batch["labels"][0, 3:] == -100).all()
    unlabelled = {"input_ids": torch.ones(3, 4, dtype=torch.long)}  # a preference pair's batch: left as it is
    assert mask_rows_from(unlabelled, 1, 3) == 0
