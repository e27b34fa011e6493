"""Recovery falls back past damaged versions, and says so."""
from __future__ import annotations

import threading
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from layercheck import LayerCheck, LayerCheckConfig
from layercheck.contract.errors import CheckpointNotFound
from layercheck.storage.manifest import read_manifest
from layercheck.backends.ranks import Ranks
from layercheck.recovery import Planner, make_plan
from layercheck.storage.localstore import LocalStore
from tests.conftest import every_layer_checkpoint, optimizer_for, tiny_lm, train_step
from tests.stores import CountedReads, NotedScatteredReads, SlowReads, ThreadNotedReads


@pytest.fixture()
def ckpt(tmp_path):
    return every_layer_checkpoint(tmp_path / "c")


def _flip(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def test_flipped_bit_falls_back_to_previous_version_with_warning(ckpt):
    store = LocalStore(ckpt)
    view = read_manifest(store)
    newest = view.versions["model.layers.1"][-1]
    _flip(ckpt / newest.file)
    plan = make_plan(store, view)
    assert plan.step == 6
    assert plan.sources["model.layers.1"].step == 5
    assert any("checksum" in w and "model.layers.1" in w for w in plan.warnings)
    model = tiny_lm(seed=4)
    opt, sched = optimizer_for(model, total=20)
    with LayerCheck(model, opt, ckpt, scheduler=sched) as lc:
        with pytest.warns(UserWarning, match="model.layers.1"):
            assert lc.restore() == 6
        assert lc.restored.plan.sources["model.layers.1"].step == 5


def test_truncated_and_missing_files_fall_back(ckpt):
    store = LocalStore(ckpt)
    view = read_manifest(store)
    (ckpt / view.versions["model.norm"][-1].file).unlink()
    emb = ckpt / view.versions["model.embed_tokens"][-1].file
    emb.write_bytes(emb.read_bytes()[:100])
    plan = make_plan(store, view)
    assert plan.sources["model.norm"].step == 5
    assert plan.sources["model.embed_tokens"].step == 5


def test_corrupt_state_falls_back_to_the_previous_step(ckpt):
    store = LocalStore(ckpt)
    view = read_manifest(store)
    _flip(ckpt / view.states[6].file)
    plan = make_plan(store, view)
    assert plan.step == 5 and all(v.step <= 5 for v in plan.sources.values())


def test_every_version_damaged_is_an_error_not_a_silent_restore(ckpt):
    store = LocalStore(ckpt)
    view = read_manifest(store)
    for v in view.versions["model.norm"]:
        _flip(ckpt / v.file)
    with pytest.raises(CheckpointNotFound, match="model.norm"):
        make_plan(store, view)


class _PeerLacks(Ranks):
    """Two ranks, the other of which cannot read its shard of ``layer``'s newest
    version: for the layers it proposes one version older."""

    world_size = 2

    def __init__(self, index: int, older: int) -> None:
        self.index, self.older = index, older

    def agree_min(self, values):
        mine = np.array(values, dtype=np.int64)
        theirs = mine.copy()
        if len(theirs) > 1:  # the layers (a plan asks for the state alone first)
            theirs[self.index] = min(theirs[self.index], self.older)
        low = np.minimum(mine, theirs)
        return low, bool(np.array_equal(mine, theirs))


def test_live_ranks_agree_on_the_older_version_and_this_rank_loads_it_again(ckpt):
    store = LocalStore(ckpt)
    view = read_manifest(store)
    index = view.layer_names.index("model.layers.1")
    loaded = []
    planner = Planner(store, view, ranks=_PeerLacks(index, older=4))
    plan = planner.plan(use=lambda version, tensors: loaded.append((version.layer, version.step)))
    assert plan.step == 6 and plan.sources["model.layers.1"].step == 4
    assert all(v.step == 6 for n, v in plan.sources.items() if n != "model.layers.1")
    # each layer loaded once, model.layers.1 twice: its newest, then the agreed one
    assert [s for n, s in loaded if n == "model.layers.1"] == [6, 4]
    assert len(loaded) == len(view.layer_names) + 1


# -- a file is checked for what it says it is, and nothing is touched before all is (item 7) --
def _rewrite(ckpt, old, new_record):
    """Replace the manifest record of ``old`` (a committed Version) by ``new_record``."""
    from layercheck.storage.format import decode_line, encode_record
    lines = (ckpt / "manifest.jsonl").read_bytes().splitlines(keepends=True)
    out = []
    for line in lines:
        record = decode_line(line)
        out.append(encode_record(new_record) if record.get("file") == old.file
                   and record.get("layer") == old.layer else line)
    (ckpt / "manifest.jsonl").write_bytes(b"".join(out))


def _live(model, opt):
    names = {id(p): n for n, p in model.named_parameters()}
    return ({n: p.detach().clone() for n, p in model.named_parameters()},
            {(names[id(p)], k): v.clone() for p, s in opt.state.items() for k, v in s.items()})


def test_a_record_naming_another_layers_file_is_passed_over(ckpt):
    """model.layers.2's file at step 6 holds model.layers.0's (copied into place, its
    record's checksum made to match; a record naming the other file itself is skipped
    when the manifest is read): the file's own metadata says whose and which step it
    is, so the version is passed over and model.layers.2 restores from step 5."""
    from safetensors.torch import load_file
    store = LocalStore(ckpt)
    view = read_manifest(store)
    other, mine = view.versions["model.layers.0"][-1], view.versions["model.layers.2"][-1]
    forged = {**mine.to_record(), "bytes": other.bytes, "checksum": other.checksum}
    _rewrite(ckpt, mine, forged)
    (ckpt / mine.file).write_bytes((ckpt / other.file).read_bytes())
    plan = make_plan(store, read_manifest(store))
    assert plan.step == 6 and plan.sources["model.layers.2"].step == 5
    assert any("model.layers.0" in w and "model.layers.2" in w for w in plan.warnings)
    model = tiny_lm(seed=4)
    opt, sched = optimizer_for(model, total=20)
    with LayerCheck(model, opt, ckpt, scheduler=sched) as lc:
        with pytest.warns(UserWarning, match="model.layers.2"):
            assert lc.restore() == 6
    params = dict(model.named_parameters())
    for key, value in load_file(ckpt / view.versions["model.layers.2"][-2].file).items():
        if key.startswith("param/"):
            assert torch.equal(params[key[6:]], value), key


def test_a_version_from_another_step_is_passed_over(ckpt):
    """A record whose file holds the same layer but of another step (a stale copy
    renamed into place, with a checksum to match) is not that step's version."""
    store = LocalStore(ckpt)
    view = read_manifest(store)
    older, mine = view.versions["model.norm"][-2], view.versions["model.norm"][-1]
    _rewrite(ckpt, mine, {**mine.to_record(), "bytes": older.bytes, "checksum": older.checksum})
    (ckpt / mine.file).write_bytes((ckpt / older.file).read_bytes())
    plan = make_plan(store, read_manifest(store))
    assert plan.sources["model.norm"].step == older.step
    assert any("step" in w and "model.norm" in w for w in plan.warnings)


def test_a_restore_that_fails_leaves_the_model_and_optimizer_untouched(ckpt):
    """The last layer's newest version is well formed and checksummed but shaped for
    another model: restore refuses, and had copied the earlier layers into the live
    model by then. Now every version is planned and checked against the model first."""
    from safetensors.torch import save
    from layercheck.contract.errors import ModelMismatch
    from layercheck.storage.format import checksum, layer_metadata
    store = LocalStore(ckpt)
    view = read_manifest(store)
    norm = view.versions["model.norm"][-1]
    data = save({"param/model.norm.weight": torch.ones(16)},
                metadata=layer_metadata("model.norm", norm.step))
    (ckpt / norm.file).write_bytes(data)
    _rewrite(ckpt, norm, {**norm.to_record(), "bytes": len(data), "checksum": checksum(data)})
    model = tiny_lm(seed=4)
    opt, sched = optimizer_for(model, total=20)
    train_step(model, opt, sched)  # live optimizer state too
    before = _live(model, opt)
    with LayerCheck(model, opt, ckpt, scheduler=sched) as lc:
        with pytest.raises(ModelMismatch, match="model.norm"):
            lc.restore()
    after = _live(model, opt)
    for part in (0, 1):
        assert before[part].keys() == after[part].keys()
        for key in before[part]:
            assert torch.equal(before[part][key], after[part][key]), key


# -- one read per file, kept within restore_memory, read ahead in parallel (issue 14) --


def _fresh():
    model = tiny_lm(seed=4)
    opt, sched = optimizer_for(model, total=20)
    return model, opt, sched


def _restored(ckpt, **config):
    """(model, optimizer, restore report, counted reads) of a restore into fresh ones."""
    model, opt, sched = _fresh()
    store = CountedReads(ckpt)
    with LayerCheck(model, opt, store, LayerCheckConfig(**config), scheduler=sched) as lc:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the damaged versions passed over
            lc.restore()
    return model, opt, lc.restored, store.reads


def _assert_same(a, b):
    for part in (0, 1):
        assert a[part].keys() == b[part].keys()
        for key in a[part]:
            assert torch.equal(a[part][key], b[part][key]), key


def _damage_some(ckpt):
    """The newest version of two layers flipped, of a third cut short: a composite
    of two steps, three versions passed over."""
    view = read_manifest(LocalStore(ckpt))
    _flip(ckpt / view.versions["model.layers.0"][-1].file)
    _flip(ckpt / view.versions["model.norm"][-1].file)
    path = ckpt / view.versions["model.layers.2"][-1].file
    path.write_bytes(path.read_bytes()[:-8])
    return view


@pytest.mark.parametrize("threads", [1, 4])
def test_a_restore_reads_each_committed_file_once(ckpt, threads):
    view = _damage_some(ckpt)
    _, _, report, reads = _restored(ckpt, restore_threads=threads)
    plan = report.plan
    damaged = {view.versions[n][-1].file for n in ("model.layers.0", "model.norm",
                                                   "model.layers.2")}
    assert {v.step for v in plan.sources.values()} == {5, 6}
    used = {v.file for v in plan.sources.values()} | {plan.state.file}
    files = {path: n for path, n in reads.items() if path != "manifest.jsonl"}
    assert files == {path: 1 for path in used | damaged}


def test_layers_beyond_restore_memory_are_read_again_and_restore_the_same(ckpt):
    _damage_some(ckpt)
    kept_all = _restored(ckpt)
    sizes = sorted(v.bytes for v in kept_all[2].plan.sources.values())
    some = _restored(ckpt, restore_memory=sum(sizes[:3]))  # three layers kept, the rest read again
    none = _restored(ckpt, restore_memory=0)
    for model, opt, report, reads in (some, none):
        _assert_same(_live(kept_all[0], kept_all[1]), _live(model, opt))
        assert report.plan.sources == kept_all[2].plan.sources
    twice = lambda reads: sum(n == 2 for p, n in reads.items() if p.startswith("layers/"))  # noqa: E731
    assert twice(none[3]) == len(kept_all[2].plan.sources)
    assert twice(some[3]) == len(kept_all[2].plan.sources) - 3
    assert twice(kept_all[3]) == 0


def test_the_restored_state_is_the_chosen_files(ckpt):
    """Bit for bit the tensors of the chosen versions, read by safetensors itself."""
    from safetensors.torch import load_file
    _damage_some(ckpt)
    model, opt, report, _ = _restored(ckpt, restore_memory=0, restore_threads=4)
    params, state = _live(model, opt)  # the moments are what was read: see the tests below
    for version in report.plan.sources.values():
        for key, value in load_file(ckpt / version.file).items():
            kind, _, rest = key.partition("/")
            if kind == "param":
                assert torch.equal(params[rest], value), key
            elif kind == "optim":
                field, _, owner = rest.partition("/")
                assert torch.equal(state[(owner, field)], value), key


def test_parallel_reads_choose_warn_and_use_as_serial_reads(ckpt):
    _damage_some(ckpt)
    store = LocalStore(ckpt)
    runs = []
    for threads in (1, 3):
        used = []
        planner = Planner(store, read_manifest(store), threads=threads, keep_bytes=1 << 30)
        plan = planner.plan(use=lambda v, t: used.append((v.file, sorted(t), float(sum(
            x.double().sum() for x in t.values())))))
        runs.append((plan.sources, plan.warnings, plan.passed_over, used))
    assert runs[0] == runs[1]
    assert len(runs[0][1]) == 3 and len(runs[0][2]) == 3
    serial, parallel = (_restored(ckpt, restore_threads=n) for n in (1, 4))
    _assert_same(_live(serial[0], serial[1]), _live(parallel[0], parallel[1]))


def test_a_damaged_file_with_no_intact_version_leaves_model_and_optimizer_unchanged(ckpt):
    """The last layer has no intact version: found while planning, after every other
    layer was read and checked. Nothing was copied into the live objects."""
    store = LocalStore(ckpt)
    view = read_manifest(store)
    for version in view.versions[view.layer_names[-1]]:
        _flip(ckpt / version.file)
    for threads, memory in ((1, None), (4, None), (4, 0)):
        model, opt, sched = _fresh()
        train_step(model, opt, sched)  # live optimizer state too
        before = _live(model, opt)
        config = LayerCheckConfig(restore_threads=threads, restore_memory=memory)
        with LayerCheck(model, opt, ckpt, config, scheduler=sched) as lc:
            with pytest.raises(CheckpointNotFound, match=view.layer_names[-1]):
                lc.restore()
        _assert_same(before, _live(model, opt))


def test_tensor_views_are_the_tensors_safetensors_reads():
    """Every dtype layercheck writes, 0-d and empty tensors: the views equal
    safetensors' own load, and share the verified buffer."""
    from safetensors.torch import load, save
    from layercheck.storage.layerread import VerifiedFile, parse_header
    from layercheck.recovery import parse_safetensors, tensor_views
    torch.manual_seed(0)
    tensors = {"a": torch.randn(3, 5), "b": torch.randn(7).to(torch.bfloat16),
               "c": torch.tensor(3.0, dtype=torch.float64), "d": torch.randint(0, 9, (4,)),
               "e": torch.zeros(0, 3), "f": torch.randn(2, 2).half(),
               "g": torch.tensor([True, False]), "h": torch.arange(5, dtype=torch.uint8),
               "i": torch.zeros(0, dtype=torch.int64), "j": torch.zeros(2, 0).to(torch.bfloat16)}
    data = bytearray(save(tensors, metadata={"k": "v"}))
    header, start = parse_header(data, "x")
    views = tensor_views(VerifiedFile(data, header, start))
    theirs = load(bytes(data))
    assert views.keys() == theirs.keys()
    for key, value in theirs.items():
        assert views[key].dtype == value.dtype and torch.equal(views[key], value), key
    views["a"][0, 0] = 42.0  # a view of the buffer, not a copy
    assert tensor_views(VerifiedFile(data, header, start))["a"][0, 0] == 42.0
    copies, metadata = parse_safetensors(bytes(data), "x")
    assert metadata == {"k": "v"} and torch.equal(copies["b"], theirs["b"])


def test_planner_and_config_refuse_bad_read_settings(ckpt):
    from layercheck.contract.config import ConfigError
    store = LocalStore(ckpt)
    with pytest.raises(ValueError, match="keep_bytes"):
        Planner(store, read_manifest(store), keep_bytes=-1)
    with pytest.raises(ValueError, match="threads"):
        Planner(store, read_manifest(store), threads=0)
    with pytest.raises(ConfigError, match="restore_memory"):
        LayerCheckConfig(restore_memory=-5)
    with pytest.raises(ConfigError, match="restore_threads"):
        LayerCheckConfig(restore_threads=0)


# -- what a plan reports (the CLI's `plan`, export's layercheck_plan.json) (issue 15) --
def test_a_plan_reports_each_layers_source_step_staleness_file_and_bytes(ckpt):
    """Per layer in header order: the step its version is from, how many steps older
    than the plan's step that is, its file, bytes and reason; the bytes to read are
    the chosen layer files' sizes on disk; the warnings are the plan's, copied."""
    import json
    view = _damage_some(ckpt)  # model.layers.0, model.norm, model.layers.2 fall back to step 5
    store = LocalStore(ckpt)
    plan = make_plan(store, read_manifest(store))
    stale = {"model.layers.0": 1, "model.norm": 1, "model.layers.2": 1}
    expected = {name: stale.get(name, 0) for name in view.layer_names}
    assert plan.staleness() == expected
    info = plan.to_dict()
    assert json.loads(json.dumps(info)) == info
    assert info.keys() == {"step", "layers", "bytes", "warnings"}
    assert info["step"] == 6
    assert [entry["layer"] for entry in info["layers"]] == view.layer_names
    for entry in info["layers"]:
        name = entry["layer"]
        chosen = view.versions[name][-1 - expected[name]]
        assert chosen.step == 6 - expected[name]
        assert entry == {"layer": name, "source_step": chosen.step, "staleness": expected[name],
                         "file": chosen.file, "bytes": (ckpt / chosen.file).stat().st_size,
                         "reason": chosen.reason}
    assert {entry["reason"] for entry in info["layers"]} - {None}  # the writer's reasons, kept
    assert info["bytes"] == sum((ckpt / entry["file"]).stat().st_size for entry in info["layers"])
    assert len(info["warnings"]) == 3 and info["warnings"] == plan.warnings
    info["warnings"].clear()  # a copy: the plan's own list is untouched
    assert len(plan.warnings) == 3
    # the plan's state, and each version passed over with its warning, in the order read
    assert plan.state == view.states[6]
    damaged = [view.versions[n][-1] for n in view.layer_names if n in stale]
    assert plan.passed_over == damaged
    for version, warning in zip(damaged, plan.warnings):
        assert warning.startswith(f"layer {version.layer}: skipping the version of step 6: ")


@pytest.fixture(scope="module")
def eight_steps(tmp_path_factory):
    """Every layer written at every step from the base (step 2) to 8: seven states."""
    return every_layer_checkpoint(tmp_path_factory.mktemp("eight") / "c", steps=8)


def test_an_exact_step_not_recoverable_names_the_recoverable_ones(eight_steps):
    """Up to six recoverable steps are listed; more are summed up as a range."""
    store = LocalStore(eight_steps)
    view = read_manifest(store)
    assert sorted(view.states) == [2, 3, 4, 5, 6, 7, 8]
    with pytest.raises(CheckpointNotFound) as seven:
        make_plan(store, view, 1, exact=True)
    assert str(seven.value) == (f"step 1 is not a recoverable step of {store.url} (7 recoverable "
                                "steps from 2 to 8); pass one of them, or leave out --step for "
                                "the newest")
    view.apply({"kind": "drop", "file": view.states[5].file})
    with pytest.raises(CheckpointNotFound) as six:
        make_plan(store, view, 5, exact=True)
    assert str(six.value) == (f"step 5 is not a recoverable step of {store.url} (recoverable "
                              "steps: 2, 3, 4, 6, 7, 8); pass one of them, or leave out --step "
                              "for the newest")


def test_a_step_is_planned_at_or_before_it_or_exactly_it(ckpt):
    """Without ``exact`` a step means the newest recoverable step at or before it, by
    every planner entry point; with it, exactly that step or an error."""
    store = LocalStore(ckpt)
    view = read_manifest(store)
    view.apply({"kind": "drop", "file": view.states[5].file})  # steps 2, 3, 4, 6 remain
    assert make_plan(store, view, 5).step == 4
    assert Planner(store, view).plan(5).step == 4
    assert Planner(store, view).state(5)[0] == view.states[4]
    assert make_plan(store, view, 2).step == 2  # the oldest
    plan = make_plan(store, view, 3)
    assert plan.step == 3 and all(v.step == 3 for v in plan.sources.values())
    assert make_plan(store, view).step == 6 and Planner(store, view).plan().step == 6
    assert make_plan(store, view, 4, exact=True).step == 4
    assert Planner(store, view).plan(4, exact=True).step == 4
    for planned in (lambda: make_plan(store, view, 5, exact=True),
                    lambda: Planner(store, view).plan(5, exact=True),
                    lambda: Planner(store, view).state(5, exact=True)):
        with pytest.raises(CheckpointNotFound, match="step 5 is not a recoverable step"):
            planned()
    with pytest.raises(CheckpointNotFound) as before:
        make_plan(store, view, 1)
    assert str(before.value) == "no recoverable step at or before 1; the oldest is 2"


def test_a_checkpoint_with_nothing_to_restore_says_what_is_missing(tmp_path, ckpt):
    empty = LocalStore(tmp_path / "empty")
    with pytest.raises(CheckpointNotFound) as no_header:
        make_plan(empty, read_manifest(empty))
    assert str(no_header.value) == (  # one message for every command (ManifestView.require_header)
        f"{empty.url}: not a layercheck checkpoint (no manifest.jsonl with a valid header); point "
        "at the directory given to LayerCheck")
    store = LocalStore(ckpt)
    view = read_manifest(store)
    for state in list(view.states.values()):
        view.apply({"kind": "drop", "file": state.file})
    with pytest.raises(CheckpointNotFound) as no_state:
        make_plan(store, view)
    assert str(no_state.value) == (f"{store.url}: no recoverable step yet (training stopped "
                                   "before the base checkpoint)")
    # a layer the header names without a record left (each line of it lost), read serially or ahead
    from layercheck.storage.format import decode_line
    lines = (ckpt / "manifest.jsonl").read_bytes().splitlines(keepends=True)
    (ckpt / "manifest.jsonl").write_bytes(b"".join(
        line for line in lines if decode_line(line).get("layer") != "model.norm"))
    view = read_manifest(store)
    assert "model.norm" in view.layer_names and "model.norm" not in view.versions
    for threads in (1, 2):
        with pytest.raises(CheckpointNotFound) as no_version:
            Planner(store, view, threads=threads).plan()
        assert str(no_version.value) == ("layer model.norm has no committed version at or "
                                         "before step 6")


def test_no_intact_version_says_how_many_were_tried_and_on_which_ranks(ckpt):
    store = LocalStore(ckpt)
    view = read_manifest(store)
    for version in view.versions["model.norm"]:
        _flip(ckpt / version.file)
    newest = view.versions["model.norm"][-1]
    with pytest.raises(CheckpointNotFound) as one:
        make_plan(store, view)
    assert str(one.value).startswith("layer model.norm: no committed version intact (5 tried, all "
                                     f"damaged; the newest here, step 6's: {newest.file}: ")
    view.header = {**view.header, "world_size": 2}  # a sharded job's checkpoint
    with pytest.raises(CheckpointNotFound) as two:
        make_plan(store, view)
    assert str(two.value).startswith("layer model.norm: no committed version intact on every "
                                     "rank (5 tried, all damaged; the newest here, step 6's: ")
    for state in view.states.values():
        _flip(ckpt / state.file)
    with pytest.raises(CheckpointNotFound) as states:
        make_plan(store, read_manifest(store))
    assert str(states.value).startswith("training state: no committed version intact (5 tried, "
                                        "all damaged; the newest here, step 6's: ")


def test_a_damaged_state_is_named_as_the_training_state(ckpt):
    store = LocalStore(ckpt)
    view = read_manifest(store)
    _flip(ckpt / view.states[6].file)
    plan = make_plan(store, view)
    assert plan.step == 5 and plan.passed_over == [view.states[6]]
    assert plan.warnings[0].startswith("training state: skipping the version of step 6: ")
    with pytest.raises(CheckpointNotFound) as exact:  # exactly step 6: no falling back
        make_plan(store, view, 6, exact=True)
    assert str(exact.value) == ("training state: no committed version intact (1 tried, all "
                                f"damaged; the newest here, step 6's: "
                                f"{plan.warnings[0].split(': ', 2)[2]})")


def _shard_in_two(ckpt, version):
    """Rewrite ``version``'s record as two ranks' shards: its own file renamed as rank
    0's and a copy of it as rank 1's (unsharded files say no rank), of a 2-rank layout
    recorded before it (issue 30: a version has its layout's shards). Returns the
    copy's path."""
    from layercheck.storage.format import Layout, Shard, encode_record, layer_path
    manifest = ckpt / "manifest.jsonl"
    header, rest = manifest.read_bytes().split(b"\n", 1)
    layout = Layout(id=1, world_size=2, facts={"fsdp": {}}).to_record()
    manifest.write_bytes(header + b"\n" + encode_record(layout) + rest)
    own, copy = (layer_path(version.layer, version.step, r) for r in range(2))  # the ranks' names
    (ckpt / version.file).rename(ckpt / own)
    (ckpt / copy).write_bytes((ckpt / own).read_bytes())
    shards = [Shard(own, version.bytes, version.checksum).to_record(),
              Shard(copy, version.bytes, version.checksum).to_record()]
    record = {k: v for k, v in version.to_record().items() if k not in ("file", "bytes", "checksum")}
    _rewrite(ckpt, version, {**record, "shards": shards, "layout": 1})
    return ckpt / copy


def test_offline_plans_verify_every_ranks_shard_a_live_rank_only_its_own(ckpt):
    """Rank 1's shard of model.layers.1 at step 6 is damaged: the offline plan
    (make_plan, ``every_shard``) passes the version over; a live rank 0, which
    verifies only its own shard (the ranks then agree), takes it."""
    store = LocalStore(ckpt)
    copy = _shard_in_two(ckpt, read_manifest(store).versions["model.layers.1"][-1])
    view = read_manifest(store)
    assert make_plan(store, view).sources["model.layers.1"].step == 6  # both shards intact
    _flip(copy)
    offline = make_plan(store, view)
    assert offline.sources["model.layers.1"].step == 5
    assert len(offline.warnings) == 1 and copy.name in offline.warnings[0]
    assert Planner(store, view, every_shard=True).plan().sources["model.layers.1"].step == 5
    live = Planner(store, view).plan()
    assert live.sources["model.layers.1"].step == 6 and live.warnings == []


class _PeerLacksSome(Ranks):
    """Two ranks, the other of which proposes ``older[i]`` for the layer at index i (it
    cannot read its newer shards); the state is agreed at once."""

    world_size = 2

    def __init__(self, older: dict[int, int]) -> None:
        self.older = older

    def agree_min(self, values):
        mine = np.array(values, dtype=np.int64)
        theirs = mine.copy()
        if len(theirs) > 1:
            for index, step in self.older.items():
                theirs[index] = min(theirs[index], step)
        return np.minimum(mine, theirs), bool(np.array_equal(mine, theirs))


def _read_again(planner, plan, store):
    """The layers whose file ``load`` reads again (not kept from the plan)."""
    before = dict(store.reads)
    for version in plan.sources.values():
        planner.load(version)
    return {name for name, v in plan.sources.items()
            if store.reads.get(v.file, 0) > before.get(v.file, 0)}


def test_the_files_kept_for_load_stay_within_keep_bytes_when_ranks_agree_on_older_ones(ckpt):
    """The peer lacks model.layers.1's and the last layer's newest shards: both are
    chosen again at step 4. What stays in memory for ``load`` is never more than
    ``keep_bytes``, and all of it when the chosen files fit exactly."""
    store = CountedReads(ckpt)
    view = read_manifest(store)
    last = view.layer_names[-1]
    older = {view.layer_names.index("model.layers.1"): 4, view.layer_names.index(last): 4}
    for keep in ("all", "all but a byte"):
        planner = Planner(store, view, ranks=_PeerLacksSome(older), keep_bytes=1 << 30)
        plan = planner.plan(use=lambda version, tensors: None)
        total = sum(v.bytes for v in plan.sources.values())
        assert {n for n, v in plan.sources.items() if v.step == 4} == {"model.layers.1", last}
        limit = total if keep == "all" else total - 1
        planner = Planner(store, view, ranks=_PeerLacksSome(older), keep_bytes=limit)
        plan = planner.plan(use=lambda version, tensors: None)
        again = _read_again(planner, plan, store)
        kept = sum(v.bytes for n, v in plan.sources.items() if n not in again)
        assert kept <= limit
        assert again == set() if keep == "all" else 0 < kept and again


def test_load_s_is_the_time_load_spent_reading_files_again(ckpt):
    store = SlowReads(ckpt)
    view = read_manifest(store)
    kept = Planner(store, view, keep_bytes=1 << 30)
    plan = kept.plan(use=lambda version, tensors: None)
    for version in plan.sources.values():
        kept.load(version)
    assert kept.load_s == 0.0  # every file kept: nothing read again
    again = Planner(store, view, keep_bytes=0)
    plan = again.plan(use=lambda version, tensors: None)
    start = time.perf_counter()
    for version in plan.sources.values():
        again.load(version)
    wall = time.perf_counter() - start
    assert len(plan.sources) * store.delay <= again.load_s <= wall


def test_threads_read_the_newest_versions_ahead_in_a_pool_of_that_many(ckpt):
    """threads=1 (the default) reads in the caller's thread; threads=n reads each
    layer's newest version in a pool of at most n 'layercheck-read' threads, also
    when the ranks agree on older versions of only two layers, and at most 2n files
    ahead of the one being chosen."""
    main = threading.current_thread().name
    store = ThreadNotedReads(ckpt)
    view = read_manifest(store)
    Planner(store, view).plan(use=lambda version, tensors: None)
    assert store.readers and {t for _, t in store.readers} == {main}
    for threads in (2, 4):
        store.readers.clear()
        Planner(store, view, threads=threads).plan(use=lambda version, tensors: None)
        readers = {t for _, t in store.layer_files()}
        assert all(t.startswith("layercheck-read") for t in readers), readers
        assert len(store.layer_files()) == len(view.layer_names) and len(readers) <= threads
    older = {view.layer_names.index("model.layers.1"): 4, len(view.layer_names) - 1: 4}
    store.readers.clear()
    Planner(store, view, ranks=_PeerLacksSome(older), threads=4).plan()
    again = store.layer_files()[len(view.layer_names):]  # the two older versions
    assert len(again) == 2 and all(t.startswith("layercheck-read") for _, t in again)
    # while the first layer is chosen, the pool has read (at most) 2 x threads files ahead
    seen = []

    def first(version, tensors):
        if not seen:
            deadline = time.monotonic() + 5
            while len(store.layer_files()) < 4 and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(0.2)  # time for a fifth read, should one have been started
            seen.append(len(store.layer_files()))

    store.readers.clear()
    Planner(store, view, threads=2).plan(use=first)
    assert seen == [4] and len(view.layer_names) > 4


class _ThreadRanks(Ranks):
    """Two ranks as two threads of this process: agree_min is a real exchange."""

    world_size = 2

    def __init__(self, rank: int, board: dict, barrier: threading.Barrier) -> None:
        self.rank, self.board, self.barrier = rank, board, barrier

    def agree_min(self, values):
        self.board[self.rank] = np.array(values, dtype=np.int64)
        self.barrier.wait()
        low = np.minimum(self.board[0], self.board[1])
        same = bool(np.array_equal(self.board[0], self.board[1]))
        self.barrier.wait()
        return low, same


def test_together_raises_on_every_rank_when_one_fails(tmp_path):
    """The failing rank raises its own error; the other one says that another rank failed."""
    from layercheck.contract.errors import LayerCheckError
    from layercheck.storage.manifest import ManifestView
    store, board, barrier = LocalStore(tmp_path), {}, threading.Barrier(2, timeout=30)
    planners = [Planner(store, ManifestView(), ranks=_ThreadRanks(r, board, barrier)) for r in (0, 1)]

    def fails():
        raise ValueError("rank 0 cannot read its shard")

    def both(works):
        results = [None, None]

        def run(rank):
            try:
                results[rank] = ("returned", planners[rank].together(works[rank]))
            except Exception as exc:  # noqa: BLE001 - the outcome under test
                results[rank] = ("raised", exc)
        threads = [threading.Thread(target=run, args=(r,)) for r in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        return results

    assert both([lambda: 1, lambda: 2]) == [("returned", 1), ("returned", 2)]
    (kind0, error0), (kind1, error1) = both([fails, lambda: 2])
    assert kind0 == kind1 == "raised"
    assert type(error0) is ValueError and str(error0) == "rank 0 cannot read its shard"
    assert type(error1) is LayerCheckError and str(error1) == (
        "another rank failed to restore (its error says why); this rank stops with it")


def test_together_raises_what_elsewhere_gives_on_the_ranks_that_did_not_fail():
    """``elsewhere``: the error of a rank whose own work succeeded (a restore's apply
    says there what that rank's objects hold); the failing rank keeps its own."""
    from layercheck.contract.errors import RestoreIncomplete
    from layercheck.recovery import together
    board, barrier, results = {}, threading.Barrier(2, timeout=30), [None, None]

    def run(rank):
        def work():
            if rank == 0:
                raise ValueError("rank 0's re-read failed")
        try:
            together(_ThreadRanks(rank, board, barrier), work,
                     elsewhere=lambda: RestoreIncomplete.elsewhere(6))
        except Exception as exc:  # noqa: BLE001 - the outcome under test
            results[rank] = exc
    threads = [threading.Thread(target=run, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert type(results[0]) is ValueError
    assert type(results[1]) is RestoreIncomplete and "hold step 6" in str(results[1])


def test_read_state_reads_and_verifies_the_file_when_not_given(ckpt):
    from safetensors.torch import load_file
    from layercheck.recovery import read_state
    store = LocalStore(ckpt)
    state = read_manifest(store).states[6]
    tensors, doc = read_state(store, state)
    assert doc["step"] == 6
    theirs = load_file(ckpt / state.file)
    assert tensors.keys() == theirs.keys()
    assert all(torch.equal(tensors[k], theirs[k]) for k in theirs)


def test_planner_refuses_read_settings_that_are_not_whole_numbers(ckpt):
    store = LocalStore(ckpt)
    view = read_manifest(store)
    for bad in (True, 2.0):
        with pytest.raises(ValueError) as keep:
            Planner(store, view, keep_bytes=bad)
        assert str(keep.value) == (f"keep_bytes={bad!r}: give the bytes of layer files a restore "
                                   "may keep in memory, an integer >= 0 (0: read again)")
        with pytest.raises(ValueError) as threads:
            Planner(store, view, threads=bad)
        assert str(threads.value) == (f"threads={bad!r}: give the number of files to read at "
                                      "once, an integer >= 1")


def test_parse_safetensors_names_what_it_parses_in_its_error():
    from layercheck.contract.errors import CorruptVersion
    from layercheck.recovery import parse_safetensors
    with pytest.raises(CorruptVersion, match="the blob under test"):
        parse_safetensors(b"\x05\x00\x00\x00\x00\x00\x00\x00{}", "the blob under test")


def test_parse_safetensors_of_read_only_bytes_warns_nothing():
    """torch warns once per process when it views read-only memory: in a fresh
    interpreter, so that this process's earlier views cannot have used it up."""
    import subprocess
    import sys
    code = ("import warnings\n"
            "from safetensors.torch import save\n"
            "import torch\n"
            "from layercheck.recovery import parse_safetensors\n"
            "warnings.simplefilter('error')\n"
            "data = save({'a': torch.arange(4.0)})\n"
            "tensors, _ = parse_safetensors(bytes(data), 'x')\n"
            "assert tensors['a'].tolist() == [0.0, 1.0, 2.0, 3.0]\n"
            "print('ok')\n")
    from layercheck.recovery import parse_safetensors  # in-process too: this test covers it
    from safetensors.torch import save
    assert parse_safetensors(save({"a": torch.ones(2)}), "x")[0]["a"].tolist() == [1.0, 1.0]
    root = Path(__file__).resolve().parents[2]  # this copy's layercheck (mutmut's, under it)
    done = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and done.stdout == "ok\n", done.stderr[-2000:]


# -- a fresh optimizer keeps its moments as read: no second copy (issue 14) -----------------


@pytest.mark.parametrize("threads, memory", [(1, None), (4, 0)])
def test_a_fresh_optimizer_keeps_the_moments_as_read_not_a_second_copy(ckpt, threads, memory):
    """Restored into an optimizer with no state, each Adam moment is the memory its
    file's bytes were read into (no copy), in buffers that hold optimizer state
    only (no weights, no header kept for the run's lifetime); the parameters are
    copied into the model's own storage."""
    model, opt, sched = _fresh()
    store = NotedScatteredReads(ckpt)
    config = LayerCheckConfig(restore_threads=threads, restore_memory=memory)
    with LayerCheck(model, opt, store, config, scheduler=sched) as lc:
        lc.restore()
    inside = lambda t: any(a <= t.data_ptr() and t.data_ptr() + t.nbytes <= b  # noqa: E731
                           for a, b in store.filled)
    assert len(opt.state) == len(list(model.parameters()))
    for p, state in opt.state.items():
        assert not inside(p)
        assert {"exp_avg", "exp_avg_sq"} <= set(state)
        for field, value in state.items():
            assert inside(value), field
    state = [v for s in opt.state.values() for v in s.values()]
    for a, b in store.filled:  # memory read into that the state keeps holds nothing else
        kept = [v for v in state if a <= v.data_ptr() < b]
        assert not kept or sum(v.nbytes for v in kept) == b - a


def test_moments_kept_as_read_train_on_exactly_as_moments_copied_into_live_state(ckpt):
    """The same composite restored into a fresh optimizer (moments kept as read) and
    into one with state (copied into it), then one more step on each: bit for bit
    the same weights and optimizer state, before and after the step."""
    runs = []
    for live_state in (False, True):
        model, opt, sched = _fresh()
        if live_state:
            train_step(model, opt, sched)
        with LayerCheck(model, opt, ckpt, scheduler=sched) as lc:
            lc.restore()
        restored = _live(model, opt)
        train_step(model, opt, sched)
        runs.append((restored, _live(model, opt), sched.state_dict()))
    _assert_same(runs[0][0], runs[1][0])
    _assert_same(runs[0][1], runs[1][1])
    assert runs[0][2] == runs[1][2]


def test_a_failed_restore_leaves_a_fresh_optimizer_without_state_and_the_model_as_it_was(ckpt):
    """Moments read apart are handed to the optimizer only at the apply, after every
    chosen file verified: a plan that fails on the last layer leaves no state."""
    store = LocalStore(ckpt)
    view = read_manifest(store)
    for version in view.versions[view.layer_names[-1]]:
        _flip(ckpt / version.file)
    for threads, memory in ((1, None), (4, 0)):
        model, opt, sched = _fresh()
        before = _live(model, opt)
        config = LayerCheckConfig(restore_threads=threads, restore_memory=memory)
        with LayerCheck(model, opt, ckpt, config, scheduler=sched) as lc:
            with pytest.raises(CheckpointNotFound, match=view.layer_names[-1]):
                lc.restore()
        assert len(opt.state) == 0
        _assert_same(before, _live(model, opt))


def test_apart_reads_apart_the_tensors_of_layer_files_only(ckpt):
    """``apart`` names tensors of a layer file to read into memory of their own
    (``Loaded.own``); a training state is read whole, whatever ``apart`` says."""
    from layercheck.recovery import read_state
    store = LocalStore(ckpt)
    view = read_manifest(store)
    planner = Planner(store, view, apart=lambda key: True, keep_bytes=1 << 30)
    state, file = planner.state()
    tensors, doc = read_state(store, state, file)
    assert doc["step"] == 6 and tensors and tensors.own == frozenset()
    sources = planner.layers(state.step, use=lambda version, tensors: None)
    loaded = planner.load(sources["model.norm"])
    assert loaded.own == set(loaded) and len(loaded) > 0
