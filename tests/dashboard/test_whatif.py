"""dashboard.whatif: settings, outcome numbers and figures."""
from __future__ import annotations

import numpy as np
import pytest

from dashboard import whatif
from layercheck.contract.config import ConfigError


def test_recorded_settings_replay_the_recorded_writes(trace):
    settings = whatif.Settings.from_trace(trace)
    replayed = whatif.replay_trace(trace, settings)
    np.testing.assert_array_equal(replayed.writes, trace.write_matrix())


def test_outcome_counts_match_the_writes(trace):
    settings = whatif.Settings.from_trace(trace)
    replayed = whatif.replay_trace(trace, settings)
    out = whatif.outcome(trace, replayed, settings)
    assert out.layer_writes == len(trace.writes)
    assert out.checkpoints == trace.writes["step"].nunique()
    assert out.total_bytes == trace.writes["bytes"].sum()
    assert out.by_reason["base"] == len(trace.layer_names)
    assert out.max_staleness <= settings.smax + settings.interval - 1
    assert 0 < out.io_saving < 1
    assert out.full_total_bytes == trace.num_steps * trace.full_checkpoint_bytes


def test_lower_threshold_writes_more_and_is_fresher(trace):
    hi = whatif.Settings.from_trace(trace)
    lo = whatif.Settings(**{**hi.__dict__, "base_threshold": hi.base_threshold / 10})
    a = whatif.outcome(trace, whatif.replay_trace(trace, hi), hi)
    b = whatif.outcome(trace, whatif.replay_trace(trace, lo), lo)
    assert b.layer_writes > a.layer_writes
    assert b.mean_weighted_staleness < a.mean_weighted_staleness


def test_zero_threshold_writes_every_layer_at_every_opportunity(trace):
    s = whatif.Settings(base_threshold=0.0, embedding_threshold=0.0, smax=100, warmup_steps=10,
                        interval=5)
    out = whatif.outcome(trace, whatif.replay_trace(trace, s), s)
    assert out.layer_writes == (trace.num_steps // 5 - 1) * len(trace.layer_names)
    assert out.io_saving == pytest.approx(1 / (trace.num_steps // 5))


def test_bad_settings_say_the_fix():
    with pytest.raises(ConfigError, match="shorten the warm-up or raise smax"):
        whatif.Settings(smax=10, warmup_steps=20)


def test_figures_and_tables(trace):
    s = whatif.Settings.from_trace(trace)
    r = whatif.replay_trace(trace, s)
    assert len(whatif.io_figure(trace, r, s).data) == 2
    assert len(whatif.staleness_figure(trace, r).data) == 2
    assert len(whatif.writes_figure(trace, r).data) == 3
    frame = whatif.written_trace_frame(trace, r)
    assert list(frame["step"]) == list(trace.writes["step"])
    assert set(whatif.summary_frame(whatif.outcome(trace, r, s))["quantity"]) >= {"layer writes", "total GB"}


def test_budget_mode_replays_the_controller_and_keeps_the_rate(trace):
    free = whatif.Settings.from_trace(trace)
    rate = whatif.outcome(trace, whatif.replay_trace(trace, free), free).bytes_per_step
    held = whatif.Settings(**{**free.__dict__, "write_budget": rate / 3})
    replayed = whatif.replay_trace(trace, held)
    assert replayed.method == "lanes" and len(set(replayed.k_scales())) > 2
    out = whatif.outcome(trace, replayed, held)
    assert out.bytes_per_step <= held.write_budget * 1.05
    assert out.max_staleness <= held.smax
    fig = whatif.budget_figure(trace, replayed, held)
    assert [t.name for t in fig.data] == ["written since the base", "budget x steps", "K factor (right)"]


def test_a_garbled_recorded_config_is_refused_not_replaced_by_the_defaults(trace):
    """The what-if opens at the recorded settings: one that is not valid is the trace
    error every reader of the recorded config raises (``layercheck.contract.decision``), never
    the defaults shown as what the run was recorded with."""
    import dataclasses

    from layercheck.contract.decision import recorded_config
    from layercheck.contract.trace import TraceError
    from sim.frontier import recorded_config as frontiers
    garbled = dataclasses.replace(trace, manifest={**trace.manifest,
                                                   "config": {"smax": 10, "warmup_steps": 20}})
    for read in (whatif.Settings.from_trace, recorded_config, frontiers):
        with pytest.raises(TraceError, match="recorded config .* not valid .*shorten the warm-up"):
            read(garbled)
