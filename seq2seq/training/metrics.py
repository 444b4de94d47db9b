"""Metrics sinks: JSON Lines (``metrics.jsonl``) and TensorBoard event files (tensorboardX)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from tensorboardX import SummaryWriter


class MetricsWriter:
    """Append ``{"step", "split", "time", <metric>: value}`` records to both sinks.

    Args:
      workdir: run directory; files are appended to, so a resumed run continues them.
      enabled: False on non-zero processes of a multi-host run (only process 0 writes).
    """

    def __init__(self, workdir: str | Path, *, enabled: bool = True):
        self.enabled = enabled
        self.path = Path(workdir) / "metrics.jsonl"
        self.tb = SummaryWriter(str(Path(workdir) / "tensorboard")) if enabled else None

    def write(self, step: int, split: str, values: dict[str, Any]) -> None:
        """Record scalar ``values`` of ``split`` (``train``, ``dev``, ``test``) at ``step``."""
        if not self.enabled:
            return
        record = {"step": int(step), "split": split, "time": time.time(),
                  **{k: float(v) for k, v in values.items()}}
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        for k, v in values.items():
            self.tb.add_scalar(f"{split}/{k}", float(v), int(step))

    def close(self) -> None:
        """Flush and close the TensorBoard writer."""
        if self.tb is not None:
            self.tb.close()


def read_metrics(workdir: str | Path) -> list[dict[str, Any]]:
    """All records of ``workdir/metrics.jsonl`` (empty if the file does not exist)."""
    path = Path(workdir) / "metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]
