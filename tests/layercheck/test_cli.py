"""python -m layercheck: inspect, plan, export, gc, and one-line errors."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from layercheck import LayerCheck, LayerCheckConfig
from layercheck.tools.cli import main
from layercheck.storage.manifest import read_manifest
from layercheck.storage.localstore import LocalStore
from tests.conftest import checkpointed_run, optimizer_for, tiny_lm, train_step

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """A checkpoint of 30 steps with layers at mixed staleness."""
    path = tmp_path_factory.mktemp("cli") / "ckpt"
    torch.manual_seed(0)
    model = tiny_lm()
    opt, sched = optimizer_for(model, lr=3e-3, total=40)
    cfg = LayerCheckConfig(base_threshold=2e-2, embedding_threshold=5e-2, warmup_steps=3, smax=12)
    with LayerCheck(model, opt, path, cfg, scheduler=sched) as lc:
        lc.restore()
        for _ in range(30):
            train_step(model, opt, sched)
            lc.step()
    return path


def test_inspect_json_reports_layers_staleness_and_bytes(ckpt, capsys):
    path = ckpt
    assert main(["inspect", str(path), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["newest_step"] == 30
    names = [l["name"] for l in info["layers"]]
    assert names[0] == "model.embed_tokens" and names[-1] == "model.norm"
    assert all(0 <= l["staleness"] <= 12 + 1 for l in info["layers"])
    on_disk = sum(p.stat().st_size for p in path.rglob("*.safetensors"))
    assert info["bytes_on_disk"] == on_disk
    assert info["problems"] == []


def test_inspect_table(ckpt, capsys):
    assert main(["inspect", str(ckpt)]) == 0
    out = capsys.readouterr().out
    assert "newest recoverable step: 30" in out and "model.layers.2" in out


def test_plan_matches_newest_versions(ckpt, capsys):
    path = ckpt
    assert main(["plan", str(path), "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    view = read_manifest(LocalStore(path))
    for layer in plan["layers"]:
        assert layer["source_step"] == view.versions[layer["layer"]][-1].step
    assert main(["plan", str(path), "--step", "10", "--json"]) == 0
    early = json.loads(capsys.readouterr().out)
    assert early["step"] == 10 and all(l["source_step"] <= 10 for l in early["layers"])


def test_plan_says_what_budget_mode_does_on_resume(tmp_path, capsys):
    checkpointed_run(tmp_path / "ckpt", LayerCheckConfig(warmup_steps=2, smax=10, write_budget=5e5), 6)
    assert main(["plan", str(tmp_path / "ckpt"), "--json"]) == 0
    budget = json.loads(capsys.readouterr().out)["budget"]
    assert budget["bytes_per_step"] == 5e5 and budget["account_from_step"] == 6
    assert budget["k_scale"] == 1.0
    assert main(["plan", str(tmp_path / "ckpt")]) == 0
    out = capsys.readouterr().out
    assert "budget mode: at most 0.5 MB per step after step 6" in out and "Smax still" in out


def test_plan_without_a_budget_says_nothing_of_one(ckpt, capsys):
    assert main(["plan", str(ckpt), "--json"]) == 0
    assert "budget" not in json.loads(capsys.readouterr().out)


def test_export_loads_with_from_pretrained(ckpt, tmp_path, capsys):
    from transformers import Qwen2ForCausalLM
    path = ckpt
    out = tmp_path / "model"
    assert main(["export", str(path), "--out", str(out)]) == 0
    model = Qwen2ForCausalLM.from_pretrained(out)
    plan = json.loads((out / "layercheck_plan.json").read_text())
    params = dict(model.named_parameters())
    for layer in plan["layers"]:
        saved = load_file(path / layer["file"])
        for key, tensor in saved.items():
            if key.startswith("param/"):
                assert torch.equal(params[key[len("param/"):]], tensor), key
    assert torch.equal(model.lm_head.weight, model.model.embed_tokens.weight)  # still tied


def test_export_refuses_a_non_empty_folder(ckpt, tmp_path, capsys):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "keep.txt").write_text("mine")
    assert main(["export", str(ckpt), "--out", str(tmp_path / "x")]) == 2
    assert "not empty" in capsys.readouterr().err
    assert (tmp_path / "x" / "keep.txt").read_text() == "mine"


def test_gc_keeps_what_the_newest_step_needs(ckpt, tmp_path, capsys):
    import shutil
    path = tmp_path / "copy"
    shutil.copytree(ckpt, path)
    assert main(["plan", str(path), "--json"]) == 0
    before = json.loads(capsys.readouterr().out)
    n_before = len(list(path.rglob("*.safetensors")))
    leftover = path / "layers" / ".model.norm@000000031.safetensors.0badf00d.tmp"
    leftover.write_bytes(b"a write a crash cut short")  # not listed, but gc removes it
    assert main(["gc", str(path)]) == 0
    assert "removed" in capsys.readouterr().out
    assert len(list(path.rglob("*.safetensors"))) < n_before
    assert not leftover.exists()
    assert main(["plan", str(path), "--json"]) == 0
    after = json.loads(capsys.readouterr().out)
    assert after["layers"] == before["layers"] and after["warnings"] == []
    model = tiny_lm(seed=9)
    opt, sched = optimizer_for(model, lr=3e-3, total=40)
    with LayerCheck(model, opt, path, scheduler=sched) as lc:
        assert lc.restore() == 30
    params = dict(model.named_parameters())
    for layer in after["layers"]:
        for key, tensor in load_file(path / layer["file"]).items():
            if key.startswith("param/"):
                assert torch.equal(params[key[len("param/"):]], tensor), key


@pytest.mark.parametrize("argv,needle", [
    (["inspect", "/no/such/dir"], "no such checkpoint directory"),
    (["plan", "."], "not a layercheck checkpoint"),
    (["plan", "CKPT", "--step", "-3"], "steps are >= 0"),
    (["plan", "CKPT", "--step", "1"], "no recoverable step at or before 1"),
    (["gc", "CKPT", "--keep", "0"], "at least 1"),
    (["frobnicate"], "invalid choice"),
])
def test_bad_input_is_one_line_and_exit_2(ckpt, tmp_path, argv, needle):
    argv = [str(ckpt) if a == "CKPT" else a for a in argv]
    proc = subprocess.run([sys.executable, "-m", "layercheck", *argv], capture_output=True,
                          text=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 2
    assert needle in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "Traceback" not in proc.stderr


def test_restore_into_a_different_model_is_refused(ckpt):
    from layercheck.contract.errors import ModelMismatch
    model = tiny_lm(layers=2)
    opt, sched = optimizer_for(model)
    with pytest.raises(ModelMismatch, match="different model"):
        LayerCheck(model, opt, ckpt, scheduler=sched)


@pytest.mark.parametrize("argv", [["inspect", "CKPT"], ["inspect", "CKPT", "--json"],
                                  ["plan", "CKPT"], ["plan", "CKPT", "--json"]])
def test_a_reader_that_went_away_ends_the_command_quietly(ckpt, argv):
    # `python -m layercheck inspect DIR | head -1`, `plan DIR | true`
    from tests.pipes import run_into_closed_pipe
    done = run_into_closed_pipe("layercheck", *[str(ckpt) if a == "CKPT" else a for a in argv])
    assert (done.returncode, done.stderr) == (0, "")


def test_a_broken_pipe_elsewhere_is_still_an_error(ckpt):
    # only stdout's reader going away is quiet: another broken pipe (a remote store's
    # connection) is the one-line error it always was, stdout being read meanwhile
    code = ("import sys, layercheck.tools.cli as cli\n"
            "def broken(args):\n"
            "    raise BrokenPipeError(32, 'Broken pipe')\n"
            "cli._run = broken\n"
            f"sys.exit(cli.main(['inspect', {str(ckpt)!r}]))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert (done.returncode, done.stderr) == (2, "layercheck: error: [Errno 32] Broken pipe\n")


def test_inspect_counts_the_same_layer_versions_in_its_table_and_its_json(ckpt):
    def inspect(*flags: str) -> str:
        done = subprocess.run([sys.executable, "-m", "layercheck", "inspect", str(ckpt), *flags],
                              capture_output=True, text=True, cwd=ROOT,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert done.returncode == 0, done.stderr
        return done.stdout

    text, info = inspect(), json.loads(inspect("--json"))
    said = int(re.search(r"layer versions: ([\d,]+)", text).group(1).replace(",", ""))
    per_layer = sum(layer["versions"] for layer in info["layers"])
    # (a layout's count once took the training states in as well: 1,215 against 1,034)
    per_layout = sum(lay.get("layer_versions", lay.get("versions")) for lay in info["layouts"])
    assert said == info["layer_versions"] == per_layer == per_layout
    assert f"training states: {info['recoverable_steps']:,}" in text
    assert sum(lay["states"] for lay in info["layouts"]) == info["recoverable_steps"]


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_every_exported_file_gets_the_mode_of_a_new_file(ckpt, tmp_path, umask):
    # safetensors writes a 0600 temporary file and renames it: model.safetensors came
    # out 0600 beside a 0644 config.json
    out = tmp_path / "model"
    done = subprocess.run([sys.executable, "-m", "layercheck", "export", str(ckpt), "--out",
                           str(out)], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)},
                          preexec_fn=lambda: os.umask(umask))
    assert done.returncode == 0, done.stderr
    modes = {p.name: oct(p.stat().st_mode & 0o777) for p in out.iterdir()}
    assert {"model.safetensors", "config.json", "layercheck_plan.json"} <= modes.keys()
    assert set(modes.values()) == {oct(0o666 & ~umask)}, modes
