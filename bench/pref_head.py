"""A DPO micro-batch's LM head alone (a bench, not a test): forward + backward time and peak memory of the
log-probs DPO takes from the head, on SmolLM2-135M's shapes (vocabulary 49,152, hidden 576), LoRA's way (the
head frozen, the reference: the same model, a second pass under no_grad), bf16 autocast, for

* ``trl``: TRL 1.16's fused head as its ``DPOTrainer`` calls it on a CPU: every position (prompt and padding
  too), the log-probs, entropy, mean logit and top-1 of each, in both passes;
* ``chunked``: hydratune's (``components/runtime/fused_head.py``) on a step that does not log: the
  completion positions only, log-probs only;
* ``chunked+metrics``: the same on a logging step (entropy, mean logit and top-1 in the policy's pass).

``rows`` rows of ``length`` tokens, the last third of each in the loss (DPO's completions). Each
(implementation, length) runs in its own process, ``--rounds`` times alternated (A B C, C B A, ...): its
time is the median over the rounds of each process's median of ``--repeats`` passes after a warm-up; its
peak the resident-set high-water mark over the process's size with its inputs.

    python bench/pref_head.py --lengths 128,1024 --rounds 2
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
IMPLS = ("trl", "chunked", "chunked+metrics")
TRL_OUTPUTS = ("log_probs", "entropy", "mean_logits", "is_top1")  # DPOTrainer's add_fused_lm_head call


def rss_gib() -> float:
    """The current resident set (Linux /proc), in GiB."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**30


def one(impl: str, rows: int, length: int, repeats: int) -> dict:
    """Time and peak of ``impl`` on ``rows`` x ``length`` tokens (in this process)."""
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: hydratune.*
    from hydratune.components.runtime.fused_head import ChunkedTokenStats
    from hydratune.components.runtime.lm_loss import chunk_for

    torch.manual_seed(0)
    head = torch.nn.Linear(HIDDEN, VOCAB, bias=False).requires_grad_(False)
    h0 = torch.randn(rows, length, HIDDEN)
    labels = torch.randint(0, VOCAB, (rows, length))
    labels[:, : 2 * length // 3] = -100  # the prompt
    shifted = labels[:, 1:]
    mask = shifted != -100

    def log_probs(h: torch.Tensor, metrics: bool) -> torch.Tensor:
        if impl == "trl":
            from trl.kernels import ChunkedLogProbFunction
            from trl.trainer.utils import _CHUNKED_LOGPROB_CHUNK_SIZE

            lp, *_ = ChunkedLogProbFunction.apply(
                h[:, :-1].reshape(-1, HIDDEN),
                head.weight,
                None,
                shifted.clamp(min=0).reshape(-1),
                1.0,
                _CHUNKED_LOGPROB_CHUNK_SIZE,
                None,
                1.0,
                TRL_OUTPUTS,
            )
            return lp.view(mask.shape).masked_fill(~mask, 0)
        lp, _ = ChunkedTokenStats.apply(
            h[:, :-1][mask], head.weight, None, shifted[mask], chunk_for(VOCAB), metrics
        )
        return lp.new_zeros(mask.shape).masked_scatter(mask, lp)

    def step() -> None:
        h = h0.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            policy = log_probs(h, impl == "chunked+metrics").sum(1)
            with torch.no_grad():
                reference = log_probs(h0, False).sum(1)
        chosen, rejected = (policy - reference).chunk(2)
        loss = -torch.nn.functional.logsigmoid(0.1 * (chosen - rejected)).mean()
        loss.backward()

    before = rss_gib()
    times = []
    for _ in range(repeats + 1):  # the first pass is the warm-up
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB
    return {"impl": impl, "length": length, "s": statistics.median(times[1:]), "peak_gib": peak - before}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=8, help="rows a micro-batch (DPO: 2 per pair)")
    p.add_argument("--lengths", default="128,1024")
    p.add_argument("--impls", default=",".join(IMPLS))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--rounds", type=int, default=2, help="processes per cell, the order alternated")
    p.add_argument("--one", help=argparse.SUPPRESS)  # impl:length, in the child process
    a = p.parse_args()
    if a.one:
        impl, length = a.one.rsplit(":", 1)
        print(json.dumps(one(impl, a.rows, int(length), a.repeats)))
        return
    print(
        f"load: {os.getloadavg()}; {a.rows} rows, bf16 autocast, threads {os.environ.get('OMP_NUM_THREADS')}"
    )
    print("| tokens a row | impl | fwd+bwd s (median) | peak GiB over the inputs | per round s |")
    print("| ---: | --- | ---: | ---: | --- |")
    impls = a.impls.split(",")
    for length in a.lengths.split(","):
        got: dict[str, list[dict]] = {i: [] for i in impls}
        for r in range(a.rounds):
            for impl in impls if r % 2 == 0 else impls[::-1]:
                cmd = [sys.executable, __file__, "--one", f"{impl}:{length}"]
                cmd += ["--rows", str(a.rows), "--repeats", str(a.repeats)]
                out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
                got[impl].append(json.loads(out.splitlines()[-1]))
        for impl in impls:
            s = [r["s"] for r in got[impl]]
            peak = statistics.median(r["peak_gib"] for r in got[impl])
            rounds = " / ".join(f"{x:.3f}" for x in s)
            print(f"| {length} | {impl} | {statistics.median(s):.3f} | {peak:.2f} | {rounds} |", flush=True)
    print(f"load after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
