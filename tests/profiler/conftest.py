"""A short real capture of the tiny model, shared by the tests that read a trace."""
from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from profiler.capture import capture  # noqa: E402
from profiler.config import CaptureConfig  # noqa: E402

TINY = dict(model="tiny", steps=14, batch_size=4, seq_len=32, warmup_steps=3, smax=8,
            threads=1, eval_sequences=8)


@pytest.fixture(scope="session")
def tiny_capture(tmp_path_factory):
    out = tmp_path_factory.mktemp("traces") / "tiny"
    return capture(CaptureConfig(**TINY), out=out, progress=False, say=lambda _: None,
                   calibrate=False)


@pytest.fixture(scope="session")
def calibrated_tiny(tiny_capture, tmp_path_factory):
    """A copy of the tiny capture with its costs.json, by
    ``python -m profiler calibrate --trace`` (one repeat per figure)."""
    import shutil

    from profiler.cli import main
    folder = tmp_path_factory.mktemp("calibrated") / "tiny"
    shutil.copytree(tiny_capture.path, folder)
    assert main(["calibrate", "--trace", str(folder), "--repeats", "1", "--quiet"]) == 0
    return folder
