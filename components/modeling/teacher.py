"""``recipe=distill``'s teacher: what ``recipe.teacher`` names, checked before any weight is read.

A teacher is a finished run dir (its ``final/``: a whole model, a merged one, or an adapter on the run's own
base, read as ``model.from_run`` reads it), a model dir holding config.json and weights, or a model option's
name (``conf/model/<name>.yaml``, as ``model=<name>`` builds it), under the same
trust rules as the run's own model (``CausalLM.validate``: no code loaded unasked, weights that unpickle
safely). Its tokenizer must agree with the student's: the same vocabulary, and the chat template rendering a
probe conversation to the same token ids (the divergence compares the two next-token distributions id by
id, and the teacher scores the student's samples as the student's template wrote them).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hydratune.components.config.errors import ConfigError

KEY = "recipe.teacher"
HINT = (
    "recipe.teacher=<a finished run dir (outputs/...)>, <a model dir with config.json and weights> or "
    "<a model option's name (conf/model/)>"
)
#: rendered by both chat templates: the ids must agree
PROBE = [{"role": "user", "content": "What is 2+3?"}, {"role": "assistant", "content": "5"}]


def rekeyed(err: ConfigError, key: str = KEY) -> ConfigError:
    """``err`` (raised for ``model.*``) said of ``key``."""
    message = str(err).split("\n")[0]
    message = message.split("] ", 1)[-1] if message.startswith("[") else message
    return ConfigError(f"the teacher: {message}", key=key, hint=err.hint or HINT)


def teacher_component(spec: str | None, *, trust_remote_code: bool = False) -> Any:
    """The teacher as a model component (``CausalLM``), its source resolved and checked (no weights read)."""
    from hydratune.components.model import CausalLM

    if not spec:
        raise ConfigError("recipe=distill needs a teacher", key=KEY, hint=HINT)
    path, trusted = Path(str(spec)).expanduser(), trust_remote_code
    try:
        option = model_option(str(spec))
        if option is not None:
            teacher = option
        elif (path / ".hydra" / "config.yaml").is_file():
            teacher = CausalLM(name_or_path=str(path), from_run=str(path), trust_remote_code=trusted)
        elif (path / "config.json").is_file():
            teacher = CausalLM(name_or_path=str(path), init="pretrained", trust_remote_code=trusted)
        else:
            what = "neither a run dir (.hydra/config.yaml) nor a model dir" if path.exists() else "not found"
            raise ConfigError(f"{spec}: {what}", key=KEY, hint=HINT)
        teacher.validate()  # config.json, weights, remote code, safe unpickling: the model's own rules
        if teacher.init == "random":  # a model option without weights (model=tiny's bundled config)
            raise ConfigError(
                f"{spec}: {teacher.describe_weights()}: a teacher needs trained weights",
                key=KEY,
                hint=HINT,
            )
    except ConfigError as err:
        raise err if err.key == KEY else rekeyed(err) from None
    return teacher


def model_option(spec: str) -> Any:
    """The model option named ``spec`` (``recipe.teacher=smollm2_135m``: conf/model/<spec>.yaml) as its
    component, or None when ``spec`` is no option's name (a path)."""
    if "/" in spec or spec.startswith("."):
        return None
    from hydratune.components.config.options import options

    found = options("model").get(spec)
    return found.build() if found is not None else None


def source_of(model: Any) -> tuple[str, str | None] | None:
    """What a model component's weights are (resolved dir or hub id, adapter dir); None for random init."""
    if model.init == "random":
        return None
    where = model.source_dir()
    local = Path(where).expanduser()
    name = str(local.resolve()) if local.exists() else where
    adapter = str(Path(model.adapter).resolve()) if model.adapter else None
    return name, adapter


def check_not_student(teacher: Any, student: Any) -> None:
    """A teacher that is the student's own starting weights teaches nothing (the divergence starts at 0)."""
    same = source_of(teacher)
    if same is not None and same == source_of(student):
        raise ConfigError(
            f"the teacher is the student itself ({same[1] or same[0]})",
            key=KEY,
            hint="a larger or better trained teacher (e.g. the SFT run of a bigger model), or a student of "
            "its own: model.init=random, or another model.name_or_path / model.from_run",
        )


def compare_tokenizers(teacher_tok: Any, student_tok: Any, teacher: str, student: str) -> None:
    """The same vocabulary (token -> id) and the same ids for the probe conversation, else refused (naming
    both)."""
    t_vocab, s_vocab = teacher_tok.get_vocab(), student_tok.get_vocab()
    fix = (
        "a student of the teacher's family (model.name_or_path / model.from_run), or one built at random "
        f"from the teacher's config: model.name_or_path={teacher} model.init=random"
    )
    if t_vocab != s_vocab:
        differ = sorted(set(t_vocab.items()) ^ set(s_vocab.items()), key=lambda kv: kv[1])
        example = ", ".join(f"{tok!r}->{i}" for tok, i in differ[:3])
        raise ConfigError(
            f"the teacher's and the student's tokenizers differ: teacher {teacher} has {len(t_vocab)} "
            f"tokens, student {student} {len(s_vocab)}; {len(differ)} (token, id) pairs differ "
            f"(e.g. {example})",
            key=KEY,
            hint=fix,
        )
    t_ids, s_ids = (render(tok) for tok in (teacher_tok, student_tok))
    if t_ids != s_ids:
        raise ConfigError(
            f"the teacher's and the student's chat templates give different ids for one conversation: "
            f"teacher {teacher} {t_ids}, student {student} {s_ids}",
            key=KEY,
            hint="model.chat_template=<the teacher's template> (a name or a .jinja file), or " + fix,
        )


def render(tokenizer: Any) -> list[int] | None:
    """The ids of :data:`PROBE` under the tokenizer's chat template (None: it has none)."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    ids = tokenizer.apply_chat_template(PROBE, tokenize=True)
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    return [int(i) for i in ids]
