"""jit detection (profiler.mechanisms.jit): a killed peer seen by the survivor's collective."""
import math

from sim.calibrated import FIGURES
from profiler.mechanisms import MECHANISMS
from profiler.mechanisms.jit import JIT_TIMEOUT_S, JitDetection, detection_seconds


def test_it_is_registered_for_the_strategys_figures():
    assert any(isinstance(m, JitDetection) for m in MECHANISMS)
    assert set(JitDetection.figures) == {n for n in FIGURES if n.startswith("jit_")}


def test_what_one_machine_cannot_measure_is_the_declared_default_said_so():
    stated = JitDetection().stated_figures()
    assert set(stated) == {"jit_replica_loss_probability", "jit_overhead_fraction"}
    for name, figure in stated.items():
        default = FIGURES[name].default
        assert (figure.value, figure.source, figure.band) == (default.value, default.source,
                                                             default.band)
        assert figure.method.startswith("not measurable on one machine")


def test_a_killed_peer_is_detected_well_before_the_timeout(tmp_path):
    samples, error = detection_seconds(tmp_path, repeats=1)
    assert len(samples) == 1 and math.isfinite(samples[0])
    # a crash is seen through the closed connection, not by waiting out the timeout
    assert 0 < samples[0] < JIT_TIMEOUT_S / 2
    assert error                         # the exception the survivor's all-reduce raised
