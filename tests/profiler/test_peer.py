"""GEMINI's peer copy, measured over loopback (profiler.mechanisms.peer)."""
import os

import pytest
import torch

from profiler.mechanisms import peer
from profiler.mechanisms.peer import loopback_copy_seconds


def _children() -> set[int]:
    """This process's live child processes (Linux /proc)."""
    me = str(os.getpid())
    kids = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[1] == me and fields[0] != "Z":
            kids.add(int(pid))
    return kids


def test_loopback_peer_copy_returns_a_positive_rate_and_its_peer_is_gone():
    before = _children()
    tensors = [torch.randn(1 << 20), torch.zeros(3, dtype=torch.bfloat16), torch.tensor(7)]
    nbytes, seconds = loopback_copy_seconds(tensors, 3, timeout_s=30)
    assert nbytes == (1 << 20) * 4 + 3 * 2 + 8
    assert len(seconds) == 3 and all(s > 0 for s in seconds)
    assert nbytes / min(seconds) > 1e6                      # loopback moves MB/s at least
    assert _children() == before                            # the peer process exited


def test_a_peer_that_never_answers_is_killed_at_the_deadline(monkeypatch):
    before = _children()
    # a peer that announces a port nobody listens on, then sleeps past the deadline
    monkeypatch.setattr(peer, "_PEER", "import sys, time\nprint(1, flush=True)\ntime.sleep(60)\n")
    with pytest.raises(OSError):
        loopback_copy_seconds([torch.ones(4)], 1, timeout_s=2)
    assert _children() == before


def test_bad_input_says_what_to_fix():
    with pytest.raises(ValueError, match="repeats"):
        loopback_copy_seconds([torch.ones(4)], 0)
