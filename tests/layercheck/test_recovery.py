"""Recovery falls back past damaged versions, and says so."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from layercheck import LayerCheck, LayerCheckConfig
from layercheck.errors import CheckpointNotFound
from layercheck.manifest import read_manifest
from layercheck.ranks import Ranks
from layercheck.recovery import Planner, make_plan
from layercheck.store import LocalStore
from tests.conftest import every_layer_checkpoint, optimizer_for, tiny_lm, train_step


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
    from layercheck.format import decode_line, encode_record
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
    """The record of model.layers.2 at step 6 names model.layers.0's file (its checksum
    verifies): the file's own metadata says whose and which step it is, so the
    version is passed over and model.layers.2 restores from step 5."""
    from safetensors.torch import load_file
    store = LocalStore(ckpt)
    view = read_manifest(store)
    other, mine = view.versions["model.layers.0"][-1], view.versions["model.layers.2"][-1]
    forged = {**mine.to_record(), "file": other.file, "bytes": other.bytes,
              "checksum": other.checksum}
    _rewrite(ckpt, mine, forged)
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
    _rewrite(ckpt, mine, {**mine.to_record(), "file": older.file, "bytes": older.bytes,
                          "checksum": older.checksum})
    plan = make_plan(store, read_manifest(store))
    assert plan.sources["model.norm"].step == older.step
    assert any("step" in w and "model.norm" in w for w in plan.warnings)


def test_a_restore_that_fails_leaves_the_model_and_optimizer_untouched(ckpt):
    """The last layer's newest version is well formed and checksummed but shaped for
    another model: restore refuses, and had copied the earlier layers into the live
    model by then. Now every version is planned and checked against the model first."""
    from safetensors.torch import save
    from layercheck.errors import ModelMismatch
    from layercheck.format import checksum, layer_metadata
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
class _CountingStore(LocalStore):
    """A real LocalStore, each read of a file counted (any read method)."""

    def __init__(self, root) -> None:
        super().__init__(root)
        self.reads: dict[str, int] = {}

    def _count(self, path: str) -> None:
        self.reads[path] = self.reads.get(path, 0) + 1

    def read(self, path, limit=None):
        self._count(path)
        return super().read(path, limit)

    def read_buffer(self, path, limit=None, consume=None):
        self._count(path)
        return super().read_buffer(path, limit, consume)

    def read_into(self, path, limit, consume, targets):
        self._count(path)
        return super().read_into(path, limit, consume, targets)


def _fresh():
    model = tiny_lm(seed=4)
    opt, sched = optimizer_for(model, total=20)
    return model, opt, sched


def _restored(ckpt, **config):
    """(model, optimizer, restore report, counted reads) of a restore into fresh ones."""
    model, opt, sched = _fresh()
    store = _CountingStore(ckpt)
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
    from layercheck.manifest import VerifiedFile, parse_header
    from layercheck.recovery import parse_safetensors, tensor_views
    torch.manual_seed(0)
    tensors = {"a": torch.randn(3, 5), "b": torch.randn(7).to(torch.bfloat16),
               "c": torch.tensor(3.0, dtype=torch.float64), "d": torch.randint(0, 9, (4,)),
               "e": torch.zeros(0, 3), "f": torch.randn(2, 2).half(),
               "g": torch.tensor([True, False]), "h": torch.arange(5, dtype=torch.uint8)}
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
    from layercheck.config import ConfigError
    store = LocalStore(ckpt)
    with pytest.raises(ValueError, match="keep_bytes"):
        Planner(store, read_manifest(store), keep_bytes=-1)
    with pytest.raises(ValueError, match="threads"):
        Planner(store, read_manifest(store), threads=0)
    with pytest.raises(ConfigError, match="restore_memory"):
        LayerCheckConfig(restore_memory=-5)
    with pytest.raises(ConfigError, match="restore_threads"):
        LayerCheckConfig(restore_threads=0)


# -- a fresh optimizer keeps its moments as read: no second copy (issue 14) -----------------
class _NotingStore(LocalStore):
    """A real LocalStore that notes the memory each scattered read fills (``read_into``)."""

    def __init__(self, root) -> None:
        super().__init__(root)
        self.filled: list[tuple[int, int]] = []

    def read_into(self, path, limit, consume, targets):
        def noted(size):
            for target in targets(size):
                start = np.frombuffer(target, dtype=np.uint8).ctypes.data if len(target) else 0
                self.filled.append((start, start + len(target)))
                yield target
        return super().read_into(path, limit, consume, noted)


@pytest.mark.parametrize("threads, memory", [(1, None), (4, 0)])
def test_a_fresh_optimizer_keeps_the_moments_as_read_not_a_second_copy(ckpt, threads, memory):
    """Restored into an optimizer with no state, each Adam moment is the memory its
    file's bytes were read into (no copy), in buffers that hold optimizer state
    only (no weights, no header kept for the run's lifetime); the parameters are
    copied into the model's own storage."""
    model, opt, sched = _fresh()
    store = _NotingStore(ckpt)
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
