"""Hugging Face Hub ids: when a model id is neither local, nor cached, nor reachable, say so once, before
anything loads (instead of the hub client's retries and an error that blames the tokenizer)."""

from __future__ import annotations

import os
import urllib.error
import urllib.request

from hydratune.components.config.errors import ConfigError

PROBE_TIMEOUT_S = 5.0


def is_local(name: str) -> bool:
    """A filesystem path rather than a hub id."""
    return name.startswith(("/", ".", "~")) or os.path.isdir(os.path.expanduser(name))


def is_cached(name: str, filename: str, revision: str | None = None) -> bool:
    """``filename`` of hub repo ``name`` is in the local Hugging Face cache."""
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(name, filename, revision=revision), str)


def probe(name: str, filename: str, revision: str | None = None) -> str | None:
    """None when the hub serves ``filename`` of ``name``; else why not, in a few words (one request with a
    short timeout, no retries)."""
    from huggingface_hub import constants, get_token

    url = f"{constants.ENDPOINT}/{name}/resolve/{revision or 'main'}/{filename}"
    request = urllib.request.Request(url, method="HEAD")
    token = get_token()
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=PROBE_TIMEOUT_S):
            return None
    except urllib.error.HTTPError as err:
        if err.code in (401, 403):
            return "the hub refused access (a gated or private model: accept its licence and log in)"
        if err.code == 404:
            return "the hub has no such model (check the id and revision)"
        return f"the hub answered HTTP {err.code}"
    except (urllib.error.URLError, TimeoutError, OSError) as err:
        reason = getattr(err, "reason", err)
        return f"the hub is unreachable ({reason})"


def unavailable(name: str, filename: str, revision: str | None = None) -> str | None:
    """None when ``filename`` of ``name`` is local, cached, or served by the hub; else why not (offline mode,
    or what the one short probe found)."""
    from huggingface_hub import constants

    if is_local(name) or is_cached(name, filename, revision):
        return None
    if constants.HF_HUB_OFFLINE:
        return "offline mode is on (HF_HUB_OFFLINE)"
    return probe(name, filename, revision)


def check_available(name: str, *, key: str, filename: str, revision: str | None = None) -> None:
    """``name`` is local, cached, or served by the hub; otherwise one ``ConfigError`` naming ``key``."""
    why = unavailable(name, filename, revision)
    if why is None:
        return
    raise ConfigError(
        f"'{name}' is not a local directory, not in the Hugging Face cache, and {why}",
        key=key,
        hint=f"point {key} at a local model directory (e.g. one saved with save_pretrained or "
        "`huggingface-cli download`), or run where the hub is reachable",
    )
