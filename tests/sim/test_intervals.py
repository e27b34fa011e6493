import pytest

from sim.costs import CostModel
from sim.errors import SimError
from sim.intervals import parse_interval, resolve_interval
from sim.theory import daly_interval_s
from sim.workload import Workload


def test_rules():
    custom = Workload.custom(iteration_s=10.0, iterations=10_000, full_bytes=int(60e9))
    costs = CostModel(save_gbps=1.0)                       # C = 60 s
    assert resolve_interval(100, custom, costs, 3600.0) == 100
    assert resolve_interval("daly", custom, costs, 3600.0) == round(daly_interval_s(60, 3600) / 10)
    assert resolve_interval("young", custom, costs, 3600.0) == round((2 * 60 * 3600) ** 0.5 / 10)
    assert parse_interval(None) is None
    with pytest.raises(SimError, match="needs an MTBF"):
        resolve_interval("daly", custom, costs, None)


@pytest.mark.parametrize("bad", ["0", "-3", "often", 0, "matched"])
def test_bad_intervals(bad):
    with pytest.raises(SimError, match="interval"):
        parse_interval(bad)
