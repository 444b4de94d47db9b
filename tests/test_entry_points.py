"""The entry points themselves: ``python -m seq2seq COMMAND`` equals the console scripts,
``seq2seq-params`` reads every shipped config, and translation falls back to data
parallelism when a run's mesh does not fit this machine."""

import subprocess
import sys

import pytest
from tiny_run import ROOT, cli_env

from seq2seq import cli
from seq2seq.__main__ import COMMANDS, main
from seq2seq.config import load_config
from seq2seq.inference import partitioner_for

CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))


def test_module_commands_are_the_console_scripts():
    import tomllib

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert {
        f"seq2seq-{name}": f"seq2seq.cli:{fn.__name__}" for name, fn in COMMANDS.items()
    } == scripts


def test_python_dash_m_runs_a_command(capsys):
    proc = subprocess.run(
        [sys.executable, "-m", "seq2seq", "params", "--config", "configs/transformer_base.yaml"],
        env=cli_env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert cli.params_main(["--config", str(ROOT / "configs/transformer_base.yaml")]) == 0
    assert proc.stdout == capsys.readouterr().out and "heads 8, layers 6+6" in proc.stdout
    assert main(["transalte"]) == 2
    assert "unknown command 'transalte'" in capsys.readouterr().err


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_params_of_every_shipped_config(path, capsys):
    assert cli.params_main(["--config", str(path)]) == 0
    out = capsys.readouterr().out
    m = load_config(path).model
    assert f"d_model {m.d_model}, d_ff {m.d_ff}, heads {m.num_heads}" in out
    total = [line for line in out.splitlines() if line.startswith("total")]
    assert total and int(total[0].split()[-2].replace(",", "")) > 1_000_000


def test_decoding_falls_back_to_data_parallel_when_the_runs_mesh_does_not_fit():
    config = load_config(None, ["mesh.data=1", "mesh.fsdp=8"])  # an 8-device run, here 1 device
    p = partitioner_for(config)
    assert dict(p.mesh.shape) == {"data": 1, "fsdp": 1, "tensor": 1}
    assert dict(partitioner_for(load_config(None, [])).mesh.shape)["data"] == 1
