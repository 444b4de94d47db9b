"""Pseudo-documents (``data.concat_pairs_to_tokens``): runs of consecutive pairs, never split,
source and target aligned, within the limit, as long as the limit allows."""

import numpy as np
import pytest

from seq2seq.data.documents import concat_pairs, document_groups

EOS = 3


def _pairs(n, rng):
    src = [
        np.append(rng.integers(4, 50, rng.integers(1, 9)), EOS).astype(np.int32) for _ in range(n)
    ]
    tgt = [
        np.append(rng.integers(4, 50, rng.integers(1, 12)), EOS).astype(np.int32) for _ in range(n)
    ]
    return src, tgt


@pytest.mark.parametrize("limit", [1, 7, 16, 40])
def test_documents_are_whole_consecutive_pairs_aligned_and_maximal(limit):
    rng = np.random.default_rng(limit)
    src, tgt = _pairs(200, rng)
    groups = document_groups([len(x) for x in src], [len(y) for y in tgt], limit)
    assert [i for g in groups for i in g] == list(range(len(src)))  # consecutive, each once
    docs_src, docs_tgt = concat_pairs(src, tgt, limit, EOS)
    assert len(docs_src) == len(docs_tgt) == len(groups)
    for g, s, t in zip(groups, docs_src, docs_tgt):
        # the document is exactly its pairs in order (inner EOS dropped): nothing split
        np.testing.assert_array_equal(s, np.concatenate([*(src[i][:-1] for i in g), [EOS]]))
        np.testing.assert_array_equal(t, np.concatenate([*(tgt[i][:-1] for i in g), [EOS]]))
        assert s.dtype == np.int32 and (s == EOS).sum() == 1 and (t == EOS).sum() == 1
        if len(g) > 1:  # a pair longer than the limit stays alone, else both sides fit
            assert len(s) <= limit and len(t) <= limit
    for g, nxt in zip(groups, groups[1:]):  # greedy: the next pair would not have fitted
        s = sum(len(src[i]) - 1 for i in g) + len(src[nxt[0]])
        t = sum(len(tgt[i]) - 1 for i in g) + len(tgt[nxt[0]])
        assert s > limit or t > limit


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="2 sources but 1 targets"):
        document_groups([2, 3], [2], 8)
    with pytest.raises(ValueError, match="max_tokens must be >= 1, got 0"):
        document_groups([2], [2], 0)


def test_a_document_limit_beyond_the_row_is_refused(tmp_path):
    from seq2seq.config import ConfigError
    from seq2seq.resolve import resolve

    overrides = ["data.max_len=64", "data.max_tokens=2048", "data.concat_pairs_to_tokens=65"]
    with pytest.raises(ConfigError, match=r"data.concat_pairs_to_tokens=65 must be in \[0, "):
        resolve(None, [f"workdir={tmp_path}", *overrides])
