"""Screenshot of ``seq2seq-serve``'s web page translating a sentence with a trained run.

    .venv/bin/python -m tools.serve_screenshot --workdir runs/tatoeba_en_es

starts ``seq2seq-serve`` on the run (127.0.0.1, a free port), waits for ``GET /health``, opens
the page in headless Chromium through Selenium (the browser ``tests/test_serve.py`` uses:
``/usr/bin/chromium`` and ``/usr/bin/chromedriver``; Selenium Manager downloads nothing),
translates ``--sentence`` with ``--nbest`` hypotheses, waits for the n-best list and the
attention heatmap, saves the page as a PNG (default ``docs/serve_page.png``, the README's
picture) and stops the server. The run directory is only read. Prints the translation, the
n-best list and the PNG's size; exits 1 if the page shows an error.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
SENTENCE = "I can't eat chicken."


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def serve_command(workdir: str, port: int, options: Sequence[str] = ()) -> list[str]:
    """``seq2seq-serve`` on ``workdir`` at 127.0.0.1:``port`` through this interpreter
    (``options``: more ``seq2seq-serve`` options, e.g. ``--beam 5``)."""
    return [
        sys.executable,
        "-m",
        "seq2seq",
        "serve",
        "--workdir",
        workdir,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *options,
    ]


def wait_for_health(url: str, proc: subprocess.Popen, timeout: float) -> dict:
    """Poll ``url/health`` until it answers 200; its JSON.

    Raises:
      RuntimeError: the server exited first (its exit status), or ``timeout`` seconds passed.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"seq2seq-serve exited with status {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as r:
                if r.status == 200:
                    return json.loads(r.read())
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.5)
    raise RuntimeError(f"seq2seq-serve did not answer {url}/health within {timeout:.0f} s")


def png_size(path: str | Path) -> tuple[int, int]:
    """``(width, height)`` in pixels from a PNG's header.

    Raises:
      ValueError: the file is not a PNG.
    """
    data = Path(path).read_bytes()[:24]
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError(f"{path} is not a PNG")
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def screenshot(
    url: str, sentence: str, nbest: int, output: str | Path, width: int, height: int = 0
) -> dict:
    """Translate ``sentence`` on the page at ``url`` in headless Chromium and save the page
    (``width`` × ``height`` pixels; ``height`` 0: as high as the page down to the heatmap).

    Returns:
      ``{"translation", "nbest": [(text, score text)], "cells"}`` as the page shows them.

    Raises:
      RuntimeError: the page shows an error (its text).
    """
    os.environ["SE_OFFLINE"] = "true"  # Selenium Manager never downloads anything
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    with tempfile.TemporaryDirectory() as profile:
        for flag in (
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            "--hide-scrollbars",
            f"--user-data-dir={profile}",
            f"--window-size={width},{height or 1200}",
        ):
            options.add_argument(flag)
        driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
        try:
            driver.get(url + "/")
            wait = WebDriverWait(driver, 120)
            wait.until(lambda d: "→" in d.find_element(By.ID, "pair").text)
            size = driver.find_element(By.ID, "nbest-size")
            size.clear()
            size.send_keys(str(nbest))
            driver.find_element(By.ID, "source").send_keys(sentence)
            driver.find_element(By.ID, "translate").click()
            wait.until(
                lambda d: (
                    d.find_elements(By.CSS_SELECTOR, "#heatmap td.cell")
                    or d.find_element(By.ID, "error").text
                )
            )
            error = driver.find_element(By.ID, "error").text
            if error:
                raise RuntimeError(f"the page shows an error: {error}")
            shown = {
                "translation": driver.find_element(By.CSS_SELECTOR, ".translation").text,
                "nbest": [
                    (
                        li.find_element(By.CSS_SELECTOR, ".text").text,
                        li.find_element(By.CSS_SELECTOR, ".score").text,
                    )
                    for li in driver.find_elements(By.CSS_SELECTOR, "#nbest li")
                ],
                "cells": len(driver.find_elements(By.CSS_SELECTOR, "#heatmap td.cell")),
            }
            if not height:  # fit the window to the page, down to the heatmap
                bottom = driver.execute_script(
                    "return Math.ceil(document.getElementById('heatmap')"
                    ".getBoundingClientRect().bottom + window.scrollY) + 24"
                )
                chrome = driver.execute_script("return window.outerHeight - window.innerHeight")
                driver.set_window_size(width, int(bottom) + max(int(chrome), 0))
            Path(output).parent.mkdir(parents=True, exist_ok=True)
            driver.save_screenshot(str(output))
            return shown
        finally:
            driver.quit()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", required=True, help="a trained run directory (only read)")
    parser.add_argument("--sentence", default=SENTENCE, help=f"default {SENTENCE!r}")
    parser.add_argument("--nbest", type=int, default=3, help="hypotheses shown (default 3)")
    parser.add_argument(
        "--output", default=str(ROOT / "docs" / "serve_page.png"), help="PNG to write"
    )
    parser.add_argument("--width", type=int, default=900, help="window width in pixels")
    parser.add_argument(
        "--height",
        type=int,
        default=0,
        help="window height in pixels (default 0: the page's, down to the heatmap)",
    )
    parser.add_argument(
        "--timeout", type=float, default=600, help="seconds to wait for the server (loading)"
    )
    parser.add_argument(
        "serve_options", nargs="*", help="more seq2seq-serve options after --, e.g. -- --beam 5"
    )
    args = parser.parse_args(argv)
    if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
        print(f"needs {CHROMIUM} and {CHROMEDRIVER} (apt-get install chromium chromium-driver)")
        return 1
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    )
    proc = subprocess.Popen(
        serve_command(args.workdir, port, args.serve_options), env=env, cwd=ROOT
    )
    try:
        health = wait_for_health(url, proc, args.timeout)
        shown = screenshot(url, args.sentence, args.nbest, args.output, args.width, args.height)
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    print(f"run: {health.get('workdir', args.workdir)}")
    print(f"{args.sentence} → {shown['translation']}")
    for i, (text, score) in enumerate(shown["nbest"], 1):
        print(f"  {i}. {text}  ({score})")
    width, height = png_size(args.output)
    print(f"wrote {args.output} ({width}×{height} pixels, {shown['cells']} heatmap cells)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
