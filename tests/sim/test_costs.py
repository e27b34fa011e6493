import pytest

from sim.costs import CostModel
from sim.errors import SimError


def test_defaults_reproduce_the_papers_recovery_fit():
    c = CostModel()
    assert c.load_s(106.6e9) == pytest.approx(10.0, abs=0.05)   # Qwen2.5-7B: 10 s
    assert c.load_s(17.3e9) == pytest.approx(5.0, abs=0.05)     # Llama-3.2-1B: 5 s
    assert c.load_s(43.2e9) == pytest.approx(7.0, abs=0.7)      # Qwen2.5-3B: 7 s


@pytest.mark.parametrize("field,value,match", [("write_gbps", 0, "bandwidth"), ("restart_s", -1, ">= 0"),
                                               ("peer_loss_probability", 2, "probability"),
                                               ("diff_batch", 0, ">= 1"), ("read_gbps", float("nan"), "finite")])
def test_rejects_bad_values(field, value, match):
    with pytest.raises(SimError, match=match):
        CostModel(**{field: value})


def test_dict_round_trip_and_unknown_keys():
    c = CostModel(restart_s=12.0)
    assert CostModel.from_dict(c.to_dict()) == c
    with pytest.raises(SimError, match="known"):
        CostModel.from_dict({"restart": 1})
