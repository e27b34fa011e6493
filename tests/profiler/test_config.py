"""CaptureConfig / DrillConfig: the paper's defaults, their scaling, and rejected values."""
from __future__ import annotations

import pytest

from profiler.config import PAPER, CaptureConfig, DrillConfig
from profiler.errors import ProfilerError


def test_short_runs_scale_warmup_and_smax_to_the_run_length():
    c = CaptureConfig(steps=300)
    assert c.resolved_warmup == round(200 * 300 / 1692) == 35
    assert c.resolved_smax == round(1000 * 300 / 1692) == 177
    assert "200 x 300/1692" in c.scaling_note and "1000 x 300/1692" in c.scaling_note
    lc = c.layercheck_config()
    assert (lc.base_threshold, lc.embedding_threshold) == (1e-3, 1e-2)
    assert (lc.warmup_steps, lc.smax) == (35, 177)


def test_long_runs_keep_the_papers_values_and_given_values_win():
    c = CaptureConfig(steps=PAPER["steps"] + 8)
    assert (c.resolved_warmup, c.resolved_smax) == (200, 1000)
    g = CaptureConfig(steps=50, warmup_steps=4, smax=9, threshold=0.5)
    lc = g.layercheck_config()
    assert (lc.warmup_steps, lc.smax, lc.base_threshold, lc.embedding_threshold) == (4, 9, 0.5, 5.0)
    assert "[given]" in g.scaling_note


@pytest.mark.parametrize("changes, words", [
    ({"steps": -5}, "steps=-5"),
    ({"steps": 0}, "steps=0"),
    ({"batch_size": 0}, "batch_size"),
    ({"seq_len": 4}, "seq_len"),
    ({"lr": -1.0}, "lr"),
    ({"threshold": -1e-3}, "threshold"),
    ({"device": "tpu"}, "device"),
    ({"fused_step": "yes"}, "fused_step='yes': use true or false"),
    ({"steps": 10, "warmup_steps": 10}, "lower --warmup-steps"),
    ({"warmup_steps": 20, "smax": 5}, "exceeds smax"),
])
def test_bad_values_are_rejected_with_the_fix(changes, words):
    with pytest.raises(ProfilerError, match=words.replace("[", r"\[")):
        CaptureConfig(**changes)


def test_round_trip_and_unknown_keys():
    c = CaptureConfig(model="tiny", steps=20, threads=1)
    assert CaptureConfig.from_dict(c.to_dict()) == c
    with pytest.raises(ProfilerError, match="unknown capture settings"):
        CaptureConfig.from_dict({**c.to_dict(), "bogus": 1})


def test_drill_needs_room_for_its_failures():
    with pytest.raises(ProfilerError, match="failures"):
        DrillConfig(capture=CaptureConfig(steps=10, warmup_steps=8), failures=3)
    assert DrillConfig(capture=CaptureConfig(steps=10, warmup_steps=7), failures=3).failures == 3


def test_fused_step_reaches_layercheck_with_or_without_a_whole_config():
    assert CaptureConfig(model="tiny", steps=20, fused_step=True).layercheck_config().fused_step
    assert not CaptureConfig(model="tiny", steps=20).layercheck_config().fused_step
    given = {"warmup_steps": 2, "smax": 10}
    assert CaptureConfig(model="tiny", steps=20, fused_step=True,
                         layercheck=given).layercheck_config().fused_step
    assert CaptureConfig(model="tiny", steps=20, layercheck={**given, "fused_step": True}
                         ).layercheck_config().fused_step
