"""The machine a trace was captured on: device, torch, CPU, and measured storage bandwidth.

Bandwidth is measured where the checkpoints go, before training: write
``probe_bytes`` with fsync (what a layer write costs), drop the file from the
page cache (``posix_fadvise(DONTNEED)`` where the OS has it), read it back.
"""
from __future__ import annotations

import os
import platform
import time
import uuid
from pathlib import Path
from typing import Any

__all__ = ["describe_machine", "host", "cpu_model", "measure_bandwidth", "resolve_device"]

PROBE_BYTES = 64 << 20
CHUNK = 4 << 20


def resolve_device(requested: str) -> tuple[str, str | None]:
    """(device to use, a one-line note when it differs from the request)."""
    import torch
    if requested == "cuda" and not torch.cuda.is_available():
        return "cpu", (f"profiler: --device cuda asked, but this torch ({torch.__version__}) sees "
                       "no CUDA GPU; running on cpu instead")
    return requested, None


def describe_machine(device: str, directory: Path, *, probe_bytes: int = PROBE_BYTES) -> dict[str, Any]:
    import torch
    info: dict[str, Any] = {
        "device": device if device == "cpu" else f"cuda:{torch.cuda.get_device_name(0)}",
        "torch": torch.__version__, "python": platform.python_version(),
        "cpu": cpu_model(), "cpu_count": os.cpu_count(), "threads": torch.get_num_threads(),
        "platform": platform.platform(),
    }
    info.update(measure_bandwidth(directory, probe_bytes))
    return info


def host(*packages: str) -> dict[str, Any]:
    """The machine as a benchmark records it (``benchmarks/``): CPU model, cores,
    Python, and the installed version of each of ``packages`` (None where it is not
    installed). Nothing is imported, so a torch-free benchmark may call it."""
    from importlib.metadata import PackageNotFoundError, version

    def installed(name: str) -> str | None:
        try:
            return version(name)
        except PackageNotFoundError:
            return None
    return {"cpu": cpu_model(), "cpus": os.cpu_count(), "python": platform.python_version(),
            **{name: installed(name) for name in packages}}


def measure_bandwidth(directory: Path, nbytes: int = PROBE_BYTES) -> dict[str, Any]:
    """Write then read ``nbytes`` in ``directory``: bytes/s each way."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f".bandwidth-{uuid.uuid4().hex[:8]}"
    block = os.urandom(CHUNK)  # incompressible, so no filesystem shortcut
    try:
        write_s = _timed_write(path, block, nbytes)
        cold = _drop_cache(path)
        read_s = _timed_read(path)
    finally:
        path.unlink(missing_ok=True)
    return {"write_bytes_per_s": nbytes / write_s, "read_bytes_per_s": nbytes / read_s,
            "bandwidth_probe_bytes": nbytes, "bandwidth_where": "the checkpoint folder",
            "read_from": "storage" if cold else "page cache (could not drop it)"}


def _timed_write(path: Path, block: bytes, nbytes: int) -> float:
    start = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for _ in range(max(1, nbytes // len(block))):
            os.write(fd, block)
        os.fsync(fd)
    finally:
        os.close(fd)
    return time.perf_counter() - start


def _drop_cache(path: Path) -> bool:
    if not hasattr(os, "posix_fadvise"):
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return True


def _timed_read(path: Path) -> float:
    start = time.perf_counter()
    with open(path, "rb", buffering=0) as handle:
        while handle.read(CHUNK):
            pass
    return time.perf_counter() - start


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what ``platform`` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
