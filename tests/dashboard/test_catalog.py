"""dashboard.catalog: listing, the default rule, uploads."""
from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

from dashboard import catalog
from dashboard.catalog import Entry


def e(name, kind, error=None):
    return Entry(name=name, path=Path(name), kind=kind, error=error)


def test_default_rule():
    assert catalog.default_entry([e("b-cap", "captured"), e("a-cap", "captured"),
                                  e("qwen2.5-7b-synthetic", "synthetic")]).name == "a-cap"
    assert catalog.default_entry([e("llama", "synthetic"), e("qwen2.5-7b-synthetic", "synthetic"),
                                  e("a-bad", "captured", error="x")]).name == "qwen2.5-7b-synthetic"
    assert catalog.default_entry([e("z", "synthetic"), e("m", "synthetic")]).name == "m"
    assert catalog.default_entry([e("bad", "captured", error="x")]) is None


def test_scan_keeps_the_error_of_invalid_traces(traces_dir):
    entries = catalog.scan(catalog.traces_dir())
    assert [x.name for x in entries] == ["broken", "qwen2.5-7b-synthetic", "tiny-captured"]
    assert not entries[0].valid and "missing keys" in entries[0].error
    assert entries[2].has_drill and entries[2].steps == 400


def test_zip_upload_round_trip(traces_dir, tmp_path):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for f in (traces_dir / "tiny-captured").iterdir():
            z.write(f, f"nested/tiny-captured/{f.name}")
    folder = catalog.unpack_upload([("t.zip", buf.getvalue())], into=tmp_path / "up")
    assert catalog.load(folder).num_steps == 400


def test_file_upload_round_trip(traces_dir, tmp_path):
    files = [(f.name, f.read_bytes()) for f in (traces_dir / "tiny-captured").iterdir()]
    (tmp_path / "up").mkdir()
    assert catalog.load(catalog.unpack_upload(files, into=tmp_path / "up")).name == "tiny-captured"


def test_model_label_is_short_for_dict_models(tmp_path):
    from dashboard.catalog import describe
    root = Path(__file__).resolve().parents[2] / "traces"
    entry = describe(root / "qwen2.5-7b-synthetic")
    assert entry.model.startswith("qwen2.5-7b (") and "M parameters" in entry.model
    assert "{" not in entry.model


def test_scan_lists_traces_whose_files_are_not_regular_files_as_invalid(tmp_path):
    """A FIFO as a trace's manifest.json or table, or a link to /dev/zero, hung the dashboard
    at start (scan reads every trace) or read until memory ran out. The scan runs in a
    subprocess with 2 GiB of address space and a minute: pyarrow's open of a FIFO never
    returns to Python, where no signal could stop it."""
    import os
    import shutil
    import subprocess
    import sys
    root = Path(__file__).resolve().parents[2]
    shipped = root / "traces" / "minilm-200steps"
    for name, file, make in (("fifo-manifest", "manifest.json", os.mkfifo),
                             ("zero-manifest", "manifest.json", lambda p: p.symlink_to("/dev/zero")),
                             ("fifo-steps", "steps.parquet", os.mkfifo),
                             ("fifo-staleness", "staleness.json", os.mkfifo),
                             ("good", None, None)):
        shutil.copytree(shipped, tmp_path / name)
        if file:
            (tmp_path / name / file).unlink()
            make(tmp_path / name / file)
    code = ("import json, resource, sys\n"
            "resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))\n"
            "from pathlib import Path\n"
            "from dashboard import catalog\n"
            "print(json.dumps({e.name: e.error for e in catalog.scan(Path(sys.argv[1]))}))\n")
    # pyarrow's own allocator reserves more address space than the cap: the system's
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=root, timeout=120,
                          capture_output=True, text=True,
                          env={**os.environ, "ARROW_DEFAULT_MEMORY_POOL": "system"})
    assert done.returncode == 0, done.stderr[-2000:]
    errors = json.loads(done.stdout.strip().splitlines()[-1])
    assert errors.pop("good") is None
    assert "manifest.json: a FIFO (named pipe), not a regular file" in errors["fifo-manifest"]
    assert "manifest.json: a character device, not a regular file" in errors["zero-manifest"]
    assert "steps.parquet: a FIFO (named pipe), not a regular file" in errors["fifo-steps"]
    assert "staleness.json: a FIFO (named pipe), not a regular file" in errors["fifo-staleness"]
