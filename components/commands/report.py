"""``hydratune report <multirun dir>``: one row per sweep point (overrides, final / best metrics; a point
whose config was refused is a row too, status ``refused``, with its error) as markdown and CSV, and a PNG
overlaying the points' loss curves."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import yaml

from hydratune.components.config.errors import ConfigError
from hydratune.components.distributed.slurm_sweep import POINT_FILE

COLUMNS = (
    "job",
    "overrides",
    "status",
    "final loss",
    "best eval_loss",
    "eval accuracy",
    "wall time (s)",
    "tokens/s",
    "error",
)
#: left in a sweep point's run dir by the CLI when its config was refused (recipes/cli.py)
REFUSED_FILE = "refused.txt"


def _metrics(job: Path) -> list[dict[str, Any]]:
    path = job / "metrics.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.is_file() else []


def job_row(job: Path, sweep_dir: Path) -> dict[str, Any]:
    """One sweep point: its overrides and what it reached."""
    overrides = yaml.safe_load((job / ".hydra" / "overrides.yaml").read_text()) or []
    records = _metrics(job)
    losses = [r["loss"] for r in records if "loss" in r]
    evals = [r["eval_loss"] for r in records if "eval_loss" in r]
    result = json.loads((job / "result.json").read_text()) if (job / "result.json").is_file() else {}
    refused = job / REFUSED_FILE
    error = refused.read_text().splitlines()[0] if refused.is_file() else None
    status = "interrupted" if "interrupted" in result else "ok" if (job / "final").is_dir() else "failed"
    status = "refused" if error else status
    slurm = job / POINT_FILE  # a SLURM job that ended without a result, or with an error
    if slurm.is_file() and status != "ok":
        record = json.loads(slurm.read_text())
        state = str(record["state"]).split()[0].lower()  # cancelled, failed, timeout, node_fail, ...
        status = status if status == "interrupted" else state if state != "completed" else "failed"
        error = f"SLURM job {record['job']} {record['state']}: {record['reason']}"
    accuracy = result.get("eval accuracy (exact match)", {}).get("after")
    cost = result.get("cost", {})
    return {
        "job": str(job.relative_to(sweep_dir)),
        "overrides": " ".join(overrides),
        "status": status,
        "final loss": round(losses[-1], 4) if losses else None,
        "best eval_loss": round(min(evals), 4) if evals else None,
        "eval accuracy": accuracy,
        "wall time (s)": cost.get("wall time (s)"),
        "tokens/s": cost.get("tokens/s (train, non-pad)"),
        "error": error,
    }


def jobs_of(sweep_dir: Path) -> list[Path]:
    """The run dirs of a multirun dir, in job order."""
    jobs = [p.parent.parent for p in sweep_dir.glob("**/.hydra/overrides.yaml")]
    return sorted(jobs, key=lambda p: [int(x) if x.isdigit() else x for x in p.relative_to(sweep_dir).parts])


def to_markdown(rows: list[dict[str, Any]]) -> str:
    def cell(v: Any) -> str:
        return "" if v is None else (f"{v:.4g}" if isinstance(v, float) else str(v)).replace("|", "\\|")

    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + " --- |" * len(COLUMNS)]
    lines += ["| " + " | ".join(cell(r[c]) for c in COLUMNS) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def plot_overlay(sweep_dir: Path, jobs: list[Path], rows: list[dict[str, Any]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for job, row in zip(jobs, rows, strict=True):
        points = [(r["step"], r["loss"]) for r in _metrics(job) if "loss" in r]
        if points:
            xs, ys = zip(*points, strict=True)
            ax.plot(xs, ys, label=row["overrides"] or row["job"])
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("train loss")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def write_report(sweep_dir: Path) -> tuple[str, list[dict[str, Any]]]:
    """Write ``report.md``, ``report.csv`` and ``report.png`` into ``sweep_dir``; return the markdown."""
    sweep_dir = Path(sweep_dir)
    jobs = jobs_of(sweep_dir) if sweep_dir.is_dir() else []
    if not jobs:
        raise ConfigError(
            f"no runs under {sweep_dir}",
            key="report",
            hint="pass a multirun dir: hydratune report multirun/<date>/<time>",
        )
    rows = [job_row(job, sweep_dir) for job in jobs]
    markdown = to_markdown(rows)
    failed = [r for r in rows if r["status"] not in ("ok", "interrupted")]
    if failed:
        markdown += (
            f"\n{len(failed)} of {len(rows)} points failed: "
            + ", ".join(f"{r['job']} ({r['status']})" for r in failed)
            + "\n"
        )
    (sweep_dir / "report.md").write_text(f"# Sweep {sweep_dir}\n\n{markdown}")
    with (sweep_dir / "report.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    plot_overlay(sweep_dir, jobs, rows, sweep_dir / "report.png")
    return markdown, rows
