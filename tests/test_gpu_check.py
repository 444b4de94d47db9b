"""``tools/gpu_check.sh --dry``: the GPU check's every section runs on CPU at tiny sizes."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from tiny_run import cli_env

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_the_gpu_check_runs_dry_on_cpu(tmp_path):
    proc = subprocess.run(
        [str(ROOT / "tools" / "gpu_check.sh"), "--dry"],
        env=cli_env(PYTHON=sys.executable, OUT=str(tmp_path)),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (
        "test_cudnn_equals_dense_on_packed_rows_on_a_gpu"
        in (tmp_path / "gpu_tests.txt").read_text()
    )
    r = json.loads((tmp_path / "gpu_check.json").read_text())
    assert r["dry"] and r["backend"] == "cpu"
    assert [b["preset"] for b in r["bench"]] == ["transformer_base", "transformer_big"]
    for b in r["bench"]:
        assert b["step_seconds"] > 0 and math.isfinite(b["loss"])
        # MFU is the achieved rate over the measured peak: the same numbers, divided
        rate = b["achieved_tflops_per_second"] / r["bf16_peak_tflops_per_second"]
        assert b["mfu_of_measured_peak"] == pytest.approx(rate)
        assert b["plan_peak_bytes"] > 0  # the planner's reading of the same compiled step
    a = r["attention"]
    assert a["padding_queries"] > 0 and not a["nan"]
    assert a["max_output_difference"] == 0.0  # dense stands in for cudnn on CPU
    t = r["train"]
    assert t["returncode"] == 0 and t["steps"] == 2 and t["losses"]
    assert all(math.isfinite(x) for x in t["losses"]) and "read_seconds" in t["data"]
