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
