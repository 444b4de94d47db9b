"""seq2seq-serve (Starlette on uvicorn): the LibreTranslate and plain bodies, bad requests,
batching of concurrent requests, a load test, and the web page in headless Chromium; and the
cross-attention behind it (``seq2seq-translate --alignments``, ``seq2seq-plot --attention``)."""

import contextlib
import importlib.util
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
from tiny_run import ROOT, cli_env, random_run

from seq2seq import cli
from seq2seq.alignment import Attention, cross_attention, pharaoh

pytest.importorskip("starlette", reason="the serve extra: pip install -e '.[serve]'")
import uvicorn  # noqa: E402

from seq2seq.serve import Limits, Service, make_app  # noqa: E402

SENTENCES = ["I can't eat chicken.", "Tom is here.", "Where did you put the keys?", "Yes."]
# one row per decode (a 16-token budget): one compiled search per width bucket, whatever the
# batch, keeps the tests cheap; the batching under test is the number of translate calls
BEAM = ["--beam", "4", "--max-tokens", "16"]
SHORT = ["Tom is here.", "Yes.", "Él no está aquí."]  # one width bucket (16 tokens)


def _load_script():
    spec = importlib.util.spec_from_file_location("load_test", ROOT / "tools" / "load_test.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


load_test = _load_script()


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A random 1+2-layer, 2-head model with a real tokenizer; short outputs (0.5·|x| + 4)."""
    return random_run(
        tmp_path_factory.mktemp("serve") / "run",
        "decode.max_len_a=0.5",
        "decode.max_len_b=4",
        num_decoder_layers=2,
    )


def _translator(run_dir, *options):
    args = cli._decode_parser("t", "").parse_args(["--workdir", str(run_dir), *options])
    return cli._translator(args, cli._load(args))


@pytest.fixture(scope="module")
def translator(run_dir):
    """The translator seq2seq-translate builds for the run, with --beam 4."""
    return _translator(run_dir, *BEAM)


def _free_socket() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    return sock


@pytest.fixture(scope="module")
def server(translator):
    """The app on a real uvicorn server in a thread, on a free localhost port."""
    with _serving(translator) as running:
        yield running


@contextlib.contextmanager
def _serving(translator):
    service = Service(
        translator,
        "en",
        "es",
        limits=Limits(max_sentences=8, max_body_bytes=100_000, max_nbest=8),
        window_ms=100,
        max_batch=32,
    )
    sock = _free_socket()
    config = uvicorn.Config(make_app(service), log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    for _ in range(200):
        if server.started:
            break
        time.sleep(0.05)
    yield url, service
    server.should_exit = True
    thread.join(30)
    sock.close()


def _request(url, body, content_type="application/json", method="POST"):
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data, {"Content-Type": content_type}, method=method)
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            raw, status, ctype = r.read(), r.status, r.headers["content-type"]
    except urllib.error.HTTPError as e:
        raw, status, ctype = e.read(), e.code, e.headers["content-type"]
    return status, (json.loads(raw) if "json" in ctype else raw.decode())


def _get(url):
    return _request(url, None, method="GET")


def _reference(translator, lines, nbest=1):
    return translator.translate(lines, nbest=nbest)


def test_translate_bodies_agree_with_the_translator(server, translator):
    url, service = server
    ref = _reference(translator, SENTENCES, nbest=3)
    best = [h[0].text for h in ref]
    assert _request(url + "/translate", {"q": SENTENCES[0], "source": "en", "target": "es"}) == (
        200,
        {"translatedText": best[0]},
    )
    status, out = _request(
        url + "/translate",
        {"q": SENTENCES, "source": "auto", "target": "es", "format": "text", "alternatives": 2},
    )
    assert status == 200 and out["translatedText"] == best
    assert out["alternatives"] == [[h.text for h in hs[1:]] for hs in ref]
    for got, hs in zip(out["nbest"], ref):
        assert [g["text"] for g in got] == [h.text for h in hs]
        np.testing.assert_allclose([g["score"] for g in got], [h.score for h in hs], atol=1e-4)
        np.testing.assert_allclose([g["logprob"] for g in got], [h.logprob for h in hs], atol=1e-4)
        assert [g["score"] for g in got] == sorted((g["score"] for g in got), reverse=True)
    status, out = _request(url + "/translate", {"text": SENTENCES[:2], "nbest": 2})
    assert status == 200 and [t["text"] for t in out["translations"]] == best[:2]
    assert [[n["text"] for n in t["nbest"]] for t in out["translations"]] == [
        [h.text for h in hs[:2]] for hs in ref[:2]
    ]
    status, text = _request(url + "/translate", "\n".join(SENTENCES).encode(), "text/plain")
    assert status == 200 and text == "".join(b + "\n" for b in best)
    # empty and whitespace-only sentences translate to empty strings
    assert _request(url + "/translate", {"q": ["", "  ", SENTENCES[1]]}) == (
        200,
        {"translatedText": ["", "", best[1]]},
    )
    status, health = _get(url + "/health")
    assert status == 200 and health["source"] == "en" and health["search"] == "beam 4"
    assert health["max_nbest"] == 4  # capped at the beam size
    assert _get(url + "/languages")[1][0] == {"code": "en", "name": "en", "targets": ["es"]}
    status, page = _get(url + "/")
    assert status == 200 and 'id="heatmap"' in page


def test_mbr_serves_what_translate_gives(run_dir):
    """``seq2seq-serve --search mbr``: the server's n-best are the MBR choices of the
    ``Translator`` that ``seq2seq-translate --search mbr`` builds, best first by expected chrF."""
    mbr = _translator(run_dir, "--search", "mbr", "--mbr-candidates", "beam", "--mbr-size", "3")
    ref = mbr.translate(SENTENCES, nbest=3)
    with _serving(mbr) as (url, _):
        status, out = _request(url + "/translate", {"text": SENTENCES, "nbest": 3})
        assert status == 200
        for got, hs in zip(out["translations"], ref):
            assert [n["text"] for n in got["nbest"]] == [h.text for h in hs]
            assert [n["score"] for n in got["nbest"]] == sorted(
                (n["score"] for n in got["nbest"]), reverse=True
            )
        status, health = _get(url + "/health")
        assert health["search"] == "mbr 3 (beam)" and health["max_nbest"] == 3


BAD = [
    (b'{"q": ', 400, "malformed JSON: Expecting value: line 1 column 7"),
    (b"[1, 2]", 422, "the body must be a JSON object, got a list"),
    (b'{"q": "caf\xe9"}', 400, "the body is not UTF-8"),
    ({"q": 5}, 422, "'q' must be a string or a list of strings, got a number"),
    ({"q": ["a", None]}, 422, "item 1 is null"),
    ({"q": "a", "text": "b"}, 400, "not both or neither"),
    ({}, 400, "give the sentences as 'q'"),
    ({"q": "a", "source": "fr", "target": "es"}, 400, "this server translates en→es"),
    ({"q": "a", "target": "de"}, 400, "unknown language pair en→de"),
    ({"q": "a", "source": 1}, 422, "'source' must be a string"),
    ({"q": "a", "format": "html"}, 400, "'format' must be 'text'"),
    ({"q": "a", "alternatives": 4}, 400, "'alternatives' must be between 0 and 3"),
    ({"q": "a", "alternatives": "2"}, 422, "'alternatives' must be an integer, got a string"),
    ({"text": "a", "nbest": 0}, 400, "'nbest' must be between 1 and 4"),
    ({"q": ["a"] * 9}, 413, "9 sentences in one request; the limit is 8 per request"),
    (
        {"q": ["a", "b " * 300]},
        413,
        "sentence 1 is 601 tokens long (EOS included); the limit is 256 tokens",
    ),
    ({"q": "x" * 120_000}, 413, "the limit is 100000"),
]


@pytest.mark.parametrize("body, status, message", BAD, ids=range(len(BAD)))
def test_bad_requests_get_a_4xx_and_the_server_keeps_serving(server, body, status, message):
    url, _ = server
    got, answer = _request(url + "/translate", body)
    assert got == status and message in answer["error"], answer
    assert _get(url + "/health")[0] == 200


def test_translate_with_a_target_prefix(server, translator):
    """``prefix`` in a ``text`` body: the translator's prefixed n-best; bad ones are 422."""
    url, _ = server
    prefixes = ["Él", "", "No"]
    ref = translator.translate(SHORT, nbest=2, prefixes=prefixes)
    status, out = _request(url + "/translate", {"text": SHORT, "nbest": 2, "prefix": prefixes})
    assert status == 200
    for got, hs, prefix in zip(out["translations"], ref, prefixes):
        assert [g["text"] for g in got["nbest"]] == [h.text for h in hs]
        assert all(g["text"].startswith(prefix) for g in got["nbest"])
    free = translator.translate(SHORT[1:2], nbest=2)  # an empty prefix forces nothing
    assert [h.text for h in ref[1]] == [h.text for h in free[0]]
    status, out = _request(url + "/translate", {"text": SHORT[0], "prefix": "Él"})
    assert status == 200 and out["translations"][0]["text"] == ref[0][0].text
    for prefix, message in (
        (["Él"], "'prefix' has 1 line(s) but the input has 3"),
        ("Él", "'prefix' must be a list of strings, one per sentence, got a string"),
        (["", "", "uno dos tres cuatro cinco seis siete ocho"], "'prefix':3: the prefix has"),
    ):
        status, out = _request(url + "/translate", {"text": SHORT, "prefix": prefix})
        assert status == 422 and message in out["error"], out


def test_unknown_routes_methods_and_attention_requests(server, translator):
    url, _ = server
    assert _get(url + "/nope") == (404, {"error": "GET /nope: Not Found"})
    assert _get(url + "/translate")[0] == 405
    assert _request(url + "/attention", {"q": "  "}) == (
        400,
        {"error": "'q' is empty: there is no attention to show"},
    )
    assert _request(url + "/attention", {"q": ["a"]})[0] == 422
    status, out = _request(url + "/attention", {"q": SENTENCES[0], "alternatives": 1})
    ref = _reference(translator, SENTENCES[:1], nbest=2)[0]
    assert status == 200 and [h["text"] for h in out["hypotheses"]] == [h.text for h in ref]
    assert (out["layers"], out["heads"]) == (2, 2)
    found = cross_attention(translator, [SENTENCES[0]] * 2, [h.tokens for h in ref])
    for got, a in zip(out["hypotheses"], found):
        assert out["source"] == list(a.source) and got["target"] == list(a.target)
        np.testing.assert_allclose(got["attention"], a.weights, atol=1e-5)
        assert got["alignment"] == [list(link) for link in a.hard()]


def test_concurrent_requests_share_one_decode_and_the_loop_keeps_answering(
    server, translator, monkeypatch
):
    url, service = server
    ref = {s: h[0].text for s, h in zip(SENTENCES, _reference(translator, SENTENCES))}
    calls = []
    real = translator.translate

    def slow_translate(lines, **kw):  # counts the decode calls and holds the worker a while
        calls.append(len(lines))
        time.sleep(0.5)
        return real(lines, **kw)

    monkeypatch.setattr(translator, "translate", slow_translate)
    answers = [None] * 10
    gate = threading.Barrier(10)

    def client(i):
        gate.wait()
        answers[i] = _request(url + "/translate", {"q": SENTENCES[i % 4]})

    threads = [threading.Thread(target=client, args=(i,)) for i in range(10)]
    for t in threads:
        t.start()
    time.sleep(0.3)  # the worker is decoding now; the event loop still answers
    start = time.perf_counter()
    assert _get(url + "/health")[0] == 200
    health_seconds = time.perf_counter() - start
    for t in threads:
        t.join()
    assert [a for a in answers] == [
        (200, {"translatedText": ref[SENTENCES[i % 4]]}) for i in range(10)
    ]
    assert sum(calls) == 10 and len(calls) <= 2, calls  # ten clients, one or two decodes
    assert health_seconds < 0.4, health_seconds


@pytest.mark.slow
def test_load_on_the_serve_command(run_dir, translator, tmp_path):
    """``python -m seq2seq serve`` in a subprocess; 8 clients send 48 requests of 1–3
    sentences (96 in all); every answer equals the Translator's (what seq2seq-translate writes)."""
    sock = _free_socket()
    port = sock.getsockname()[1]
    sock.close()
    log = open(tmp_path / "serve.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "seq2seq", "serve", "--workdir", str(run_dir), *BEAM]
        + ["--host", "127.0.0.1", "--port", str(port), "--batch-window-ms", "20", "--warmup"]
        + ["--max-batch", "16", "--max-sentences", "8", "--max-body-bytes", "50000"]
        + ["--max-nbest", "2"],
        env=cli_env(),
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(600):
            try:
                if _get(url + "/health")[0] == 200:
                    break
            except OSError:
                time.sleep(0.1)
        else:
            pytest.fail((tmp_path / "serve.log").read_text())
        import gzip

        with gzip.open(ROOT / "data/tatoeba-en-es/test.en.gz", "rt", encoding="utf-8") as f:
            lines = f.read().split("\n")[:100]
        batches = [lines[2 * i : 2 * i + 1 + i % 3] for i in range(48)]
        result = load_test.load_test(url, batches, 8, "en", "es")
        print("\n" + load_test.report(result, 8))
        ref = [h[0].text for h in _reference(translator, lines)]
        expected = [(200, {"translatedText": ref[2 * i : 2 * i + 1 + i % 3]}) for i in range(48)]
        assert result["answers"] == expected
        assert 0 < result["p50"] <= result["p99"] and result["sentences"] == 96 == sum(
            map(len, batches)
        )
        health = _get(url + "/health")[1]
        assert health["decode_calls"] < 48, health  # requests shared decodes
        assert (health["max_nbest"], health["max_sentences"]) == (2, 8)
        status, out = _request(url + "/translate", {"q": ["a"] * 9})
        assert status == 413 and "the limit is 8 per request" in out["error"]
        status, out = _request(url + "/translate", {"q": "x" * 60_000})
        assert status == 413 and "the limit is 50000" in out["error"]
        status, out = _request(url + "/translate", {"q": "a", "alternatives": 2})
        assert status == 400 and "between 0 and 1" in out["error"]
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()
    # one row per decode (--max-tokens 16): the 16-, 32- and 64-token buckets, compiled first
    assert "warm-up: 3 batch shapes compiled" in (tmp_path / "serve.log").read_text()


def test_cross_attention_is_the_models_teacher_forced_softmax(translator):
    """Padded, batched pairs give the weights of each pair alone in an exact-width batch."""
    import jax
    from flax import nnx

    hyps = _reference(translator, SENTENCES)
    found = cross_attention(translator, SENTENCES, [h[0].tokens for h in hyps])
    tok = translator.tokenizer
    # the model's own teacher-forced weights (Transformer.attention_weights), pair by pair
    alone = jax.jit(
        lambda params, batch: nnx.merge(translator.graphdef, params).attention_weights(
            batch, bos_id=tok.bos_id
        )["cross"]
    )
    for s, h, a in list(zip(SENTENCES, hyps, found))[:2]:  # the others: other widths
        src = tok.encode([s])[0]
        tgt = np.append(np.asarray(h[0].tokens, np.int32), tok.eos_id)
        assert a.source[-1] == a.target[-1] == "</s>" and len(a.source) == len(src)
        n = max(len(src), len(tgt))
        batch = {
            "src": np.pad(src, (0, n - len(src)))[None],
            "src_segments": (np.arange(n) < len(src)).astype(np.int32)[None],
            "src_positions": np.arange(n, dtype=np.int32)[None],
            "tgt": np.pad(tgt, (0, n - len(tgt)))[None],
            "tgt_segments": (np.arange(n) < len(tgt)).astype(np.int32)[None],
            "tgt_positions": np.arange(n, dtype=np.int32)[None],
        }
        cross = np.asarray(alone(translator.params, batch))
        np.testing.assert_allclose(a.weights, cross[:, 0, :, : len(tgt), : len(src)], atol=1e-6)
        np.testing.assert_allclose(a.weights.sum(-1), 1.0, atol=1e-5)
    weights = np.zeros((1, 2, 3, 4), np.float32)
    weights[0, 0, [0, 1, 2], [2, 0, 3]] = 1.0  # the EOS column (3) is never a link
    weights[0, 1, 1, 1] = 0.6
    links = Attention(("a", "b", "c", "</s>"), ("x", "y", "</s>"), weights).hard()
    assert links == [(2, 0), (0, 1)] and pharaoh(links) == "2-0 0-1"


def test_translate_writes_hard_and_soft_alignments(run_dir, translator, tmp_path, capsys):
    src = tmp_path / "in.en"
    src.write_text("\n".join(SHORT + [""]) + "\n", encoding="utf-8")
    out = tmp_path / "out.es"
    common = ["--workdir", str(run_dir), *BEAM, "--input", str(src), "--output", str(out)]
    assert cli.translate_main([*common, "--alignments", "hard", "--nbest", "2"]) == 0
    soft_path = tmp_path / "soft.jsonl"
    assert (
        cli.translate_main(
            [*common, "--alignments", "soft", "--nbest", "2", "--alignments-output", str(soft_path)]
        )
        == 0
    )
    hard = (tmp_path / "out.es.align").read_text(encoding="utf-8").splitlines()
    soft = [json.loads(line) for line in soft_path.read_text(encoding="utf-8").splitlines()]
    outputs = out.read_text(encoding="utf-8").splitlines()
    assert len(hard) == len(soft) == len(outputs) == 7  # 3 lines × 2 hypotheses + the empty one
    assert [r["line"] for r in soft] == [int(o.split(" ||| ")[0]) for o in outputs]
    for links, record in zip(hard, soft):
        m = np.asarray(record["attention"])
        assert m.shape == (len(record["target"]), len(record["source"]))
        np.testing.assert_allclose(m.sum(1), 1.0, atol=1e-3)
        pairs = [tuple(map(int, link.split("-"))) for link in links.split()]
        assert [j for _, j in pairs] == list(range(m.shape[0] - 1))  # each piece but EOS
        for i, j in pairs:  # its largest weight (up to the JSON's rounding), EOS excluded
            assert i < m.shape[1] - 1 and m[j, i] >= m[j, :-1].max() - 2e-5
    assert hard[-1] == "" and soft[-1]["source"] == soft[-1]["target"] == ["</s>"]
    # the errors: no file to write to, a bad directory
    assert cli.translate_main(["--workdir", str(run_dir), "--alignments", "hard"]) == 2
    assert "--alignments needs --output or --alignments-output" in capsys.readouterr().err
    bad = [*common, "--alignments", "soft", "--alignments-output", str(tmp_path / "no/x")]
    assert cli.translate_main(bad) == 2 and "no directory" in capsys.readouterr().err


def test_plot_attention_writes_a_heatmap_png(run_dir, tmp_path, capsys):
    png = tmp_path / "att.png"
    argv = ["--workdir", str(run_dir), "--attention", SHORT[0], "--output", str(png)]
    assert cli.plot_main(argv) == 0
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5_000
    width, height = struct.unpack(">II", data[16:24])
    assert width > 300 and height > 250
    assert "alignment " in capsys.readouterr().out
    assert cli.plot_main([*argv, "--layer", "1", "--head", "0"]) == 0
    assert cli.plot_main([*argv, "--head", "2"]) == 2
    assert "the model has 2 heads (0..1)" in capsys.readouterr().err
    assert cli.plot_main(["--workdir", str(run_dir), "--layer", "0"]) == 2


CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"


@pytest.mark.slow
@pytest.mark.skipif(
    not (os.path.exists(CHROMIUM) and shutil.which(CHROMEDRIVER)),
    reason="needs Chromium and its driver from the system packages "
    "(apt-get install -y chromium chromium-driver; .ci/run installs them)",
)
def test_the_page_in_headless_chromium(server, translator, tmp_path, monkeypatch):
    monkeypatch.setenv("SE_OFFLINE", "true")  # Selenium Manager never downloads anything
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service as DriverService
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    url, _ = server
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--user-data-dir={tmp_path / 'profile'}",
        "--window-size=1200,1600",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=DriverService(CHROMEDRIVER), options=options)
    try:
        driver.get(url + "/")
        wait = WebDriverWait(driver, 60)
        wait.until(lambda d: "en → es" in d.find_element(By.ID, "pair").text)
        sentence = SENTENCES[0]
        driver.find_element(By.ID, "source").send_keys(sentence)
        driver.find_element(By.ID, "translate").click()
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#heatmap td.cell"))
        ref = _reference(translator, [sentence], nbest=3)[0]
        assert driver.find_element(By.CSS_SELECTOR, ".translation").text == ref[0].text
        items = driver.find_elements(By.CSS_SELECTOR, "#nbest li .text")
        assert [i.text for i in items] == [h.text for h in ref]
        scores = driver.find_elements(By.CSS_SELECTOR, "#nbest li .score")
        assert scores[0].text.startswith(f"score {ref[0].score:.4f}")
        found = cross_attention(translator, [sentence], [ref[0].tokens])[0]
        src, tgt = len(found.source), len(found.target)
        assert len(driver.find_elements(By.CSS_SELECTOR, "#heatmap td.cell")) == src * tgt
        assert len(driver.find_elements(By.CSS_SELECTOR, "#heatmap tbody tr")) == tgt

        def marked():
            cells = driver.find_elements(By.CSS_SELECTOR, "#heatmap td.hard")
            return sorted(
                (int(c.get_attribute("data-s")), int(c.get_attribute("data-t"))) for c in cells
            )

        def expected(weights):  # the page's argmax, from the same rounded weights
            m = np.round(weights.astype(np.float64), 5)
            return sorted((int(i), j) for j, i in enumerate(m[:-1, :-1].argmax(1)))

        assert marked() == expected(found.weights.mean((0, 1)))
        Select(driver.find_element(By.ID, "layer")).select_by_value("1")
        Select(driver.find_element(By.ID, "head")).select_by_value("0")
        wait.until(lambda d: d.find_element(By.ID, "heatmap").get_attribute("data-view") == "1/0/0")
        assert marked() == expected(found.weights[1, 0])
        cell = driver.find_element(By.CSS_SELECTOR, '#heatmap td[data-t="0"][data-s="0"]')
        assert cell.get_attribute("title").endswith(f"{found.weights[1, 0, 0, 0]:.3f}")
        driver.find_elements(By.CSS_SELECTOR, "#nbest li")[1].click()  # another hypothesis
        wait.until(lambda d: d.find_element(By.ID, "heatmap").get_attribute("data-view") == "1/0/1")
        rows = driver.find_elements(By.CSS_SELECTOR, "#heatmap tbody tr")
        assert len(rows) == len(ref[1].tokens) + 1
        if os.environ.get("SEQ2SEQ_SCREENSHOT"):
            driver.save_screenshot(os.environ["SEQ2SEQ_SCREENSHOT"])
    finally:
        driver.quit()


def test_serve_command_names_a_bad_run_before_it_binds(tmp_path, capsys):
    assert cli.serve_main(["--workdir", str(tmp_path / "none"), "--port", "1"]) == 2
    assert f"{tmp_path / 'none'} is not a run directory" in capsys.readouterr().err
