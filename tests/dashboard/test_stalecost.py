"""The staleness study on the Recovery fidelity page (dashboard.stalecost), read from a
real study of the tiny model (tests/dashboard/data)."""
from __future__ import annotations

import copy
import math

import pytest

from dashboard.stalecost import StudyError, curves_figure, delta_figure, phi_table, read_study

from conftest import measured_study


@pytest.fixture(scope="module")
def doc() -> dict:
    return measured_study()


def test_every_run_and_reading_is_read(doc):
    study = read_study(doc)
    assert list(study.runs["kind"]) == [r["kind"] for r in doc["runs"]]
    assert len(study.readings) == sum(len(r["readings"]) for r in doc["runs"])
    exact = study.runs[study.runs["kind"] == "exact"]
    assert exact["identical"].all()
    assert (study.readings[study.readings["kind"] == "exact"]["delta"] == 0).all()
    first = doc["runs"][0]
    row = study.readings[study.readings["label"] == study.runs["label"][0]].iloc[0]
    name = row["horizon"]
    assert row["delta"] == first["readings"][name]["delta"]
    assert row["after"] == first["readings"][name]["step"] - first["failure_step"]
    assert study.steps == doc["reference"]["curve_steps"][-1]


def test_the_figures_draw_every_run(doc):
    study = read_study(doc)
    curves = curves_figure(study)
    assert [t.name for t in curves.data] == ["failure-free", *study.runs["label"]]
    delta = delta_figure(study)
    names = [t.name for t in delta.data]
    assert "noise floor (data order)" in names
    assert not any("twin" in n for n in names if n != "noise floor (data order)")


def test_the_table_gives_phi_with_the_noise_floor_beside_it(doc):
    table = phi_table(read_study(doc))
    own = [r for r in doc["runs"] if r["kind"] in ("composite", "blocks", "embedding", "control")]
    assert {r["kind"] for r in own} == {"composite", "blocks", "embedding", "control"}
    assert len(table) == sum(len(r["readings"]) for r in own)
    for row, (run, horizon) in zip(table.itertuples(index=False),
                                   [(r, h) for r in own for h in r["readings"]]):
        assert (row.run, row.threshold, row.horizon) == (run["kind"], run["threshold"], horizon)
        phi = run["phi"][horizon]
        assert (math.isnan(row.phi) if phi is None else row.phi == phi["value"])
        floor = table.columns.get_loc("noise floor")
        assert row[floor] == doc["noise_floor"].get(horizon, math.nan) or math.isnan(row[floor])


def test_a_study_in_another_shape_says_so(doc):
    with pytest.raises(StudyError, match="python -m profiler staleness"):
        read_study(None)
    broken = copy.deepcopy(doc)
    del broken["runs"][0]["readings"]
    with pytest.raises(StudyError, match="not in the profiler's shape"):
        read_study(broken)
    broken = copy.deepcopy(doc)
    broken["runs"][0]["kind"] = "other"
    with pytest.raises(StudyError, match="run kind"):
        read_study(broken)
