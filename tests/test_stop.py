"""``agree_to_stop`` in one process: the inputs come back unchanged, with no collective.

The multi-process agreement is proved on two real processes in
tests/test_sharding_multidevice.py (SIGTERM to one of them stops both at the same step).
"""

import signal

import pytest
from jax.experimental import multihost_utils

from seq2seq.sharding import agree_to_stop


@pytest.mark.parametrize(
    "signum, out_of_time",
    [(None, False), (None, True), (signal.SIGINT, False), (signal.SIGTERM, True)],
)
def test_one_process_returns_its_own_flags_without_a_collective(monkeypatch, signum, out_of_time):
    def no_collective(*args, **kwargs):
        raise AssertionError("a single process must not call a collective")

    monkeypatch.setattr(multihost_utils, "process_allgather", no_collective)
    assert agree_to_stop(signum, out_of_time) == (signum, out_of_time)
