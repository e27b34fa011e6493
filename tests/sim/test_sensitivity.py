import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from layercheck.contract.band import BandError
from layercheck.contract.calibration import TRANSFERRED_STALE_COST, Band, CalibrationError, Figure
from sim.calibrated import FIGURES, band_of
from sim import CostModel, Scenario, SimError
from sim.presets import PRESET_NAMES
from sim.sensitivity import sensitivity

ROOT = Path(__file__).resolve().parents[2]
DAY = 86400.0


def _small(preset="qwen2.5-7b", **fields):
    return Scenario.from_preset(preset, window_s=3 * DAY, **fields)


# -- the bands live with the figures ----------------------------------------------------------
def test_every_figure_spec_declares_a_default_band_with_a_reason():
    for name, spec in FIGURES.items():
        assert spec.band is not None, name
        assert len(spec.band.reason) > 40, name


@pytest.mark.parametrize("costs", [CostModel.paper_a100()] + [
    Scenario.from_preset(p).costs for p in PRESET_NAMES], ids=["paper-a100", *PRESET_NAMES])
def test_every_figure_not_measured_here_has_a_band_holding_its_value(costs):
    for name in FIGURES:
        record = costs.provenance[name]
        assert record.source != "measured"
        band = costs.band(name)
        assert band is not None and band.reason.strip(), name
        assert band.low <= getattr(costs, name) <= band.high, name


def test_the_paper_figures_carry_their_own_bands_and_presets_read_them_back():
    paper = CostModel.paper_a100()
    own = {n for n in FIGURES if paper.provenance[n].band is not None}
    assert {"save_gbps", "load_gbps", "snapshot_gbps", "restart_s", "diff_fraction"} <= own
    preset = Scenario.from_preset("qwen2.5-7b").costs    # read from the trace's costs.json
    assert preset.band("save_gbps") == paper.provenance["save_gbps"].band


def test_a_measured_figure_has_no_band_and_an_interval_is_its_band():
    measured = Figure(value=2.0, source="measured", method="timed", samples=(1.0, 2.0))
    assert band_of("save_gbps", measured) is None
    phi = Figure(value=0.4, low=0.1, high=0.9, source="measured", method="95% CI of 3 runs")
    band = band_of("stale_cost", phi)
    assert (band.low, band.high) == (0.1, 0.9) and "95% CI" in band.reason
    # the transferred phi carries the measured interval: that is its band
    transferred = CostModel.paper_a100().band("stale_cost")
    assert (transferred.low, transferred.high) == TRANSFERRED_STALE_COST.interval
    # an interval of no width is no band: the spec's rule (0 to 1) applies
    point = Figure(value=0.4, low=0.4, high=0.4, source="transferred", method="m")
    assert (band_of("stale_cost", point).low, band_of("stale_cost", point).high) == (0.0, 1.0)
    minilm = Scenario.from_trace(__import__("layercheck.contract.trace", fromlist=["read_trace"]).read_trace(
        ROOT / "traces" / "minilm-200steps")).costs
    # measured on the capture: no band; assumed there (LowDiff's batch size): its band
    assert minilm.band("save_gbps") is None and minilm.band("peer_gbps") is None
    assert minilm.band("diff_batch") is not None


def test_a_band_states_its_reason_and_holds_the_value():
    with pytest.raises(BandError, match="reason"):
        Band(low=1.0, high=2.0, reason=" ")
    with pytest.raises(BandError, match="low must not exceed high"):
        Band(low=3.0, high=2.0, reason="r")
    with pytest.raises(CalibrationError, match="must hold value"):
        Figure(value=5.0, source="assumed", method="m", band=Band(low=1.0, high=2.0, reason="r"))
    figure = Figure(value=1.5, source="assumed", method="m", band=Band(low=1.0, high=2.0, reason="r"))
    assert Figure.from_dict(figure.to_dict()) == figure
    with pytest.raises(CalibrationError, match="band must be an object"):
        Figure.from_dict({**figure.to_dict(), "band": {"low": 1.0}})


# -- the tornado -----------------------------------------------------------------------------------
def test_each_strategys_range_brackets_its_point_ratio():
    result = sensitivity(_small(), mtbf_s=1800.0, seeds=2, window_s=3 * DAY,
                         figures=["save_gbps", "persist_gbps", "peer_gbps", "restart_s",
                                  "stale_cost"])
    frame = result.frame()
    assert set(frame["figure"]) == {"save_gbps", "persist_gbps", "peer_gbps", "restart_s",
                                    "stale_cost"}
    # at phi > 0 LayerCheck's ratio holds the composite's stale work, which depends on
    # where the failures strike (a restart's length moves them) and so is not monotone in
    # any other figure: its rows are checked at phi = 0, where only time is counted
    stale = dataclasses.replace(_small(), costs=_small().costs.with_overrides(stale_cost=0.0))
    timed = sensitivity(stale, mtbf_s=1800.0, seeds=2, window_s=3 * DAY,
                        figures=["restart_s"]).frame()
    layercheck = frame.strategy.str.startswith("layercheck") & (frame.figure != "stale_cost")
    for row in [*frame[~layercheck].itertuples(), *timed.itertuples()]:
        low, high = sorted((row.at_low, row.at_high))
        assert low - 1e-9 <= row.point <= high + 1e-9, (row.figure, row.strategy)
    # each figure moves the strategies that use it: a faster storage write helps deepspeed
    save = frame[(frame.figure == "save_gbps") & (frame.strategy == "deepspeed")].iloc[0]
    assert save.at_high > save.point
    gemini_rows = frame[(frame.figure == "save_gbps") & (frame.strategy == "gemini")]
    assert gemini_rows.iloc[0].swing == 0


def test_a_figure_that_flips_the_ranking_is_named_with_its_new_leader():
    # GEMINI leads the preset at MTBF 0.5 h; a 12 GB/s synchronous save (the paper's
    # LowDiff checkpoint share read as write time) puts DeepSpeed ahead of it
    result = sensitivity(_small(), mtbf_s=1800.0, seeds=2, window_s=3 * DAY,
                         figures=["save_gbps", "lc_commit_s"])
    assert result.leader == "gemini"
    flips = result.flips()
    assert [(f["figure"], f["end"], f["leader"]) for f in flips] == [("save_gbps", "high", "deepspeed")]
    assert "save_gbps at its high end (12) puts deepspeed first" in result.text()


def test_no_flip_is_reported_as_none():
    result = sensitivity(_small(), mtbf_s=1800.0, seeds=2, window_s=3 * DAY,
                         figures=["lc_commit_s", "diff_replay_gbps"])
    assert result.flips() == []
    assert "no figure's band changes which strategy ranks first (gemini)" in result.text()


def test_measured_and_given_figures_are_not_varied():
    from layercheck.contract.trace import read_trace
    scenario = Scenario.from_trace(read_trace(ROOT / "traces" / "minilm-200steps"), stale_cost=0.5)
    result = sensitivity(scenario, mtbf_s=3600.0, seeds=1, window_s=0.5 * DAY,
                         figures=["save_gbps", "peer_gbps", "diff_batch", "stale_cost"])
    assert [r["figure"] for r in result.rows] == ["diff_batch"]
    why = {u["figure"]: u["why"] for u in result.unvaried}
    assert why == {"save_gbps": "measured here", "peer_gbps": "measured here",
                   "stale_cost": "given for this run (--stale-cost)"}


def test_the_work_bound_covers_every_run_before_the_first():
    from sim.workbound import bound_work
    scenario, figures = _small(), ["save_gbps", "persist_gbps", "peer_gbps", "restart_s",
                                   "lc_write_gbps", "diff_fraction", "stale_cost", "lc_commit_s"]
    one = dict(seeds=50, window_s=30 * DAY, strategies=7, engine="fast",
               mean_step_s=float(scenario.workload.compute_s.mean()))
    bound_work(scenario.failures, [60.0], **one)     # each run alone is within the bound...
    with pytest.raises(SimError, match="limit"):     # ...the 17 of them together are not
        sensitivity(scenario, mtbf_s=60.0, seeds=50, window_s=30 * DAY, figures=figures)


def test_bad_input():
    with pytest.raises(SimError, match="unknown cost figures"):
        sensitivity(_small(), mtbf_s=1800.0, figures=["nope"])
    with pytest.raises(SimError, match="seeds"):
        sensitivity(_small(), mtbf_s=1800.0, seeds=0)


# -- the command line ------------------------------------------------------------------------------
def _run(*args):
    return subprocess.run([sys.executable, "-m", "sim", "sensitivity", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_cli_json_names_the_flip_and_states_its_smaller_defaults():
    done = _run("--mtbf", "0.5h", "--figures", "save_gbps,peer_gbps", "--window", "3d", "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["seeds"] == 5 and data["window_s"] == 3 * DAY and data["leader"] == "gemini"
    # at 12 GB/s DeepSpeed's synchronous saves win; at a 10 Gb/s peer link GEMINI's copies
    # fall behind the tiered strategy's (the same link, but a failure that loses only
    # processes reads its copy back locally, and storage holds LayerCheck's versions)
    assert [(f["figure"], f["end"], f["leader"]) for f in data["flips"]] == [
        ("save_gbps", "high", "deepspeed"), ("peer_gbps", "low", "tiered")]
    assert {r["figure"] for r in data["figures"]} == {"save_gbps", "peer_gbps"}
    assert all(r["reason"] for r in data["figures"])
    text = _run("--mtbf", "0.5h", "--figures", "peer_gbps", "--window", "3d")
    assert "5 seeds x 3 days a point" in text.stdout


@pytest.mark.parametrize("args, message", [
    (("--mtbf", "0.5h", "--figures", "nope"), "unknown cost figures"),
    (("--figures", "save_gbps"), "give --mtbf"),
    (("--mtbf", "0.5h", "--seeds", "0"), "--seeds 0"),
    (("--mtbf", "0.5h", "--window", "-1d"), "--window"),
])
def test_cli_errors_are_one_line_exit_2(args, message):
    done = _run(*args)
    assert done.returncode == 2
    assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert "Traceback" not in done.stderr
