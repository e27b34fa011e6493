"""How well the probes beside a validation's runs estimated their restarts
(``profiler.failures.estimates``)."""
from __future__ import annotations

import json

import pytest

from profiler.failures.estimates import estimate_errors, main, restart_per_failure


def test_a_failure_during_a_restart_ends_that_restart():
    # failures at 10, 14 and 50 of a 60 s window, restarts of 8 s: the second failure
    # cuts the first restart at 4 s, so the total is 4 + 8 + 8
    assert restart_per_failure(20.0, [10.0, 14.0, 50.0], 60.0) == pytest.approx(8.0)
    # the last restart runs into the window's end: 8 + 8 + 3
    assert restart_per_failure(19.0, [10.0, 30.0, 57.0], 60.0) == pytest.approx(8.0)
    assert restart_per_failure(0.0, [], 60.0) == 0.0
    with pytest.raises(ValueError, match="longer than the window"):
        restart_per_failure(60.0, [10.0], 60.0)


def _doc():
    def run(restarts):
        table = [{"strategy": s} for s in restarts]
        return {"failures_s": [10.0, 40.0], "table": table,
                "probes": {s: {"restarts_s": list(p)} for s, (p, _) in restarts.items()},
                "measured": {s: {"restart_s": 2 * r} for s, (_, r) in restarts.items()}}
    return {"window_s": 100.0, "runs": [
        run({"deepspeed": ((9.0, 10.0, 11.0), 10.0), "gemini": ((12.0, 12.0, 12.0), 11.0)}),
        run({"deepspeed": ((10.0, 10.0, 10.0), 9.0)})]}


def test_each_run_is_estimated_before_it_and_bracketed_by_the_next_run_s_probe():
    errors = estimate_errors(_doc())
    assert errors["before"] == pytest.approx([0.0, 1.0, 1.0])
    # the first run: 9, 10, 11, 12, 12, 12 -> 11.5; the second: 12 x 3 and 10 x 3 -> 11;
    # the last has no probe after it
    assert errors["bracketed"] == pytest.approx([1.5, 0.0, 1.0])


def test_a_document_s_own_restarts_after_a_run_bracket_it():
    doc = _doc()
    doc["runs"][1]["probes"]["deepspeed"]["after_s"] = [14.0, 14.0, 14.0]
    # the last run: 10 x 3 and 14 x 3 -> 12, 3 over its 9 s
    assert estimate_errors(doc)["bracketed"] == pytest.approx([1.5, 0.0, 3.0])


def test_the_command_prints_both_estimates_and_refuses_a_document_without_probes(tmp_path,
                                                                                 capsys):
    good, bad = tmp_path / "v.json", tmp_path / "old.json"
    good.write_text(json.dumps(_doc()))
    bad.write_text(json.dumps({"window_s": 100.0, "runs": [{"table": [{"strategy": "x"}]}]}))
    assert main([str(good), str(good)]) == 0
    out = capsys.readouterr().out
    assert "before     root mean square 0.82 s, mean +0.67 s (3 runs)" in out
    assert "all" in out and "(6 runs)" in out
    assert main([str(bad)]) == 2
    assert "not a validation document with probes" in capsys.readouterr().err
    assert main([]) == 2
