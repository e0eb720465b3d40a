"""The causal-LM loss alone (a bench, not a test): forward + backward time and peak memory of the LM head and
cross-entropy on SmolLM2-135M's shapes (vocabulary 49,152, hidden 576), for

* ``plain``: the full logits, ``F.cross_entropy`` (what a raw loop and transformers' own loss do);
* ``trl``: TRL 1.16's fused head (``ChunkedLogProbFunction``, as ``SFTTrainer`` installs it: log-probs,
  entropy and top-1 on every step);
* ``chunked``: hydratune's (``components/runtime/lm_loss.py``), off a log step (loss only) and on one
  (``chunked+metrics``: entropy and top-1 too).

Each (implementation, tokens) runs in its own process: its peak is the resident-set high-water mark over
the process's RSS before the first pass (the inputs and the head already there). ``--grad-head``: the head's
weight trains too (full fine-tuning; LoRA leaves it frozen, the default here).

    python bench/lm_loss.py --tokens 512,2048,8192 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

VOCAB, HIDDEN = 49152, 576
IMPLS = ("plain", "trl", "chunked", "chunked+metrics")


def rss_gib() -> float:
    """The current resident set (Linux /proc), in GiB."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**30


def one(impl: str, tokens: int, repeats: int, bf16: bool, grad_head: bool) -> dict:
    """Time and peak of ``impl`` at ``tokens`` positions (in this process)."""
    import torch
    import torch.nn.functional as F

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: hydratune.*
    from hydratune.components.runtime.lm_loss import token_log_probs

    torch.manual_seed(0)
    head = torch.nn.Linear(HIDDEN, VOCAB, bias=False)
    head.weight.requires_grad_(grad_head)
    h0 = torch.randn(1, tokens, HIDDEN)
    labels = torch.randint(0, VOCAB, (1, tokens))
    labels[0, : tokens // 4] = -100  # a prompt out of the loss

    def step() -> None:
        h = h0.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            if impl == "plain":
                logits = head(h)[:, :-1].float()
                targets = labels[:, 1:].reshape(-1)
                loss = F.cross_entropy(logits.reshape(-1, VOCAB), targets, ignore_index=-100)
            elif impl == "trl":
                from trl.kernels import ChunkedLogProbFunction
                from trl.trainer.utils import _CHUNKED_LOGPROB_CHUNK_SIZE

                shifted = labels[:, 1:]
                mask = shifted != -100
                lp, *_ = ChunkedLogProbFunction.apply(
                    h[:, :-1].reshape(-1, HIDDEN),
                    head.weight,
                    None,
                    shifted.clamp(min=0).reshape(-1),
                    1.0,
                    _CHUNKED_LOGPROB_CHUNK_SIZE,
                    None,
                    1.0,
                    ("log_probs", "entropy", "is_top1"),
                )
                loss = -lp.view(mask.shape).masked_fill(~mask, 0).sum() / mask.sum()
            else:
                out = token_log_probs(h, labels, head, metrics=impl == "chunked+metrics")
                loss = -out["log_probs"].sum() / out["num_valid"]
        loss.backward()

    before = rss_gib()
    times = []
    for _ in range(repeats + 1):  # the first pass is the warm-up
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB
    return {"impl": impl, "tokens": tokens, "s": statistics.median(times[1:]), "peak_gib": peak - before}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", default="512,2048,8192")
    p.add_argument("--impls", default=",".join(IMPLS))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--fp32", action="store_true", help="no bf16 autocast")
    p.add_argument("--grad-head", action="store_true", help="the head's weight trains (full fine-tuning)")
    p.add_argument("--one", help=argparse.SUPPRESS)  # impl:tokens, in the child process
    a = p.parse_args()
    if a.one:
        impl, tokens = a.one.rsplit(":", 1)
        print(json.dumps(one(impl, int(tokens), a.repeats, not a.fp32, a.grad_head)))
        return
    print(f"load: {os.getloadavg()}; bf16 autocast: {not a.fp32}; head trains: {a.grad_head}")
    print("| tokens | impl | fwd+bwd s (median) | peak GiB over the inputs |")
    print("| ---: | --- | ---: | ---: |")
    for tokens in a.tokens.split(","):
        for impl in a.impls.split(","):
            flags = [*(["--fp32"] if a.fp32 else []), *(["--grad-head"] if a.grad_head else [])]
            cmd = [sys.executable, __file__, "--one", f"{impl}:{tokens}", "--repeats", str(a.repeats), *flags]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            r = json.loads(out.splitlines()[-1])
            print(f"| {tokens} | {impl} | {r['s']:.3f} | {r['peak_gib']:.2f} |", flush=True)
    print(f"load after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
