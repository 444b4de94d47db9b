"""Training curves of a run as a PNG, drawn with matplotlib's Agg backend from ``metrics.jsonl``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from seq2seq.training.metrics import read_metrics


def curves(records: list[dict[str, Any]]) -> dict[tuple[str, str], tuple[list[int], list[float]]]:
    """``{(split, metric): (steps, values)}`` from metric records, sorted by step.

    If a step of a split appears more than once (a run resumed before records were
    deduplicated), the last record wins.
    """
    latest: dict[tuple[str, int], dict[str, Any]] = {}
    for r in records:
        latest[(r.get("split", "?"), int(r.get("step", 0)))] = r
    out: dict[tuple[str, str], tuple[list[int], list[float]]] = {}
    for (split, step), r in sorted(latest.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        for k, v in r.items():
            if k in ("step", "split", "time") or not isinstance(v, (int, float)):
                continue
            steps, values = out.setdefault((split, k), ([], []))
            steps.append(step)
            values.append(float(v))
    return out


def plot_run(workdir: str | Path, output: str | Path | None = None) -> Path:
    """Draw a run's curves into one PNG: train/dev loss, dev BLEU (and the test score at the
    step of the checkpoint decoded), learning rate, gradient norm. Axes are optimizer steps.

    Args:
      workdir: a run directory with ``metrics.jsonl``.
      output: the PNG to write (default ``workdir/curves.png``).

    Returns:
      The path written.

    Raises:
      FileNotFoundError: ``workdir/metrics.jsonl`` is missing or holds no records.
    """
    workdir = Path(workdir)
    records = read_metrics(workdir)
    if not records:
        raise FileNotFoundError(f"no metrics in {workdir / 'metrics.jsonl'}")
    data = curves(records)
    fig = Figure(figsize=(11, 7), layout="constrained")
    FigureCanvasAgg(fig)
    (loss_ax, bleu_ax), (lr_ax, grad_ax) = fig.subplots(2, 2, sharex=True)

    def draw(ax, key, label, **kw):
        if key in data:
            steps, values = data[key]
            ax.plot(
                steps,
                values,
                label=label,
                marker="o" if len(steps) < 30 else None,
                markersize=3,
                **kw,
            )

    draw(loss_ax, ("train", "loss"), "train loss (smoothed)")
    draw(loss_ax, ("dev", "loss"), "dev loss (smoothed)")
    draw(loss_ax, ("dev", "nll"), "dev NLL", linestyle="--")
    loss_ax.set(title="loss per target token (nats)", ylabel="loss")
    draw(bleu_ax, ("dev", "bleu"), "dev BLEU")
    tests = [r for r in records if r.get("split") == "test" and "bleu" in r]
    if tests:  # drawn at the step of the checkpoint that was decoded
        bleu_ax.scatter(
            [r.get("checkpoint", r["step"]) for r in tests],
            [r["bleu"] for r in tests],
            color="black",
            marker="*",
            s=80,
            label="test BLEU",
            zorder=3,
        )
    bleu_ax.set(title="BLEU (sacreBLEU)", ylabel="BLEU")
    draw(lr_ax, ("train", "learning_rate"), "learning rate")
    lr_ax.set(title="learning rate", xlabel="step")
    draw(grad_ax, ("train", "grad_norm"), "gradient norm (before clipping)")
    grad_ax.set(title="gradient norm", xlabel="step")
    for ax in (loss_ax, bleu_ax, lr_ax, grad_ax):
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small")
        else:
            ax.text(0.5, 0.5, "no data yet", ha="center", va="center", transform=ax.transAxes)
    fig.suptitle(f"{workdir.name}: {max(r.get('step', 0) for r in records)} steps")
    path = Path(output) if output else workdir / "curves.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    return path
