"""The FSDP2 capture, for real: two ranks under torchrun (gloo, CPU), FsdpLayerCheck on each.

The capture runs the tiny model with the settings of the plain ``tiny_capture``
fixture, typed as a user would under torchrun. The tiny model has no dropout,
so the two runs compute the same numbers up to float rounding: the FSDP2
capture must train the plain capture's job, step by step, and decide the
same writes.
"""
from __future__ import annotations

import pytest

from layercheck.contract.trace import read_trace
from profiler.cli import main
from tests.profiler.conftest import assert_trains_the_plain_job, torchrun_capture


@pytest.fixture(scope="module")
def fsdp(tmp_path_factory):
    """``torchrun --nproc_per_node 2 -m profiler capture --fsdp ...``, typed by hand."""
    return torchrun_capture(tmp_path_factory.mktemp("fsdp") / "tiny-fsdp", "--fsdp")


@pytest.mark.slow
def test_fsdp_capture_trains_the_plain_capture_job(fsdp, tiny_capture):
    """Same weights, batches, optimizer and schedule: the batch split over two ranks,
    FSDP2's gradient averaging and sharding change only float rounding."""
    plain = tiny_capture.trace
    assert_trains_the_plain_job(fsdp.trace, plain)
    # a version's bytes are both ranks' shards of the same tensors, plus a second header
    sizes = {l["name"]: l["bytes"] for l in plain.manifest["layers"]}
    for layer in fsdp.trace.manifest["layers"]:
        assert abs(layer["bytes"] - sizes[layer["name"]]) <= 0.02 * sizes[layer["name"]] + 1024


@pytest.mark.slow
def test_fsdp_trace_records_the_setup_and_a_measured_restore(fsdp):
    m = fsdp.trace.manifest
    assert m["name"] == "tiny-fsdp" and "PyTorch FSDP2 capture on 2 ranks" in m["description"]
    source = m["sources"]["fsdp"]
    assert (source["ranks"], source["backend"], source["micro_batch_per_rank"]) == (2, "gloo", 2)
    assert source["integration"] == "layercheck.fsdp.FsdpLayerCheck"
    blocks = [u for u in source["units"] if u["unit"]]
    assert len(blocks) == 4 and all(u["layers"] == [u["unit"]] for u in blocks)
    assert source["launched_by"] == "torchrun" and len(source["median_step_s_per_rank"]) == 2
    assert m["sources"]["command"].startswith("torchrun --nproc_per_node 2 -m profiler capture")
    rec = fsdp.trace.recovery
    assert rec["bytes"].iloc[0] == fsdp.trace.full_checkpoint_bytes  # both ranks' shards
    assert (rec[["load_s", "restore_s"]] > 0).all(axis=None)


@pytest.mark.slow
def test_a_drill_refuses_an_fsdp_trace(fsdp, capsys):
    assert main(["drill", "--from", str(fsdp.path)]) == 2
    assert "an FSDP2 capture" in capsys.readouterr().err


@pytest.mark.parametrize("args, words", [
    (["capture", "--fsdp", "--deepspeed", "zero3"], "give one"),
    (["capture", "--fsdp", "--batch-size", "3"], "does not split evenly over 2 ranks"),
    (["capture", "--fsdp", "--device", "cuda"], "FSDP captures run on the CPU"),
])
def test_bad_fsdp_input_is_one_line_and_exit_2_before_any_rank_starts(args, words, capsys):
    assert main(args) == 2
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1 and "starting" not in err


@pytest.mark.slow
def test_calibrate_measures_an_fsdp_capture_on_its_own_sharded_job(fsdp, tmp_path):
    """``python -m profiler calibrate`` starts torchrun with the capture's world size and
    times DCP's save and FsdpLayerCheck on both ranks, the rest on rank 0 alone."""
    import shutil
    import sys

    from sim.calibrated import read_calibration
    from tests.profiler.conftest import run_command
    folder = tmp_path / "tiny-fsdp"
    shutil.copytree(fsdp.path, folder)
    done = run_command([sys.executable, "-m", "profiler", "calibrate", "--trace", str(folder),
                        "--repeats", "1", "--quiet"])
    assert "starting 2 ranks" in done.stderr and done.stdout.count("wrote") == 1
    costs = read_calibration(folder)
    figures = costs.figures
    assert "under the capture's FSDP2 sharded job on 2 ranks" in figures["save_gbps"].method
    assert "torch.distributed.checkpoint.save" in figures["save_gbps"].method
    assert "FsdpLayerCheck on 2 ranks" in figures["lc_write_gbps"].method
    assert "torchrun of 2 ranks building the FSDP2 job" in figures["restart_s"].method
    assert "not under the 2-rank FSDP2 job" in figures["snapshot_gbps"].method
    trace = read_trace(folder)
    assert figures["lc_load_gbps"].bytes == trace.full_checkpoint_bytes
    assert all(f.value > 0 for f in figures.values() if f.source == "measured")


@pytest.mark.slow
def test_a_validation_refuses_an_fsdp_trace(fsdp, capsys):
    assert main(["validate", "--trace", str(fsdp.path), "--quiet"]) == 2
    assert "an FSDP2 capture" in capsys.readouterr().err
