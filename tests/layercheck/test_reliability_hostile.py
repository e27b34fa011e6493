"""Hostile and damaged input: no pickle, no escape, damage reported, never a traceback."""
from __future__ import annotations

import ast
import json
import shutil
from pathlib import Path

import pytest
import torch

from layercheck import LayerCheck, LayerCheckConfig
from layercheck.tools.cli import main
from layercheck.contract.errors import LayerCheckError
from layercheck.storage.format import MANIFEST, encode_record
from layercheck.storage.manifest import read_manifest
from layercheck.storage.localstore import LocalStore
from tests.conftest import optimizer_for, tiny_lm, train_step

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("layercheck", "profiler", "sim", "dashboard")


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    path = tmp_path_factory.mktemp("hostile") / "ckpt"
    torch.manual_seed(0)
    model = tiny_lm()
    opt, sched = optimizer_for(model, total=20)
    cfg = LayerCheckConfig(base_threshold=0, embedding_threshold=0, warmup_steps=2)
    with LayerCheck(model, opt, path, cfg, scheduler=sched) as lc:
        lc.restore()
        for _ in range(4):
            train_step(model, opt, sched)
            lc.step()
    return path


@pytest.fixture()
def ckpt(pristine, tmp_path):
    path = tmp_path / "ckpt"
    shutil.copytree(pristine, path)
    return path


# -- no pickle, anywhere ----------------------------------------------------------
def _calls(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            yield node, ast.unparse(node.func)


def _pickle_offenders(root: Path, package: str) -> list[str]:
    offenders = []
    files = sorted((root / package).rglob("*.py"))
    assert files, f"{package}/ has no Python files: the scan would prove nothing"
    for path in files:
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
                if any(n.split(".")[0] in UNPICKLERS for n in names):
                    offenders.append(f"{path}:{node.lineno} imports {names}")
        for call, name in _calls(tree):
            where = f"{path.relative_to(root)}:{call.lineno} {name}"
            keywords = {k.arg: k.value for k in call.keywords}
            if name.endswith(("read_pickle", "jit.load")):
                offenders.append(where)
            if name.endswith("torch.load"):
                value = keywords.get("weights_only")
                if not (isinstance(value, ast.Constant) and value.value is True):
                    offenders.append(f"{where} without weights_only=True")
            if name.endswith(("np.load", "numpy.load")):
                value = keywords.get("allow_pickle")
                if value is not None and not (isinstance(value, ast.Constant)
                                              and value.value is False):
                    offenders.append(f"{where} with allow_pickle")
    return offenders


UNPICKLERS = ("pickle", "cPickle", "_pickle", "dill", "joblib", "shelve", "marshal",
              "cloudpickle")


@pytest.mark.parametrize("package", PACKAGES)
def test_no_code_path_can_unpickle(package):
    """torch.load only with weights_only=True; no pickle module, no
    np.load(allow_pickle=True), no pandas.read_pickle, no torch.jit.load."""
    assert _pickle_offenders(ROOT, package) == []


def test_the_pickle_scan_catches_what_it_looks_for(tmp_path):
    bad = tmp_path / "bad" / "m.py"
    bad.parent.mkdir()
    bad.write_text("import torch\nimport pickle\nx = torch.load('f')\n"
                   "z = torch.load('f', weights_only=False)\nimport numpy as np\n"
                   "y = np.load('a', allow_pickle=True)\nimport pandas as pd\n"
                   "w = pd.read_pickle('p')\nok = torch.load('f', weights_only=True)\n")
    found = _pickle_offenders(tmp_path, "bad")
    assert len(found) == 5, found
    assert not any(":9 " in f for f in found)  # weights_only=True is fine


# -- manifest records that try to escape or confuse --------------------------------
def _append(path: Path, record: dict) -> None:
    with open(path / MANIFEST, "ab") as handle:
        handle.write(encode_record(record))


@pytest.mark.parametrize("file", ["../../etc/passwd", "/etc/passwd", "layers/../../x",
                                  "layers/a b", "layers//x", "layers/x\x00y", "~/x", ""])
def test_a_record_pointing_outside_is_skipped_never_read(ckpt, file):
    _append(ckpt, {"kind": "state", "step": 99, "file": file, "bytes": 1,
                   "checksum": "crc32:00000000"})
    view = read_manifest(LocalStore(ckpt))
    assert 99 not in view.states
    assert any("refusing path" in p for p in view.problems)


# A record with a valid CRC may still name a file that is not its own: retention then
# deleted it (issue 43, item 2). Every reader replays the manifest through one check.
OTHER_FILES = [MANIFEST, ".lock", "notes.txt", "model_config.json",
               "layers/model.layers.0@000000004.safetensors",  # another layer's live version
               "layers/model.norm@000000003.safetensors",  # its own layer's, another step's
               "layers/model.norm@4.safetensors",  # not the format's spelling of its name
               "states/000000004.safetensors", "layers/model.norm@000000004.rank00000.safetensors"]


@pytest.mark.parametrize("file", OTHER_FILES)
def test_a_layer_record_naming_a_file_not_its_own_is_skipped_and_said(ckpt, file, capsys):
    own = read_manifest(LocalStore(ckpt)).versions["model.norm"][-1]
    _rewrite(ckpt, lambda records: [r.update(file=file) for r in records
                                    if r.get("layer") == "model.norm" and r["step"] == 4])
    view = read_manifest(LocalStore(ckpt))
    assert [v.step for v in view.versions["model.norm"]] == [2, 3]
    assert len(view.problems) == 1 and repr(file) in view.problems[0]
    assert repr(own.file) in view.problems[0] and "not its own" in view.problems[0]
    assert main(["plan", str(ckpt), "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert {l["layer"]: l["source_step"] for l in plan["layers"]}["model.norm"] == 3
    assert main(["inspect", str(ckpt), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["problems"] == view.problems


@pytest.mark.parametrize("file", [f for f in OTHER_FILES if not f.startswith("states/")]
                         + ["states/000000003.safetensors", "states/000000004.rank00001.safetensors"])
def test_a_state_record_or_a_shard_naming_a_file_not_its_own_is_skipped(ckpt, file):
    from layercheck.storage.format import Layout, layer_path
    _rewrite(ckpt, lambda records: [r.update(file=file) for r in records
                                    if r["kind"] == "state" and r["step"] == 4])
    view = read_manifest(LocalStore(ckpt))
    assert sorted(view.states) == [2, 3] and "not its own" in view.problems[0]
    layout = Layout(id=1, world_size=2, facts={}).to_record()
    shards = [{"file": layer_path("model.norm", 5, 0), "bytes": 1, "checksum": "crc32:0"},
              {"file": file, "bytes": 1, "checksum": "crc32:0"}]  # rank 1's is not its own
    _append(ckpt, layout)
    _append(ckpt, {"kind": "layer", "step": 5, "layer": "model.norm", "reason": "threshold",
                   "layout": 1, "shards": shards})
    for rank in (0, 1):
        view = read_manifest(LocalStore(ckpt), rank)
        assert [v.step for v in view.versions["model.norm"]] == [2, 3, 4]
        assert repr(file) in view.problems[-1] and "not its own" in view.problems[-1]


def test_a_layer_the_header_does_not_list_and_a_second_record_of_a_version_are_refused(ckpt):
    """A version of a layer the header does not list is damaged (its file name might be
    a listed layer's: 'enc 0' and 'enc_0' share one); a second record of a (layer,
    step) replaces the first, so no file is live twice (retention would retire one
    and delete the file the other needs)."""
    from layercheck.storage.format import layer_path
    from layercheck.storage.retention import Retention
    view = read_manifest(LocalStore(ckpt))
    norm = view.versions["model.norm"][-1]
    _append(ckpt, {**norm.to_record(), "layer": "ghost", "file": layer_path("ghost", 4)})
    _append(ckpt, norm.to_record())
    again = read_manifest(LocalStore(ckpt))
    assert "ghost" not in again.versions and "does not list" in again.problems[0]
    assert again.versions == view.versions and len(again.problems) == 1
    retired = [v for v in Retention(1, again).committed([]) if v.layer == "model.norm"]
    assert retired == [view.versions["model.norm"][1]]  # step 3's, never step 4's


@pytest.mark.parametrize("header", [
    {"kind": "header"},
    {"kind": "header", "layers": "model.norm"},
    {"kind": "header", "layers": [1, 2]},
    {"kind": "header", "layers": [{"name": 3, "kind": "block", "params": 1}]},
    {"kind": "header", "layers": [{"name": "a", "kind": "block", "params": "many"}]},
    {"kind": "header", "layers": [{"name": "a"}]},
])
def test_a_malformed_header_is_not_a_checkpoint_and_the_cli_says_so(tmp_path, header, capsys):
    (tmp_path / "c").mkdir()
    _append(tmp_path / "c", header)
    view = read_manifest(LocalStore(tmp_path / "c"))
    assert view.header is None and any("header" in p for p in view.problems)
    for command in ("inspect", "plan", "gc"):
        assert main([command, str(tmp_path / "c")]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "not a layercheck checkpoint" in err


@pytest.mark.parametrize("record", [
    {"kind": "layer", "step": "x", "file": "layers/a@1.safetensors", "bytes": 1, "checksum": "c"},
    {"kind": "layer", "step": 1, "file": "layers/a@1.safetensors", "bytes": [], "checksum": "c"},
    {"kind": "layer", "step": -1, "file": "layers/a@1.safetensors", "bytes": 1, "checksum": "c",
     "layer": "model.norm"},
    {"kind": "layer", "step": 1, "file": "layers/a@1.safetensors", "bytes": 1, "checksum": "c",
     "layer": ["model.norm"]},
    {"kind": "state", "step": 1.5, "file": "states/x.safetensors", "bytes": 1, "checksum": "c"},
    {"kind": "resume", "step": None},
    {"kind": "nonsense"},
])
def test_malformed_records_are_problems_and_commands_still_work(ckpt, record, capsys):
    _append(ckpt, record)
    view = read_manifest(LocalStore(ckpt))
    assert len(view.problems) == 1 and view.latest_step() == 4
    assert main(["inspect", str(ckpt), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert len(info["problems"]) == 1
    assert main(["plan", str(ckpt), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["step"] == 4


def test_symlinked_lock_file_is_refused_and_its_target_untouched(ckpt, tmp_path):
    victim = tmp_path / "precious.txt"
    victim.write_text("do not truncate me")
    (ckpt / ".lock").unlink(missing_ok=True)
    (ckpt / ".lock").symlink_to(victim)
    with pytest.raises(LayerCheckError, match="symbolic link"):
        LocalStore(ckpt).lock()
    assert victim.read_text() == "do not truncate me"


def test_symlinked_manifest_is_never_appended_to(ckpt, tmp_path):
    victim = tmp_path / "precious.jsonl"
    shutil.move(ckpt / MANIFEST, victim)
    (ckpt / MANIFEST).symlink_to(victim)
    before = victim.read_bytes()
    with pytest.raises(LayerCheckError, match="symbolic link"):
        LocalStore(ckpt).append(MANIFEST, b"x\n")
    assert victim.read_bytes() == before


def test_a_symlinked_layers_folder_is_refused_and_its_target_untouched(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "layers").symlink_to(elsewhere)
    model = tiny_lm()
    opt, sched = optimizer_for(model)
    cfg = LayerCheckConfig(warmup_steps=0, smax=2)
    lc = LayerCheck(model, opt, ckpt, cfg, scheduler=sched)
    lc.restore()
    train_step(model, opt, sched)
    lc.step()
    with pytest.raises(Exception, match="symbolic link"):
        lc.close()  # the write failed: nothing was written through the link
    assert list(elsewhere.iterdir()) == []
    assert read_manifest(LocalStore(ckpt)).states == {}


def test_a_new_folder_is_made_durable_in_its_parent(tmp_path, monkeypatch):
    """A power cut must not lose the folder holding committed files: creating
    layers/ fsyncs the checkpoint directory that now lists it."""
    import layercheck.storage.fds as store_module
    synced = []
    real = store_module.fsync_dir
    monkeypatch.setattr(store_module, "fsync_dir", lambda path: (synced.append(path), real(path)))
    store = LocalStore(tmp_path / "ckpt")
    store.write_atomic("layers/a@000000001.safetensors", b"data")
    root = (tmp_path / "ckpt").resolve()
    assert synced.index(root) < synced.index(root / "layers")
    synced.clear()
    store.write_atomic("layers/b@000000001.safetensors", b"data")
    assert synced == [root / "layers"]  # an existing folder: only its own entry list


# -- inspect reports the damage -----------------------------------------------------
def _damage(ckpt):
    view = read_manifest(LocalStore(ckpt))
    flipped = ckpt / view.versions["model.layers.1"][-1].file
    data = bytearray(flipped.read_bytes())
    data[len(data) // 2] ^= 0x10
    flipped.write_bytes(bytes(data))
    truncated = ckpt / view.versions["model.norm"][-1].file
    truncated.write_bytes(truncated.read_bytes()[:50])
    missing = ckpt / view.versions["model.layers.0"][-2].file
    missing.unlink()
    with open(ckpt / MANIFEST, "ab") as handle:
        handle.write(b'{"crc":"00000000","r":{"kind":"state"}}\n{"torn')
    return (flipped.relative_to(ckpt).as_posix(), truncated.relative_to(ckpt).as_posix(),
            missing.relative_to(ckpt).as_posix())


def test_inspect_lists_every_kind_of_damage(ckpt, capsys):
    flipped, truncated, missing = _damage(ckpt)
    assert main(["inspect", str(ckpt), "--json"]) == 0
    problems = json.loads(capsys.readouterr().out)["problems"]
    assert any(flipped in p and "checksum" in p for p in problems), problems
    assert any(truncated in p and "bytes" in p for p in problems), problems
    assert any(missing in p and "missing" in p for p in problems), problems
    assert any("CRC" in p for p in problems) and any("torn" in p for p in problems)
    assert len(problems) == 5
    assert main(["inspect", str(ckpt)]) == 0
    table = capsys.readouterr().out
    assert sum(line.startswith("DAMAGE:") for line in table.splitlines()) == 5
    assert main(["inspect", str(ckpt), "--quick", "--json"]) == 0  # sizes only, no checksums
    quick = json.loads(capsys.readouterr().out)["problems"]
    assert len(quick) == 4 and not any(flipped in p for p in quick)


def test_plan_after_damage_falls_back_and_names_every_fallback(ckpt, capsys):
    flipped, truncated, _ = _damage(ckpt)
    assert main(["plan", str(ckpt), "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["step"] == 4
    sources = {l["layer"]: l["source_step"] for l in plan["layers"]}
    assert sources["model.layers.1"] == 3 and sources["model.norm"] == 3
    assert any(flipped in w for w in plan["warnings"])
    assert any(truncated in w for w in plan["warnings"])


@pytest.mark.parametrize("content", [b"", b"\x00" * 64, b"\xff\xfe garbage", b"{}\n",
                                     b'{"crc":"1","r":[]}\n', b"[" * 100000 + b"\n"])
def test_a_garbage_manifest_is_one_line_exit_2(tmp_path, content, capsys):
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / MANIFEST).write_bytes(content)
    for command in ("inspect", "plan", "gc"):
        assert main([command, str(tmp_path / "c")]) == 2
        assert capsys.readouterr().err.count("\n") == 1


def test_a_layer_file_that_is_not_safetensors_but_has_the_right_checksum(ckpt):
    """An attacker who controls the manifest controls the checksums too: the
    file must still be parsed as safetensors only (no pickle fallback), found
    malformed by its structure, and passed over with a warning."""
    import zlib
    payload = b"\x80\x04\x95" + b"cos\nsystem\n(S'echo pwned'\ntR." + b"\x00" * 8
    evil = "layers/model.norm@000000004.safetensors"  # in place of the version's own file
    (ckpt / evil).write_bytes(payload)
    lines = []
    for line in (ckpt / MANIFEST).read_bytes().splitlines():
        record = json.loads(line)["r"]
        if record.get("layer") == "model.norm" and record["step"] == 4:
            assert record["file"] == evil
            record.update(bytes=len(payload),
                          checksum=f"crc32:{zlib.crc32(payload) & 0xFFFFFFFF:08x}")
        lines.append(encode_record(record))
    (ckpt / MANIFEST).write_bytes(b"".join(lines))
    model = tiny_lm(seed=8)
    opt, sched = optimizer_for(model, total=20)
    with LayerCheck(model, opt, ckpt, scheduler=sched) as lc:
        with pytest.warns(UserWarning, match=f"{evil}: not a valid safetensors file"):
            assert lc.restore() == 4
        assert lc.restored.plan.sources["model.norm"].step == 3


# -- links and special files where a regular file belongs (issue 13, item 10) ----------------
# Each command runs in a child with 1 GiB of address space and a deadline: reading
# /dev/zero whole, or opening a FIFO that no one writes, must fail there, not here.
def _cli_bounded(*argv: str) -> "subprocess.CompletedProcess[str]":
    import os
    import subprocess
    import sys
    limit = ("import resource, runpy, sys; resource.setrlimit(resource.RLIMIT_AS, (1 << 30, "
             "1 << 30)); sys.argv = ['layercheck', *sys.argv[1:]]; "
             "runpy.run_module('layercheck', run_name='__main__')")
    return subprocess.run([sys.executable, "-c", limit, *argv], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})


@pytest.mark.parametrize("kind", ["link to /dev/zero", "fifo"])
def test_a_manifest_that_is_not_a_regular_file_is_one_line_exit_2(ckpt, kind):
    import os
    (ckpt / MANIFEST).unlink()
    if kind == "fifo":
        os.mkfifo(ckpt / MANIFEST)
    else:
        (ckpt / MANIFEST).symlink_to("/dev/zero")
    for command in ("inspect", "plan"):
        done = _cli_bounded(command, str(ckpt))
        assert done.returncode == 2, done.stderr[-2000:]
        assert done.stderr.count("\n") == 1 and MANIFEST in done.stderr, done.stderr
        assert "regular file" in done.stderr or "symbolic link" in done.stderr


@pytest.mark.parametrize("kind", ["link to /dev/zero", "link to a copy", "fifo"])
def test_a_layer_file_that_is_not_a_regular_file_is_passed_over(ckpt, kind):
    import os
    view = read_manifest(LocalStore(ckpt))
    newest = view.versions["model.layers.1"][-1]
    path = ckpt / newest.file
    copy = ckpt.parent / "copy.safetensors"
    shutil.copyfile(path, copy)
    path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero" if kind == "link to /dev/zero" else copy)
    done = _cli_bounded("plan", str(ckpt), "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    plan = json.loads(done.stdout)
    source = next(l for l in plan["layers"] if l["layer"] == "model.layers.1")
    assert source["source_step"] < newest.step  # never read through the link, never hung
    assert any(newest.file in w for w in plan["warnings"])
    done = _cli_bounded("inspect", str(ckpt), "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    assert any(newest.file in p for p in json.loads(done.stdout)["problems"])


# -- a pretrained file that is not a regular file (issue 43, item 4) -------------------------
# Frozen weights recorded by reference (``pretrained=``) are read from a file outside
# the directory, which a record names by absolute path: it was opened with open(), so
# a FIFO there hung inspect and restore(). Each call runs in a thread with a deadline;
# one stuck on the FIFO is released (its writer end opened and closed) and fails.
@pytest.fixture(scope="module")
def by_reference(tmp_path_factory):
    """A checkpoint of 2 steps whose frozen weights are recorded by reference to
    pretrained/model.safetensors, beside it."""
    from tests.layercheck.test_frozen import EVERY_STEP, frozen_model
    where = tmp_path_factory.mktemp("by_reference")
    model, opt, sched = frozen_model()
    model.save_pretrained(where / "pretrained")
    with LayerCheck(model, opt, where / "ckpt", EVERY_STEP, scheduler=sched,
                    pretrained=where / "pretrained") as lc:
        lc.restore()
        for _ in range(2):
            train_step(model, opt, sched)
            lc.step()
    full = read_manifest(LocalStore(where / "ckpt")).versions["model.layers.0"][0]
    assert full.refs  # its frozen weights named by reference, read by each version after it
    return where


def _within_deadline(call, fifo: Path, seconds: float = 60):
    """``call()``'s result (or its exception, raised), or a failure if it still runs after
    ``seconds``: then whatever blocks on ``fifo`` is released first, so nothing hangs."""
    import os
    import threading
    outcome: list = []

    def run() -> None:
        try:
            outcome.append(("value", call()))
        except BaseException as exc:  # noqa: BLE001 - raised below, in the test's thread
            outcome.append(("error", exc))

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        while worker.is_alive():  # a reader blocked on the FIFO: give it an end of file
            try:
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass
            worker.join(0.1)
        pytest.fail(f"blocked on the FIFO {fifo} for {seconds} s")
    kind, value = outcome[0]
    if kind == "error":
        raise value
    return value


@pytest.mark.parametrize("kind", ["fifo", "link to a fifo"])
def test_a_pretrained_file_replaced_by_a_fifo_is_refused_by_inspect_and_restore(
        by_reference, tmp_path, kind):
    import os
    from layercheck.contract.errors import CheckpointNotFound
    from layercheck.tools.inspection import inspect_directory
    from tests.layercheck.test_frozen import EVERY_STEP, frozen_model
    shutil.copytree(by_reference, tmp_path, dirs_exist_ok=True)
    pretrained = tmp_path / "pretrained" / "model.safetensors"
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    pretrained.unlink()
    if kind == "fifo":
        os.rename(fifo, pretrained)
        fifo = pretrained
    else:
        pretrained.symlink_to(fifo)
    _relocate_references(tmp_path / "ckpt", by_reference, tmp_path)
    info = _within_deadline(lambda: inspect_directory(LocalStore(tmp_path / "ckpt")), fifo)
    assert info["problems"] and all(str(pretrained) in p and "FIFO" in p and
                                    "regular file" in p for p in info["problems"])
    model, opt, sched = frozen_model(seed=9)
    with LayerCheck(model, opt, tmp_path / "ckpt", EVERY_STEP, scheduler=sched) as lc:
        with pytest.raises(CheckpointNotFound, match="no committed version intact") as info:
            _within_deadline(lc.restore, fifo)  # every version of a layer reads the file
    assert str(pretrained) in str(info.value) and "is a FIFO" in str(info.value)
    assert "put the pretrained files back" in str(info.value)


def _relocate_references(ckpt: Path, old: Path, new: Path) -> None:
    """The references of ``ckpt``'s records to files under ``old`` made to ``new``'s."""
    def change(records):
        for r in records:
            for ref in (r.get("refs") or {}).values():
                ref["file"] = ref["file"].replace(str(old.resolve()), str(new.resolve()))
    _rewrite(ckpt, change)


def test_a_pretrained_file_reached_through_a_link_is_read(by_reference, tmp_path):
    """Links are followed to a pretrained file (a Hugging Face cache links each file of a
    snapshot to its blob): what is read is the regular file they resolve to."""
    from layercheck.tools.inspection import inspect_directory
    shutil.copytree(by_reference, tmp_path, dirs_exist_ok=True)
    pretrained = tmp_path / "pretrained" / "model.safetensors"
    blob = tmp_path / "blob"
    pretrained.rename(blob)
    pretrained.symlink_to(blob)
    _relocate_references(tmp_path / "ckpt", by_reference, tmp_path)
    assert inspect_directory(LocalStore(tmp_path / "ckpt"))["problems"] == []


# -- well-formed records with hostile values (issue 27, item 9) ---------------------------
# Each record below has a valid CRC and the fields its kind needs, so only the schema
# of its kind (format.RECORD_SCHEMAS, checked where the manifest is read) stands
# between it and the code that uses its values.
def _rewrite(path: Path, change) -> None:
    """The manifest of ``path`` with ``change(records)`` applied, CRCs recomputed."""
    records = [json.loads(line)["r"] for line in (path / MANIFEST).read_bytes().splitlines()]
    change(records)
    (path / MANIFEST).write_bytes(b"".join(encode_record(r) for r in records))


def _commands(ckpt: Path, out: Path) -> list[list[str]]:
    return [["inspect", str(ckpt)], ["plan", str(ckpt)], ["plan", str(ckpt), "--json"],
            ["gc", str(ckpt), "--dry-run"], ["export", str(ckpt), "--out", str(out)]]


@pytest.mark.parametrize("field,value,needle", [
    ("world_size", float("inf"), "world_size=inf"),
    ("world_size", [2], "world_size=[2]"),
    ("world_size", 0, "world_size=0"),
    ("config", [1, 2], "config=[1, 2]"),
    ("config", {"write_budget": [1]}, "write_budget=[1]"),
    ("config", {"write_budget": float("nan")}, "write_budget=nan"),
    ("layers", [], "layers=[]"),
    ("lr_peak", "fast", "lr_peak='fast'"),
])
def test_a_header_with_a_hostile_value_is_refused_in_one_line_by_every_command(
        ckpt, tmp_path, capsys, field, value, needle):
    """Not a traceback, not an empty export: exit 2, one line naming the field and the
    value, nothing deleted, nothing exported."""
    _rewrite(ckpt, lambda records: records[0].update({field: value}))
    files = sorted(p.name for p in ckpt.rglob("*.safetensors"))
    for argv in _commands(ckpt, tmp_path / "out"):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "not a layercheck checkpoint" in err, err
        assert needle in err and "header record" in err, err
    assert not (tmp_path / "out").exists()
    assert sorted(p.name for p in ckpt.rglob("*.safetensors")) == files


def test_a_layer_record_whose_reason_is_an_object_is_skipped_and_reported(ckpt, tmp_path,
                                                                           capsys):
    def hostile(records):
        newest = max((r for r in records if r.get("layer") == "model.norm"),
                     key=lambda r: r["step"])
        newest["reason"] = {"why": "hostile"}
    _rewrite(ckpt, hostile)
    assert main(["plan", str(ckpt), "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["step"] == 4
    assert {l["layer"]: l["source_step"] for l in plan["layers"]}["model.norm"] == 3
    assert main(["plan", str(ckpt)]) == 0  # the table formats every reason
    capsys.readouterr()
    assert main(["inspect", str(ckpt), "--json"]) == 0
    problems = json.loads(capsys.readouterr().out)["problems"]
    assert len(problems) == 1 and "reason={'why': 'hostile'}" in problems[0], problems
    assert main(["export", str(ckpt), "--out", str(tmp_path / "out")]) == 0


@pytest.mark.parametrize("step,refused", [(2**70, True), (2**63, True), (2**63 - 1, False)])
def test_a_state_at_a_step_past_int64_is_a_damaged_line_and_every_command_works(
        ckpt, tmp_path, capsys, step, refused):
    """Steps are int64 where they are used (the ranks agree on them in int64 tensors):
    a larger one is a damaged line; the largest int64 is read, and passed over, since
    the file it names (its own) is not there."""
    from layercheck.storage.format import state_path

    def hostile(records):
        state = max((r for r in records if r["kind"] == "state"), key=lambda r: r["step"])
        records.append({**state, "step": step, "file": state_path(step)})
    _rewrite(ckpt, hostile)
    assert main(["inspect", str(ckpt), "--json"]) == 0
    problems = json.loads(capsys.readouterr().out)["problems"]
    assert len(problems) == 1
    assert (f"step={step}" in problems[0]) == refused, problems
    assert main(["plan", str(ckpt), "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["step"] == 4 and len(plan["warnings"]) == (0 if refused else 1)
    assert main(["export", str(ckpt), "--out", str(tmp_path / "out")]) == 0
    assert main(["gc", str(ckpt)]) == 0
    capsys.readouterr()
    assert main(["plan", str(ckpt), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["step"] == 4


@pytest.mark.parametrize("content", [b"[" * 100_000 + b"]" * 100_000,
                                     b'{"a":' * 70 + b"1" + b"}" * 70, b"[1, 2]", b"\xff{",
                                     b'{"torn": '])
def test_export_refuses_a_model_config_it_cannot_copy_in_one_line(ckpt, tmp_path, capsys,
                                                                   content):
    (ckpt / "model_config.json").write_bytes(content)
    assert main(["export", str(ckpt), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "model_config.json is" in err and "replace it" in err, err
    assert not (tmp_path / "out").exists()
    (ckpt / "model_config.json").unlink()  # the fix it names: the weights, without a config
    assert main(["export", str(ckpt), "--out", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "model.safetensors").exists()


@pytest.mark.parametrize("facts,format", [
    ({"zero": {"stage": float("inf"), "checkpoint": {}}}, "hf"),
    ({"zero": {"stage": float("inf"), "checkpoint": {}}}, "deepspeed"),
    ({"fsdp": {"world_size": float("inf"), "params": {}, "param_groups": []}}, "hf"),
    ({"fsdp": {"world_size": 1, "params": {"w": {"shape": [float("inf")], "dim": 0}},
               "param_groups": []}}, "dcp"),
])
def test_backend_facts_with_an_infinite_count_are_malformed_in_one_line(ckpt, tmp_path, capsys,
                                                                        facts, format):
    """The backend facts an export parses (``ZeroFacts``, ``FsdpFacts``): int(inf) is an
    OverflowError, malformed like any other bad value there."""
    _rewrite(ckpt, lambda records: records[0].update(facts))
    assert main(["export", str(ckpt), "--format", format, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "malformed" in err and "OverflowError" in err, err
