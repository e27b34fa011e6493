"""Sharded commits: records that name every rank's shard, exchanged over a real
gloo group between two real processes."""
from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from layercheck.storage.commit import Commit, ShardedCommit, all_gather_json  # noqa: E402
from layercheck.contract.errors import WriteFailed  # noqa: E402
from layercheck.storage.format import (MANIFEST, Shard, Version, encode_record, layer_path,
                                       state_path)
from layercheck.storage.manifest import read_manifest  # noqa: E402
from layercheck.storage.localstore import LocalStore  # noqa: E402
from tests.stores import FullAppends  # noqa: E402


def _version(step: int, layer: str | None, rank: int | None) -> Version:
    """``rank``'s file of a version (None: unsharded), named as the writer names it."""
    return Version(step=step, file=layer_path(layer, step, rank) if layer else state_path(step, rank),
                   bytes=10 + (rank or 0), checksum=f"crc32:0000000{rank or 0}", layer=layer,
                   reason="base" if layer else None)


def _records(store):
    raw = store.read(MANIFEST) if store.exists(MANIFEST) else b""
    return [json.loads(line)["r"] for line in raw.splitlines()]


def test_one_process_appends_its_versions_in_order_or_nothing(tmp_path):
    store = LocalStore(tmp_path)
    versions = [_version(3, "a", None), _version(3, "b", None), _version(3, None, None)]
    assert Commit().commit(store, 3, versions, None) == versions
    assert [(r["kind"], r["step"], r.get("layer")) for r in _records(store)] == [
        ("layer", 3, "a"), ("layer", 3, "b"), ("state", 3, None)]  # layers first, state last
    assert Commit().commit(store, 4, [], None) == []  # a step that wrote nothing commits nothing
    with pytest.raises(OSError, match="No space"):  # its writes failed: commits nothing, says why
        Commit().commit(store, 5, [_version(5, "a", None)], OSError(28, "No space left on device"))
    assert len(_records(store)) == 3
    assert sorted(read_manifest(store).states) == [3]


def test_a_rank_reads_its_own_shard_and_drops_go_by_rank0_file(tmp_path):
    store = LocalStore(tmp_path)
    shards = tuple(Shard(layer_path("a", 1, r), 10 + r, f"crc32:{r:08x}") for r in range(2))
    record = Version(step=1, file=shards[0].file, bytes=10, checksum=shards[0].checksum,
                     layer="a", reason="base", shards=shards).to_record()
    assert "file" not in record and len(record["shards"]) == 2
    store.append(MANIFEST, encode_record({"kind": "header", "format": "layercheck/1",
                                          "layers": [{"name": "a", "kind": "block", "params": 1}],
                                          "world_size": 2}))
    store.append(MANIFEST, encode_record(record))
    state_shards = tuple(Shard(state_path(1, r), 20 + r, f"crc32:{r:08x}") for r in range(2))
    store.append(MANIFEST, encode_record(Version(step=1, file=state_shards[0].file, bytes=20,
                                                 checksum=state_shards[0].checksum,
                                                 shards=state_shards).to_record()))
    assert read_manifest(store, rank=1).states[1].file == "states/000000001.rank00001.safetensors"
    one = read_manifest(store, rank=1)
    assert one.world_size == 2
    (version,) = one.versions["a"]
    assert (version.file, version.bytes, version.checksum) == (shards[1].file, 11, shards[1].checksum)
    assert version.key == shards[0].file and version.total_bytes == 21
    assert version.files == [s.file for s in shards]
    store.append(MANIFEST, encode_record({"kind": "drop", "file": shards[0].file}))
    assert read_manifest(store, rank=1).versions["a"] == []


def test_a_sharded_record_without_a_shard_per_rank_of_its_layout_is_a_problem(tmp_path):
    # issue 30: a rank absent from a version's layout reads rank 0's shard (a restore at
    # another world size); a record whose shards are not its layout's ranks is damaged
    store = LocalStore(tmp_path)
    shard = Shard(layer_path("a", 1, 0), 1, "crc32:00000000")
    store.append(MANIFEST, encode_record({"kind": "header", "format": "layercheck/1",
                                          "layers": [{"name": "a", "kind": "block", "params": 1}],
                                          "world_size": 2}))
    store.append(MANIFEST, encode_record({"kind": "layer", "step": 1, "layer": "a",
                                          "reason": "base", "shards": [shard.to_record()]}))
    view = read_manifest(store, rank=3)
    assert view.versions == {} and "1 shards in a version of layout 0" in view.problems[0]


def _outcome(commit, store, step, versions, error):
    try:
        return "committed " + ",".join(v.file for v in commit.commit(store, step, versions, error))
    except Exception as exc:  # noqa: BLE001 - what each rank saw is the result
        return f"{type(exc).__name__}: {exc}"


def _rank_main(rank: int, root: str, fail_rank: int) -> None:
    # a collective that one rank never joins fails after a minute instead of hanging;
    # a file rendezvous, not a port that another test could take first
    dist.init_process_group("gloo", init_method=f"file://{Path(root) / 'rendezvous'}", rank=rank,
                            world_size=2, timeout=timedelta(seconds=60))
    group = dist.new_group(backend="gloo")
    store = LocalStore(root)
    commit = ShardedCommit(group, rank, 2)
    out = {"gathered": all_gather_json({"rank": rank, "text": "x" * (rank * 50)}, group, 2)}
    mine = [_version(1, "a", rank), _version(1, None, rank)]
    merged = commit.commit(store, 1, mine, None)
    out["merged"] = [v.to_record() for v in merged]
    error = OSError(28, "No space left on device") if rank == fail_rank else None
    out["second"] = _outcome(commit, store, 2, [] if error else [_version(2, "a", rank)], error)
    # step 3: rank 1 writes another layer than rank 0 (a rank that skipped a step)
    out["disagree"] = _outcome(commit, store, 3, [_version(3, "a" if rank == 0 else "b", rank)], None)
    # step 4: rank 1 fails for a reason a retry cannot fix; rank 0 a full disk (retryable)
    error = ValueError("bad tensor") if rank == 1 else OSError(28, "No space left on device")
    out["final"] = _outcome(commit, store, 4, [], error)
    # step 5: every rank wrote its shard, rank 0 cannot append the records
    out["append"] = _outcome(commit, FullAppends(root) if rank == 0 else store, 5,
                             [_version(5, "a", rank)], None)
    # step 6: both ranks failed, both retryable: each raises its own error
    error = OSError(5, f"I/O error on rank {rank}")
    out["both"] = _outcome(commit, store, 6, [], error)
    Path(root, f"out{rank}.json").write_text(json.dumps(out))
    dist.destroy_process_group()


def test_ranks_commit_together_or_not_at_all(tmp_path):
    # spawned, not forked: a forked rank would inherit a default group that another
    # test file left in this process (tests/conftest.py::in_a_fresh_python says which)
    mp.start_processes(_rank_main, args=(str(tmp_path), 1), nprocs=2, join=True,
                       start_method="spawn")
    outs = [json.loads((tmp_path / f"out{r}.json").read_text()) for r in range(2)]
    assert [g["rank"] for g in outs[0]["gathered"]] == [0, 1]
    assert outs[1]["gathered"][1]["text"] == "x" * 50
    # step 1: one record per version, naming both ranks' shards, state last
    view0, view1 = read_manifest(LocalStore(tmp_path), 0), read_manifest(LocalStore(tmp_path), 1)
    assert [v.file for v in view0.versions["a"]] == ["layers/a@000000001.rank00000.safetensors"]
    assert [v.file for v in view1.versions["a"]] == ["layers/a@000000001.rank00001.safetensors"]
    assert sorted(view0.states) == sorted(view1.states) == [1]
    # step 2: rank 1 failed to write, so neither rank committed anything of it
    assert outs[0]["second"] == ("WriteFailed: rank 1 could not write its shard of step 2 "
                                 "(OSError: [Errno 28] No space left on device)")
    assert outs[1]["second"] == "OSError: [Errno 28] No space left on device"
    # every rank returns the same merged records: its versions with every rank's shard
    assert outs[0]["merged"] == outs[1]["merged"]
    assert [[sh["file"] for sh in r["shards"]] for r in outs[0]["merged"]] == [
        [layer_path("a", 1, r) for r in range(2)], [state_path(1, r) for r in range(2)]]
    # step 3: the ranks disagree on what the step writes: neither commits, both say so
    for out in outs:
        assert out["disagree"] == ("WriteFailed: the ranks disagree on what step 3 writes "
                                   "([('a',), ('b',)]); every rank must call step() after every "
                                   "optimizer step")
    # step 4: a failure a retry cannot fix wins on every rank (LayerCheckError, not retried)
    assert outs[0]["final"] == ("LayerCheckError: rank 1 could not write its shard of step 4 "
                                "(ValueError: bad tensor)")
    assert outs[1]["final"] == "ValueError: bad tensor"
    # step 5: rank 0's append failed: it raises its own error, rank 1 learns of it
    assert outs[0]["append"] == "OSError: [Errno 28] No space left on device"
    assert outs[1]["append"] == ("WriteFailed: rank 0 could not append the manifest records of "
                                 "step 5 (OSError: [Errno 28] No space left on device)")
    assert [outs[r]["both"] for r in range(2)] == [f"OSError: [Errno 5] I/O error on rank {r}"
                                                    for r in range(2)]
    # nothing of steps 2-6 was committed, on either rank's view
    assert all(v.step == 1 for v in view0.versions["a"]) and sorted(view0.states) == [1]
    assert read_manifest(LocalStore(tmp_path), 0).versions.keys() == {"a"}
