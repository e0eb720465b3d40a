"""The process group of a multi-process job on CPU, made by hydratune with its collective timeout.

On GPU transformers passes ``TrainingArguments.ddp_timeout`` (``launcher.collective_timeout``) to accelerate,
which makes the group. On CPU it passes no timeout (torch's default, 30 minutes, applies) and DeepSpeed's own
default is 10 minutes: so on CPU the group is made first, here, and accelerate and DeepSpeed use it as it is.
A collective whose peer went away then fails within the timeout instead of waiting without end.
"""

from __future__ import annotations

import os
from datetime import timedelta


def start_process_group(device: str, timeout_s: float) -> bool:
    """Make the gloo process group of this rank (a launched worker of a multi-process job on CPU) with a
    collective timeout of ``timeout_s``; False when there is nothing to make here."""
    import torch.distributed as dist

    if device != "cpu" or int(os.environ.get("WORLD_SIZE", 1)) < 2 or not dist.is_available():
        return False
    if dist.is_initialized():
        return False
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout_s))
    return True
