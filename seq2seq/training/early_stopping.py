"""Best-checkpoint selection and early stopping, as JSON that travels in each checkpoint.

The tracker is stored in every checkpoint's metadata, so a resumed run knows the best value so
far, its step and how many evaluations have passed without improvement: patience survives
preemption and restarts.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

MODES = {"bleu": "max", "loss": "min"}


@dataclass
class BestTracker:
    """The best value of one dev metric and the evaluations since it last improved.

    Attributes:
      metric: ``bleu`` (higher is better) or ``loss`` (lower is better).
      value: the best value so far (None before the first evaluation).
      step: the step where it was reached.
      evals_without_improvement: evaluations in a row that did not improve ``value``.

    Raises:
      ValueError: ``metric`` is not one of ``MODES``.
    """

    metric: str
    value: float | None = None
    step: int | None = None
    evals_without_improvement: int = 0

    def __post_init__(self):
        if self.metric not in MODES:
            raise ValueError(f"unknown best metric {self.metric!r}; use one of {sorted(MODES)}")

    @property
    def mode(self) -> str:
        """``max`` or ``min``: which direction is better."""
        return MODES[self.metric]

    def update(self, value: float, step: int) -> bool:
        """Record an evaluation; returns True if ``value`` is a new best (strictly better).

        A non-finite value never improves.
        """
        better = math.isfinite(value) and (
            self.value is None or (value > self.value if self.mode == "max" else value < self.value))
        if better:
            self.value, self.step, self.evals_without_improvement = float(value), int(step), 0
        else:
            self.evals_without_improvement += 1
        return better

    def should_stop(self, patience: int) -> bool:
        """True when ``patience`` > 0 evaluations in a row brought no improvement."""
        return patience > 0 and self.evals_without_improvement >= patience

    def to_json(self) -> dict[str, Any]:
        """A plain dict for the checkpoint's JSON metadata."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any] | None, metric: str) -> "BestTracker":
        """The tracker saved in a checkpoint, or a fresh one if none was saved or it tracked a
        different metric (e.g. ``train.best_metric`` changed between runs)."""
        if not data or data.get("metric") != metric:
            return cls(metric)
        return cls(metric=metric, value=data.get("value"), step=data.get("step"),
                   evals_without_improvement=int(data.get("evals_without_improvement", 0)))
