from dataclasses import fields

import pytest

from layercheck.contract.calibration import TRANSFERRED_STALE_COST, Figure, write_calibration
from sim.calibrated import FIGURES, Calibration
from sim.costs import CostModel
from sim.errors import SimError


def test_fields_are_the_calibration_figures():
    assert [f.name for f in fields(CostModel)][:len(FIGURES)] == list(FIGURES)


def test_lowdiff_s_differential_is_its_share_of_the_state_over_its_rates():
    costs = CostModel().with_overrides(diff_fraction=0.02, diff_snapshot_gbps=0.5,
                                       diff_replay_gbps=4.0)
    diff = costs.diff_bytes(10e9)
    assert diff == pytest.approx(2e8)
    assert costs.diff_snapshot_s(diff) == pytest.approx(0.4)
    assert costs.diff_replay_s(diff) == pytest.approx(0.05)


def test_defaults_reproduce_the_papers_recovery_fit():
    c = CostModel.paper_a100()
    assert c.load_s(106.6e9) == pytest.approx(10.0, abs=0.05)   # Qwen2.5-7B: 10 s
    assert c.load_s(17.3e9) == pytest.approx(5.0, abs=0.05)     # Llama-3.2-1B: 5 s
    assert c.load_s(43.2e9) == pytest.approx(7.0, abs=0.7)      # Qwen2.5-3B: 7 s
    assert {c.provenance[n].source for n in FIGURES if n != "stale_cost"} <= {
        "published", "derived", "fit", "assumed"}
    # the paper measured no convergence cost of stale layers: it comes from the shipped capture
    assert c.provenance["stale_cost"] == TRANSFERRED_STALE_COST
    assert all(len(c.provenance[n].method) > 20 for n in FIGURES)


@pytest.mark.parametrize("field,value,match", [("save_gbps", 0, "positive"), ("restart_s", -1, ">= 0"),
                                               ("peer_loss_probability", 2, "probability"),
                                               ("diff_batch", 0, "positive"),
                                               ("load_gbps", float("nan"), "finite")])
def test_rejects_bad_values(field, value, match):
    with pytest.raises(SimError, match=match):
        CostModel(**{field: value})


def test_overrides_are_marked_given():
    c = CostModel.paper_a100().with_overrides(restart_s=12.0)
    assert c.restart_s == 12.0 and c.provenance["restart_s"].source == "given"
    assert c.provenance["save_gbps"].source == "derived"
    assert CostModel(restart_s=7.0).provenance["restart_s"].source == "given"
    with pytest.raises(SimError, match="known"):
        CostModel.paper_a100().with_overrides(restart=1)
    with pytest.raises(SimError, match="--save-gbps"):
        CostModel.paper_a100().with_overrides(save_gbps=-1.0)


def test_a_calibration_is_a_cost_model(tmp_path):
    figures = {n: Figure(value=2.0 if FIGURES[n].unit != "1" else 0.25, source="measured",
                         method=f"timed {n}") for n in FIGURES}
    cal = Calibration(name="here", description="this machine", figures=figures)
    c = CostModel.from_calibration(cal)
    assert c.name == "here" and c.save_gbps == 2.0 and c.peer_loss_probability == 0.25
    assert c.provenance["save_gbps"].method == "timed save_gbps"
    assert c.to_dict()["figures"]["save_gbps"] == {"value": 2.0, "source": "measured",
                                                   "method": "timed save_gbps", "unit": "GB/s"}
    write_calibration(cal, tmp_path / "costs.json")
    assert CostModel.named(str(tmp_path)) == c
    assert CostModel.named("paper-a100") == CostModel.paper_a100()
    with pytest.raises(SimError, match="neither"):
        CostModel.named("paper-h100")
    (tmp_path / "costs.json").write_text("{}")
    with pytest.raises(SimError, match="schema_version"):
        CostModel.named(str(tmp_path / "costs.json"))


def test_the_stale_cost_factor_is_a_figure_with_its_interval():
    paper = CostModel.paper_a100()
    assert paper.stale_cost == TRANSFERRED_STALE_COST.value
    assert paper.to_dict()["figures"]["stale_cost"]["source"] == "transferred"
    # a measured negative factor (the recovered run ahead) is kept as measured
    assert CostModel(stale_cost=-0.3).stale_cost == -0.3
    with pytest.raises(SimError, match="finite"):
        CostModel(stale_cost=float("inf"))
    # an override is given, without the interval of what it replaced
    record = Figure(value=0.5, low=0.2, high=0.8, source="measured", method="m")
    measured = CostModel(stale_cost=0.5, provenance={**paper.provenance, "stale_cost": record})
    assert measured.provenance["stale_cost"].interval == (0.2, 0.8)
    assert measured.to_dict()["figures"]["stale_cost"]["low"] == 0.2
    given = measured.with_overrides(stale_cost=0.7).provenance["stale_cost"]
    assert given.source == "given" and given.interval == (0.7, 0.7)


@pytest.mark.parametrize("field,value,match", [
    ("lc_commit_s", 1e300, r"lc_commit_s=1e\+300 is outside 0 to 1e\+07 s"),
    ("save_gbps", 1e-300, r"save_gbps=1e-300 is below 1e-06 GB/s"),
    ("diff_fraction", 1e300, r"diff_fraction=1e\+300 is outside 0 to 1"),
    ("tracking_fraction", 3.0, "outside 0 to 1"),
    ("diff_batch", 1e18, r"diff_batch=1e\+18 is outside 1 to 1e\+06 steps")])
def test_every_figure_is_range_checked(field, value, match):
    """Issue 27, item 11: a finite but absurd figure gave ratios above 1 and NaN rows (one
    strategy's 1e300-second commits swamped every other lane's float64 times)."""
    with pytest.raises(SimError, match=match):
        CostModel(**{field: value})


def test_a_cost_model_is_a_validated_immutable_mapping_over_the_schema():
    """Issue 28: one entry per declared figure, read by name or attribute; no field list of
    its own to drift from the declarations."""
    import dataclasses

    from sim.strategies import MODULES
    c = CostModel.paper_a100()
    assert list(c) == list(FIGURES) == [n for m in MODULES for n in m.FIGURES]
    assert dict(c)["save_gbps"] == c["save_gbps"] == c.save_gbps == FIGURES["save_gbps"].default.value
    assert len(c) == len(FIGURES) and "name" not in c
    with pytest.raises(KeyError):
        c["restart"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.save_gbps = 2.0
    with pytest.raises(SimError, match="whole number"):
        CostModel(diff_batch=2.5)
