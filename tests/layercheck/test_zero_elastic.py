"""Resuming a ZeRO job at another world size and stage (issue 30), for real: torchrun, gloo, CPU.

One directory: ZeRO-3 on 2 ranks killed with SIGKILL, resumed in one process (a plain
LayerCheck, torch's AdamW), killed again, resumed on 2 ranks. After each restore every
layer's fp32 masters and Adam moments are exactly the tensors the composite's versions
hold, gathered whole (each job saves, at every step that writes layers, what it wrote as
whole tensors by parameter, and after its restore its own state gathered whole:
``tests.layercheck.elastic``), padding stays zero, and the run ends within 1% of the
failure-free loss. The one process keeps some layers as the 2 ranks wrote them, so the
last restore composes versions of both layouts. ZeRO-1/2: ZeRO-2 with bf16 weights on 2
ranks resumed on one rank under ZeRO-1 and under ZeRO-3.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

pytest.importorskip("deepspeed")

from safetensors.torch import load_file  # noqa: E402

from layercheck.tools.cli import main  # noqa: E402
from layercheck.storage.manifest import read_manifest  # noqa: E402
from layercheck.recovery import make_plan  # noqa: E402
from layercheck.storage.localstore import LocalStore  # noqa: E402
from tests.layercheck.torchrun import Torchrun  # noqa: E402

HERE = Path(__file__).parent
ZERO = Torchrun(HERE / "zero_worker.py", env={"DS_ACCELERATOR": "cpu"})
PLAIN = Torchrun(HERE / "plain_worker.py", ranks=1)
ZERO_ONE = Torchrun(HERE / "zero_worker.py", env={"DS_ACCELERATOR": "cpu"}, ranks=1)
STEPS = 24
FIELDS = ("master", "exp_avg", "exp_avg_sq")


def resumed_problems(earlier: list[Path], resumed: Path, ranks: int) -> list[str]:
    """Every difference between each resumed rank's gathered state and the whole
    tensors of the versions it came from (saved by the ``earlier`` jobs)."""
    dumps = {int(p.stem): p for out in earlier for p in (out / "gathered").iterdir()}
    problems = []
    for r in range(ranks):
        sources = json.loads((resumed / f"rank{r}.json").read_text())["sources"]
        restored = torch.load(resumed / f"restored{r}.pt")
        if restored.pop("padding")["nonzero"]:
            problems.append(f"rank {r}: nonzero padding")
        restored.pop("module")
        for name, entry in restored.items():
            layer = max((l for l in sources if name.startswith(l + ".")), key=len)
            saved = torch.load(dumps[sources[layer]])[name]
            for what in FIELDS:
                if not torch.equal(saved[what].reshape(-1), entry[what].reshape(-1)):
                    problems.append(f"rank {r}: {name} {what} differs")
            if saved["step"] != entry["step"]:
                problems.append(f"rank {r}: {name} Adam step {entry['step']}, saved "
                                f"{saved['step']}")
        if len(restored) != len(torch.load(dumps[min(dumps)])):  # the base: every parameter
            problems.append(f"rank {r}: {len(restored)} parameters restored")
    return problems


def final_loss(out: Path) -> float:
    return json.loads((out / "rank0.json").read_text())["losses"][str(STEPS)]


@pytest.fixture(scope="module")
def zero3_chain(tmp_path_factory):
    """ZeRO-3 on 2 ranks killed once step 9 is committed; resumed in one process and
    killed once step 12 is (a higher threshold there, but for the embedding, which the
    tied LM head makes the layer whose staleness costs most: some layers stay as the 2
    ranks wrote them); resumed on 2 ranks to step 24; and the failure-free run."""
    root = tmp_path_factory.mktemp("chain")
    ckpt, o1, o2, o3 = (root / n for n in ("ckpt", "o1", "o2", "o3"))
    zero3 = ("--steps", str(STEPS), "--stage", "3", "--dump")
    killed = (ZERO.kill_mid_run(ckpt, o1, *zero3, at=9),
              PLAIN.kill_mid_run(ckpt, o2, "--steps", str(STEPS), "--dump", "--threshold", "0.03",
                                 "--embedding-threshold", "1e-3", at=12))
    ZERO.run("--dir", str(ckpt), "--out", str(o3), *zero3)
    ZERO.run("--dir", str(root / "free"), "--out", str(root / "free-out"), "--steps", str(STEPS),
             "--stage", "3")
    return {"ckpt": ckpt, "killed": killed, "outs": (o1, o2, o3), "free": root / "free-out"}


def test_zero3_on_2_ranks_resumed_in_one_process_holds_the_composite_exactly(zero3_chain):
    o1, o2, _ = zero3_chain["outs"]
    assert zero3_chain["killed"] == (9, 12)
    one = json.loads((o2 / "rank0.json").read_text())
    assert one["restored_step"] == 9 and one["layouts"] == [0]
    assert len(set(one["sources"].values())) > 1, one["sources"]  # a mixed composite
    assert resumed_problems([o1], o2, ranks=1) == []


def test_one_process_resumed_on_2_zero3_ranks_holds_the_composite_of_both_layouts_exactly(
        zero3_chain):
    o1, o2, o3 = zero3_chain["outs"]
    for r in range(2):
        rank = json.loads((o3 / f"rank{r}.json").read_text())
        assert rank["restored_step"] == 12 and rank["layouts"] == [0, 1], rank["sources"]
    assert resumed_problems([o1, o2], o3, ranks=2) == []
    view = read_manifest(LocalStore(zero3_chain["ckpt"]))
    assert {k: (v.world_size, v.backend) for k, v in view.layouts.items()} == {
        0: (2, "zero"), 1: (1, None)}
    for versions in view.versions.values():  # each job wrote in its own layout
        for v in versions:
            assert (v.layout, len(v.shards)) == ((1, 0) if 9 < v.step <= 12 else (0, 2)), v


def test_the_elastic_run_ends_within_one_percent_of_the_failure_free_loss(zero3_chain):
    elastic, free = final_loss(zero3_chain["outs"][2]), final_loss(zero3_chain["free"])
    losses = json.loads((zero3_chain["free"] / "rank0.json").read_text())["losses"]
    assert free < 0.8 * losses["1"]  # it learns: 1% says something
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
    shutil.copytree(a, b)
    ZERO_ONE.run("--dir", str(b), "--out", str(ob), "--steps", "12", "--stop-at", "7",
                 "--stage", str(stage), "--bf16", "--dump")
    assert json.loads((ob / "rank0.json").read_text())["restored_step"] == 5
    assert resumed_problems([oa], ob, ranks=1) == []
    restored = torch.load(ob / "restored0.pt")
    for name, weight in restored["module"].items():
        if name in restored:
            master = restored[name]["master"].reshape(weight.shape)
            assert torch.equal(weight, master.to(torch.bfloat16).double()), name


def test_zero2_resumed_under_zero3_at_the_same_world_size_is_resharded(zero2_bf16, tmp_path):
    """At the same world size ZeRO-2's and ZeRO-3's partitions of this model have the
    same sizes but other contents (a group's concatenation cut in two, against each
    parameter cut in two): the shapes alone would let them through. The stage is part
    of the layout, so the versions are read by ZeRO-2's arithmetic, exactly."""
    (a, oa), b, ob = zero2_bf16, tmp_path / "b", tmp_path / "ob"
    shutil.copytree(a, b)
    ZERO.run("--dir", str(b), "--out", str(ob), "--steps", "12", "--stop-at", "6",
             "--stage", "3", "--bf16", "--dump")
    assert json.loads((ob / "rank0.json").read_text())["restored_step"] == 5
    assert resumed_problems([oa], ob, ranks=2) == []

def test_a_layout_the_header_does_not_spell_out_is_refused_with_the_reason(tmp_path):
    """ZeRO-2 with round-robin gradients reorders its flat partitions in a way the
    header does not record: resumed on another world size, it is refused on every rank
    before anything changes, saying why and what to do; the directory is as it was."""
    ckpt = tmp_path / "ckpt"
    ZERO.run("--dir", str(ckpt), "--out", str(tmp_path / "o1"), "--steps", "6", "--stop-at", "3",
             "--stage", "2", "--round-robin")
    manifest = (ckpt / "manifest.jsonl").read_bytes()
    text = ZERO_ONE.run("--dir", str(ckpt), "--out", str(tmp_path / "o2"), "--steps", "6",
                        "--stage", "2", ok=False)
    assert "written by 2 ranks, this job has 1" in text, text[-3000:]
    assert "round_robin_gradients" in text and "resume it at its own world size" in text
    assert (ckpt / "manifest.jsonl").read_bytes() == manifest


def _mixed_step(ckpt: Path) -> int:
    """The first step after the one process's whose training state the 2 ZeRO-3 ranks
    wrote (layout 0) and whose composite still takes layers from the one process."""
    view = read_manifest(LocalStore(ckpt))
    for step in sorted(s for s in view.states if s > 12):
        plan = make_plan(LocalStore(ckpt), view, step, exact=True)
        if plan.state.layout == 0 and any(v.layout == 1 for v in plan.sources.values()):
            return step
    raise AssertionError("no composite of both layouts after step 12")


def test_the_hf_export_of_a_composite_of_both_layouts_is_its_versions_masters(zero3_chain,
                                                                              tmp_path):
    o1, o2, _ = zero3_chain["outs"]
    assert main(["export", str(zero3_chain["ckpt"]), "--step", "12", "--out",
                 str(tmp_path / "hf")]) == 0
    plan = json.loads((tmp_path / "hf" / "layercheck_plan.json").read_text())
    sources = {e["layer"]: e["source_step"] for e in plan["layers"]}
    assert {e.get("layout", 0) for e in plan["layers"]} == {0, 1}, plan["layers"]
    dumps = {int(p.stem): p for out in (o1, o2) for p in (out / "gathered").iterdir()}
    weights = load_file(tmp_path / "hf" / "model.safetensors")
    for name, weight in weights.items():
        layer = max((l for l in sources if name.startswith(l + ".")), key=len)
        saved = torch.load(dumps[sources[layer]]).get(name)
        if saved is not None:  # a buffer has no master
            assert torch.equal(weight.reshape(-1), saved["master"].reshape(-1)), name


def test_a_deepspeed_export_reshards_the_one_process_layers_into_the_zero3_ranks(
        zero3_chain, tmp_path, capsys):
    """Step 12's state was written by one process: refused with the steps that would
    do; a later step's composite of both layouts, exported, loads with DeepSpeed's own
    engine.load_checkpoint on 2 ZeRO-3 ranks into exactly the versions' tensors."""
    ckpt = zero3_chain["ckpt"]
    assert main(["export", str(ckpt), "--step", "12", "--format", "deepspeed", "--out",
                 str(tmp_path / "refused")]) == 2
    assert "ran no DeepSpeed engine" in capsys.readouterr().err
    step, out = _mixed_step(ckpt), tmp_path / "loaded"
    assert main(["export", str(ckpt), "--step", str(step), "--format", "deepspeed", "--out",
                 str(tmp_path / "ds"), "--adam-step", "own"]) == 0  # each version's own count
    ZERO.run("--dir", str(tmp_path / "unused"), "--out", str(out), "--steps", str(STEPS),
             "--stop-at", str(step), "--stage", "3", "--ds-load-dir", str(tmp_path / "ds"),
             "--dump")
    assert resumed_problems(list(zero3_chain["outs"]), out, ranks=2) == []
