"""dashboard.sensitivity: the tornado and the flips over sim.sensitivity."""
import pytest

from dashboard import sensitivity as view
from sim import Scenario
from sim.sensitivity import sensitivity

DAY = 86400.0


@pytest.fixture(scope="module")
def result():
    return sensitivity(Scenario.from_preset("qwen2.5-7b", window_s=3 * DAY), mtbf_s=1800.0,
                       seeds=2, window_s=3 * DAY, figures=["save_gbps", "peer_gbps", "lc_commit_s"])


def test_tornado_is_a_bar_per_figure_from_end_to_end_around_the_point(result):
    fig = view.tornado_figure(result, "deepspeed")
    low, high = fig.data
    assert set(low.y) == {"save_gbps", "peer_gbps", "lc_commit_s"}
    point = result.point["deepspeed"]
    assert low.base == pytest.approx(point) and high.base == pytest.approx(point)
    i = list(high.y).index("save_gbps")
    assert point + high.x[i] == pytest.approx(result.rows[0]["ratios_high"]["deepspeed"])
    assert list(high.y)[-1] == "save_gbps"            # the widest swing on top
    with pytest.raises(ValueError, match="was not simulated"):
        view.tornado_figure(result, "nope")


def test_flips_and_bands_frames(result):
    flips = view.flips_frame(result)
    assert list(flips["figure"]) == ["save_gbps", "peer_gbps"]
    assert list(flips["leader"]) == ["deepspeed", "tiered"]
    bands = view.bands_frame(result)
    assert list(bands["figure"]) == ["save_gbps", "peer_gbps", "lc_commit_s"]
    assert bands["reason"].str.len().min() > 20
