"""Garbage collection never deletes what it could not verify, and says what it kept."""
from __future__ import annotations

import pytest

from layercheck import LayerCheck, LayerCheckConfig
from layercheck.tools.cleanup import collect_garbage
from layercheck.contract.errors import LayerCheckError
from layercheck.storage.format import MANIFEST
from layercheck.storage.manifest import read_manifest
from layercheck.recovery import make_plan
from layercheck.storage.localstore import LocalStore
from tests.conftest import every_layer_checkpoint, optimizer_for, tiny_lm, train_step
from tests.stores import FlakyReads


@pytest.fixture()
def ckpt(tmp_path):
    return every_layer_checkpoint(tmp_path / "c")


def test_a_transient_read_error_is_not_damage_and_gc_deletes_nothing(ckpt):
    """gc read the newest version of a layer, got EIO, took it for corruption, planned
    with the older version and deleted the newest, intact one."""
    view = read_manifest(LocalStore(ckpt))
    newest = view.versions["model.layers.1"][-1]
    before = (ckpt / MANIFEST).read_bytes()
    files = sorted(p.name for p in (ckpt / "layers").iterdir())
    with pytest.raises(LayerCheckError, match="I/O error") as info:
        collect_garbage(FlakyReads(ckpt, newest.file))
    assert "nothing was deleted" in str(info.value) and newest.file in str(info.value)
    assert (ckpt / MANIFEST).read_bytes() == before
    assert sorted(p.name for p in (ckpt / "layers").iterdir()) == files
    # and restore or plan do not pass over it either: they stop, saying what happened
    with pytest.raises(LayerCheckError, match="I/O error"):
        make_plan(FlakyReads(ckpt, newest.file), view)
    report = collect_garbage(LocalStore(ckpt))  # the storage answers again
    assert report.kept_steps == [6] and report.skipped == []
    assert make_plan(LocalStore(ckpt), read_manifest(LocalStore(ckpt))).sources[
        "model.layers.1"].step == newest.step


def test_gc_keeps_a_version_it_found_damaged_and_reports_it(ckpt, capsys):
    """A damaged newest version is passed over by the plan, but gc does not delete it
    (nor its record): it may be the only copy of that step, for whoever repairs it."""
    from layercheck.tools.cli import main
    view = read_manifest(LocalStore(ckpt))
    newest = view.versions["model.layers.1"][-1]
    data = bytearray((ckpt / newest.file).read_bytes())
    data[len(data) // 2] ^= 0x01
    (ckpt / newest.file).write_bytes(bytes(data))
    assert main(["gc", str(ckpt)]) == 0
    captured = capsys.readouterr()
    assert "kept 1 version it could not verify" in captured.out
    assert newest.file in captured.err and "checksum" in captured.err
    assert (ckpt / newest.file).exists()
    after = read_manifest(LocalStore(ckpt))
    assert newest in after.versions["model.layers.1"]
    assert len(after.versions["model.layers.1"]) < len(view.versions["model.layers.1"])


def test_gc_deletes_nothing_where_no_step_is_recoverable(tmp_path, capsys):
    """Layer versions without any committed state (a layer failing under 'warn' since
    the base checkpoint): no kept step needs them, but no newer state has superseded
    them either. gc refuses, as retention retires nothing without a newer state."""
    from layercheck.tools.cli import main
    from tests.layercheck.test_retention import versions_without_any_state
    root = tmp_path / "c"
    versions_without_any_state(root)
    files = sorted(p.name for p in (root / "layers").iterdir())
    assert files
    assert main(["gc", str(root)]) == 2
    assert "no recoverable step" in capsys.readouterr().err
    assert sorted(p.name for p in (root / "layers").iterdir()) == files


def test_gc_removes_only_the_temp_files_of_interrupted_writes_and_only_under_the_lock(
        ckpt, capsys):
    """A manifest compaction killed before its rename leaves '.manifest.jsonl.<hex>.tmp'
    (so does a layer write cut short, in layers/). gc removes exactly the files of
    write_atomic's own pattern, says so, and only while it holds the lock: beside a
    running writer (whose write may be in flight) it removes nothing. ``list`` and
    ``inspect`` never count them."""
    from layercheck.tools.cli import main
    from layercheck.contract.errors import DirectoryLocked
    from layercheck.tools.inspection import inspect_directory
    leftovers = [f".{MANIFEST}.0123abcd.tmp",
                 "layers/.model.layers.1@000000007.safetensors.deadbeef.tmp"]
    foreign = [".notes", f".{MANIFEST}.tmp", f".{MANIFEST}.0123ABCD.tmp", "notes.txt",
               "layers/.keep"]
    store = LocalStore(ckpt)
    before = inspect_directory(store)
    for name in leftovers + foreign:
        (ckpt / name).write_bytes(b"x" * 100)
    listed = store.list("") + store.list("layers")
    assert "notes.txt" in listed and not any(n.rsplit("/", 1)[-1].startswith(".") for n in listed)
    assert inspect_directory(store) == before  # nothing of them counted
    model = tiny_lm()
    with LayerCheck(model, optimizer_for(model)[0], ckpt):  # a live writer holds the directory
        with pytest.raises(DirectoryLocked):
            collect_garbage(LocalStore(ckpt))
        assert all((ckpt / name).exists() for name in leftovers)
    assert main(["gc", str(ckpt)]) == 0
    assert "(2 left by interrupted writes)" in capsys.readouterr().out
    assert [n for n in leftovers + foreign if (ckpt / n).exists()] == foreign
    assert inspect_directory(store)["newest_step"] == before["newest_step"]
    assert make_plan(store, read_manifest(store)).warnings == []


def test_a_record_naming_a_kept_versions_file_never_displaces_its_record(ckpt):
    """A record of step 99 naming step 6's state file (gc kept only it, and lost step
    6) names a file that is not its own: it is skipped as damaged, so gc keeps step 6
    with its record and files."""
    from layercheck.storage.format import encode_record
    store = LocalStore(ckpt)
    newest = read_manifest(store).states[6]
    store.append(MANIFEST, encode_record({**newest.to_record(), "step": 99}))
    assert any("not its own" in p for p in read_manifest(store).problems)
    report = collect_garbage(store, keep=1)
    assert report.kept_steps == [6]
    view = read_manifest(store)
    assert sorted(view.states) == [6] and (ckpt / newest.file).exists()
    plan = make_plan(store, view)
    assert plan.step == 6 and plan.state.step == 6


def test_gc_deletes_only_files_the_format_names(ckpt):
    """gc deleted every file in layers/ and states/ that no kept version named, a user's
    notes there too. It deletes only versions' files and the temp files of writes;
    records naming files that are not their own (notes.txt, the manifest, the .lock,
    another layer's live version) make it keep, or delete, none of those."""
    from layercheck.storage.format import deletable, layer_path
    from tests.layercheck.test_retention import _rename_in_records
    foreign = ["layers/notes.txt", "states/README", "layers/.notes.txt.0123abcd.tmp",
               "notes.txt"]
    for name in foreign:
        (ckpt / name).write_text("the user's own\n")
    (ckpt / ".lock").write_text("")
    norm = layer_path("model.norm", 6)
    _rename_in_records(ckpt, {("model.layers.0", 3): "notes.txt",
                              ("model.layers.1", 3): MANIFEST, ("model.layers.2", 3): ".lock",
                              ("model.embed_tokens", 3): norm})
    report = collect_garbage(LocalStore(ckpt), keep=1)
    assert [n for n in foreign + [".lock", norm] if not (ckpt / n).exists()] == []
    assert report.removed_files and all(deletable(f) for f in report.removed_files)
    view = read_manifest(LocalStore(ckpt))
    assert view.header is not None and sorted(view.states) == [6]
    assert make_plan(LocalStore(ckpt), view).sources["model.norm"].step == 6


def test_gc_keeps_the_lineage(ckpt):
    """The timelines live now (``storage.lineage``) survive gc's rewrite of the manifest:
    the memory tier's copies are judged by them."""
    from layercheck.storage.format import encode_record, resume_record
    store = LocalStore(ckpt)
    store.append(MANIFEST, encode_record(resume_record(6, "ab12")))
    before = read_manifest(store).lineage
    assert before.current == "ab12" and len(before.branches) == 2
    collect_garbage(store)
    assert read_manifest(store).lineage == before
