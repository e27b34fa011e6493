"""Fingerprints of frozen tensors: equal bytes give equal ones, a change of any word
another, and the device sum is the exact integer the module doc defines."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from layercheck.storage.fingerprint import CHUNK, fingerprint, fingerprints


def reference_sum(data: bytes) -> int:
    """The device sum of the module doc, computed here from its definition (numpy, int64)."""
    raw = np.frombuffer(data, dtype=np.uint8)
    words = raw[: len(raw) // 2 * 2].view(np.int16).astype(np.int64)
    j = np.arange(CHUNK, dtype=np.int64)
    table = ((j * 2654435761) % (1 << 32)) >> 17 | 1
    sums = [int((words[c:c + CHUNK] * table[:len(words[c:c + CHUNK])]).sum())
            for c in range(0, len(words), CHUNK)]
    if len(raw) % 2:
        sums.append(int(raw[-1]))
    h, mask = len(sums), (1 << 64) - 1
    for c, s in enumerate(sums):
        h = (h + s * (((c + 1) * 0x9E3779B97F4A7C15) & mask | 1)) & mask
    return h


@pytest.mark.parametrize("tensor", [
    torch.randn(CHUNK + 12345),                        # two chunks, the second partial
    torch.randn(2 * CHUNK // 2).to(torch.bfloat16),    # exactly one chunk of int16 words
    torch.arange(7, dtype=torch.uint8),                # an odd byte at the end
    torch.tensor(3.5, dtype=torch.float64),            # 0-d
    torch.zeros(0),                                     # empty
], ids=["two-chunks", "one-chunk", "odd-bytes", "0-d", "empty"])
def test_the_device_sum_is_the_defined_integer(tensor):
    data = tensor.reshape(-1).view(torch.uint8).numpy().tobytes() if tensor.numel() else b""
    kind = f"{str(tensor.dtype).removeprefix('torch.')}{list(tensor.shape)}"
    assert fingerprint(tensor, summed=True) == f"sum64:{reference_sum(data):016x}:{kind}"


@pytest.mark.parametrize("summed", [False, True], ids=["crc32c", "sum64"])
def test_any_one_changed_word_changes_the_fingerprint(summed):
    gen = torch.Generator().manual_seed(0)
    t = torch.randn(3 * CHUNK // 2 + 5, generator=gen)
    before = fingerprint(t, summed=summed)
    assert fingerprint(t.clone(), summed=summed) == before
    for place in torch.randint(0, t.numel(), (20,), generator=gen).tolist() + [0, t.numel() - 1]:
        changed = t.clone()
        changed.view(torch.int32)[place] ^= 1 << (place % 32)  # one bit of one word
        assert fingerprint(changed, summed=summed) != before, place
    # an EMA step that no version counter sees
    moved = t.clone()
    moved.data.mul_(0.999)
    assert fingerprint(moved, summed=summed) != before


def test_dtype_shape_and_layout():
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    assert fingerprint(t) != fingerprint(t.reshape(4, 3))  # same bytes, another shape
    assert fingerprint(t) != fingerprint(t.view(torch.int32))  # same bytes, another dtype
    assert fingerprint(t.T.contiguous().T) == fingerprint(t)  # the values, whatever the strides
    odd = torch.arange(9, dtype=torch.uint8)[1:]  # starts at an odd byte: words of a copy
    assert fingerprint(odd, summed=True) == fingerprint(odd.clone(), summed=True)
    both = fingerprints({"a": t, "b": odd}, summed=True)
    assert both == {"a": fingerprint(t, summed=True), "b": fingerprint(odd, summed=True)}
