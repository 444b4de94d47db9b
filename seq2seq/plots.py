"""Training curves of a run (from ``metrics.jsonl``) and cross-attention heatmaps as PNGs, drawn
with matplotlib's Agg backend."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from seq2seq.alignment import Attention
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


def plot_attention(
    attention: Attention,
    output: str | Path,
    *,
    layer: int | None = None,
    head: int | None = None,
    title: str = "",
) -> Path:
    """Draw a cross-attention heatmap (rows: target pieces, columns: source pieces, EOS
    included) with the hard alignment (``Attention.hard`` of the drawn weights) marked.

    Args:
      attention: from ``seq2seq.alignment.cross_attention``.
      output: the PNG to write.
      layer, head: draw one decoder layer / head (default: the mean over them).
      title: shown above the plot (e.g. the translation).

    Returns:
      The path written.

    Raises:
      ValueError: ``layer`` or ``head`` out of range (the message gives the counts).
    """
    layers, heads = attention.weights.shape[:2]
    if layer is not None and not 0 <= layer < layers:
        raise ValueError(
            f"--layer {layer}: the model has {layers} decoder layers (0..{layers - 1})"
        )
    if head is not None and not 0 <= head < heads:
        raise ValueError(f"--head {head}: the model has {heads} heads (0..{heads - 1})")
    w = attention.weights
    w = w.mean(axis=0) if layer is None else w[layer]
    w = w.mean(axis=0) if head is None else w[head]  # [T, S]
    shown = Attention(attention.source, attention.target, w[None, None])
    src, tgt = attention.source, attention.target
    fig = Figure(figsize=(max(4.0, 0.45 * len(src) + 2), max(3.0, 0.4 * len(tgt) + 1.5)))
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    image = ax.imshow(w, cmap="Blues", vmin=0.0, vmax=max(float(w.max()), 1e-9))
    ax.set_xticks(range(len(src)), src, rotation=90)
    ax.set_yticks(range(len(tgt)), tgt)
    ax.set(xlabel="source", ylabel="target")
    for i, j in shown.hard():
        ax.add_patch(Rectangle((i - 0.5, j - 0.5), 1, 1, fill=False, edgecolor="red", lw=1.5))
    fig.colorbar(image, ax=ax, fraction=0.04)
    what = f"layer {'mean' if layer is None else layer}, head {'mean' if head is None else head}"
    ax.set_title(f"{title}\n{what}" if title else what, fontsize="small")
    path = Path(output)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    return path
