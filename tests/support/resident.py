"""What a separately loaded reward model holds resident on CPU, measured inside the run (issue 48's "one
model copy").

``python -m tests.support.resident <out.json> <hydratune args>`` is ``python -m hydratune <args>`` in which,
after each call of a :class:`~hydratune.components.rewards.RewardModel` (a reward model loaded as its own
model, the adapter folded into its base), the bytes of its weights that are resident are measured and the
largest written to ``out.json``: ``anonymous`` (storages outside any file mapping, whole) and ``mapped``
(the resident pages, by ``/proc/self/smaps``, of the safetensors file its weights are mapped from: the
pages it has read or written, not the file's size), with ``file``, that file's size.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
from typing import Any


def mappings() -> list[tuple[int, int, str, int]]:
    """(start, end, path, resident bytes) of each mapping of this process."""
    rows: list[tuple[int, int, str, int]] = []
    with open("/proc/self/smaps") as handle:
        for line in handle:
            head = line.split()
            if "-" in head[0] and not head[0].endswith(":"):
                start, end = (int(x, 16) for x in head[0].split("-"))
                rows.append((start, end, head[5] if len(head) > 5 else "", 0))
            elif head[0] == "Rss:":
                start, end, path, _ = rows[-1]
                rows[-1] = (start, end, path, int(head[1]) * 1024)
    return rows


def resident_weights(model: Any) -> dict[str, int]:
    """The resident bytes of ``model``'s parameters and buffers: ``anonymous`` (storages outside any file
    mapping, whole) and ``mapped`` (the resident pages of each safetensors mapping they lie in, once)."""
    maps = mappings()
    storages = {s.data_ptr(): s.nbytes() for s in (t.untyped_storage() for t in model.state_dict().values())}
    anonymous, files = 0, {}
    for pointer, size in storages.items():
        mapped = [m for m in maps if m[0] <= pointer < m[1] and m[2].endswith(".safetensors")]
        if mapped:
            files[mapped[0][:2]] = mapped[0][3]
        else:
            anonymous += size
    return {"anonymous": anonymous, "mapped": sum(files.values())}


def main(out: str, args: list[str]) -> None:
    from hydratune.components import rewards

    score = rewards.RewardModel.__call__
    largest: dict[str, int] = {}

    def measured(self: Any, *a: Any, **k: Any) -> Any:
        result = score(self, *a, **k)
        sizes = resident_weights(self.model)
        if sizes["anonymous"] + sizes["mapped"] > largest.get("anonymous", 0) + largest.get("mapped", 0):
            file = os.path.join(self.model.name_or_path, "model.safetensors")
            largest.update(sizes, file=os.path.getsize(file))
            with open(out, "w") as handle:
                json.dump(largest, handle)
        return result

    rewards.RewardModel.__call__ = measured  # type: ignore[method-assign]
    sys.argv = ["hydratune", *args]
    runpy.run_module("hydratune", run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
