"""Tokenizer set-up for training: pad token, padding side and chat template, done once and correctly."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hydratune.components.config.errors import ConfigError
from hydratune.components.text.chat_template import resolve_chat_template

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def build_tokenizer(
    name_or_path: str,
    *,
    revision: str | None = None,
    trust_remote_code: bool = False,
    chat_template: str | None = None,
    padding_side: str = "right",
    gguf_file: str | None = None,
) -> PreTrainedTokenizerBase:
    """Load a tokenizer and make it safe to train with.

    - A pad token always exists: the tokenizer's own, else a dedicated pad-like special token from its
      vocabulary, else EOS (labels of padding are masked by length, so EOS is still learned).
    - ``padding_side`` is right for training; generation code switches to left locally.
    - ``chat_template`` (a name such as ``chatml`` or ``llama3_2``, a .jinja path or the template text; see
      ``hydratune.components.text.chat_template``) replaces the tokenizer's and is saved with it.
    """
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(
            name_or_path, revision=revision, trust_remote_code=trust_remote_code, gguf_file=gguf_file
        )
    except OSError as err:
        raise ConfigError(
            f"cannot load the tokenizer of '{name_or_path}' ({err.__class__.__name__})",
            key="model.tokenizer",
            hint="point model.tokenizer (or model.name_or_path) at a local dir holding tokenizer files",
        ) from None
    except ValueError as err:  # a hub tokenizer whose own code transformers would have to run
        if trust_remote_code or "trust_remote_code" not in str(err):
            raise
        raise ConfigError(
            f"the tokenizer of '{name_or_path}' needs its own code to load (transformers has no class of "
            "its own for it)",
            key="model.trust_remote_code",
            hint="read that code, then pass model.trust_remote_code=true on the command line (code never "
            "runs unasked), or point model.tokenizer at a tokenizer transformers builds itself",
        ) from None
    if chat_template:
        tok.chat_template = resolve_chat_template(chat_template)[0]
    if tok.pad_token is None:
        candidates = [t for t in ("<|pad|>", "<pad>", "<|finetune_right_pad_id|>") if t in tok.get_vocab()]
        tok.pad_token = candidates[0] if candidates else tok.eos_token
    tok.padding_side = padding_side
    return tok
