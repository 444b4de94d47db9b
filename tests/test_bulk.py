"""Bulk translation (``seq2seq-translate --output-dir``, seq2seq/bulk.py): chunks, resume after
kill -9, two processes, the report's counts, refused reruns. A random tiny run decodes."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import sentencepiece as spm
from tiny_run import ROOT, cli_env, random_checkpoint, random_run, shipped_pairs

from seq2seq import bulk, cli

TRANSLATE = (
    "import sys; from seq2seq.cli import translate_main; sys.exit(translate_main(sys.argv[1:]))"
)
CHUNK = 4  # lines per chunk in the subprocess tests: 4 rows, one compiled shape


def test_chunk_bounds():
    assert bulk.chunk_bounds(10, 4) == [(0, 4), (4, 8), (8, 10)]
    assert bulk.chunk_bounds(8, 4) == [(0, 4), (4, 8)]
    assert bulk.chunk_bounds(0, 4) == []
    with pytest.raises(ValueError, match="chunk_lines must be ≥ 1, got 0"):
        bulk.chunk_bounds(5, 0)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A random tiny model decoding greedily with short outputs (a·|x| + b, a = 0.5)."""
    return random_run(
        tmp_path_factory.mktemp("bulk") / "run",
        "decode.beam_size=1",
        "decode.max_len_a=0.5",
        "decode.max_len_b=4",
    )


@pytest.fixture(scope="module")
def short_input(run, tmp_path_factory):
    """1,200 shipped English lines of at most 16 tokens (one length bucket, so every chunk of
    ``CHUNK`` lines is one batch of ``CHUNK`` rows: a single compiled shape)."""
    sp = spm.SentencePieceProcessor(model_file=str(run / "spm.model"))
    lines = [en for en, _ in shipped_pairs(0, 4000) if en.strip()]
    short = [s for s, ids in zip(lines, sp.encode(lines)) if len(ids) + 1 <= 16][:1200]
    assert len(short) == 1200
    path = tmp_path_factory.mktemp("input") / "mono.en"
    path.write_text("".join(s + "\n" for s in short), encoding="utf-8")
    return path


def _bulk(run, src, out_dir, *extra) -> list[str]:
    return ["--workdir", str(run), "--input", str(src), "--output-dir", str(out_dir), *extra]


@pytest.fixture(scope="module")
def reference(run, short_input, tmp_path_factory):
    """The uninterrupted one-process bulk output of ``short_input`` (in this process)."""
    out = tmp_path_factory.mktemp("reference")
    assert cli.translate_main(_bulk(run, short_input, out, "--chunk-lines", str(CHUNK))) == 0
    text = (out / "translations.txt").read_text(encoding="utf-8")
    assert len(text.splitlines()) == 1200 and len(set(text.splitlines())) > 50
    return text


def _report(out_dir: Path) -> dict:
    return json.loads((out_dir / "report.json").read_text(encoding="utf-8"))


@pytest.mark.slow
def test_bulk_equals_plain_translate_counts_bad_lines_and_resumes(run, tmp_path, capsys):
    """Chunks of 7 lines (the last shorter): the merged output equals plain translate's,
    line for line; empty and over-long lines are handled as translate does and counted; a
    rerun decodes nothing; a leftover temporary file of a killed write is ignored."""
    lines = [en for en, _ in shipped_pairs(100, 40)]
    lines[3], lines[11], lines[20] = "", "   ", " ".join(["word"] * 200)  # 200+ tokens > 64
    src = tmp_path / "in.en"
    src.write_text("".join(s + "\n" for s in lines), encoding="utf-8")
    limit = ["--max-src-tokens", "64"]
    assert cli.translate_main(["--workdir", str(run), "--input", str(src), *limit]) == 0
    plain = capsys.readouterr().out
    out = tmp_path / "out"
    assert cli.translate_main(_bulk(run, src, out, "--chunk-lines", "7", *limit)) == 0
    err = capsys.readouterr().err
    merged = (out / "translations.txt").read_text(encoding="utf-8")
    assert merged == plain and len(merged.splitlines()) == 40
    assert merged.splitlines()[3] == merged.splitlines()[11] == ""
    assert sorted(p.name for p in (out / "chunks").iterdir()) == [f"{k:06d}.json" for k in range(6)]
    report = _report(out)
    t = report["totals"]
    assert (t["lines"], t["empty"], t["truncated"], report["chunks"]) == (40, 2, 1, 6)
    sp = spm.SentencePieceProcessor(model_file=str(run / "spm.model"))
    kept = [line for line in lines if line.strip()]  # EOS counted, at most 64 tokens
    assert t["source_tokens"] == sum(min(len(x) + 1, 64) for x in sp.encode(kept))
    out_lines = merged.splitlines()
    assert t["empty_outputs"] == sum(not o for o, i in zip(out_lines, lines) if i.strip())
    # a non-empty output has ≥ 1 piece; none has more than its limit a·|x| + b (EOS excluded)
    assert sum(bool(o) for o in out_lines) <= t["target_tokens"] <= 38 * (0.5 * 64 + 4)
    assert report["run"]["chunks"] == 6 and report["run"]["skipped"] == 0
    assert "in.en:21: " in err and "truncated to 64" in err  # the file's line, not the chunk's
    assert "40 lines in 6 chunks" in err and "2 empty, 1 over the source limit" in err

    (out / "chunks" / ".000002.json.999.tmp").write_text("{half a chunk")  # a killed write
    (out / "translations.txt").unlink()
    assert cli.translate_main(_bulk(run, src, out, "--chunk-lines", "7", *limit)) == 0
    assert (out / "translations.txt").read_text(encoding="utf-8") == plain
    again = _report(out)["run"]
    assert (again["chunks"], again["skipped"], again["lines"]) == (0, 6, 0)
    assert not list((out / "chunks").glob(".*.tmp"))


@pytest.mark.slow
def test_sampling_is_seeded_by_the_line_number_in_the_file(run, short_input, tmp_path, capsys):
    """With --sampling each line's key is fold_in(seed, line number in the file): chunks of 5
    give plain translate's samples (before the fix every chunk reused lines 0..4's keys)."""
    src = tmp_path / "in.en"
    src.write_text("".join(short_input.read_text().splitlines(True)[:20]), encoding="utf-8")
    sampling = ["--sampling", "--seed", "3", "--temperature", "2"]
    assert cli.translate_main(["--workdir", str(run), "--input", str(src), *sampling]) == 0
    plain = capsys.readouterr().out
    out = tmp_path / "out"
    assert cli.translate_main(_bulk(run, src, out, "--chunk-lines", "5", *sampling)) == 0
    merged = (out / "translations.txt").read_text(encoding="utf-8").splitlines()
    assert merged == plain.splitlines() and len(set(merged)) > 10


@pytest.mark.slow
def test_an_ensemble_decodes_in_bulk_as_in_plain_translate(run, short_input, tmp_path, capsys):
    """Two members (the run twice: ``seq2seq.decoding.Ensemble``), beam 2, chunks of 3."""
    src = tmp_path / "in.en"
    src.write_text("".join(short_input.read_text().splitlines(True)[:10]), encoding="utf-8")
    ensemble = ["--workdir", str(run), "--workdir", str(run), "--beam", "2"]
    assert cli.translate_main([*ensemble, "--input", str(src)]) == 0
    plain = capsys.readouterr().out
    out = tmp_path / "out"
    args = [*ensemble, "--input", str(src), "--output-dir", str(out), "--chunk-lines", "3"]
    assert cli.translate_main(args) == 0
    assert (out / "translations.txt").read_text(encoding="utf-8") == plain
    assert len(plain.splitlines()) == 10
    job = json.loads((out / "job.json").read_text(encoding="utf-8"))
    assert len(job["models"]) == 2 and job["decode"]["beam_size"] == 2


def test_rerun_with_other_settings_or_options_is_refused(run, tmp_path, capsys):
    src = tmp_path / "in.en"
    src.write_text("Tom is here.\nYes.\n", encoding="utf-8")
    out = tmp_path / "out"
    out.mkdir()
    (out / "job.json").write_text(json.dumps({"lines": 3}), encoding="utf-8")
    assert cli.translate_main(_bulk(run, src, out)) == 2
    err = capsys.readouterr().err
    assert f"{out}/job.json: this directory holds the chunks of another job: input was None" in err
    assert cli.translate_main(_bulk(run, src, out, "--nbest", "2")) == 2
    assert "--output-dir does not take --nbest" in capsys.readouterr().err
    assert cli.translate_main(["--workdir", str(run), "--output-dir", str(out)]) == 2
    assert "--output-dir needs --input FILE" in capsys.readouterr().err
    assert (
        cli.translate_main(["--workdir", str(run), "--chunk-lines", "5", "--process-id", "0"]) == 2
    )
    assert "--chunk-lines, --process-id only apply with --output-dir" in capsys.readouterr().err
    long = tmp_path / "long.en"
    long.write_text("Yes.\n" * 29 + "word " * 100 + "\nYes.\n", encoding="utf-8")
    args = ["--on-long", "reject", "--max-src-tokens", "64", "--chunk-lines", "4"]
    assert cli.translate_main(_bulk(run, long, tmp_path / "out2", *args)) == 2
    assert f"{long}: 1 line(s) longer than the limit of 64 tokens: line 30" in (
        capsys.readouterr().err
    )
    assert not (out / "chunks").exists() and not (tmp_path / "out2").exists()  # nothing decoded


def test_a_job_records_its_checkpoint_and_precision_and_refuses_another(
    run, short_input, tmp_path, capsys
):
    """job.json holds the resolved checkpoint (step and path, not null for the default) and
    the matmul precision: after the run's default moved to a new checkpoint, or with another
    --matmul-dtype, a rerun is refused with both values (before the fix it decoded the missing
    chunk with the other model and merged it); the same model and precision resume."""
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    src = tmp_path / "in.en"
    src.write_text("".join(short_input.read_text().splitlines(True)[:6]), encoding="utf-8")
    out = tmp_path / "out"
    args = _bulk(copy, src, out, "--chunk-lines", "2")
    assert cli.translate_main(args) == 0
    first = (out / "translations.txt").read_text(encoding="utf-8")
    job = json.loads((out / "job.json").read_text(encoding="utf-8"))
    one = str((copy / "checkpoints" / "1").resolve())
    assert job["models"] == [
        {
            "run": str(copy.resolve()),
            "step": 1,
            "checkpoint": one,
            "dtype": "float32",
            "matmul_dtype": "float32",
            "attention": "dense",
        }
    ]
    (out / "chunks" / "000002.json").unlink()  # as if the job had been interrupted
    capsys.readouterr()

    random_checkpoint(copy, 2, seed=1)  # training went on: the default is now step 2
    assert cli.translate_main(args) == 2
    err = capsys.readouterr().err
    assert f"{out}/job.json: this directory holds the chunks of another job" in err
    assert "models[0].step was 1, now 2" in err
    assert "rerun with --step 1" in err and "give another --output-dir" in err
    assert cli.translate_main([*args, "--step", "1", "--matmul-dtype", "bfloat16"]) == 2
    err = capsys.readouterr().err
    assert "models[0].matmul_dtype was 'float32', now 'bfloat16'" in err
    assert "rerun with --matmul-dtype float32" in err
    assert not (out / "chunks" / "000002.json").exists()

    assert cli.translate_main([*args, "--step", "1"]) == 0  # the recorded model: resumes
    assert (out / "translations.txt").read_text(encoding="utf-8") == first
    r = _report(out)["run"]
    assert (r["chunks"], r["skipped"]) == (1, 2)


def _chunks_done(out: Path) -> int:
    try:
        return sum(1 for p in os.scandir(out / "chunks") if p.name.endswith(".json"))
    except FileNotFoundError:
        return 0


def _start_and_stop(cmd, out: Path, log: Path, at_least: int, signum: int) -> int:
    """Run ``cmd``, send ``signum`` once ``at_least`` chunks exist, wait; its exit status."""
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, env=cli_env(), cwd=ROOT, stdout=f, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 600
        while _chunks_done(out) < at_least:
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "no chunk written"
            time.sleep(0.002)
        proc.send_signal(signum)
        return proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.slow
def test_ctrl_c_then_kill_9_then_rerun_translates_every_line_once(
    run, short_input, reference, tmp_path
):
    """SIGINT, then SIGKILL of a rerun, once chunks are written: the last rerun decodes only
    the others, and the merged output equals the uninterrupted run's (every line once, in
    order)."""
    out = tmp_path / "out"
    args = _bulk(run, short_input, out, "--chunk-lines", str(CHUNK))
    cmd = [sys.executable, "-c", TRANSLATE, *args]
    total = 1200 // CHUNK
    log = tmp_path / "interrupted.log"
    assert _start_and_stop(cmd, out, log, 3, signal.SIGINT) == 130, log.read_text()[-3000:]
    assert "interrupted; the finished chunks are kept in" in log.read_text()
    first = _chunks_done(out)
    log = tmp_path / "killed.log"
    assert _start_and_stop(cmd, out, log, first + 3, signal.SIGKILL) == -signal.SIGKILL
    done = _chunks_done(out)
    assert 3 <= first < first + 3 <= done < total, (first, done)
    assert "this run:" not in log.read_text() and not (out / "translations.txt").exists()

    rerun = subprocess.run(
        cmd, env=cli_env(), cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert (out / "translations.txt").read_text(encoding="utf-8") == reference
    r = _report(out)["run"]
    assert (r["skipped"], r["chunks"], r["lines"]) == (done, total - done, 1200 - done * CHUNK)
    assert f"this run: {total - done} chunks decoded ({done} done before)" in rerun.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_processes_split_the_chunks_and_merge_the_one_process_output(
    run, short_input, reference, tmp_path
):
    """jax.distributed on localhost, 2 processes × 1 CPU device: process p decodes the chunks
    k ≡ p (mod 2); process 0 merges them into the one-process output."""
    out, port = tmp_path / "out", _free_port()
    logs = [tmp_path / f"process_{i}.log" for i in range(2)]
    procs = []
    try:
        for i in range(2):
            with open(logs[i], "w") as f:
                args = _bulk(run, short_input, out, "--chunk-lines", str(CHUNK))
                args += ["--coordinator-address", f"127.0.0.1:{port}", "--num-processes", "2"]
                procs.append(
                    subprocess.Popen(
                        [sys.executable, "-c", TRANSLATE, *args, "--process-id", str(i)],
                        env=cli_env(),
                        cwd=ROOT,
                        stdout=f,
                        stderr=subprocess.STDOUT,
                    )
                )
        for p in procs:
            p.wait(timeout=600)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    text = [log.read_text() for log in logs]
    for i, p in enumerate(procs):
        assert p.returncode == 0, text[i][-3000:]
    total = 1200 // CHUNK
    for i in range(2):
        assert f"process {i} of 2: {total // 2} of its {total // 2} chunks to decode" in text[i]
    assert (out / "translations.txt").read_text(encoding="utf-8") == reference
    report = _report(out)
    assert report["processes"] == 2 and report["run"]["chunks"] == total
    assert "this run:" in text[0] and "this run:" not in text[1]  # one report, by process 0
