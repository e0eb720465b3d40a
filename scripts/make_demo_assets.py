"""Regenerate the shipped offline demo assets (deterministic): tokenizer, tiny model config, datasets.

    python scripts/make_demo_assets.py

The demo task is two-number addition ("What is 23 + 5?" → "28"), written for this project: small
enough that a ~1M-parameter model learns it on a laptop CPU in about a minute, and scored by exact match.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

ASSETS = Path(__file__).resolve().parent.parent / "components" / "assets"
TINY, DEMO = ASSETS / "tiny", ASSETS / "demo"
SEED = 1234
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>"]

# ChatML; the assistant's content and its closing <|im_end|> sit inside {% generation %} so that
# assistant-only loss trains the answer and the stop token, and nothing else.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'assistant' -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- generation -%}{{- message['content'] + '<|im_end|>' -}}{%- endgeneration -%}"
    "{{- '\\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

QUESTIONS = ("What is {a} + {b}?", "Add {a} and {b}.", "Compute {a} + {b}.", "{a} + {b} = ?")
WRONG = ("off by one", "digits swapped")
ENGLISH = (
    "The quick brown fox jumps over the lazy dog. Fine-tuning adapts a pretrained language model to a task. "
    "A tokenizer splits text into tokens; the model predicts the next token. Learning rate, batch size and "
    "warmup steps are hyper-parameters. Please answer the question and explain your reasoning briefly. "
    "Instruction: summarise the following paragraph in one sentence. Response: the paragraph says that "
    "small models can learn simple arithmetic when the data is clean and the task is consistent."
)


def problems(rng: random.Random) -> list[tuple[int, int]]:
    """Every pair (a, b) with a in 0..99 and b in 0..9, shuffled."""
    pairs = [(a, b) for a in range(100) for b in range(10)]
    rng.shuffle(pairs)
    return pairs


def chat(a: int, b: int, rng: random.Random) -> dict:
    question = rng.choice(QUESTIONS).format(a=a, b=b)
    return {"messages": [{"role": "user", "content": question}, {"role": "assistant", "content": str(a + b)}]}


def wrong_answer(a: int, b: int, rng: random.Random) -> str:
    right = a + b
    if rng.random() < 0.5 or right < 10 or str(right)[::-1] == str(right):
        return str(right + rng.choice((-1, 1)) if right > 0 else right + 1)
    return str(right)[::-1]


def unpaired(pairs: list[dict]) -> list[dict]:
    """KTO's demo: the chosen answer of every even pair (desirable), the rejected one of every odd pair
    (undesirable): balanced, and no prompt twice, so the KL estimate's shifted pairs are mismatched."""
    return [
        {"prompt": p["prompt"], "completion": p["rejected" if i % 2 else "chosen"], "label": not i % 2}
        for i, p in enumerate(pairs)
    ]


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def make_datasets() -> list[tuple[int, int]]:
    rng = random.Random(SEED)
    pairs = problems(rng)
    eval_pairs, train_pairs = pairs[:64], pairs[64:]
    write_jsonl(DEMO / "sft_train.jsonl", [chat(a, b, rng) for a, b in train_pairs])
    write_jsonl(DEMO / "sft_eval.jsonl", [chat(a, b, rng) for a, b in eval_pairs])
    few = train_pairs[:50]
    write_jsonl(
        DEMO / "alpaca.jsonl",
        [
            {"instruction": "Add the two numbers.", "input": f"{a} and {b}", "output": str(a + b)}
            for a, b in few
        ],
    )
    write_jsonl(
        DEMO / "prompt_completion.jsonl",
        [{"prompt": f"What is {a} + {b}?", "completion": str(a + b)} for a, b in few],
    )
    write_jsonl(DEMO / "text.jsonl", [{"text": f"{a} + {b} = {a + b}"} for a, b in few])

    def preference(a: int, b: int) -> dict:
        return {"prompt": f"What is {a} + {b}?", "chosen": str(a + b), "rejected": wrong_answer(a, b, rng)}

    train_prefs = [preference(a, b) for a, b in train_pairs[:512]]
    eval_prefs = [preference(a, b) for a, b in eval_pairs]
    write_jsonl(DEMO / "preference_train.jsonl", train_prefs)
    write_jsonl(DEMO / "preference_eval.jsonl", eval_prefs)
    write_jsonl(DEMO / "unpaired_train.jsonl", unpaired(train_prefs))
    write_jsonl(DEMO / "unpaired_eval.jsonl", unpaired(eval_prefs))
    write_jsonl(
        DEMO / "preference_messages.jsonl",
        [
            {
                "prompt": [{"role": "user", "content": p["prompt"]}],
                "chosen": [{"role": "assistant", "content": p["chosen"]}],
                "rejected": [{"role": "assistant", "content": p["rejected"]}],
            }
            for p in (preference(a, b) for a, b in few)
        ],
    )

    def prompt_row(a: int, b: int) -> dict:
        return {"prompt": [{"role": "user", "content": f"What is {a} + {b}?"}], "answer": str(a + b)}

    write_jsonl(DEMO / "prompts_train.jsonl", [prompt_row(a, b) for a, b in train_pairs[:512]])
    write_jsonl(DEMO / "prompts_eval.jsonl", [prompt_row(a, b) for a, b in eval_pairs])
    return pairs


def make_tokenizer(corpus: list[str]) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1024,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|pad|>",
        unk_token=None,
        bos_token=None,
        model_max_length=256,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(TINY)


def make_model_config() -> None:
    from transformers import AutoTokenizer, LlamaConfig

    tok = AutoTokenizer.from_pretrained(TINY)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        attention_bias=True,  # q/k/v/o biases (Qwen2-style), so BitFit has something to train
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        rms_norm_eps=1e-6,
        initializer_range=0.02,
    )
    config.save_pretrained(TINY)


GAME = "I picked a whole number from 1 to 7. Find it: call guess, I answer higher, lower or correct."
GUESS_SCHEMA = [
    {
        "type": "function",
        "function": {
            "name": "guess",
            "description": "Guess the secret number.",
            "parameters": {
                "type": "object",
                "properties": {"number": {"type": "integer", "description": "your guess"}},
                "required": ["number"],
            },
            "return": {"type": "string"},
        },
    }
]


def search(secret: int, first: int, calls: int = 3) -> list[tuple[int, str]] | None:
    """The guessing game played from ``first``, then halving what is left: (guess, answer) pairs, or None
    when ``calls`` guesses do not find ``secret``."""
    low, high, number, played = 1, 7, first, []
    for _ in range(calls):
        answer = "correct" if number == secret else "higher" if number < secret else "lower"
        played.append((number, answer))
        if answer == "correct":
            return played
        low, high = (number + 1, high) if answer == "higher" else (low, number - 1)
        number = (low + high) // 2
    return None


def make_agent_demo() -> None:
    """The guessing game (docs/agents.md): GRPO's prompts (each secret 10 times; the eval file once each)
    and the SFT warm start's transcripts: every first guess 1-7 then halving, each (first guess, secret)
    that finds the secret in 3 calls: 37 games, of which only a first guess of 4 always wins."""
    prompt = [{"role": "user", "content": GAME}]
    write_jsonl(DEMO / "agent_train.jsonl", [{"prompt": prompt, "answer": str(s % 7 + 1)} for s in range(70)])
    write_jsonl(DEMO / "agent_eval.jsonl", [{"prompt": prompt, "answer": str(s)} for s in range(1, 8)])
    rows = []
    for first in range(1, 8):
        for secret in range(1, 8):
            played = search(secret, first)
            if played is None:
                continue
            messages: list[dict] = [{"role": "user", "content": GAME}]
            for number, answer in played:
                call = {"type": "function", "function": {"name": "guess", "arguments": {"number": number}}}
                messages += [{"role": "assistant", "content": "", "tool_calls": [call]}]
                messages += [{"role": "tool", "name": "guess", "content": answer}]
            messages.append({"role": "assistant", "content": str(secret)})
            rows.append({"messages": messages, "tools": json.dumps(GUESS_SCHEMA)})
    write_jsonl(DEMO / "agent_sft.jsonl", rows)


def main() -> None:
    make_datasets()
    make_agent_demo()
    corpus = [
        json.dumps(json.loads(line))
        for name in ("sft_train.jsonl", "alpaca.jsonl", "prompt_completion.jsonl")
        for line in (DEMO / name).read_text().splitlines()
    ]
    corpus += [ENGLISH] * 20 + [m for m in (CHAT_TEMPLATE,)]
    make_tokenizer(corpus)
    make_model_config()
    print(f"wrote {sorted(p.relative_to(ASSETS).as_posix() for p in ASSETS.rglob('*') if p.is_file())}")


if __name__ == "__main__":
    main()
