"""sim.settings: each strategy's space of settings, the protocols' own cadences among them."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from sim import CostModel, Scenario
from sim.errors import SimError
from sim.settings import Setting, centres, ladder, near, rollback_space
from sim.strategies import Cadence

from .conftest import small_workload


def scenario() -> Scenario:
    return Scenario(name="small", workload=small_workload(steps=200),
                    costs=CostModel.paper_a100(save_gbps=2.0, persist_gbps=2.0, peer_gbps=3.0))


def test_a_ladder_spans_an_eighth_to_eight_times_its_start_within_the_job():
    points = ladder(80, 1692)
    assert points == sorted(set(points)) and points[0] == 10 and points[-1] == 640
    ratios = np.diff(np.log2(points))
    assert np.all(ratios > 0) and np.all(ratios < 0.3)
    assert ladder(3, 20) == sorted(set(ladder(3, 20))) and max(ladder(3, 20)) <= 20
    assert min(ladder(0.2, 20)) == 1


@pytest.mark.parametrize("name", ["deepspeed", "checkfreq", "gemini", "lowdiff"])
def test_the_protocols_cadences_are_marked_points_of_every_space(name):
    s = scenario()
    space = rollback_space(s, name, mtbf_s=900.0)
    marked = {o: p.cadence for p in space for o in p.origin}
    for protocol in ("matched", "native"):
        expected = dataclasses.replace(s, protocol=protocol).cadence(name, 900.0)
        assert marked[protocol] == expected
    assert len({p.cadence for p in space}) == len(space)          # each cadence once


def test_near_keeps_the_marked_points_and_those_close_to_the_centre():
    s = scenario()
    space = rollback_space(s, "deepspeed", mtbf_s=900.0)
    centre, _ = centres("deepspeed", s, 900.0)
    kept = near(space, s, 900.0)
    for p in kept:
        assert p.origin or centre / 2 ** 0.5 <= p.cadence.every <= centre * 2 ** 0.5
    assert len(kept) < len(space)


def test_a_setting_says_what_it_is():
    assert Setting(strategy="deepspeed", cadence=Cadence(every=14)).label() == "every 14"
    assert Setting(strategy="gemini", cadence=Cadence(every=5, storage_every=80)).label() == \
        "memory every 5, storage every 80"
    assert Setting(strategy="lowdiff", cadence=Cadence(every=330, batch=1)).label() == \
        "full every 330, batches of 1"
    with pytest.raises(SimError, match="unknown strategy"):
        Setting(strategy="nope")
