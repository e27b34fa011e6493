import pytest

from sim.architectures import ARCHITECTURES


@pytest.mark.parametrize("name,layers,gb", [("qwen2.5-7b", 31, 106.6), ("qwen2.5-3b", 38, 43.2),
                                            ("llama-3.2-1b", 18, 17.3)])
def test_layer_tables_match_the_paper(name, layers, gb):
    arch = ARCHITECTURES[name]
    table = arch.layers()
    assert len(table) == layers
    assert sum(l["bytes"] for l in table) / 1e9 == pytest.approx(gb, abs=0.05)
    assert all(l["bytes"] == 14 * l["params"] for l in table)


def test_tied_models_have_no_head():
    assert "lm_head" not in [l["name"] for l in ARCHITECTURES["qwen2.5-3b"].layers()]
    assert "lm_head" in [l["name"] for l in ARCHITECTURES["qwen2.5-7b"].layers()]
