"""tools/serve_screenshot.py: the README's picture of the web page, taken from a run."""

import importlib.util
import os
import shutil
import subprocess
import sys

import pytest
from tiny_run import ROOT, random_run

from seq2seq import cli


def _load_script():
    path = ROOT / "tools" / "serve_screenshot.py"
    spec = importlib.util.spec_from_file_location("serve_screenshot", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


shot = _load_script()


def test_png_size_reads_the_header_and_refuses_other_files(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=(3.2, 2.4), dpi=100)  # 320 × 240 pixels
    fig.savefig(tmp_path / "a.png")
    plt.close(fig)
    assert shot.png_size(tmp_path / "a.png") == (320, 240)
    (tmp_path / "b.png").write_bytes(b"GIF89a" + bytes(40))
    with pytest.raises(ValueError, match="is not a PNG"):
        shot.png_size(tmp_path / "b.png")


def test_the_server_command_and_a_server_that_dies(tmp_path):
    port = shot.free_port()
    command = shot.serve_command("runs/x", port, ["--beam", "5"])
    assert command[1:] == [
        "-m",
        "seq2seq",
        "serve",
        "--workdir",
        "runs/x",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--beam",
        "5",
    ]
    # a server that exits before it answers is reported with its status, not waited for
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    with pytest.raises(RuntimeError, match="exited with status 3"):
        shot.wait_for_health(f"http://127.0.0.1:{port}", proc, timeout=60)
    # nothing listening and no exit: the timeout
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        with pytest.raises(RuntimeError, match="did not answer"):
            shot.wait_for_health(f"http://127.0.0.1:{port}", sleeper, timeout=1)
    finally:
        sleeper.kill()
        sleeper.wait()


@pytest.mark.slow
@pytest.mark.skipif(
    not (os.path.exists(shot.CHROMIUM) and shutil.which(shot.CHROMEDRIVER)),
    reason="needs Chromium and its driver from the system packages",
)
def test_the_script_photographs_the_page_of_a_run(tmp_path, capsys):
    run = random_run(tmp_path / "run", "decode.beam_size=3", "decode.max_len_a=0.5")
    png = tmp_path / "page.png"
    assert shot.main(["--workdir", str(run), "--output", str(png), "--width", "800"]) == 0
    width, height = shot.png_size(png)
    assert width == 800 and 400 < height < 3000  # fitted to the page
    out = capsys.readouterr().out
    # what the page showed is what seq2seq-translate gives for the sentence (beam 3, 3-best)
    (tmp_path / "in.txt").write_text(shot.SENTENCE + "\n", encoding="utf-8")
    argv = ["--workdir", str(run), "--input", str(tmp_path / "in.txt"), "--nbest", "3"]
    assert cli.translate_main([*argv, "--output", str(tmp_path / "out.txt")]) == 0
    rows = [r.split(" ||| ") for r in (tmp_path / "out.txt").read_text().splitlines()]
    assert f"{shot.SENTENCE} → {rows[0][1]}\n" in out
    for i, row in enumerate(rows, 1):
        assert f"  {i}. {row[1]}  (score {row[3]}" in out
