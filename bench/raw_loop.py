"""The hand-written baseline: a plain PyTorch training loop on the benchmark model and data.

fp32 master weights, bf16 autocast on GPU (on CPU fp32, or bf16 autocast for a ``bf16`` row), SDPA
attention, torch AdamW (fused where the device supports it), gradient clipping at 1.0, optional
``torch.compile``; the model's own cross-entropy loss. SFT trains on every token of rows of exactly
``seq_len`` tokens (the variable-length regime's conversations concatenated back to back and cut into full
rows, as a hand-written loop would pack them; no cross-document masking). DPO is the sigmoid loss against a
frozen copy of the initial policy, chosen and rejected in one forward, padded to the longest in the batch.
LoRA / QLoRA through peft (and bitsandbytes NF4 for the base weights). Writes one JSON result line (see
``common.write_result``).

    python bench/raw_loop.py --spec '<json>'      # specs are written by bench/throughput.py
"""

from __future__ import annotations

import contextlib
import copy
import json
import time
from pathlib import Path
from typing import Any

from common import benchmark_model, benchmark_tokenizer, load_spec, peak_memory_gib, sync, write_result


def build_model(spec: dict[str, Any]) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    device = spec["device"]
    if spec.get("quant"):
        from transformers import BitsAndBytesConfig

        bnb = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=torch.bfloat16,
        )
        model = AutoModelForCausalLM.from_pretrained(
            spec["model_dir"], quantization_config=bnb, dtype=torch.bfloat16, attn_implementation="sdpa"
        )
    else:
        model = benchmark_model(spec).to(device)
    model.config.use_cache = False
    if spec.get("peft"):
        from peft import LoraConfig, get_peft_model

        lora = spec["peft"]
        model = get_peft_model(
            model,
            LoraConfig(
                r=lora["r"],
                lora_alpha=lora["alpha"],
                lora_dropout=lora["dropout"],
                target_modules="all-linear",
                task_type="CAUSAL_LM",
            ),
        )
    return model


def sft_batches(spec: dict[str, Any]):
    """Endless micro-batches of full ``seq_len`` rows from the token file."""
    import torch

    seq_len, mb = spec["seq_len"], spec["micro_batch"]
    docs = [json.loads(line)["input_ids"] for line in Path(spec["tokens"]).read_text().splitlines()]
    stream = [t for doc in docs for t in doc]
    rows = [stream[i : i + seq_len] for i in range(0, len(stream) - seq_len + 1, seq_len)]
    if len(rows) < mb:
        raise ValueError(f"{len(rows)} full rows of {seq_len} tokens, need at least {mb}")
    i = 0
    while True:
        chunk = [rows[(i + j) % len(rows)] for j in range(mb)]
        i += mb
        yield {"input_ids": torch.tensor(chunk)}


def dpo_batches(spec: dict[str, Any], pad_id: int, eos_id: int):
    """Endless micro-batches of preference pairs: [chosen; rejected] right-padded to the longest."""
    import torch

    pairs = [json.loads(line) for line in Path(spec["tokens"]).read_text().splitlines()]
    mb, max_len = spec["micro_batch"], spec["seq_len"]
    i = 0
    while True:
        chunk = [pairs[(i + j) % len(pairs)] for j in range(mb)]
        i += mb
        seqs, starts = [], []
        for key in ("chosen", "rejected"):
            for p in chunk:
                ids = (p["prompt"] + p[key] + [eos_id])[:max_len]
                seqs.append(ids)
                starts.append(min(len(p["prompt"]), len(ids) - 1))
        width = max(map(len, seqs))
        ids = torch.full((len(seqs), width), pad_id)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        loss_mask = torch.zeros((len(seqs), width), dtype=torch.bool)
        for row, (seq, start) in enumerate(zip(seqs, starts, strict=True)):
            ids[row, : len(seq)] = torch.tensor(seq)
            mask[row, : len(seq)] = 1
            loss_mask[row, start : len(seq)] = True
        yield {"input_ids": ids, "attention_mask": mask, "loss_mask": loss_mask}


def sequence_logps(model: Any, batch: dict[str, Any]) -> Any:
    import torch

    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, :-1]
    labels = batch["input_ids"][:, 1:]
    logp = torch.log_softmax(logits.float(), -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    return (logp * batch["loss_mask"][:, 1:]).sum(-1)


def main(spec: dict[str, Any]) -> dict[str, Any]:
    import torch
    import torch.nn.functional as F

    device = spec["device"]
    torch.manual_seed(spec.get("seed", 0))
    model = build_model(spec)
    model.train()
    ref = None
    if spec["recipe"] == "dpo":
        ref = copy.deepcopy(model).eval().requires_grad_(False)
    params = [p for p in model.parameters() if p.requires_grad]
    try:
        opt = torch.optim.AdamW(params, lr=spec["lr"], fused=True)
    except (RuntimeError, TypeError):  # fused needs a device (and dtype) that supports it
        opt = torch.optim.AdamW(params, lr=spec["lr"])
    step_model = torch.compile(model) if spec.get("compile") else model
    ref_model = torch.compile(ref) if ref is not None and spec.get("compile") else ref
    bf16 = device == "cuda" or spec.get("bf16")
    autocast = torch.autocast(device, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
    if spec["recipe"] == "dpo":
        tok = benchmark_tokenizer(spec)
        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        batches = dpo_batches(spec, pad, tok.eos_token_id)
    else:
        batches = sft_batches(spec)
    steps, warmup = spec["steps"], spec["warmup"]
    marks, tokens = [], 0
    for step in range(1, steps + 1):
        batch = {k: v.to(device, non_blocking=True) for k, v in next(batches).items()}
        with autocast:
            if spec["recipe"] == "dpo":
                policy = sequence_logps(step_model, batch)
                with torch.no_grad():
                    reference = sequence_logps(ref_model, batch)
                n = policy.shape[0] // 2
                margin = (policy[:n] - policy[n:]) - (reference[:n] - reference[n:])
                loss = -F.logsigmoid(spec.get("beta", 0.1) * margin).mean()
                tokens += int(batch["attention_mask"].sum())
            else:
                ids = batch["input_ids"]
                loss = step_model(input_ids=ids, labels=ids).loss
                tokens += ids.numel()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step == 1 or step >= warmup:
            loss.item()  # syncs, like a trainer's loss logging
            sync(device)
            marks.append((step, tokens, time.perf_counter()))
    from common import window

    result = {
        **window(marks, warmup),
        "peak memory (GiB)": peak_memory_gib(device),
        "final loss": float(loss),
    }
    return result


if __name__ == "__main__":
    spec = load_spec()
    write_result(spec["result"], main(spec))
