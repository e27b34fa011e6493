"""``sim.published``: the paper's figures and the failure regimes, data that loads nothing heavy."""
import subprocess
import sys
from pathlib import Path

from sim import presets, published
from sim.recovery import GPUS_PER_NODE
from sim.scale import LLAMA3_NODE_MTBF_S

ROOT = Path(__file__).resolve().parents[2]


def test_it_imports_no_numpy_so_the_command_line_can_declare_its_choices_at_once():
    code = "import sys, sim.published; assert 'numpy' not in sys.modules, sorted(sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_the_presets_and_the_scale_model_build_on_the_same_figures():
    assert presets.PUBLISHED is published.PUBLISHED and presets.REGIMES is published.REGIMES
    assert presets.PRESET_NAMES == tuple(published.PUBLISHED) == published.PRESET_NAMES
    llama = published.REGIMES["llama3-405b"]
    assert llama.node_mtbf_s(GPUS_PER_NODE) == LLAMA3_NODE_MTBF_S
    assert round(LLAMA3_NODE_MTBF_S / 86400) == 264           # 54 d / 419 x 2,048 nodes
