"""Load test of a running ``seq2seq-serve``: N concurrent clients, a fixed number of requests.

    .venv/bin/seq2seq-serve --workdir runs/tatoeba_en_es &
    .venv/bin/python -m tools.load_test --url http://127.0.0.1:8000 --clients 8 --requests 200

Each client sends its share of the requests one after another (POST /translate, LibreTranslate
body, ``--sentences`` lines of the shipped test split each, in turn); the script prints the
p50/p99 latency per request and the sentences per second over the whole run, and exits 1 if a
request failed. Only the standard library: it runs in any Python 3.11.
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

TEST = Path(__file__).resolve().parents[1] / "data" / "tatoeba-en-es" / "test.en.gz"


def post(url: str, body: dict, timeout: float = 120.0) -> tuple[int, dict]:
    """POST ``body`` as JSON; ``(status, decoded JSON answer)``, 4xx/5xx included."""
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-quantile (0..1) of ``values`` by the nearest-rank rule."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered) + 0.5) - 1))]


def load_test(
    url: str, batches: Sequence[Sequence[str]], clients: int, source: str, target: str
) -> dict:
    """Send ``batches`` (one request each) from ``clients`` threads at once.

    Returns:
      ``{"answers": [(status, json)] in the order of batches, "latencies": seconds per
      request, "seconds": wall time, "sentences": sentences sent, "p50", "p99",
      "sentences_per_second"}``.
    """
    answers: list = [None] * len(batches)
    latencies: list = [None] * len(batches)
    start_gate = threading.Barrier(clients)

    def client(k: int) -> None:
        start_gate.wait()
        for i in range(k, len(batches), clients):
            t = time.perf_counter()
            answers[i] = post(
                url.rstrip("/") + "/translate",
                {"q": list(batches[i]), "source": source, "target": target},
            )
            latencies[i] = time.perf_counter() - t

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - t0
    sentences = sum(len(b) for b in batches)
    return {
        "answers": answers,
        "latencies": latencies,
        "seconds": seconds,
        "sentences": sentences,
        "p50": percentile(latencies, 0.5),
        "p99": percentile(latencies, 0.99),
        "mean": statistics.fmean(latencies),
        "sentences_per_second": sentences / seconds,
    }


def report(result: dict, clients: int) -> str:
    """One line: requests, clients, p50/p99 latency, sentences/s."""
    return (
        f"{len(result['latencies'])} requests ({result['sentences']} sentences) from {clients} "
        f"clients in {result['seconds']:.2f} s: latency p50 {result['p50'] * 1000:.0f} ms, "
        f"p99 {result['p99'] * 1000:.0f} ms; {result['sentences_per_second']:.1f} sentences/s"
    )


def random_run(workdir: str, config: str = "configs/tatoeba_en_es.yaml") -> None:
    """Write a run directory with ``config``'s model, randomly initialised (no training), and
    its SentencePiece model trained on the first 20,000 training pairs: a server to measure
    in seconds instead of the preset's 16-minute training. Its outputs run to the length
    limit (a·|x| + b), the slowest case of the search. Needs this checkout's package."""
    from seq2seq.config import load_config, replace, save_config
    from seq2seq.data.sources import read_lines
    from seq2seq.data.tokenizer import train_or_load
    from seq2seq.resolve import resolve
    from seq2seq.sharding import Partitioner
    from seq2seq.training.checkpoints import Checkpointer
    from seq2seq.training.context import train_context
    from seq2seq.workdir import checkpoint_dir, config_path

    data = Path(__file__).resolve().parents[1] / "data" / "tatoeba-en-es"
    texts = [
        t for lang in ("en", "es") for t in read_lines(str(data / f"train.{lang}.gz"))[:20_000]
    ]
    base = load_config(config, [f"workdir={workdir}"])
    Path(workdir).mkdir(parents=True, exist_ok=True)
    vocab = train_or_load(texts, base.tokenizer, workdir).vocab_size
    # resolved: the batch size and steps a trained run would have saved
    run = resolve(config, [f"workdir={workdir}", f"model.vocab_size={vocab}"]).config
    save_config(run, config_path(Path(workdir)))
    # a new run's state, as seq2seq-train initialises it (train.seed 0)
    context = train_context(replace(run, **{"train.seed": 0}), Partitioner.single_device())
    state = context.fresh_state()
    ck = Checkpointer(checkpoint_dir(Path(workdir)), keep=None, async_save=False)
    try:
        ck.save(1, state, {"step": 1})
    finally:
        ck.close()
    print(
        f"wrote {workdir}: {config}'s model, random weights; serve it with "
        f"seq2seq-serve --workdir {workdir}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--make-random-run",
        metavar="DIR",
        help="only write a run directory with the preset's model, untrained (see random_run)",
    )
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--sentences", type=int, default=1, help="sentences per request")
    args = parser.parse_args(argv)
    if args.make_random_run:
        random_run(args.make_random_run)
        return 0
    with gzip.open(TEST, "rt", encoding="utf-8") as f:
        lines = [line for line in f.read().split("\n") if line.strip()]
    with urllib.request.urlopen(args.url.rstrip("/") + "/health", timeout=30) as r:
        health = json.loads(r.read())
    n = args.sentences
    batches = [[lines[(i * n + j) % len(lines)] for j in range(n)] for i in range(args.requests)]
    result = load_test(args.url, batches, args.clients, health["source"], health["target"])
    failed = [a for a in result["answers"] if a[0] != 200]
    print(f"{health['source']}→{health['target']}, {health['search']}")
    print(report(result, args.clients))
    if failed:
        print(f"{len(failed)} requests failed, e.g. {failed[0]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
