"""Rewards as a user writes them: their own module's function (resolved before load, with close matches for a
misspelt name), a reward served over HTTP (GRPO, PPO, Best-of-N against a local server), and the trust
rule and the data a reward reads, all refused before any model loads."""

from __future__ import annotations

import base64
import io
import json
import os
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from hydratune.components.config.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
USER_REWARDS = (
    "def correct(prompts, completions, answer, **columns):\n    return [1.0 for _ in completions]\n"
)
GRPO = [
    "recipe=grpo",
    "data.eval_path=null",
    "train.eval_every=0",
    "train.micro_batch_size=16",
    "recipe.num_generations=4",
    "train.eval_generations=0",
    "train.save_every=0",
    "train.max_steps=1",
]


#: answers outside the contract, from the list of good scores: (JSON text, what the error must say)
BAD_ANSWERS = {
    "malformed": (lambda s: '{"scores": [1, 2', "answered no JSON"),
    "nan": (lambda s: json.dumps({"scores": [float("nan")] * len(s)}), "scores[0] is nan, not a finite"),
    "count": (lambda s: json.dumps({"scores": s[:-1]}), "for 2 completions"),
    "missing": (lambda s: json.dumps({"score": s}), 'no "scores" list'),
}


class RewardServer:
    """A reward server on a free local port: scores ``-len(completion)``, records every request body; the
    first ``fail`` requests get HTTP 503, and while ``hold`` is clear a request waits (a timeout). ``bad``
    (a key of :data:`BAD_ANSWERS`) answers every scored batch after the first ``good`` ones that way;
    ``redirect`` answers every request with a 302 to that URL."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.fail = 0
        self.bad: str | None = None
        self.good = 0
        self.redirect: str | None = None
        self.hold = threading.Event()
        self.hold.set()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.hold.wait(10)
                server.requests.append(body)
                if server.fail > 0 or server.redirect:
                    server.fail -= not server.redirect
                    self.send_response(302 if server.redirect else 503)
                    self.send_header("Location", server.redirect or "")
                    self.end_headers()
                    return
                scores = [-float(len(c)) for c in body["completions"]]
                answer = json.dumps({"scores": scores}).encode()
                if server.bad and scores and len(server.scored()) > server.good:
                    answer = BAD_ANSWERS[server.bad][0](scores).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/score"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def scored(self) -> list[dict[str, Any]]:
        """The requests that carried completions (not the empty pre-load probe)."""
        return [r for r in self.requests if r["completions"]]


def serving() -> Iterator[RewardServer]:
    served = RewardServer()
    served.thread.start()
    yield served
    served.hold.set()
    served.httpd.shutdown()
    served.httpd.server_close()


server = pytest.fixture(serving)
other_server = pytest.fixture(serving)


@pytest.fixture
def user_dirs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Undo what resolving a user module adds to sys.path and PYTHONPATH."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))


def checked(compose_cfg: Any, *overrides: str) -> Any:
    """The components of a composed config, after every check that runs before load (mode=plan's)."""
    from hydratune.components.runtime.checks import check_before_load
    from hydratune.components.runtime.run import Components

    cfg = compose_cfg(*overrides)
    comps = Components.from_config(cfg)
    check_before_load(cfg, comps)
    return comps


# ---- a user's own reward function --------------------------------------------------------------------
def test_a_reward_module_in_the_working_directory_resolves_before_load(
    compose_cfg, tmp_path, monkeypatch, user_dirs
) -> None:
    from hydratune.components.rewards import resolve_reward

    (tmp_path / "cwd_rewards_a.py").write_text(USER_REWARDS)
    monkeypatch.chdir(tmp_path)  # the working directory is not on sys.path (a console script's isn't)
    checked(compose_cfg, "recipe=grpo", "recipe.reward_funcs=[cwd_rewards_a.correct]")
    assert resolve_reward("cwd_rewards_a.correct")(["p"], ["c"], answer=["a"]) == [1.0]
    with pytest.raises(ConfigError) as info:
        checked(compose_cfg, "recipe=grpo", "recipe.reward_funcs=[cwd_rewards_a.corect]")
    assert info.value.key == "recipe.reward_funcs[0]" and "did you mean correct" in str(info.value)
    from hydratune.components.rewards import import_reward

    for spec, near in [
        ("cwd_rewardz_a.correct", "did you mean cwd_rewards_a"),
        ("hydratune.components.rewards.exact_mach", "did you mean exact_match"),
    ]:
        with pytest.raises(ConfigError, match=near):
            import_reward(spec)


def test_a_reward_module_beside_the_data_resolves_and_is_called_by_keyword(
    compose_cfg, tmp_path, monkeypatch, user_dirs
) -> None:
    """``rewards.py`` next to data.jsonl, run from another folder: imported from beside the data.path the
    command line names (a data.path set anywhere else grants nothing); ``correct(completions, answer,
    **kw)`` passes, as TRL calls it by keyword; one without a ``completions`` parameter is refused naming
    its parameters."""
    from hydratune.components.rewards import resolve_reward
    from tests.support.data import write_jsonl

    data = tmp_path / "data"
    data.mkdir()
    path = write_jsonl(data / "data.jsonl", [{"prompt": f"{i}+1?", "answer": str(i + 1)} for i in range(8)])
    (data / "beside_rewards_a.py").write_text(
        "def correct(completions, answer, **kw):\n"
        "    return [float(a in c) for c, a in zip(completions, answer)]\n\n"
        "def wrong(answer, completion):\n    return [0.0]\n"
    )
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    args = ["recipe=grpo", f"data.path={path}", "recipe.reward_funcs=[beside_rewards_a.correct]"]
    monkeypatch.setattr(sys, "argv", ["hydratune"])  # data.path not on the command line: not searched
    with pytest.raises(ConfigError, match="no module 'beside_rewards_a'"):
        checked(compose_cfg, *args)
    monkeypatch.setattr(sys, "argv", ["hydratune", *args])
    checked(compose_cfg, *args)
    assert resolve_reward("beside_rewards_a.correct")(
        prompts=["p"], completions=["2", "x"], answer=["2", "3"]
    ) == [
        1.0,
        0.0,
    ]
    with pytest.raises(ConfigError) as info:
        checked(compose_cfg, *args[:2], "recipe.reward_funcs=[beside_rewards_a.wrong]")
    assert info.value.key == "recipe.reward_funcs[0]"
    assert "takes (answer, completion)" in str(info.value) and "trust_targets" not in (info.value.hint or "")


# ---- trust: a reward is a plain function of the user's own code --------------------------------------
@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["recipe=grpo", "recipe.reward_funcs=[torch.hub.load]"], "recipe.reward_funcs[0]"),
        (["recipe=ppo", "recipe.reward._target_=torch.hub.load"], "recipe.reward"),
        (["recipe=best_of_n", "recipe.reward._target_=json.dumps"], "recipe.reward"),
        (
            [
                "recipe=ppo",
                "recipe.reward._target_=hydratune.components.rewards.length_penalty",
                "+recipe.reward.target={_target_: torch.hub.load, _partial_: true}",
            ],
            "recipe.reward",
        ),
    ],
)
def test_a_reward_from_an_installed_package_or_binding_a_call_is_refused(compose_cfg, overrides, key) -> None:
    with pytest.raises(ConfigError) as info:
        checked(compose_cfg, *overrides)
    assert info.value.key.startswith(key) and "trust_targets=true" in (info.value.hint or ""), str(info.value)
    if "torch.hub.load" in overrides[-1] and "+" not in overrides[-1]:
        checked(compose_cfg, *overrides, "trust_targets=true")  # the user vouches for the config


# ---- the data a reward reads -----------------------------------------------------------------------------
def test_a_blank_reference_or_a_missing_answer_column_fails_before_the_model_loads(
    run_recipe, compose_cfg, tmp_path, monkeypatch
) -> None:
    from hydratune.components.data.prepare import plan_data
    from hydratune.components.runtime.session import Session

    def loaded(*args: Any) -> None:
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(Session, "build_model", loaded)
    nan = tmp_path / "nan.jsonl"
    nan.write_text('{"prompt": "1+1", "answer": "2"}\n{"prompt": "2+2", "answer": NaN}\n')
    bare = tmp_path / "bare.jsonl"
    bare.write_text('{"prompt": "1+1"}\n{"prompt": "2+2"}\n')
    cases = [
        (nan, {"grpo": "data.path", "ppo": "data.path"}, "no value in column 'answer'"),
        (bare, {"grpo": "recipe.reward_funcs[0]", "ppo": "recipe.reward"}, "reads column 'answer'"),
    ]
    for path, keys, words in cases:
        for recipe, key in keys.items():
            data = [f"recipe={recipe}", f"data.path={path}", "data.eval_path=null", "train.eval_every=0"]
            with pytest.raises(ConfigError) as info:
                run_recipe(*data, name=f"{recipe}_{path.stem}")
            assert info.value.key == key and words in str(info.value), str(info.value)
        comps = checked(compose_cfg, *data)  # (ppo)
        with pytest.raises(ConfigError) as info:
            plan_data(comps, 0)  # mode=plan's data check says the same
        assert info.value.key == key


# ---- a reward served over HTTP -----------------------------------------------------------------------
def test_the_http_reward_sends_the_contract_retries_and_times_out(server) -> None:
    from hydratune.components.rewards_http import HttpReward, RewardServerError

    reward = HttpReward(server.url, timeout=5, retries=1)
    prompts = [[{"role": "user", "content": "1+1"}]] * 2
    completions = [[{"role": "assistant", "content": "2"}], "four"]
    scores = reward(
        prompts, completions, answer=["2", "4"], completion_ids=[[1], [2]], trainer_state=object()
    )
    assert scores == [-1.0, -4.0]
    assert server.requests[-1] == {"prompts": prompts, "completions": ["2", "four"], "answer": ["2", "4"]}
    # a vision-language model's prompt carries its image (TRL puts it in the part): a PNG data URL
    from PIL import Image

    image = Image.new("RGB", (3, 2), (255, 0, 0))
    part = [{"role": "user", "content": [{"type": "image", "image": image}, {"type": "text", "text": "?"}]}]
    assert reward([part], ["red"], images=[[image]]) == [-3.0]
    sent = server.requests[-1]
    url = sent["prompts"][0][0]["content"][0]["image"]
    assert url.startswith("data:image/png;base64,") and sent["images"] == [[url]]
    decoded = Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1])))
    assert decoded.size == (3, 2) and decoded.getpixel((0, 0)) == (255, 0, 0)
    server.fail = 1  # one 503, then an answer
    assert reward(["p"], ["abc"]) == [-3.0] and len(server.requests) == 4
    server.fail = 5
    with pytest.raises(RewardServerError, match="2 tries"):
        HttpReward(server.url, timeout=5, retries=1)(["p"], ["abc"])
    server.hold.clear()  # the server never answers in time
    with pytest.raises(RewardServerError, match="did not answer"):
        HttpReward(server.url, timeout=0.2, retries=0)(["p"], ["abc"])


def test_grpo_ppo_and_best_of_n_score_with_a_reward_url(run_recipe, server) -> None:
    url = f"recipe.reward_url={server.url}"
    ctx, _ = run_recipe(*GRPO, "recipe.reward_funcs=[]", url, name="grpo")
    grpo = server.scored()
    assert grpo and len(grpo[0]["completions"]) == 16 and grpo[0]["answer"], grpo[0].keys()
    rewards = [r["reward"] for r in ctx.run_dir.read_metrics() if "reward" in r]
    lengths = [-len(c) for r in grpo for c in r["completions"]]
    assert rewards == pytest.approx([sum(lengths) / len(lengths)])  # one step, every completion scored once
    _, metrics = run_recipe(
        "recipe=ppo",
        "recipe.num_iterations=1",
        "recipe.rollout_batch_size=8",
        "recipe.mini_batch_size=8",
        "recipe.response_length=4",
        "train.micro_batch_size=8",
        "train.eval_generations=0",
        "train.save_every=0",
        url,
        name="ppo",
    )
    ppo = server.scored()[len(grpo) :]
    assert len(ppo) == 1 and len(ppo[0]["completions"]) == 8
    assert metrics["reward/mean"] == pytest.approx(sum(-len(c) for c in ppo[0]["completions"]) / 8)
    _, metrics = run_recipe(
        "recipe=best_of_n",
        "recipe.max_new_tokens=4",
        "recipe.num_return_sequences=2",
        "data.max_samples=3",
        url,
        name="bon",
    )
    bon = server.scored()[len(grpo) + len(ppo) :]
    assert len(bon) == 1 and len(bon[0]["completions"]) == 6 and len(bon[0]["answer"]) == 6
    assert metrics["mean reward, all samples"] == pytest.approx(
        sum(-len(c) for c in bon[0]["completions"]) / 6
    )


# ---- a reward server that misbehaves: named before the first step, checkpointed after it ------------------
def test_a_redirect_is_never_followed(server, other_server) -> None:
    """The issue's probe: a redirect to another host was followed (as a GET, without the completions) and
    that host's scores accepted. Refused before load, naming where it pointed; the other host gets nothing."""
    from hydratune.components.rewards_http import HttpReward, RewardURL

    server.redirect = other_server.url
    with pytest.raises(ConfigError) as info:
        RewardURL(reward_url=server.url).check_reward_url()
    assert info.value.key == "recipe.reward_url" and server.url in str(info.value), str(info.value)
    assert f"HTTP 302, a redirect to {other_server.url}: redirects are not followed" in str(info.value)
    with pytest.raises(ConfigError, match="redirects are not followed"):
        HttpReward(server.url).probe("recipe.reward_url")
    assert not other_server.requests and len(server.requests) == 2


@pytest.mark.parametrize("bad", sorted(BAD_ANSWERS))
def test_an_answer_outside_the_contract_is_named_with_what_came_back(server, bad: str) -> None:
    from hydratune.components.rewards_http import HttpReward, RewardServerError

    server.bad = bad
    with pytest.raises(RewardServerError) as info:
        HttpReward(server.url, retries=0)(["p", "q"], ["ab", "c"])
    assert str(info.value).startswith(server.url) and BAD_ANSWERS[bad][1] in str(info.value), str(info.value)


def test_a_reward_server_failing_in_the_first_step_is_exit_2_naming_it(run_recipe, server) -> None:
    """The probe's empty batch passes; the first scored batch holds a NaN: refused as a config error (exit
    2, no traceback), naming the URL and the answer; no checkpoint (nothing to resume)."""
    server.bad = "nan"
    with pytest.raises(ConfigError) as info:
        run_recipe(*GRPO, "recipe.reward_funcs=[]", f"recipe.reward_url={server.url}", name="first")
    text = str(info.value)
    assert info.value.key == "recipe.reward_url" and "before the first training step" in text, text
    assert server.url in text and "scores[0] is nan" in text


def test_ppo_checkpoints_the_last_finished_iteration_when_the_server_fails(
    run_recipe, compose_cfg, server
) -> None:
    """The second iteration's answer is short by one: PPO writes checkpoint-1, its prompt sampler set back to
    where iteration 1 left it (the failed iteration's prompts are drawn again on resume), and stops with
    ServerFailed (the CLI's exit 76)."""
    import torch

    from hydratune.components.config.errors import ServerFailed

    server.bad, server.good = "count", 1
    ppo = ["recipe=ppo", "recipe.num_iterations=3", "recipe.rollout_batch_size=4", "recipe.mini_batch_size=4"]
    ppo += ["recipe.response_length=4", "train.micro_batch_size=4", "train.eval_generations=0"]
    with pytest.raises(ServerFailed) as info:
        run_recipe(*ppo, "train.save_every=0", f"recipe.reward_url={server.url}", name="ppo_fails")
    assert info.value.step == 1 and info.value.checkpoint and info.value.checkpoint.endswith("checkpoint-1")
    assert server.url in str(info.value) and "3 scores for 4 completions" in str(info.value)
    state = torch.load(Path(info.value.checkpoint) / "loop_state.pt", weights_only=False)
    rows = sum(1 for line in Path(compose_cfg(*ppo).data.path).read_text().splitlines() if line.strip())
    assert state["iteration"] == 1 and len(state["sampler"]["queue"]) == rows - 4  # not rows - 8
