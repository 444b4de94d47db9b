"""Metrics sinks: JSON Lines (``metrics.jsonl``) and TensorBoard event files (tensorboardX)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from tensorboardX import SummaryWriter


class MetricsWriter:
    """Append ``{"step", "split", "time", <metric>: value}`` records to both sinks.

    A resumed run passes ``resume_step``: records written after that checkpoint by the run that
    was interrupted (they will be recomputed) are dropped from ``metrics.jsonl``, and TensorBoard
    is told to purge its events after that step, so neither shows a step twice.

    Args:
      workdir: run directory; files are appended to, so a resumed run continues them.
      enabled: False on non-zero processes of a multi-host run (only process 0 writes).
      resume_step: the step of the restored checkpoint, or None for a fresh run.
    """

    def __init__(
        self, workdir: str | Path, *, enabled: bool = True, resume_step: int | None = None
    ):
        self.enabled = enabled
        self.path = Path(workdir) / "metrics.jsonl"
        self.dropped = 0
        if enabled and resume_step is not None:
            self.dropped = truncate_metrics(workdir, resume_step)
        purge = None if resume_step is None else resume_step + 1
        self.tb = (
            SummaryWriter(str(Path(workdir) / "tensorboard"), purge_step=purge) if enabled else None
        )

    def write(self, step: int, split: str, values: dict[str, Any]) -> None:
        """Record scalar ``values`` of ``split`` (``train``, ``dev``, ``test``) at ``step``.

        None values are left out.
        """
        if not self.enabled:
            return
        values = {k: float(v) for k, v in values.items() if v is not None}
        record = {"step": int(step), "split": split, "time": time.time(), **values}
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        assert self.tb is not None  # enabled: __init__ opened the writer
        for k, v in values.items():
            self.tb.add_scalar(f"{split}/{k}", v, int(step))

    def close(self) -> None:
        """Flush and close the TensorBoard writer."""
        if self.tb is not None:
            self.tb.close()


def truncate_metrics(workdir: str | Path, step: int) -> int:
    """Drop records after ``step`` from ``workdir/metrics.jsonl`` (atomically); returns how many.

    A torn last line (a crash mid-write) is dropped too.
    """
    path = Path(workdir) / "metrics.jsonl"
    if not path.is_file():
        return 0
    kept, dropped = [], 0
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            dropped += 1
            continue
        if record.get("step", 0) > step:
            dropped += 1
        else:
            kept.append(line + "\n")
    if dropped:
        tmp = path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(kept), encoding="utf-8")
        os.replace(tmp, path)
    return dropped


def read_metrics(workdir: str | Path) -> list[dict[str, Any]]:
    """All records of ``workdir/metrics.jsonl`` (empty if the file does not exist).

    Blank or torn lines are skipped.
    """
    path = Path(workdir) / "metrics.jsonl"
    if not path.is_file():
        return []
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records
