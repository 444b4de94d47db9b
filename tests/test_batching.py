"""Packing invariants and the determinism of the batch sequence."""

import numpy as np
import pytest
from conftest import random_pairs

from seq2seq.data.batching import FIELDS, PackedBatches, make_batch, pack, real_token_share


def test_pack_keeps_every_pair_once_and_fits_rows():
    rng = np.random.default_rng(0)
    src, tgt = random_pairs(500, rng, hi=20)
    sl, tl = np.array([len(x) for x in src]), np.array([len(x) for x in tgt])
    rows = pack(sl, tl, rng.permutation(500), 32)
    flat = sorted(i for r in rows for i in r)
    assert flat == list(range(500))
    for r in rows:
        assert sl[r].sum() <= 32 and tl[r].sum() <= 32


def test_make_batch_positions_restart_and_segments_count():
    src = [np.array([5, 6, 3]), np.array([7, 3])]
    tgt = [np.array([8, 3]), np.array([9, 10, 11, 3])]
    b = make_batch([[0, 1]], src, tgt, 2, 8)
    np.testing.assert_array_equal(b["src"][0], [5, 6, 3, 7, 3, 0, 0, 0])
    np.testing.assert_array_equal(b["src_segments"][0], [1, 1, 1, 2, 2, 0, 0, 0])
    np.testing.assert_array_equal(b["src_positions"][0], [0, 1, 2, 0, 1, 0, 0, 0])
    np.testing.assert_array_equal(b["tgt_positions"][0], [0, 1, 0, 1, 2, 3, 0, 0])
    assert not b["src"][1].any()  # missing row is padding
    assert real_token_share(b) == pytest.approx((5 + 6) / 32)


def test_batch_at_step_is_a_function_of_seed_and_step():
    src, tgt = random_pairs(300, np.random.default_rng(1))
    a = PackedBatches(src, tgt, max_len=24, rows=4, seed=7)
    b = PackedBatches(src, tgt, max_len=24, rows=4, seed=7)
    steps = [0, 3, a.batches_in_epoch(0) + 2, 57]  # crosses an epoch boundary
    for k in reversed(steps):  # a fresh object asked out of order gives the same batches
        for key, value in a.batch_at(k).items():
            np.testing.assert_array_equal(value, b.batch_at(k)[key])
    c = PackedBatches(src, tgt, max_len=24, rows=4, seed=8)
    assert not np.array_equal(a.batch_at(0)["src"], c.batch_at(0)["src"])


def test_epochs_cover_the_corpus_and_reshuffle():
    src, tgt = random_pairs(200, np.random.default_rng(2))
    pb = PackedBatches(src, tgt, max_len=24, rows=4, seed=0)
    for epoch in (0, 1):
        members = sorted(i for r in pb.epoch_rows(epoch) for i in r)
        assert members == list(range(200))
    assert pb.epoch_rows(0) != pb.epoch_rows(1)


def test_packing_raises_real_token_share():
    src, tgt = random_pairs(400, np.random.default_rng(3), hi=12)
    packed = PackedBatches(src, tgt, max_len=64, rows=8, seed=0)
    single = PackedBatches(src, tgt, max_len=64, rows=8, seed=0, packing=False)
    share = np.mean([real_token_share(b) for b in packed.epoch(0)][:-1])
    assert share > 0.9
    assert np.mean([real_token_share(b) for b in single.epoch(0)]) < 0.2


# --- packing invariants on real packed batches ----------------------------------------------


def _segment_runs(segments):
    """(segment id, start, end) of each run of equal non-zero ids in one row."""
    runs, start = [], 0
    for i in range(1, len(segments) + 1):
        if i == len(segments) or segments[i] != segments[start]:
            if segments[start]:
                runs.append((int(segments[start]), start, i))
            start = i
    return runs


def test_positions_restart_and_masks_stay_inside_each_segment():
    from seq2seq.model.attention import causal_segment_mask, segment_mask

    src, tgt = random_pairs(120, np.random.default_rng(4), hi=10)
    batch = PackedBatches(src, tgt, max_len=32, rows=8, seed=3).batch_at(2)
    multi = 0
    for side in ("src", "tgt"):
        segs, pos = batch[f"{side}_segments"], batch[f"{side}_positions"]
        for r in range(segs.shape[0]):
            runs = _segment_runs(segs[r])
            multi += len(runs) > 1
            assert [s for s, _, _ in runs] == list(range(1, len(runs) + 1))
            for _, a, b in runs:
                np.testing.assert_array_equal(pos[r, a:b], np.arange(b - a))
                assert batch[side][r, b - 1] == 3  # every segment ends with its EOS
    assert multi > 0

    seg = batch["tgt_segments"]
    same = (seg[:, :, None] == seg[:, None, :]) & (seg[:, None, :] > 0)
    enc = np.asarray(segment_mask(batch["src_segments"], batch["src_segments"]))[:, 0]
    dec = np.asarray(causal_segment_mask(seg))[:, 0]
    cross = np.asarray(segment_mask(seg, batch["src_segments"]))[:, 0]
    ss = batch["src_segments"]
    np.testing.assert_array_equal(enc, (ss[:, :, None] == ss[:, None, :]) & (ss[:, None, :] > 0))
    np.testing.assert_array_equal(dec, same & np.tril(np.ones((32, 32), bool)))
    np.testing.assert_array_equal(cross, (seg[:, :, None] == ss[:, None, :]) & (ss[:, None, :] > 0))
    # no query ever sees a key of another pair
    for m, q, k in ((enc, ss, ss), (dec, seg, seg), (cross, seg, ss)):
        other = q[:, :, None] != k[:, None, :]
        assert not (m & other).any()


def test_packed_loss_equals_unpacked_loss_of_the_same_pairs():
    import jax
    import jax.numpy as jnp
    from conftest import BOS, tiny_config
    from flax import nnx

    from seq2seq.model import build_model
    from seq2seq.training.step import make_eval_step

    src, tgt = random_pairs(24, np.random.default_rng(5), hi=9)
    graphdef, params = nnx.split(build_model(tiny_config(), seed=3), nnx.Param)
    packed = PackedBatches(src, tgt, max_len=32, rows=4, seed=0, shuffle=False)
    assert packed.batches_in_epoch(0) < 24 // 4  # several pairs share rows
    unpacked = PackedBatches(src, tgt, max_len=32, rows=4, seed=0, shuffle=False, packing=False)

    eval_step = jax.jit(make_eval_step(graphdef, bos_id=BOS, label_smoothing=0.1))

    def totals(batches):
        out = np.zeros(4)
        for b in batches:
            m = eval_step(params, {k: jnp.asarray(v) for k, v in b.items()})
            out += [float(m[k]) for k in ("loss", "nll", "correct", "tokens")]
        return out

    p, u = totals(packed.epoch(0)), totals(unpacked.epoch(0))
    assert p[3] == u[3] == sum(len(t) for t in tgt)
    np.testing.assert_allclose(p, u, rtol=1e-5)


def test_batch_sequence_is_the_same_after_a_restart():
    src, tgt = random_pairs(150, np.random.default_rng(6))
    run = PackedBatches(src, tgt, max_len=24, rows=4, seed=11)
    uninterrupted = [run.batch_at(k) for k in range(3 * run.batches_in_epoch(0))]
    restart = run.batches_in_epoch(0) + 3  # the second epoch, mid-way
    resumed = PackedBatches(src, tgt, max_len=24, rows=4, seed=11)  # a new process
    for k in range(restart, len(uninterrupted)):
        got = resumed.batch_at(k)
        for key in FIELDS:
            np.testing.assert_array_equal(got[key], uninterrupted[k][key])


@pytest.mark.parametrize("rows, count", [(8, 2), (6, 3)])
def test_process_shares_partition_every_global_batch(rows, count):
    src, tgt = random_pairs(200, np.random.default_rng(7))
    pb = PackedBatches(src, tgt, max_len=24, rows=rows, seed=1)
    for step in (0, 5, pb.batches_in_epoch(0), pb.batches_in_epoch(0) + 1):
        full = pb.batch_at(step)
        shares = [
            PackedBatches(src, tgt, max_len=24, rows=rows, seed=1).batch_at(step, i, count)
            for i in range(count)
        ]
        for key in FIELDS:
            assert all(s[key].shape == (rows // count, 24) for s in shares)
            np.testing.assert_array_equal(np.concatenate([s[key] for s in shares]), full[key])
    # across a whole epoch the shares hold every pair exactly once
    seen = []
    for step in range(pb.batches_in_epoch(0)):
        for i in range(count):
            part = pb.batch_at(step, i, count)
            seen += [r.tobytes() for r in part["src"][part["src_segments"].any(axis=1)]]
    assert len(seen) == len(pb.epoch_rows(0))
    assert len(set(seen)) == len(seen)


def test_process_arguments_are_checked():
    src, tgt = random_pairs(40, np.random.default_rng(8))
    pb = PackedBatches(src, tgt, max_len=24, rows=6, seed=0)
    with pytest.raises(ValueError, match="6 rows per batch cannot be split evenly over 4"):
        pb.batch_at(0, 0, 4)
    with pytest.raises(ValueError, match="process_index=2"):
        pb.batch_at(0, 2, 2)


def test_real_token_share_of_an_epoch_matches_its_batches():
    src, tgt = random_pairs(300, np.random.default_rng(9), hi=12)
    pb = PackedBatches(src, tgt, max_len=32, rows=8, seed=2)
    shares = [real_token_share(b) for b in pb.epoch(1)]
    assert pb.real_token_share(1) == pytest.approx(np.mean(shares))
    tokens = sum(map(len, src)) + sum(map(len, tgt))
    assert pb.real_token_share(1) == pytest.approx(tokens / (2 * 32 * 8 * len(shares)))


def test_prefetcher_gives_the_train_batch_sequence_and_raises_its_errors():
    """The background thread changes no value: each step's batch equals ``train_batch`` at its
    position (across epoch boundaries, with accumulation and a process share), while the main
    thread reads the same batches' epoch sizes concurrently; a failure reaches ``get``."""
    from seq2seq.training.batches import Prefetcher, train_batch

    src, tgt = random_pairs(300, np.random.default_rng(2))
    batches = PackedBatches(src, tgt, max_len=24, rows=4, seed=3)
    reference = PackedBatches(src, tgt, max_len=24, rows=4, seed=3)
    first, accum, share = 5, 3, (1, 2)
    steps = 3 * reference.batches_in_epoch(0) // accum  # about three epochs
    with Prefetcher(batches, first, accum, share, depth=2) as prefetch:
        for k in range(steps):
            got = prefetch.get()
            want = train_batch(reference, first + k * accum, accum, share)
            assert set(got) == set(want)
            for key in want:
                np.testing.assert_array_equal(got[key], want[key])
            assert (got.real_tokens, got.target_tokens) == (want.real_tokens, want.target_tokens)
            batches.locate(first + k * accum)  # the main thread's checkpoint metadata
    assert batches._epoch_sizes == [
        reference.batches_in_epoch(e) for e in range(len(batches._epoch_sizes))
    ]

    class Broken:
        rows = 4

        def batch_at(self, step, *share):
            if step >= 2:
                raise ValueError(f"bad batch {step}")
            return reference.batch_at(step, *share)

        def tokens_at(self, step):
            return reference.tokens_at(step)

    with Prefetcher(Broken(), 0, 1) as prefetch:
        prefetch.get(), prefetch.get()
        with pytest.raises(ValueError, match="bad batch 2"):
            prefetch.get()


def test_a_resume_in_epoch_5_packs_only_epoch_5(tmp_path, monkeypatch):
    """With the epoch sizes kept (``sizes_file``), a fresh reader locating a step in epoch 5
    packs epoch 5 alone, as a resume in epoch 0 packs epoch 0 alone, and lays out the same
    batch as the reader that packed every epoch."""
    from seq2seq.data import batching

    src, tgt = random_pairs(300, np.random.default_rng(4))
    sizes = tmp_path / "train.epochs.json"
    first = PackedBatches(src, tgt, max_len=24, rows=4, seed=2, sizes_file=sizes)
    step = sum(first.batches_in_epoch(e) for e in range(5)) + 3  # the 4th batch of epoch 5
    want = first.batch_at(step)
    packed = []
    real = batching.pack_rows
    monkeypatch.setattr(batching, "pack_rows", lambda *a, **k: packed.append(1) or real(*a, **k))
    resumed = PackedBatches(src, tgt, max_len=24, rows=4, seed=2, sizes_file=sizes)
    assert resumed.locate(step) == (5, 3)
    got = resumed.batch_at(step)
    assert len(packed) == 1  # epoch 5's packing, nothing of epochs 0-4
    for key in want:
        np.testing.assert_array_equal(got[key], want[key])
