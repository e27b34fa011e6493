"""The memory tier and buddy under the sharded backends, FSDP2 and ZeRO: real torchrun ranks.

Each rank is a "node" of its own (``tiers_shards_worker.py``: its own memory-tier
folder, its buddy the other rank), keeps the shard it owns in its memory tier and
sends it to its buddy. A job is SIGKILLed once step 4 is committed in every
tier; the digests it recorded up to then are the failure-free run's. A restart
after the processes' death restores step 4 from each rank's own memory, after a
node's loss (its folder wiped) that node's shard from its buddy, after both
nodes' loss the durable composite, and at another world size (two ranks on one
node, restarted as one; ZeRO: one node lost, the other restarted alone) the
node's copies resharded (FSDP2's rows, ZeRO's flat partitions), never a shard of
the old layout as it is.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.layercheck.torchrun import ROOT, Torchrun, damage_newest_shard

WORKER = Path(__file__).with_name("tiers_shards_worker.py")
JOB = Torchrun(WORKER, env={"DS_ACCELERATOR": "cpu"})
STEPS, AT = 6, 4


def killed(root: Path, backend: str, *args: str) -> Path:
    """A job of ``backend`` killed once step ``AT`` is committed everywhere."""
    JOB.kill_mid_run(root / "ckpt", root / "first", "--backend", backend, "--tier",
                     str(root / "mem"), "--steps", str(STEPS), *args, at=AT)
    return root


def resume(killed: Path, work: Path, backend: str, *args: str, ranks: int = 2
           ) -> tuple[list[dict], list[dict], str]:
    """Copy the killed job to ``work`` and go on with ``ranks`` ranks: (its reports, the
    killed job's, its output)."""
    shutil.copytree(killed, work)
    text = JOB.run("--dir", str(work / "ckpt"), "--out", str(work / "again"), "--backend",
                   backend, "--tier", str(work / "mem"), "--steps", str(STEPS), *args,
                   ranks=ranks)
    first = len(list((work / "first").glob("rank*.json")))  # the killed job's ranks
    return JOB.results(work / "again", ranks), JOB.results(work / "first", first), text


def plan(work: Path) -> list[dict[str, list]]:
    """Per rank, per layer: [tier, step] that ``python -m layercheck plan`` says a restore
    of ``work`` would take, from both nodes' memory tiers."""
    done = subprocess.run([sys.executable, "-m", "layercheck", "plan", str(work / "ckpt"),
                           "--memory-tier", str(work / "mem" / "node0"), "--memory-tier",
                           str(work / "mem" / "node1"), "--json"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    ranks = json.loads(done.stdout)["tiers"]["ranks"]
    return [{layer["layer"]: [layer["tier"], layer["step"]] for layer in rank["layers"]}
            for rank in ranks]


def tiers_of(report: dict) -> set[str]:
    return {tier for tier, _ in report["sources"].values()}


@pytest.fixture(scope="module")
def fsdp(tmp_path_factory) -> Path:
    return killed(tmp_path_factory.mktemp("fsdp"), "fsdp")


@pytest.fixture(scope="module")
def zero2(tmp_path_factory) -> Path:
    pytest.importorskip("deepspeed")
    return killed(tmp_path_factory.mktemp("zero2"), "zero2")


@pytest.fixture(scope="module")
def zero3(tmp_path_factory) -> Path:
    pytest.importorskip("deepspeed")
    return killed(tmp_path_factory.mktemp("zero3"), "zero3")


def test_fsdp_killed_processes_resume_from_their_own_memory_bit_identical(fsdp, tmp_path):
    ranks, first, _ = resume(fsdp, tmp_path / "w", "fsdp")
    for r, resumed in enumerate(ranks):
        assert resumed["restored_step"] == AT
        assert tiers_of(resumed) == {"memory"}
        assert resumed["digests"][str(AT)] == first[r]["digests"][str(AT)]
        assert resumed["whole"][str(AT)] == first[r]["whole"][str(AT)]


@pytest.mark.parametrize("backend", ["fsdp", "zero2", pytest.param("zero3", marks=pytest.mark.drill)])
def test_a_lost_node_resumes_its_shard_from_its_buddy_bit_identical(backend, request, tmp_path):
    job = request.getfixturevalue(backend)
    work = tmp_path / "w"
    assert (job / "mem" / "node0" / "ward1").is_dir()  # node 0 keeps rank 1's shard
    shutil.copytree(job, work)
    shutil.rmtree(work / "mem" / "node1")  # node 1 lost: its processes and its memory tier
    ranks, first, _ = resume(work, tmp_path / "again", backend)
    for r, resumed in enumerate(ranks):
        assert resumed["restored_step"] == AT
        assert resumed["digests"][str(AT)] == first[r]["digests"][str(AT)]
    assert tiers_of(ranks[0]) == {"memory"}
    assert tiers_of(ranks[1]) == {"buddy"}


def test_fsdp_a_node_and_its_buddy_lost_resume_from_storage(fsdp, tmp_path):
    work = tmp_path / "w"
    shutil.copytree(fsdp, work)
    shutil.rmtree(work / "mem")
    ranks, _, _ = resume(work, tmp_path / "again", "fsdp")
    for resumed in ranks:
        assert resumed["restored_step"] <= AT
        assert tiers_of(resumed) == {"storage"}
    assert ranks[0]["restored_step"] == ranks[1]["restored_step"]


def damage(slots: Path, item: str, step: int) -> None:
    """Flip a bit in ``item`` of the slot under ``slots`` that holds ``step``."""
    for marker in slots.glob("slot?.json"):
        if json.loads(marker.read_text())["step"] == step:
            path = slots / marker.stem / item
            data = bytearray(path.read_bytes())
            data[len(data) // 2] ^= 0x01
            path.write_bytes(bytes(data))
            return
    raise AssertionError(f"no slot of step {step} under {slots}")


def test_fsdp_a_layer_damaged_on_one_rank_comes_from_one_step_on_every_rank(fsdp, tmp_path):
    """Rank 1's shard of model.layers.1 at step 4 is damaged in its memory and at its
    buddy: rank 0's intact shard of step 4 must not be mixed with an older one of
    rank 1: both take that layer from one older step (memory or storage)."""
    work = tmp_path / "w"
    shutil.copytree(fsdp, work)
    damage(work / "mem" / "node1" / "rank1", "L2", AT)
    damage(work / "mem" / "node0" / "ward1", "L2", AT)
    planned = plan(work)
    ranks, _, _ = resume(work, tmp_path / "again", "fsdp")
    sources = [r["sources"]["model.layers.1"] for r in ranks]
    assert sources[0][1] == sources[1][1] < AT, sources
    assert [planned[r]["model.layers.1"] for r in (0, 1)] == sources  # plan says it first
    for resumed in ranks:
        assert resumed["restored_step"] == AT
        assert resumed["sources"]["model.layers.2"] == ["memory", AT]


@pytest.fixture(scope="module")
def one_node(tmp_path_factory) -> Path:
    """Two FSDP2 ranks on one node (one memory-tier folder, no buddy), killed at step 4."""
    return killed(tmp_path_factory.mktemp("onenode"), "fsdp", "--one-node")


def test_fsdp_resumes_at_another_world_size_from_the_nodes_memory_bit_identical(one_node,
                                                                               tmp_path):
    """Restarted as one rank, it reshards both old ranks' slots of step 4 from the
    node's folder: the whole weights and moments equal the failure-free run's."""
    (resumed,), first, text = resume(one_node, tmp_path / "w", "fsdp", "--one-node", ranks=1)
    assert resumed["restored_step"] == AT
    assert tiers_of(resumed) == {"memory"}
    assert "resharding step 4 from the memory tier: 2 ranks (fsdp) -> 1 process" in text
    assert resumed["whole"][str(AT)] == first[0]["whole"][str(AT)]


@pytest.mark.drill
def test_fsdp_at_another_world_size_a_damaged_copy_falls_back_to_storage(one_node, tmp_path):
    """One old rank's copy of a layer damaged: the reshard is refused before anything is
    copied in, the restore says so in one line and takes storage."""
    work = tmp_path / "w"
    shutil.copytree(one_node, work)
    damage(work / "mem" / "node0" / "rank1", "L2", AT)
    (resumed,), _, text = resume(work, tmp_path / "again", "fsdp", "--one-node", ranks=1)
    assert tiers_of(resumed) == {"storage"}
    assert "cannot be resharded here (" in text
    assert "restoring from storage" in text


@pytest.fixture(scope="module")
def fsdp_smax2(tmp_path_factory) -> Path:
    """As ``fsdp``, its durable tier writing every layer at steps 2 and 4 (Smax 2)."""
    return killed(tmp_path_factory.mktemp("fsdp_smax2"), "fsdp", "--smax", "2")


def test_fsdp_ranks_that_read_a_layer_from_storage_never_mix_its_versions(fsdp_smax2,
                                                                          tmp_path):
    """Rank 1's shard of model.layers.1 is damaged in both its slots and its buddy's, so
    every rank takes that layer from storage; rank 1's newest durable shard of it is
    damaged too: rank 0's intact newest shard must not be mixed with rank 1's older
    one, so the restore is the durable one, whose ranks agree on a version."""
    work = tmp_path / "w"
    shutil.copytree(fsdp_smax2, work)
    for slots in (work / "mem" / "node1" / "rank1", work / "mem" / "node0" / "ward1"):
        for step in (AT - 1, AT):
            damage(slots, "L2", step)
    newest, older = damage_newest_shard(work / "ckpt", "model.layers.1", rank=1)
    assert newest.step == AT
    ranks, _, text = resume(work, tmp_path / "again", "fsdp", "--smax", "2")
    assert "restoring from storage, which agrees on them" in text
    for resumed in ranks:
        assert tiers_of(resumed) == {"storage"}
        assert resumed["sources"]["model.layers.1"] == ["storage", older.step]


def zero_one_node(root: Path, backend: str, ranks: int = 2) -> Path:
    """``ranks`` ZeRO ranks of ``backend`` on one node (one folder, no buddy), killed at
    step 4."""
    pytest.importorskip("deepspeed")
    job = JOB if ranks == 2 else Torchrun(WORKER, env={"DS_ACCELERATOR": "cpu"}, ranks=ranks)
    job.kill_mid_run(root / "ckpt", root / "first", "--backend", backend, "--tier",
                     str(root / "mem"), "--steps", str(STEPS), "--one-node", at=AT)
    return root


@pytest.fixture(scope="module")
def zero2_one_node(tmp_path_factory) -> Path:
    return zero_one_node(tmp_path_factory.mktemp("zero2onenode"), "zero2")


def assert_resharded_from_memory(job: Path, work: Path, backend: str, ranks: int,
                                 *args: str) -> None:
    """Restarted with ``ranks`` ranks, every rank restores step 4 from the node's memory
    tier, resharded: every parameter's whole master, moments and step count, the module
    weights and the schedule equal the failure-free run's at step 4."""
    resumed, first, text = resume(job, work, backend, *args, ranks=ranks)
    old = len(first)
    describe = lambda n: "1 process" if n == 1 else f"{n} ranks"  # noqa: E731
    assert (f"resharding step 4 from the memory tier: {describe(old)} (zero) -> "
            f"{describe(ranks)}") in text, text
    for r, again in enumerate(resumed):
        assert again["restored_step"] == AT
        assert tiers_of(again) == {"memory"}
        assert again["whole"][str(AT)] == first[0]["whole"][str(AT)], r


def test_zero2_a_lost_node_resumes_on_the_other_alone_from_its_memory_bit_identical(
        zero2, tmp_path):
    """Node 1 lost (its processes and folder), the job restarted as one rank on node 0:
    it reshards its own slots of step 4 and the buddy copy of rank 1's it keeps
    (``ward1/``) by the durable restore's resharding of flat partitions
    (``Partitions.apply_elastic``)."""
    work = tmp_path / "w"
    shutil.copytree(zero2, work)
    shutil.rmtree(work / "mem" / "node1")
    assert_resharded_from_memory(work, tmp_path / "again", "zero2", 1)


@pytest.mark.drill
def test_zero2_resumes_at_another_world_size_from_the_nodes_memory_bit_identical(
        zero2_one_node, tmp_path):
    """Two ZeRO-2 ranks on one node (their own slots, no buddy) restarted as one."""
    assert_resharded_from_memory(zero2_one_node, tmp_path / "w", "zero2", 1, "--one-node")


@pytest.mark.drill
def test_zero3_resumes_at_another_world_size_from_the_nodes_memory_bit_identical(
        tmp_path_factory, tmp_path):
    job = zero_one_node(tmp_path_factory.mktemp("zero3onenode"), "zero3")
    assert_resharded_from_memory(job, tmp_path / "w", "zero3", 1, "--one-node")


@pytest.mark.drill
def test_zero2_one_process_resumes_on_two_ranks_from_the_nodes_memory_bit_identical(
        tmp_path_factory, tmp_path):
    job = zero_one_node(tmp_path_factory.mktemp("zero2one"), "zero2", ranks=1)
    assert_resharded_from_memory(job, tmp_path / "w", "zero2", 2, "--one-node")


@pytest.mark.drill
def test_zero2_resumes_as_zero3_in_one_process_from_the_nodes_memory_bit_identical(
        zero2_one_node, tmp_path):
    """A stage change too: the ZeRO-2 ranks' flat partitions cut into ZeRO-3's, as the
    durable restore cuts them."""
    assert_resharded_from_memory(zero2_one_node, tmp_path / "w", "zero3", 1, "--one-node")


@pytest.mark.drill
def test_zero_at_another_world_size_a_damaged_copy_falls_back_to_storage(zero2_one_node,
                                                                        tmp_path):
    """One old rank's copy of a layer damaged: nothing is copied in from memory, the
    restore says why in one line and takes storage."""
    work = tmp_path / "w"
    shutil.copytree(zero2_one_node, work)
    damage(work / "mem" / "node0" / "rank1", "L2", AT)
    (resumed,), _, text = resume(work, tmp_path / "again", "zero2", "--one-node", ranks=1)
    assert tiers_of(resumed) == {"storage"}
    assert "cannot be resharded here (" in text
    assert ("the memory tier holds copies written by 2 ranks (zero), not this job's 1 process "
            "(zero), that cannot be resharded here: restoring from storage") in text


def test_copies_of_another_layout_are_resharded_only_on_the_lineage(tmp_path):
    """``reshard.found`` (in one process, over markers written here): a copy of a timeline
    a restore abandoned is never one to reshard (``storage.lineage``)."""
    from layercheck.storage.lineage import Lineage
    from layercheck.tiers.reshard import found
    from layercheck.tiers.slots import Slot
    old = {"world_size": 2, "backend": "fsdp", "zero3": False, "id": 1}
    for rank, k, step, timeline in ((0, 0, 3, "a"), (0, 1, 5, "a"), (1, 0, 4, "b")):
        (tmp_path / f"rank{rank}").mkdir(exist_ok=True)
        Slot(tmp_path / f"rank{rank}", k).commit({"step": step, "rank": rank, "items": {},
                                                  "document": {"job": "j", "layout": old,
                                                               "timeline": timeline}})
    lineage = Lineage().opened("a", 0).opened("b", 3)  # a restore of step 3 left a
    copies, layouts = found(str(tmp_path), "j", {**old, "world_size": 1, "id": 2}, lineage)
    assert {step: sorted(ranks) for step, ranks in copies.items()} == {3: [0], 4: [1]}
    everything, _ = found(str(tmp_path), "j", {**old, "world_size": 1, "id": 2},
                          Lineage().opened("a", 0))
    assert sorted(everything) == [3, 5]  # before that restore: a's steps, not b's
