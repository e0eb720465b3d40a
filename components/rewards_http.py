"""A reward served over HTTP (``recipe.reward_url``, for GRPO, PPO and Best-of-N): stdlib ``urllib`` only.

The contract (docs/recipes.md, "A reward served over HTTP"): one ``POST <reward_url>`` per scored batch,
``Content-Type: application/json``, body ``{"prompts": [...], "completions": [...], "<column>": [...], ...}``
(one entry per completion: the prompt as text or chat messages, the completion's text, each other column of
the rows, e.g. ``answer``; an image, in a prompt's ``{"type": "image", "image": ...}`` part or in the
``images`` column of a vision-language model's rows, as a ``data:image/png;base64,...`` URL); the answer
``{"scores": [<float>, ...]}``, one number per completion. A request
that fails to connect, times out (``recipe.reward_timeout`` seconds) or gets a 5xx is retried
``recipe.reward_retries`` times (0.5 s, 1 s, 2 s ... apart); a 4xx or a malformed answer is not. A redirect
(3xx) is never followed, not even to the same host: the completions would go where the URL does not say
(urllib would follow it as a GET, without them); the answer names where it pointed. Before any model loads
(``mode=plan`` too) the URL is probed with an empty batch, which must be answered ``{"scores": []}``.

What a failure does (components/runtime/session.py ``server_failed``): before the first step of a run
finished, exit 2 naming the URL and what came back; after it, a checkpoint of the last finished step, then
exit :data:`~hydratune.components.config.errors.EXIT_SERVER_FAILED` (76) with the ``resume=`` command.
"""

from __future__ import annotations

import json
import math
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any, ClassVar

from omegaconf import DictConfig

from hydratune.components.config.errors import ConfigError, ServerError
from hydratune.components.config.ranges import NON_NEGATIVE, POSITIVE, knob
from hydratune.components.rewards import (
    CALL_KEYWORDS,
    check_reward,
    default_reward,
    resolve_reward,
    reward_model_path,
    text_of,
)


def with_data_urls(value: Any) -> Any:
    """``value`` with every PIL image in it (at any depth of lists and dicts) as a PNG ``data:`` URL: the
    JSON a reward server reads (anything else JSON cannot hold is sent as its ``str``)."""
    if isinstance(value, dict):
        return {k: with_data_urls(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [with_data_urls(v) for v in value]
    if hasattr(value, "save") and hasattr(value, "mode") and hasattr(value, "size"):  # a PIL image
        import base64
        import io

        png = io.BytesIO()
        value.save(png, format="PNG")
        return "data:image/png;base64," + base64.b64encode(png.getvalue()).decode()
    return value


class RewardServerError(ServerError):
    """The reward server did not answer, or answered outside the contract."""


class NoRedirects(urllib.request.HTTPRedirectHandler):
    """A 3xx stays an answer (an ``HTTPError``): never followed."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


OPENER = urllib.request.build_opener(NoRedirects)


@dataclass(frozen=True)
class HttpReward:
    """A reward function that asks ``url`` for the scores (see the module's contract)."""

    url: str
    timeout: float = 30.0
    retries: int = 2

    __name__: ClassVar[str] = "reward_url"  # TRL logs each reward function under its __name__

    def __call__(self, prompts: list[Any], completions: list[Any], **columns: Any) -> list[float]:
        payload = {
            "prompts": list(prompts),
            "completions": [text_of(c) for c in completions],
            **{k: list(v) for k, v in columns.items() if k not in CALL_KEYWORDS and v is not None},
        }
        return self.scores(self.post(with_data_urls(payload)), len(completions))

    def scores(self, answer: Any, n: int) -> list[float]:
        """The ``scores`` of an answer: ``n`` finite numbers, else a RewardServerError saying what came."""
        scores = answer.get("scores") if isinstance(answer, dict) else None
        if not isinstance(scores, list):
            why = 'no "scores" list'
        elif len(scores) != n:
            why = f"{len(scores)} scores for {n} completions"
        else:
            bad = [i for i, s in enumerate(scores) if isinstance(s, bool) or not isinstance(s, (int, float))]
            bad = bad or [i for i, s in enumerate(scores) if not math.isfinite(s)]
            why = f"scores[{bad[0]}] is {scores[bad[0]]!r}, not a finite number" if bad else ""
        if why:
            raise RewardServerError(
                f'{self.url} answered {str(answer)[:200]!r}: {why} (expected {{"scores": [{n} numbers]}})'
            )
        return [float(s) for s in scores]

    def post(self, payload: dict[str, Any]) -> Any:
        """POST ``payload`` as JSON; retried on connection errors, timeouts and 5xx."""
        body = json.dumps(payload, default=str).encode()
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        last: Exception | None = None
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(min(0.5 * 2 ** (attempt - 1), 8.0))
            request = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
            try:
                with OPENER.open(request, timeout=self.timeout) as response:
                    text = response.read()
            except urllib.error.HTTPError as err:
                if 300 <= err.code < 400:
                    raise RewardServerError(
                        f"{self.url} answered HTTP {err.code}, a redirect to "
                        f"{err.headers.get('Location') or 'nowhere'}: redirects are not followed"
                    ) from None
                if err.code < 500:
                    raise RewardServerError(f"{self.url} refused the request: HTTP {err.code}") from None
                last = err
                continue
            except (urllib.error.URLError, OSError) as err:  # refused, unreachable, timed out
                last = err
                continue
            try:
                return json.loads(text)
            except (ValueError, RecursionError):
                raise RewardServerError(f"{self.url} answered no JSON: {text[:200]!r}") from None
        tries = self.retries + 1
        raise RewardServerError(f"{self.url} did not answer ({tries} tries, {self.timeout:g} s each): {last}")

    def probe(self, key: str) -> None:
        """Before load: the server answers an empty batch with ``{"scores": []}``, else a ConfigError."""
        try:
            self.scores(self.post({"prompts": [], "completions": []}), 0)
        except RewardServerError as err:
            raise ConfigError(
                f"the reward server does not answer: {err}",
                key=key,
                hint='start the server (it must answer POST {"prompts": [], "completions": []} with '
                '{"scores": []}), or fix the URL (a redirect: give the URL it points to)',
            ) from None


@dataclass(frozen=True)
class RewardURL:
    """The knobs of a reward served over HTTP, shared by the recipes that score completions."""

    # a reward served over HTTP (docs/recipes.md): POST JSON {prompts, completions, <columns>} -> {scores};
    # probed before load, mode=plan too
    reward_url: str | None = None
    reward_timeout: float = knob(30.0, POSITIVE)  # seconds per request
    reward_retries: int = knob(2, NON_NEGATIVE)  # further tries after a connection error, timeout or 5xx

    def http_reward(self) -> HttpReward | None:
        """The served reward, if ``reward_url`` names one."""
        if not self.reward_url:
            return None
        return HttpReward(self.reward_url, self.reward_timeout, self.reward_retries)

    def check_reward_url(self) -> None:
        """Before load (``mode=plan`` too): the URL's form, then the server answers the probe."""
        if self.reward_url is None:
            return
        if not str(self.reward_url).startswith(("http://", "https://")):
            raise ConfigError(
                f"'{self.reward_url}' is not an http(s) URL",
                key="recipe.reward_url",
                hint="http://host:port/path",
            )
        HttpReward(self.reward_url, self.reward_timeout, self.reward_retries).probe("recipe.reward_url")


@dataclass(frozen=True)
class OneReward(RewardURL):
    """``recipe.reward`` (a function or a reward model) or ``recipe.reward_url``: PPO's and Best-of-N's."""

    # a reward function (_target_, called with prompts, completions and the row's columns such as answer),
    # or a trained reward model: recipe.reward.model=<reward run dir or model dir> (then _target_ is unused)
    reward: Any = field(default_factory=default_reward)

    def check_one_reward(self, cfg: DictConfig) -> None:
        """Before load: the reward resolves (user modules, trust) or the server answers; not both."""
        spec = self.reward
        if self.reward_url is not None:
            if reward_model_path(spec):
                raise ConfigError(
                    "two rewards: recipe.reward.model and recipe.reward_url",
                    key="recipe.reward_url",
                    hint="drop one of them",
                )
            self.check_reward_url()
            return
        check_reward(spec, "recipe.reward", trusted=bool(cfg.get("trust_targets", False)))

    def reward_function(self, device: str = "cpu") -> Any:
        """The reward that scores completions: the server, else ``recipe.reward`` resolved."""
        return self.http_reward() or resolve_reward(self.reward, device)

    def check_columns(self, comps: Any, splits: Any) -> None:
        """Before load: the reward function reads only columns the rows have (``answer`` for exact_match)."""
        from hydratune.components.rewards import check_columns

        if self.reward_url is None and not reward_model_path(self.reward):
            function = resolve_reward(self.reward)
            check_columns([("recipe.reward", function)], splits["train"].column_names, str(comps.data.path))
