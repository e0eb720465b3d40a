"""``hydratune chat <run dir | model dir>``: talk to a model in the terminal, tokens streamed as generated.

The conversation is kept and rendered with the chat template the model was saved with (a run's
``final/``), so the model sees what it was trained on. Commands: ``/system <text>`` sets the system prompt,
``/history`` shows the turns so far, ``/reset`` clears them, ``/exit`` (or Ctrl-D) quits.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from components.config.errors import ConfigError

USAGE = (
    "hydratune chat <run dir | model dir> [system=<text>] [max_new_tokens=256] [temperature=0.7] [top_p=0.9]"
    " [model.trust_remote_code=true]"
)
REMOTE_CODE = "model.trust_remote_code=true"  # an adapter run's base may load its model dir's code
HELP = "commands: /system <text>, /history, /reset, /exit (or Ctrl-D)"


def parse_args(args: list[str]) -> tuple[Path, dict[str, Any]]:
    """``<path> [key=value ...]`` → (path, options), checked before anything loads."""
    if not args or "=" in args[0]:
        raise ConfigError("chat needs a run dir or a model dir", key="chat", hint=USAGE)
    defaults: dict[str, Any] = {"system": None, "max_new_tokens": 256, "temperature": 0.7, "top_p": 0.9}
    options = dict(defaults)
    for arg in args[1:]:
        key, sep, value = arg.partition("=")
        if not sep or key not in defaults:
            raise ConfigError(f"unknown argument '{arg}'", key="chat", hint=USAGE)
        try:
            options[key] = value if key == "system" else type(defaults[key])(value)
        except ValueError:
            raise ConfigError(f"'{value}' is not a number", key=f"chat.{key}", hint=USAGE) from None
    if options["max_new_tokens"] < 1 or options["temperature"] < 0 or not 0 < options["top_p"] <= 1:
        raise ConfigError(
            "out of range", key="chat", hint="max_new_tokens >= 1, temperature >= 0, 0 < top_p <= 1"
        )
    path = Path(args[0]).expanduser()
    if not (path / ".hydra" / "config.yaml").is_file() and not (path / "config.json").is_file():
        raise ConfigError(
            f"{path} is neither a run dir (.hydra/config.yaml) nor a model dir (config.json)",
            key="chat",
            hint=USAGE,
        )
    return path, options


def load(path: Path, remote_code: bool = False) -> tuple[Any, Any]:
    """(model, tokenizer): a run dir's model as trained (an adapter on its base), or a model dir."""
    if (path / ".hydra" / "config.yaml").is_file():
        from components.modeling.trained import TrainedRun

        return TrainedRun.open(path, key="chat", trust_remote_code=remote_code).load()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from components.modeling.model_dir import check_model_dir
    from components.modeling.vision import is_vision_config

    check_model_dir(path, key="chat", trust_remote_code=remote_code, flag=REMOTE_CODE.split("=")[0])
    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=remote_code)
    if not tokenizer.chat_template:
        raise ConfigError(
            f"{path}'s tokenizer has no chat template",
            key="chat",
            hint="chat with a hydratune run dir (its final/ saves the template it trained with)",
        )
    auto = AutoModelForCausalLM
    config = json.loads((path / "config.json").read_text())
    if is_vision_config(config):  # text turns only for now (no --image yet): the decoder answers
        from transformers import AutoModelForImageTextToText as auto
    model = auto.from_pretrained(path, trust_remote_code=remote_code)
    return model.eval(), tokenizer


def reply(model: Any, tokenizer: Any, messages: list[dict[str, str]], options: dict[str, Any]) -> str:
    """Generate the assistant's answer to ``messages``, printing its tokens as they come; return its text."""
    from transformers import TextStreamer

    from components.generation.sampling import Sampling, complete

    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    sampling = Sampling(options["max_new_tokens"], options["temperature"], options["top_p"])
    streamer = TextStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True)
    [[done]] = complete(model, tokenizer, [ids], sampling, streamer=streamer)
    return done.text.strip()


def loop(model: Any, tokenizer: Any, options: dict[str, Any]) -> None:
    """Read a line, answer it, keep the turns; until /exit or end of input."""
    system = options["system"]
    turns: list[dict[str, str]] = []
    print(HELP, flush=True)
    while True:
        try:
            line = input("you> ").strip()
        except EOFError:
            print()
            return
        if not line:
            continue
        if line == "/exit":
            return
        if line == "/reset":
            turns = []
            print("(conversation cleared)", flush=True)
        elif line == "/history":
            shown = ([{"role": "system", "content": system}] if system else []) + turns
            for turn in shown:
                print(f"  {turn['role']}: {turn['content']}")
            print(f"({len(turns)} turns)", flush=True)
        elif line.startswith("/system"):
            system = line[len("/system") :].strip() or None
            print(f"(system prompt {'set' if system else 'cleared'})", flush=True)
        elif line.startswith("/"):
            print(f"unknown command {line.split()[0]}; {HELP}", flush=True)
        else:
            turns.append({"role": "user", "content": line})
            print("assistant> ", end="", flush=True)
            messages = ([{"role": "system", "content": system}] if system else []) + turns
            turns.append({"role": "assistant", "content": reply(model, tokenizer, messages, options)})


def cli(args: list[str]) -> int:
    """Entry of ``hydratune chat``; errors are ConfigErrors the caller prints (exit 2)."""
    path, options = parse_args([a for a in args if a != REMOTE_CODE])
    model, tokenizer = load(path, REMOTE_CODE in args)
    print(f"chatting with {path}", flush=True)
    loop(model, tokenizer, options)
    return 0
