"""The registry of strategies run for real (``profiler.checkpointers``): one record each,
keyed by the simulator's strategy, whose checkpointer and keywords are the ones a run gets."""
from __future__ import annotations

import inspect
import subprocess
import sys

import pytest

from profiler.checkpointers import REAL, VALIDATED, checkpointer_class, real
from profiler.checkpointers.base import Checkpointer
from profiler.errors import ProfilerError
from sim.strategies import STRATEGIES, Cadence
from sim.costs import CostModel


def test_every_record_names_a_simulated_strategy_and_a_checkpointer():
    assert VALIDATED == tuple(REAL)
    assert list(VALIDATED) == [n for n in STRATEGIES if n in REAL]   # sim's report order
    for name, record in REAL.items():
        assert STRATEGIES[name] is record.model
        cls = checkpointer_class(name)
        assert issubclass(cls, Checkpointer) and cls is not Checkpointer
    classes = [checkpointer_class(n) for n in REAL]
    assert len(set(classes)) == len(classes)


def test_keywords_at_a_cadence_are_what_each_checkpointer_takes():
    costs = CostModel()
    cadence = Cadence(every=3, storage_every=12, batch=2)
    assert real("gemini").options(cadence, costs) == {"storage_every": 12}
    assert real("lowdiff").options(cadence, costs) == {"batch": 2}
    assert real("lowdiff").options(Cadence(every=3), costs) == {"batch": costs.diff_batch}
    assert real("deepspeed").options(cadence, costs) == {}
    for name in REAL:
        accepted = inspect.signature(checkpointer_class(name)).parameters
        assert set(real(name).options(cadence, costs)) <= set(accepted), name


def test_what_the_validation_reads_of_each():
    assert [n for n, r in REAL.items() if r.peer] == ["gemini"]
    assert [n for n, r in REAL.items() if r.full_saves] == ["deepspeed", "lowdiff"]
    assert [n for n, r in REAL.items() if r.layerwise] == ["layercheck", "tiered"]
    assert [n for n, r in REAL.items() if r.node_memory] == ["tiered"]
    assert {n: r.every for n, r in REAL.items() if r.every} == {"tiered": 1}
    costs = CostModel()
    for record in REAL.values():   # every priced load is a CostModel method and figure
        if record.load is not None:
            method, rate = record.load
            assert callable(getattr(costs, method)) and hasattr(costs, rate)


def test_an_unknown_strategy_is_refused_with_the_known_ones():
    with pytest.raises(ProfilerError, match="deepspeed, checkfreq"):
        real("jit")


def test_the_registry_loads_no_torch():
    code = ("import sys, profiler.checkpointers as c; c.REAL; "
            "assert 'torch' not in sys.modules, 'torch loaded'")
    subprocess.run([sys.executable, "-c", code], check=True)
