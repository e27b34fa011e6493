"""Resuming a ZeRO job at another world size and stage (issue 30), for real: torchrun, gloo, CPU.

Killed with SIGKILL on 2 ranks, resumed in one process, killed again, resumed on 2
ranks: every layer's fp32 masters and Adam moments after each resume are exactly the
tensors the composite's versions hold, gathered whole (each phase saves, at every
step that writes layers, what it wrote as whole tensors by parameter; a resumed
phase saves its own state gathered whole: ``tests.layercheck.elastic``), padding
stays zero, and the run ends within 1% of the failure-free loss.

The restore goes through ``tests.layercheck.elastic.elastic_restore``, a local
stand-in for ``LayerCheck.restore()`` at another world size (helper CORE's
plumbing), from the old directory into a new one; what it calls per layer is the
code under test: ``zero.Partitions.apply_elastic`` and ``pieces.zero_layer_tensors``.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("deepspeed")

from layercheck.manifest import read_manifest  # noqa: E402
from layercheck.store import LocalStore  # noqa: E402
from tests.layercheck.torchrun import Torchrun  # noqa: E402

HERE = Path(__file__).parent
ZERO = Torchrun(HERE / "zero_worker.py", env={"DS_ACCELERATOR": "cpu"})
PLAIN = Torchrun(HERE / "plain_worker.py", ranks=1)
ZERO_ONE = Torchrun(HERE / "zero_worker.py", env={"DS_ACCELERATOR": "cpu"}, ranks=1)
STEPS = 24
FIELDS = ("master", "exp_avg", "exp_avg_sq")


def resumed_problems(previous: Path, resumed: Path, ranks: int) -> list[str]:
    """Every difference between each resumed rank's gathered state and the whole
    tensors of the versions it came from (``previous``' saved ones)."""
    problems = []
    for r in range(ranks):
        sources = json.loads((resumed / f"rank{r}.json").read_text())["sources"]
        restored = torch.load(resumed / f"restored{r}.pt")
        if restored.pop("padding")["nonzero"]:
            problems.append(f"rank {r}: nonzero padding")
        restored.pop("module")
        for name, entry in restored.items():
            layer = max((l for l in sources if name.startswith(l + ".")), key=len)
            saved = torch.load(previous / "gathered" / f"{sources[layer]}.pt")[name]
            for what in FIELDS:
                if not torch.equal(saved[what].reshape(-1), entry[what].reshape(-1)):
                    problems.append(f"rank {r}: {name} {what} differs")
            if saved["step"] != entry["step"]:
                problems.append(f"rank {r}: {name} Adam step {entry['step']}, saved "
                                f"{saved['step']}")
        base = min((previous / "gathered").iterdir(), key=lambda p: int(p.stem))
        if len(restored) != len(torch.load(base)):  # the base checkpoint: every parameter
            problems.append(f"rank {r}: {len(restored)} parameters restored")
    return problems


def final_loss(out: Path) -> float:
    return json.loads((out / "rank0.json").read_text())["losses"][str(STEPS)]


@pytest.fixture(scope="module")
def zero3_chain(tmp_path_factory):
    """ZeRO-3 on 2 ranks killed once step 9 is committed; resumed in one process
    (plain torch) and killed once step 16 is; resumed on 2 ranks to step 24; and the
    failure-free run."""
    root = tmp_path_factory.mktemp("chain")
    d = {name: root / name for name in ("a", "b", "c", "free", "oa", "ob", "oc", "ofree")}
    zero3 = ("--steps", str(STEPS), "--stage", "3", "--dump")
    assert ZERO.kill_mid_run(d["a"], d["oa"], *zero3, at=9) == 9
    assert PLAIN.kill_mid_run(d["b"], d["ob"], "--steps", str(STEPS), "--dump",
                              "--elastic-from", str(d["a"]), at=16) == 16
    ZERO.run("--dir", str(d["c"]), "--out", str(d["oc"]), *zero3, "--elastic-from", str(d["b"]))
    ZERO.run("--dir", str(d["free"]), "--out", str(d["ofree"]), "--steps", str(STEPS),
             "--stage", "3")
    return d


def test_zero3_on_2_ranks_resumed_in_one_process_holds_the_composite_exactly(zero3_chain):
    d = zero3_chain
    rank0 = json.loads((d["ob"] / "rank0.json").read_text())
    assert rank0["restored_step"] == 9
    assert len(set(rank0["sources"].values())) > 1, rank0["sources"]  # a mixed composite
    assert resumed_problems(d["oa"], d["ob"], ranks=1) == []
    view = read_manifest(LocalStore(d["b"]))
    assert view.world_size == 1 and all(not v.shards for vs in view.versions.values() for v in vs)


def test_one_process_resumed_on_2_zero3_ranks_holds_the_composite_exactly(zero3_chain):
    d = zero3_chain
    for r in range(2):
        assert json.loads((d["oc"] / f"rank{r}.json").read_text())["restored_step"] == 16
    assert resumed_problems(d["ob"], d["oc"], ranks=2) == []
    view = read_manifest(LocalStore(d["c"]))  # the new versions: the new layout's
    assert all(len(v.shards) == 2 for vs in view.versions.values() for v in vs)


def test_the_elastic_run_ends_within_one_percent_of_the_failure_free_loss(zero3_chain):
    elastic, free = final_loss(zero3_chain["oc"]), final_loss(zero3_chain["ofree"])
    assert abs(elastic / free - 1) < 0.01, (elastic, free)


@pytest.fixture(scope="module")
def zero2_bf16(tmp_path_factory):
    """ZeRO-2 with bf16 weights on 2 ranks, stopped after step 5: (directory, its out)."""
    root = tmp_path_factory.mktemp("zero2")
    ZERO.run("--dir", str(root / "a"), "--out", str(root / "oa"), "--steps", "12",
             "--stop-at", "5", "--stage", "2", "--bf16", "--dump")
    return root / "a", root / "oa"


@pytest.mark.parametrize("stage", [1, 3])
def test_zero2_bf16_on_2_ranks_resumed_on_1_rank_under_another_stage(zero2_bf16, tmp_path,
                                                                      stage):
    """bf16 module weights over fp32 masters, written by ZeRO-2 on 2 ranks and resumed
    by one ZeRO-1 rank (the flat concatenation re-cut) or one ZeRO-3 rank (per
    parameter): the masters and moments are the composite's, padding zero, and the
    bf16 weights are the masters rounded, as after a same-size restore."""
    (a, oa), b, ob = zero2_bf16, tmp_path / "b", tmp_path / "ob"
    ZERO_ONE.run("--dir", str(b), "--out", str(ob), "--steps", "12", "--stop-at", "7",
                 "--stage", str(stage), "--bf16", "--elastic-from", str(a))
    assert json.loads((ob / "rank0.json").read_text())["restored_step"] == 5
    assert resumed_problems(oa, ob, ranks=1) == []
    restored = torch.load(ob / "restored0.pt")
    for name, weight in restored["module"].items():
        if name in restored:
            master = restored[name]["master"].reshape(weight.shape)
            assert torch.equal(weight, master.to(torch.bfloat16).double()), name
