"""Answers kept on disk as JSON: read back equal, keyed by every input and the code, and a
damaged or foreign file is computed again, never trusted (nor unpickled)."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from dashboard import answerstore


def _frame() -> pd.DataFrame:
    return pd.DataFrame({"strategy": ["a", None, "c"], "ratio": [0.1 + 0.2, np.nan, -np.inf],
                         "n": np.array([1, 2, 3], dtype=np.int64), "ok": [True, False, True],
                         "tiny": [5e-324, 1.7976931348623157e308, 2.0000000000000004]})


def test_a_frame_reads_back_to_the_bit():
    frame = _frame()
    back = answerstore.frame_of(json.loads(json.dumps(answerstore.frame_payload(frame))))
    pd.testing.assert_frame_equal(back, frame, check_exact=True)
    assert back["ratio"].iloc[0] == 0.1 + 0.2


def _store(parts, value, calls):
    def compute():
        calls.append(parts)
        return value
    return answerstore.cached(parts, compute, encode=lambda v: {"frame": answerstore.frame_payload(v)},
                              decode=lambda p: answerstore.frame_of(p["frame"]))


def test_an_answer_is_computed_once_and_read_back_equal(answer_store):
    calls = []
    first = _store({"argv": ["--mtbf", "1h"]}, _frame(), calls)
    again = _store({"argv": ["--mtbf", "1h"]}, None, calls)   # None: would fail if computed
    assert len(calls) == 1 and len(list(answer_store.glob("*.json"))) == 1
    pd.testing.assert_frame_equal(again, first, check_exact=True)


def test_another_input_or_other_code_is_another_answer(answer_store, tmp_path, monkeypatch):
    calls = []
    _store({"argv": ["--mtbf", "1h"]}, _frame(), calls)
    _store({"argv": ["--mtbf", "2h"]}, _frame().head(1), calls)
    assert len(calls) == 2
    source = tmp_path / "sim"
    source.mkdir()
    (source / "engine.py").write_text("RATE = 1\n")
    monkeypatch.setattr(answerstore, "_SOURCES", (source,))
    answerstore.fingerprint.cache_clear()
    before = answerstore.key({"argv": []})
    (source / "engine.py").write_text("RATE = 2\n")
    answerstore.fingerprint.cache_clear()
    assert answerstore.key({"argv": []}) != before
    answerstore.fingerprint.cache_clear()


@pytest.mark.parametrize("damage", [
    b"", b'{"format": 1, "key": "', b"\x80\x04\x95not json",
    b"\x80\x04\x95\x0e\x00\x00\x00\x00\x00\x00\x00}\x94\x8c\x06format\x94K\x01s.",  # a pickle
    "foreign",          # a whole file, written for another key
    "payload"],         # JSON of the right key whose payload is not a frame
    ids=["empty", "truncated", "not-json", "pickle", "foreign", "payload"])
def test_a_damaged_or_foreign_file_is_computed_again(answer_store, damage):
    parts = {"argv": ["--mtbf", "1h"]}
    calls = []
    _store(parts, _frame(), calls)
    path, = answer_store.glob("*.json")
    if damage == "foreign":
        stored = json.loads(path.read_text())
        stored["key"] = "0" * 40
        damage = json.dumps(stored).encode()
    elif damage == "payload":
        stored = json.loads(path.read_text())
        stored["payload"] = {"frame": {"columns": ["x"], "dtypes": ["float64"], "data": []}}
        damage = json.dumps(stored).encode()
    path.write_bytes(damage)
    again = _store(parts, _frame().head(2), calls)
    assert len(calls) == 2 and len(again) == 2              # computed, not read
    assert len(_store(parts, None, calls)) == 2 and len(calls) == 2   # and kept again, whole


def test_a_folder_that_cannot_be_written_keeps_nothing(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv(answerstore.ENV, str(blocker / "answers"))
    calls = []
    assert len(_store({"a": 1}, _frame(), calls)) == 3
    assert len(_store({"a": 1}, _frame(), calls)) == 3 and len(calls) == 2
