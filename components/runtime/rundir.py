"""The run dir: versions, metrics, plots and the human summary every run leaves behind."""

from __future__ import annotations

import importlib.metadata
import json
import platform
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

VERSIONED_PACKAGES = (
    "hydratune",
    "torch",
    "transformers",
    "trl",
    "peft",
    "accelerate",
    "datasets",
    "tokenizers",
    "hydra-core",
    "omegaconf",
    "safetensors",
    "deepspeed",
    "bitsandbytes",
    "liger-kernel",
    "wandb",
    "mlflow",
)


def git_sha(start: Path) -> str | None:
    """The commit of the checkout holding ``start``, '+dirty' when it has local changes."""
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=start, capture_output=True, text=True, timeout=5, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=start,
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return sha + ("+dirty" if dirty else "")


def package_versions() -> dict[str, str | None]:
    """Installed versions of python and the libraries a run depends on (None = not installed)."""
    versions: dict[str, str | None] = {"python": sys.version.split()[0], "platform": platform.platform()}
    for name in VERSIONED_PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    versions["git_sha"] = git_sha(Path(__file__).resolve().parent)
    return versions


def run_environment() -> dict[str, str]:
    """The variables of this process that shape a run (hub and offline flags, threads, CUDA / NCCL, trackers:
    those DeepSpeed's hostfile launcher carries to every host), secrets' values as ``<set>``."""
    from hydratune.components.config.trust import secret_name
    from hydratune.components.distributed.hostfile import forwarded

    return {k: "<set>" if secret_name(k) else v for k, v in forwarded(paths=False).items()}


class RunDir:
    """Paths and writers of one run dir (Hydra's output dir)."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"

    @property
    def final(self) -> Path:
        return self.path / "final"

    @property
    def metrics_file(self) -> Path:
        return self.path / "metrics.jsonl"

    def write_json(self, name: str, data: Any) -> Path:
        out = self.path / name
        tmp = out.with_suffix(out.suffix + ".tmp")
        tmp.write_text(json.dumps(data, indent=2, default=str) + "\n")
        tmp.replace(out)
        return out

    def write_versions(self, extra: dict[str, Any] | None = None) -> Path:
        return self.write_json(
            "versions.json", {**package_versions(), **(extra or {}), "environment": run_environment()}
        )

    def append_metrics(self, record: dict[str, Any]) -> None:
        with self.metrics_file.open("a") as f:
            f.write(json.dumps(record, default=float) + "\n")

    def read_metrics(self) -> list[dict[str, Any]]:
        if not self.metrics_file.exists():
            return []
        return [json.loads(line) for line in self.metrics_file.read_text().splitlines() if line.strip()]

    def plot_losses(self, name: str = "loss.png") -> Path | None:
        """Train and eval loss curves against the optimizer step."""
        records = self.read_metrics()
        series = {
            key: [(r["step"], r[key]) for r in records if key in r and "step" in r]
            for key in ("loss", "eval_loss")
        }
        if not any(series.values()):
            return None
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        for key, points in series.items():
            if points:
                xs, ys = zip(*points, strict=True)
                label = "eval loss" if key == "eval_loss" else "train loss"
                ax.plot(xs, ys, marker="o" if key == "eval_loss" else None, label=label)
        ax.set_xlabel("optimizer step")
        ax.set_ylabel("loss")
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        out = self.path / name
        fig.savefig(out, dpi=110)
        plt.close(fig)
        return out

    def write_summary(
        self, title: str, sections: Iterable[tuple[str, dict[str, Any] | list[dict[str, Any]]]]
    ) -> Path:
        """``summary.md``: one markdown table per section: key | value rows for a dict, one column per key
        for a list of dicts (e.g. the loss mask's segments)."""
        lines = [f"# {title}", ""]
        for heading, rows in sections:
            if not rows:
                continue
            lines += [f"## {heading}", ""]
            if isinstance(rows, list):
                columns = list(rows[0])
                lines += ["| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
                lines += ["| " + " | ".join(_fmt(r.get(c, "")) for c in columns) + " |" for r in rows]
            else:
                lines += ["| | |", "| --- | --- |"]
                lines += [f"| {k} | {_fmt(v)} |" for k, v in rows.items()]
            lines.append("")
        out = self.path / "summary.md"
        out.write_text("\n".join(lines))
        return out


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value).replace("|", "\\|")
