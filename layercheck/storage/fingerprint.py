"""What a tensor's bytes are now, cheaply enough to ask at every version: the proof that a
frozen tensor did not change.

Frozen (``requires_grad`` False) is not unchanged: an EMA teacher (MoCo, DINO,
BYOL) moves every step without training, and code can write any tensor. A
version may leave a tensor out only while it provably equals the copy the
version names (``layercheck.frozen``: a full version's file, a pretrained file;
``layercheck.zero``: the live model's own); ``fingerprint`` is that proof, taken
where the tensor is:

- **host memory**: CRC-32C of its bytes (``checksums``: the CPU's CRC
  instruction, about a plain read's speed; the checksum a pretrained reference
  records, so both name the same bytes alike);
- **device memory** (CUDA and the rest): an exact integer sum computed there,
  sum over the bytes read as int16 words x_j of x_j * m_j, m_j an odd 15-bit
  multiplier fixed by j's place in its chunk of ``CHUNK`` words, each chunk's
  sum weighted on the host by a 64-bit multiplier of its index. Nothing
  overflows (|x m| < 2^30, a chunk's sum < 2^50), so it is exact: the same
  integers on every device, in any summation order. Only one int64 per chunk
  crosses to the host, where copying the tensor there would cost what
  capturing it costs. A change of any one word always changes it.

Torch's ``_version`` counter is no proof: writes through ``.data`` (MoCo's own
EMA code) or a raw pointer do not bump it, and it does not outlive the process.
Both fingerprints are deterministic across processes and machines, and carry
the tensor's dtype and shape: fingerprints of another algorithm (a tensor that
moved between host and device) never compare equal, which only costs a write.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Mapping

import torch

from .checksums import CHECKSUM, CHECKSUMS, checksum

__all__ = ["fingerprint", "fingerprints", "recomputed", "CHUNK"]

CHUNK = 1 << 20
"""int16 words per chunk of the device sum (its multiplier table: 4 MiB per device)."""
_GOLDEN = 0x9E3779B97F4A7C15
_MASK = (1 << 64) - 1


def fingerprint(tensor: torch.Tensor, *, summed: bool = False) -> str:
    """The fingerprint of ``tensor``'s bytes (module doc): equal for equal bytes, dtype
    and shape; other bytes give another one but for a checksum's chance collision."""
    return fingerprints({"": tensor}, summed=summed)[""]


def fingerprints(tensors: Mapping[str, torch.Tensor], *, summed: bool = False,
                 algorithm: str = CHECKSUM) -> dict[str, str]:
    """``fingerprint`` of each tensor; those on devices are summed there and cross to
    the host together (one synchronisation per device, not per tensor). ``summed``:
    the device sum for host tensors too (what tests and benchmarks of it run here);
    ``algorithm``: the checksum of host tensors (``checksums.CHECKSUMS``)."""
    out, sums = {}, {}
    for name, tensor in tensors.items():
        data = tensor.detach()
        what = f"{str(data.dtype).removeprefix('torch.')}{list(data.shape)}"
        flat = data.reshape(-1).view(torch.uint8) if data.numel() else \
            torch.zeros(0, dtype=torch.uint8, device=data.device)
        if flat.device.type == "cpu" and not summed:
            out[name] = f"{checksum(memoryview(flat.numpy()), algorithm)}:{what}"
        else:
            sums.setdefault(flat.device, []).append((name, what, _chunk_sums(flat)))
    for device_sums in sums.values():
        values = torch.cat([s for _, _, s in device_sums]).tolist()
        start = 0
        for name, what, s in device_sums:
            out[name] = f"sum64:{_combine(values[start:start + len(s)]):016x}:{what}"
            start += len(s)
    return out


def recomputed(tensor: torch.Tensor, recorded: str) -> str | None:
    """``tensor``'s fingerprint taken as ``recorded`` was (its algorithm, wherever the
    tensor is now; cast to its dtype, so a bf16 copy of fp32 weights compares as the
    bf16 tensor it became), to compare with it; None where ``recorded`` names no
    dtype or algorithm this module has."""
    algorithm, kind = recorded.partition(":")[0], recorded.rpartition(":")[2]
    dtype = getattr(torch, kind.partition("[")[0], None)
    if algorithm not in ("sum64", *CHECKSUMS) or not isinstance(dtype, torch.dtype):
        return None
    if algorithm == "sum64":
        return fingerprint(tensor.detach().to(dtype), summed=True)
    return fingerprints({"": tensor.detach().to("cpu", dtype)}, algorithm=algorithm)[""]


def _chunk_sums(data: torch.Tensor) -> torch.Tensor:
    """Per chunk of ``data``'s int16 words, sum x_j m_j (int64, on its device); then the
    odd last byte's value, if any."""
    even = data[: data.numel() // 2 * 2]
    try:
        words = even.view(torch.int16)
    except RuntimeError:  # bytes that start at an odd address: int16 words of a copy
        words = even.clone().view(torch.int16)
    table = _multipliers(data.device)
    whole = words.numel() // CHUNK * CHUNK
    sums = [torch.mul(words[:whole].view(-1, CHUNK), table).sum(dim=1, dtype=torch.int64)]
    if words.numel() > whole:
        rest = words.numel() - whole
        sums.append(torch.mul(words[whole:], table[:rest]).sum(dtype=torch.int64).view(1))
    if data.numel() % 2:
        sums.append(data[-1:].to(torch.int64))
    return torch.cat(sums)


def _combine(sums: list[int]) -> int:
    """The chunk sums weighted by odd 64-bit multipliers of their index, modulo 2^64."""
    h = len(sums)
    for c, s in enumerate(sums):
        h = (h + s * (((c + 1) * _GOLDEN) & _MASK | 1)) & _MASK
    return h


@lru_cache(maxsize=None)
def _multipliers(device: torch.device) -> torch.Tensor:
    """The odd 15-bit multiplier of each place in a chunk (a fixed formula, not an RNG:
    every process and torch version computes the same table), on ``device``."""
    j = torch.arange(CHUNK, dtype=torch.int64)
    return (((j * 2654435761) % (1 << 32)) >> 17 | 1).to(torch.int32).to(device)
