"""``hydratune cache ls`` lists the prepared-data cache (components/data/prepared_cache.py): each entry's key,
when and by whom it was prepared and in how long, its rows and size, the data files it was made from;
``hydratune cache clear [key ...]`` frees it (every entry no process is preparing, or only the keys named).

    hydratune cache ls                         # $HYDRATUNE_DATA_CACHE, else $HYDRATUNE_CACHE/data
    hydratune cache ls --dir /shared/cache     # the data.cache_dir a run used
    hydratune cache clear                      # everything (entries, leftovers of killed runs, hashes)
    hydratune cache clear 5df96af68e26f813     # one entry (a unique prefix of its key)
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from hydratune.components.config.errors import ConfigError
from hydratune.components.data.prepared_cache import cache_root, clear, entries


def size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"


def describe(item: dict[str, Any]) -> list[str]:
    """One entry's row of the listing."""
    meta = item["meta"]
    if meta is None:
        return [
            item["key"],
            "-",
            size(item["bytes"]),
            "-",
            "-",
            "not whole (no meta.json): cache clear removes it",
        ]
    made, parts, splits = meta.get("made", {}), meta.get("parts", {}), meta.get("splits", {})
    rows = "/".join(str(splits.get(f"rows/{s}", {}).get("rows", "-")) for s in ("train", "eval"))
    tokens = "tokens" if any(name.startswith("tokens/") for name in splits) else "rows"
    files = list((parts.get("data") or {}).get("files", {})) or ["-"]
    source = files[0] + (f" (+{len(files) - 1})" if len(files) > 1 else "")
    what = f"{parts.get('component', '?')}, {tokens}"
    return [item["key"], str(made.get("at", "-")), size(item["bytes"]), rows, what, source]


def listing(root: Path) -> str:
    found = entries(root)
    if not found:
        return f"{root}: no prepared data"
    head = ["key", "prepared at", "size", "rows train/eval", "what", "data"]
    rows = [head, *(describe(item) for item in found)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head) - 1)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)) + "  " + r[-1] for r in rows]
    total = sum(item["bytes"] for item in found)
    return "\n".join([f"{root}: {len(found)} entries, {size(total)}", *lines])


def cli(args: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="hydratune cache", description=__doc__.split("\n")[0])
    parser.add_argument("action", choices=["ls", "clear"])
    parser.add_argument("keys", nargs="*", help="clear: these entries only (unique key prefixes)")
    parser.add_argument(
        "--dir", help="the cache dir (default: $HYDRATUNE_DATA_CACHE, else $HYDRATUNE_CACHE/data)"
    )
    options = parser.parse_args(args)
    root = Path(options.dir).expanduser() if options.dir else cache_root({})
    if options.action == "ls":
        if options.keys:
            raise ConfigError("cache ls takes no keys", key="cache", hint="hydratune cache ls [--dir DIR]")
        print(listing(root))
        return 0
    keys = None
    if options.keys:
        known = [item["key"] for item in entries(root)]
        keys = []
        for prefix in options.keys:
            matches = [k for k in known if k.startswith(prefix)]
            if len(matches) != 1:
                what = "no entry" if not matches else f"{len(matches)} entries"
                raise ConfigError(
                    f"{what} of {root} starts with '{prefix}'",
                    key="cache",
                    hint="hydratune cache ls lists the keys",
                )
            keys.append(matches[0])
    removed = clear(root, keys)
    print(f"removed {len(removed)} entr{'y' if len(removed) == 1 else 'ies'} from {root}")
    return 0
