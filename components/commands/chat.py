"""``hydratune chat <run dir | model dir>``: talk to a model in the terminal, tokens streamed as generated.

The conversation is kept and rendered with the chat template the model was saved with (a run's
``final/``), so the model sees what it was trained on. Commands: ``/system <text>`` sets the system prompt,
``/history`` shows the turns so far, ``/reset`` clears them, ``/exit`` (or Ctrl-D) quits.

A vision-language model sees images: ``--image <file>`` (repeatable) puts them before the first message,
``/image <file>`` before the next one; the model's processor (saved with the run's ``final/`` and every
export) expands them to their image tokens, as training did.

An agent calls tools: ``--tools my_tools.add,my_tools.lookup`` (checked before load as ``recipe.tools`` is,
the same trust rules; ``trust_targets=true`` lifts them) runs each answer as GRPO's tool loop does
(components/tool_loop.py ``ToolLoop``): the model's tool calls are run, their results shown and appended as
``tool`` messages, and the model goes on, up to ``max_tool_calls`` rounds (``tool_timeout`` seconds a call).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hydratune.components.config.errors import ConfigError

USAGE = (
    "hydratune chat <run dir | model dir> [--image <file>] [--tools <module.function>,...] [system=<text>] "
    "[max_new_tokens=256] [temperature=0.7] [top_p=0.9] [max_tool_calls=<n>] [tool_timeout=10] "
    "[trust_targets=true] [model.trust_remote_code=true]"
)
TOOL_OPTIONS = ("max_tool_calls", "tool_timeout", "trust_targets")
REMOTE_CODE = "model.trust_remote_code=true"  # an adapter run's base may load its model dir's code
HELP = "commands: /system <text>, /image <file> (a VLM), /history, /reset, /exit (or Ctrl-D)"


def split_images(args: list[str]) -> tuple[list[str], list[Path]]:
    """(the other arguments, the ``--image <file>`` / ``--image=<file>`` files in order)."""
    rest: list[str] = []
    images: list[Path] = []
    it = iter(args)
    for arg in it:
        if arg == "--image":
            value = next(it, None)
            if value is None:
                raise ConfigError("--image needs a file", key="chat.image", hint=USAGE)
            images.append(Path(value).expanduser())
        elif arg.startswith("--image="):
            images.append(Path(arg.partition("=")[2]).expanduser())
        else:
            rest.append(arg)
    return rest, images


def split_tools(args: list[str]) -> tuple[list[str], list[str], dict[str, Any]]:
    """(the other arguments, the ``--tools a,b`` / ``--tools=a,b`` dotted paths, the tool options:
    ``max_tool_calls`` (None: no limit), ``tool_timeout``, ``trust_targets``)."""
    rest: list[str] = []
    tools: list[str] = []
    options: dict[str, Any] = {"max_tool_calls": None, "tool_timeout": 10.0, "trust_targets": False}
    it = iter(args)
    for arg in it:
        key, sep, value = arg.partition("=")
        if arg == "--tools":
            value = next(it, "")
            if not value:
                raise ConfigError("--tools needs module.function names", key="chat.tools", hint=USAGE)
            tools += [t for t in value.split(",") if t]
        elif key == "--tools" and sep:
            tools += [t for t in value.split(",") if t]
        elif key in TOOL_OPTIONS and sep:
            try:
                options[key] = {"max_tool_calls": int, "tool_timeout": float}.get(key, parse_bool)(value)
            except ValueError:
                raise ConfigError(f"'{value}' is not a valid {key}", key=f"chat.{key}", hint=USAGE) from None
        else:
            rest.append(arg)
    limit = options["max_tool_calls"]
    if (limit is not None and limit < 1) or options["tool_timeout"] <= 0:
        raise ConfigError("out of range", key="chat", hint="max_tool_calls >= 1, tool_timeout > 0")
    if not tools and args != rest:
        raise ConfigError("tool options without --tools", key="chat.tools", hint=USAGE)
    return rest, tools, options


def parse_bool(value: str) -> bool:
    if value.lower() not in ("true", "false"):
        raise ValueError(value)
    return value.lower() == "true"


def tool_loop(path: Path, tokenizer: Any, functions: list[Any], options: dict[str, Any]) -> Any:
    """The tool loop of the chat (``ToolLoop``); a chat template that cannot render or parse tool calls is
    refused naming ``model.chat_template`` (the one the model was trained and saved with)."""
    from hydratune.components.tool_loop import ToolLoop

    try:
        return ToolLoop(
            tokenizer, functions, limit=options["max_tool_calls"], timeout=options["tool_timeout"]
        )
    except ConfigError as err:
        message = str(err).split("\n")[0].split("] ", 1)[-1]
        raise ConfigError(
            f"{path}: {message}",
            key=err.key,
            hint=f"chat uses the template saved with the model: train it with {err.hint}",
        ) from None


def open_image(path: Path) -> Any:
    """The image at ``path`` as RGB, checked as training checks a row's image (``data/images.py``: a regular
    file, fully decoded, no decompression bomb): a ConfigError naming it otherwise."""
    from hydratune.components.data.images import open_image_file
    from hydratune.components.data.readers import RowError

    try:
        return open_image_file(path, "--image")
    except RowError as err:
        raise ConfigError(
            f"cannot open the image: {err.args[0]}",
            key="chat.image",
            hint="give a PNG / JPEG / WebP... file that opens (PIL refuses more than twice "
            f"PIL.Image.MAX_IMAGE_PIXELS as a decompression bomb); usage: {USAGE}",
        ) from None


def saved_processor(path: Path) -> bool:
    """Whether the run's ``final/`` (or the model dir) holds a processor: a vision-language model's."""
    from hydratune.components.modeling.vision import has_processor

    return has_processor(path / "final" if (path / ".hydra" / "config.yaml").is_file() else path)


def load_processor(path: Path, tokenizer: Any, remote_code: bool = False) -> Any:
    """A vision-language model's processor (with the chat's tokenizer): the one a run saved in ``final/``,
    or a model dir's (``processor_config.json``); None for a text model."""
    from hydratune.components.modeling.vision import has_processor

    if (path / ".hydra" / "config.yaml").is_file():
        from hydratune.components.modeling.trained import TrainedRun

        return TrainedRun.open(path, key="chat", trust_remote_code=remote_code).processor(tokenizer)
    if not has_processor(path):
        return None
    from hydratune.components.modeling.vision import load_processor as load

    return load(str(path), tokenizer, trust_remote_code=remote_code)


def model_config(path: Path) -> dict[str, Any]:
    """The ``config.json`` of what ``path`` chats with: a run dir's ``final/`` (or, for an adapter there, its
    base's when that is a local dir), or the model dir's; ``{}`` where none is on disk (a hub base)."""
    folders = [path]
    if (path / ".hydra" / "config.yaml").is_file():
        from omegaconf import OmegaConf

        base = OmegaConf.select(OmegaConf.load(path / ".hydra" / "config.yaml"), "model.name_or_path")
        folders = [path / "final"] + ([Path(str(base))] if base else [])
    for folder in folders:
        if (folder / "config.json").is_file():
            return json.loads((folder / "config.json").read_text())
    return {}


def check_processor_packages(path: Path) -> None:
    """A vision-language model whose processor needs a package that is not installed (Qwen-VL's video
    processor: torchvision) is refused before anything loads, naming the extra, as training refuses it."""
    from hydratune.components.modeling.vision import require_processor_packages

    require_processor_packages(model_config(path), str(path), key="chat")


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
        from hydratune.components.modeling.trained import TrainedRun

        return TrainedRun.open(path, key="chat", trust_remote_code=remote_code).load()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hydratune.components.modeling.model_dir import WEIGHT_PATTERNS, check_model_dir, weight_files
    from hydratune.components.modeling.vision import is_vision_config

    check_model_dir(path, key="chat", trust_remote_code=remote_code, flag=REMOTE_CODE.split("=")[0])
    if not weight_files(path):
        raise ConfigError(
            f"{path} holds no weight file ({', '.join(WEIGHT_PATTERNS)}): there is no model to chat with",
            key="chat",
            hint="point it at a model dir with its weights (save_pretrained's), or at a run dir",
        )
    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=remote_code)
    if not tokenizer.chat_template:
        raise ConfigError(
            f"{path}'s tokenizer has no chat template",
            key="chat",
            hint="chat with a hydratune run dir (its final/ saves the template it trained with)",
        )
    auto = AutoModelForCausalLM
    config = json.loads((path / "config.json").read_text())
    if is_vision_config(config):  # --image / /image give it images (its processor: load_processor)
        from transformers import AutoModelForImageTextToText as auto
    model = auto.from_pretrained(path, trust_remote_code=remote_code)
    return model.eval(), tokenizer


def reply(
    model: Any,
    tokenizer: Any,
    messages: list[dict[str, Any]],
    options: dict[str, Any],
    processor: Any = None,
    images: list[Any] | None = None,
) -> str:
    """Generate the assistant's answer to ``messages``, printing its tokens as they come; return its text.
    ``images``: the conversation's images in order (its turns hold ``{"type": "image"}`` parts), expanded
    by the model's ``processor``."""
    from transformers import TextStreamer

    from hydratune.components.generation.sampling import Sampling, complete, complete_images

    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    sampling = Sampling(options["max_new_tokens"], options["temperature"], options["top_p"])
    streamer = TextStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True)
    if images:
        [done] = complete_images(model, processor, text, images, sampling, streamer=streamer)
        return done.text.strip()
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    [[done]] = complete(model, tokenizer, [ids], sampling, streamer=streamer)
    return done.text.strip()


def agent_reply(
    model: Any, tokenizer: Any, messages: list[dict[str, Any]], options: dict[str, Any], agent: Any
) -> list[dict[str, Any]]:
    """The assistant's turns to ``messages`` through the tool loop: each turn streamed, each tool's result
    printed as it comes; returns the new messages (tool calls, tool results, the answer)."""
    from transformers import TextStreamer

    from hydratune.components.generation.sampling import Sampling, complete

    sampling = Sampling(options["max_new_tokens"], options["temperature"], options["top_p"])

    turns = []

    def generate(prompts: list[list[int]]) -> list[Any]:
        if turns:  # the model's next turn, after the tools' results
            print("assistant> ", end="", flush=True)
        turns.append(len(turns))
        streamer = TextStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True)
        [[done]] = complete(model, tokenizer, prompts, sampling, streamer=streamer)
        return [done]

    def show(message: dict[str, Any]) -> None:
        if message["role"] == "tool":
            print(f"[tool {message['name']}] {message['content']}", flush=True)

    context = getattr(model.config, "max_position_embeddings", None)
    [episode] = agent.run(
        [messages], [agent.prompt_ids(messages)], generate, context=context, on_message=show
    )
    if episode.finish_reason == "tool_limit":
        print(f"(tool call left unanswered: max_tool_calls={agent.limit})", flush=True)
    elif episode.finish_reason == "length" and episode.messages[-1]["role"] == "tool":
        print(f"(the conversation fills the model's context of {context} tokens: /reset)", flush=True)
    return episode.messages[len(messages) :]


def user_turn(line: str, pending: int) -> dict[str, Any]:
    """A user turn: text, or (``pending`` images before it) a list of image parts and the text."""
    if not pending:
        return {"role": "user", "content": line}
    return {"role": "user", "content": [{"type": "image"}] * pending + [{"type": "text", "text": line}]}


def as_text(content: Any) -> str:
    return content if isinstance(content, str) else "".join(p.get("text") or "<image>" for p in content)


def loop(
    model: Any,
    tokenizer: Any,
    options: dict[str, Any],
    processor: Any = None,
    images: list[Any] | None = None,
    agent: Any = None,
) -> None:
    """Read a line, answer it, keep the turns; until /exit or end of input. ``images`` (a VLM) go before
    the first message; ``/image <file>`` adds one before the next. ``agent``: the tool loop answers."""
    system = options["system"]
    turns: list[dict[str, Any]] = []
    seen: list[Any] = []  # the conversation's images, in order
    pending = list(images or [])
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
            turns, seen = [], []
            print("(conversation cleared)", flush=True)
        elif line.startswith("/image"):
            if processor is None:
                print("(this model takes no images)", flush=True)
                continue
            try:
                pending.append(open_image(Path(line[len("/image") :].strip()).expanduser()))
            except ConfigError as err:
                print(f"({err.args[0]})", flush=True)
                continue
            print(f"({len(pending)} image(s) before your next message)", flush=True)
        elif line == "/history":
            shown = ([{"role": "system", "content": system}] if system else []) + turns
            for turn in shown:
                calls = [c["function"] for c in turn.get("tool_calls") or []]
                text = as_text(turn["content"]) + "".join(f" [calls {json.dumps(c)}]" for c in calls)
                print(f"  {turn['role']}: {text}")
            print(f"({len(turns)} turns)", flush=True)
        elif line.startswith("/system"):
            system = line[len("/system") :].strip() or None
            print(f"(system prompt {'set' if system else 'cleared'})", flush=True)
        elif line.startswith("/"):
            print(f"unknown command {line.split()[0]}; {HELP}", flush=True)
        else:
            turns.append(user_turn(line, len(pending)))
            seen, pending = seen + pending, []
            print("assistant> ", end="", flush=True)
            messages = ([{"role": "system", "content": system}] if system else []) + turns
            if agent is not None:
                turns += agent_reply(model, tokenizer, messages, options, agent)
                continue
            answer = reply(model, tokenizer, messages, options, processor, seen)
            turns.append({"role": "assistant", "content": answer})


def cli(args: list[str]) -> int:
    """Entry of ``hydratune chat``; errors are ConfigErrors the caller prints (exit 2)."""
    args, files = split_images(args)
    args, tools, tool_options = split_tools(args)
    path, options = parse_args([a for a in args if a != REMOTE_CODE])
    images = [open_image(f) for f in files]  # checked before the model loads
    functions: list[Any] = []
    if tools:
        from hydratune.components.tools import resolve_tools

        if images:
            raise ConfigError("--tools runs text conversations", key="chat.tools", hint="drop --image")
        functions = resolve_tools(tools, trusted=tool_options["trust_targets"], key="chat.tools")
        tool_loop(path, saved_tokenizer(path), functions, tool_options)  # the template, before load
    if images and not saved_processor(path):
        raise ConfigError(
            f"{path} holds no processor (a text model): it takes no images",
            key="chat.image",
            hint="drop --image",
        )
    check_processor_packages(path)
    model, tokenizer = load(path, REMOTE_CODE in args)
    processor = load_processor(path, tokenizer, REMOTE_CODE in args)
    agent = tool_loop(path, tokenizer, functions, tool_options) if tools else None
    print(f"chatting with {path}" + (f" (tools: {', '.join(tools)})" if tools else ""), flush=True)
    loop(model, tokenizer, options, processor, images, agent)
    return 0


def saved_tokenizer(path: Path) -> Any:
    """The tokenizer (and chat template) a run dir's ``final/`` or a model dir saved: no weights read."""
    from transformers import AutoTokenizer

    folder = path / "final" if (path / ".hydra" / "config.yaml").is_file() else path
    return AutoTokenizer.from_pretrained(folder)
