"""Plain TRL with its defaults on the benchmark model and data: SFTTrainer / DPOTrainer, peft's LoraConfig
for LoRA, a BitsAndBytesConfig (NF4, double quant) for QLoRA, ``deepspeed=<dict>`` for ZeRO.

Only what fixes the shape of the work is set: ``max_steps``, ``per_device_train_batch_size`` (the shared
micro-batch), ``max_length`` (the shared sequence length), ``learning_rate``, ``bf16`` on GPU (issue 6's
"bf16 autocast"), no saving, no eval, seed. Everything else is TRL's default (for TRL 1.16:
gradient checkpointing on, no packing, fused AdamW, padding to the longest in the batch); ``trl_set`` in
the spec overrides config fields on request (``throughput.py --trl-set key=value``). Tokens are counted
by wrapping the data collator (the non-pad attention-mask tokens of every batch the trainer draws) and
timed by a callback at the end of every optimizer step, after a device sync.

    python bench/trl_baseline.py --spec '<json>'      # specs are written by bench/throughput.py
"""

from __future__ import annotations

import copy
import os
import tempfile
import time
from typing import Any

from common import (
    benchmark_model,
    benchmark_tokenizer,
    load_spec,
    peak_memory_gib,
    sync,
    window,
    write_result,
)


class CountingCollator:
    """Wraps a collator and counts the non-pad tokens of the batches it builds."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.tokens = 0

    def __call__(self, features: Any) -> Any:
        batch = self.inner(features)
        masks = [v for k, v in batch.items() if k.endswith("attention_mask")]
        if masks:
            self.tokens += int(sum(m.sum() for m in masks))
        else:  # padding-free batches carry no mask: every token is real
            self.tokens += int(sum(v.numel() for k, v in batch.items() if k.endswith("input_ids")))
        return batch


def deepspeed_config(stage: int) -> dict[str, Any]:
    return {
        "zero_optimization": {"stage": stage},
        "bf16": {"enabled": "auto"},
        "fp16": {"enabled": "auto"},
        "train_micro_batch_size_per_gpu": "auto",
        "train_batch_size": "auto",
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
    }


def main(spec: dict[str, Any]) -> dict[str, Any]:
    import datasets
    import torch
    from transformers import AutoModelForCausalLM, TrainerCallback

    device = spec["device"]
    if spec.get("zero"):  # one process, no launcher: the env a launcher would set
        os.environ.setdefault("RANK", "0")
        os.environ.setdefault("LOCAL_RANK", "0")
        os.environ.setdefault("WORLD_SIZE", "1")
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(spec.get("port", 29533)))
    tokenizer = benchmark_tokenizer(spec)
    data = datasets.load_dataset("json", data_files=spec["data"], split="train")
    common_args: dict[str, Any] = {
        "output_dir": tempfile.mkdtemp(prefix="trl_bench_"),
        "max_steps": spec["steps"],
        "per_device_train_batch_size": spec["micro_batch"],
        "max_length": spec["seq_len"],
        "learning_rate": spec["lr"],
        "save_strategy": "no",
        "eval_strategy": "no",
        "report_to": "none",
        "seed": spec.get("seed", 0),
        "use_cpu": device == "cpu",
    }
    if device == "cuda":
        common_args["bf16"] = True
    elif spec.get("bf16") is not None:  # --real rows say; otherwise TRL's default (bf16=True, even on a CPU)
        common_args["bf16"] = spec["bf16"]
    if spec.get("zero"):
        common_args["deepspeed"] = deepspeed_config(spec["zero"])
    common_args.update(spec.get("trl_set", {}))

    model_kwargs: dict[str, Any] = {}
    if spec.get("quant"):
        from transformers import BitsAndBytesConfig

        model_kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=torch.bfloat16,
        )
        model = AutoModelForCausalLM.from_pretrained(spec["model_dir"], dtype=torch.bfloat16, **model_kwargs)
    else:
        model = benchmark_model(spec)
        model.config.architectures = [type(model).__name__]
    peft_config = None
    if spec.get("peft"):
        from peft import LoraConfig

        lora = spec["peft"]
        peft_config = LoraConfig(
            r=lora["r"],
            lora_alpha=lora["alpha"],
            lora_dropout=lora["dropout"],
            target_modules="all-linear",
            task_type="CAUSAL_LM",
        )

    clock: list[tuple[int, float, float]] = []
    first_step: list[float] = []  # the process's age at the end of its first optimizer step

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            sync(device)
            clock.append((state.global_step, counter.tokens, time.perf_counter()))
            if not first_step:
                import psutil

                first_step.append(round(time.time() - psutil.Process().create_time(), 2))

    if spec["recipe"] == "grpo":
        from trl import GRPOConfig, GRPOTrainer

        def exact_sum(completions: list, answer: list, **_: Any) -> list[float]:
            """The demo's reward (hydratune's ``exact_match``): 1 where the answer is the reference."""
            texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
            return [float(t.strip() == a.strip()) for t, a in zip(texts, answer, strict=True)]

        grpo = spec["grpo"]
        common_args.pop("max_length")  # GRPO bounds the completion (below) and renders each prompt whole
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=[exact_sum],
            args=GRPOConfig(
                **common_args,
                num_generations=grpo["num_generations"],
                max_completion_length=grpo["max_completion_length"],
            ),
            train_dataset=data,
            processing_class=tokenizer,
            peft_config=peft_config,
            callbacks=[Clock()],
        )
    elif spec["recipe"] == "dpo":
        from trl import DPOConfig, DPOTrainer

        # TRL's default reference is a second copy of the initial policy loaded from the model's path; a
        # random-init model has none, so it gets the same thing directly (PEFT: the adapter-free policy)
        ref_model = None if peft_config else copy.deepcopy(model).eval().requires_grad_(False)
        trainer = DPOTrainer(
            model=model,
            ref_model=ref_model,
            args=DPOConfig(**common_args),
            train_dataset=data,
            processing_class=tokenizer,
            peft_config=peft_config,
            callbacks=[Clock()],
        )
    else:
        from trl import SFTConfig, SFTTrainer

        trainer = SFTTrainer(
            model=model,
            args=SFTConfig(**common_args),
            train_dataset=data,
            processing_class=tokenizer,
            peft_config=peft_config,
            callbacks=[Clock()],
        )
    counter = CountingCollator(trainer.data_collator)
    if spec["recipe"] != "grpo":  # GRPO's batches are prompts, its rows' lengths come from sampling
        trainer.data_collator = counter
    trainer.train()
    return {
        **window(clock, spec["warmup"]),
        "peak memory (GiB)": peak_memory_gib(device),
        "first step (s)": first_step[0] if first_step else None,
        "final loss": trainer.state.log_history[-1].get("train_loss"),
        "trl args": {k: v for k, v in common_args.items() if k not in ("output_dir", "deepspeed")},
    }


if __name__ == "__main__":
    spec = load_spec()
    write_result(spec["result"], main(spec))
