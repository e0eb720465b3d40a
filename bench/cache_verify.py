"""What checking a prepared-data cache entry costs (issue 37): a warm run opens its entry by checking the
sha256 of every file of it (components/config/files.py) before memory-mapping it. This times, in one
process and alternated, the whole warm ``prepare_data`` call of ``bench/data_scale.py``'s chat file
(``data.max_length=512``, SFT's tokens) with the check and with it skipped, and reports the ratio.

    python bench/cache_verify.py     # 100k rows (an ~80 MB file; the first, cold prepare takes minutes)
    python bench/cache_verify.py --rows 10000 --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from data_scale import MAX_LENGTH, make_chats, tokenizer

from hydratune.components.data import prepared_cache


def warm_call(data: Any, tokens: Any) -> float:
    from hydratune.components.data.prepare import prepare_data

    start = time.perf_counter()
    prepared = prepare_data(data, tokenizer(), 0, 0, tokens)
    seconds = time.perf_counter() - start
    assert prepared.notes["data cache"].startswith("hit"), prepared.notes["data cache"]
    return seconds


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--work", type=Path, help="keep the file and the cache here")
    args = parser.parse_args(argv)
    from hydratune.components.data.chats import ChatDataset
    from hydratune.components.data.prepare import prepare_data
    from hydratune.components.data.tokens import SFTTokens

    work = args.work or Path(tempfile.mkdtemp(prefix="cache_verify."))
    work.mkdir(parents=True, exist_ok=True)
    chats = make_chats(work / f"chats_{args.rows}.jsonl", args.rows)
    data = ChatDataset(
        path=str(chats), eval_fraction=0.0, max_length=MAX_LENGTH, cache_dir=str(work / "cache")
    )
    tokens = SFTTokens(True, True, MAX_LENGTH, False, "bfd")
    start = time.perf_counter()
    prepare_data(data, tokenizer(), 0, 0, tokens)  # cold (or already there)
    cold = time.perf_counter() - start
    (entry,) = prepared_cache.entries(Path(data.cache_dir))
    checked = prepared_cache.mismatch
    times: dict[str, list[float]] = {"checked": [], "unchecked": []}
    for _ in range(args.repeats):
        times["checked"].append(warm_call(data, tokens))
        prepared_cache.mismatch = lambda folder, digests: None  # the check skipped
        try:
            times["unchecked"].append(warm_call(data, tokens))
        finally:
            prepared_cache.mismatch = checked
    median = {k: statistics.median(v) for k, v in times.items()}
    result = {
        "rows": args.rows,
        "entry MB": round(entry["bytes"] / 1e6, 1),
        "cold s": round(cold, 1),
        "warm s, checked (median)": round(median["checked"], 3),
        "warm s, unchecked (median)": round(median["unchecked"], 3),
        "ratio": round(median["checked"] / median["unchecked"], 2),
        "spread": {k: [round(x, 3) for x in v] for k, v in times.items()},
    }
    print(result)
    return result


if __name__ == "__main__":
    main()
