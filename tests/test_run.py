"""The application (``seq2seq/run.py``): the search of dev BLEU during training and of the final
test decode, on the real loop with a tiny model."""

from __future__ import annotations

import json

import pytest
from tiny_run import tiny_config, write_corpus

from seq2seq import run as run_module
from seq2seq.config import replace
from seq2seq.data.pipeline import decode_source_limit
from seq2seq.summary import RunSummary
from seq2seq.trained import load_trained
from seq2seq.translation import Translator


@pytest.mark.slow
def test_dev_bleu_decodes_with_beam_search_and_the_test_with_decode_search(tmp_path, monkeypatch):
    """``decode.search=sampling``: each dev evaluation decodes with beam search of
    ``train.bleu_beam_size`` and the config's length penalty (before the fix it sampled), and
    the test decode samples; both outputs equal a fresh decode of the checkpoint so set."""
    corpus = write_corpus(tmp_path / "corpus")
    decoded = []  # (decode config, sources, first hypotheses) of every Translator of the run

    class Spy(Translator):
        def translate(self, lines, *args, **kwargs):
            results = super().translate(lines, *args, **kwargs)
            decoded.append((self.config, list(lines), [r[0].text for r in results]))
            return results

    monkeypatch.setattr(run_module, "Translator", Spy)
    config = tiny_config(
        corpus,
        tmp_path / "run",
        "train.steps=2",
        "train.eval_every=2",
        "train.dev_bleu=true",
        "train.bleu_subset=6",
        "train.bleu_beam_size=2",
        "train.test_checkpoint=last",
        "decode.search=sampling",
        "decode.seed=3",
        "decode.alpha=0.8",
        "decode.length_penalty=plain",
        "decode.test_limit=6",
    )
    summary = run_module.train(config)
    assert len(decoded) == 2  # one dev evaluation (step 2), then the test decode
    (dev_decode, dev_src, dev_hyps), (test_decode, test_src, test_hyps) = decoded
    assert dev_decode == replace(config.decode, search="beam", beam_size=2)
    assert (dev_decode.alpha, dev_decode.length_penalty) == (0.8, "plain")
    assert test_decode == config.decode and test_decode.search == "sampling"
    assert summary.dev["bleu_sentences"] == len(dev_src) == 6

    run_config, tokenizer, graphdef, params = load_trained(tmp_path / "run", 2)
    limit = decode_source_limit(run_config)

    def fresh(decode, lines):
        translator = Translator(graphdef, params, tokenizer, decode, max_src_len=limit)
        return [r[0].text for r in translator.translate(lines)]

    assert dev_hyps == fresh(dev_decode, dev_src)
    assert test_hyps == fresh(config.decode, test_src)
    assert (tmp_path / "run" / "test.hyp").read_text(encoding="utf-8") == "".join(
        h + "\n" for h in test_hyps
    )
    assert dev_hyps != fresh(config.decode, dev_src)  # sampling would have decoded others


def test_a_run_builds_its_abstract_state_optimizer_and_parent_once(tmp_path, monkeypatch):
    """A run through ``run.train`` builds its abstract ``TrainState`` (the resolve check, the
    restore target, the shardings and the step all share it), its optimizer and its
    ``train.init_from`` parent once each: a new run, its resume, and a fine-tune from it (which
    builds the parent's abstract state and optimizer once more, for the parent's model)."""
    import collections
    import sys

    from seq2seq.training import init_from, step

    originals = {
        "abstract_train_state": step.abstract_train_state,
        "make_optimizer": step.make_optimizer,
        "resolve_parent": init_from.resolve_parent,
    }
    calls: collections.Counter = collections.Counter()

    def counted(name, fn):
        def wrapper(*args, **kwargs):
            first = args[0] if args else None
            # which run's model: the config's workdir (TrainConfig for the optimizer)
            calls[name, getattr(first, "workdir", None)] += 1
            return fn(*args, **kwargs)

        return wrapper

    for module in [m for n, m in sys.modules.items() if n.startswith("seq2seq")]:
        for name, fn in originals.items():
            if getattr(module, name, None) is fn:
                monkeypatch.setattr(module, name, counted(name, fn))
    corpus = write_corpus(tmp_path / "corpus")
    parent, child = str(tmp_path / "parent"), str(tmp_path / "child")
    expected_one_run = {
        ("abstract_train_state", parent): 1,
        ("make_optimizer", None): 1,
        ("resolve_parent", parent): 1,
    }
    summary = run_module.train(tiny_config(corpus, tmp_path / "parent", "train.steps=2"))
    assert summary.step == 2 and dict(calls) == expected_one_run
    calls.clear()
    summary = run_module.train(tiny_config(corpus, tmp_path / "parent", "train.steps=4"))
    assert summary.step == 4 and dict(calls) == expected_one_run  # the resume
    calls.clear()
    config = tiny_config(corpus, tmp_path / "child", "train.steps=2", f"train.init_from={parent}")
    summary = run_module.train(config)
    assert summary.step == 2
    # the typed record and test.json hold the same: the page and the file are one record
    saved = json.loads((tmp_path / "child" / "test.json").read_text(encoding="utf-8"))
    assert RunSummary.from_json(saved) == summary and saved == summary.to_json()
    assert "message" not in saved and summary.best["step"] in (None, 2)
    assert dict(calls) == {
        ("abstract_train_state", child): 1,
        ("abstract_train_state", parent): 1,  # the parent's model: shape check and restore
        ("make_optimizer", None): 2,  # this run's and the parent's (its state's structure)
        ("resolve_parent", child): 1,
    }
