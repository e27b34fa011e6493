"""python -m layercheck export --format deepspeed, for real: two-rank ZeRO jobs under torchrun.

One job per ZeRO stage trains a tiny Qwen2 with ZeroLayerCheck to step T
(layers at mixed staleness) and also saves DeepSpeed's own checkpoint at T.
The export of step T must have the files and structure DeepSpeed's own save
has, hold the composite (each layer's newest shards, read here straight from
the safetensors files), load with ``engine.load_checkpoint`` in a new job
exactly as ``ZeroLayerCheck.restore`` restores it and train on bit for bit
like it, and reconstruct with ``zero_to_fp32`` to the composite's weights.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("deepspeed")

import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from layercheck.tools.cli import main  # noqa: E402
from layercheck.storage.manifest import read_manifest  # noqa: E402
from layercheck.storage.localstore import LocalStore  # noqa: E402
from tests.stores import BeforeFirstRead  # noqa: E402
from tests.layercheck.test_zero import ROOT, _command, _env, _results  # noqa: E402

T, STEPS = 7, 10
"""Export step T (mixed staleness in these jobs), then train on to STEPS."""
TRAINED_STAGES = LOADED_STAGES = (3, 2)
RESTORED_STAGES = (3,)
"""Stages trained, whose export is loaded in a new job, and also restored with
ZeroLayerCheck in another (ZeRO-1 differs from ZeRO-2 in two constants of the
files). The jobs are this file's time: ~20 CPU-seconds each, mostly imports."""


def _jobs(root: Path, *argsets: list[str], timeout: float = 420) -> None:
    """Run torchrun jobs side by side (two cores: their imports overlap); each must succeed."""
    procs = []
    for i, args in enumerate(argsets):
        log = open(root / f"job{i}.log", "w")
        procs.append((subprocess.Popen(_command(*args), env=_env(), cwd=ROOT, stdout=log,
                                       stderr=subprocess.STDOUT), log, root / f"job{i}.log"))
    for proc, log, path in procs:
        proc.wait(timeout=timeout)
        log.close()
        assert proc.returncode == 0, path.read_text()[-4000:]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[int, dict]:
    """Per stage: the layercheck directory, DeepSpeed's own save at T, the
    export of T, and (stages 3 and 2) the reports of two jobs resuming at T:
    one restored with ZeroLayerCheck, one loading the export."""
    root = tmp_path_factory.mktemp("dsexport")
    out = {s: {"ckpt": root / f"ckpt{s}", "first": root / f"first{s}",
               "export": root / f"export{s}"} for s in TRAINED_STAGES}
    _jobs(root, *[["--dir", str(r["ckpt"]), "--out", str(r["first"]), "--steps", str(STEPS),
                   "--stop-at", str(T), "--ds-save", str(T), "--stage", str(s)]
                  for s, r in out.items()])
    for s, r in out.items():
        if s == 3:  # the command line itself, once
            done = subprocess.run([sys.executable, "-m", "layercheck", "export", str(r["ckpt"]),
                                   "--step", str(T), "--format", "deepspeed", "--out",
                                   str(r["export"])], capture_output=True, text=True, cwd=ROOT,
                                  env={**_env(), "PYTHONPATH": str(ROOT)}, timeout=300)
            assert done.returncode == 0, done.stderr[-3000:]
            assert f"exported step {T} to" in done.stdout
        else:
            assert main(["export", str(r["ckpt"]), "--step", str(T), "--format", "deepspeed",
                         "--out", str(r["export"])]) == 0
        if s in RESTORED_STAGES:
            r["export_own"] = root / f"export_own{s}"
            assert main(["export", str(r["ckpt"]), "--step", str(T), "--format", "deepspeed",
                         "--adam-step", "own", "--out", str(r["export_own"])]) == 0
            shutil.copytree(r["ckpt"], root / f"copy{s}")  # restoring appends to a directory
    argsets = []
    for s in LOADED_STAGES:
        r = out[s]
        r["loaded"] = root / f"loaded{s}"
        argsets.append(["--dir", str(root / "unused"), "--out", str(r["loaded"]), "--steps",
                        str(STEPS), "--stage", str(s), "--ds-load-dir", str(r["export"]),
                        "--check-composite", str(r["ckpt"]), "--expect-adam-step", str(T)])
        if s in RESTORED_STAGES:
            r["loaded_own"] = root / f"loaded_own{s}"
            argsets.append(["--dir", str(root / "unused"), "--out", str(r["loaded_own"]),
                            "--steps", str(STEPS), "--stage", str(s), "--ds-load-dir",
                            str(r["export_own"]), "--check-composite", str(r["ckpt"])])
            r["restored"] = root / f"restored{s}"
            argsets.append(["--dir", str(root / f"copy{s}"), "--out", str(r["restored"]),
                            "--steps", str(STEPS), "--stage", str(s), "--check"])
    _jobs(root, *argsets)
    return out


def _composite(ckpt: Path) -> tuple[dict, dict[str, tuple[int, list[dict]]]]:
    """The header, and per layer its newest version <= T: (step, every rank's tensors)."""
    view = read_manifest(LocalStore(ckpt, create=False))
    layers = {}
    for name in view.layer_names:
        version = max((v for v in view.versions[name] if v.step <= T), key=lambda v: v.step)
        layers[name] = (version.step, [load_file(ckpt / s.file) for s in version.shards])
    return view.header, layers


def _full_weights(header: dict, layers: dict) -> dict[str, torch.Tensor]:
    """Each whole parameter from every rank's fp32 master partitions (ZeRO-3:
    each parameter split in world-size slices; ZeRO-1/2: the group's flat split)."""
    zero, world, out = header["zero"], header["world_size"], {}
    for sg in zero["sub_groups"]:
        masters = [shard[f"master/sg{sg['sub_group']}"] for shard in layers[sg["layer"]][1]]
        flat, offset = torch.cat(masters), 0
        for name, shape in sg["params"]:
            numel = math.prod(shape)
            if zero["stage"] == 3:
                part = -(-numel // world)
                whole = torch.cat([m[offset:offset + part] for m in masters])
                out[name] = whole[:numel].view(shape)
                offset += part
            else:
                out[name] = flat[offset:offset + numel].view(shape)
                offset += numel
    return out


def _partitions(optim: dict) -> list[dict[str, torch.Tensor]]:
    """Per sub-group of a DeepSpeed optimizer-states file: master, exp_avg, exp_avg_sq, step."""
    sd = optim["optimizer_state_dict"]
    inner = sd["optimizer_state_dict"] if "fp32_flat_groups" in sd else sd["base_optimizer_state"]
    flats = sd.get("fp32_flat_groups", sd.get("single_partition_of_fp32_groups"))
    ids = [i for g in inner["param_groups"] for i in g["params"]]
    return [{"master": flats[k], **inner["state"][i]} for k, i in enumerate(ids)]


def _differences(a, b, path: str = "") -> list[str]:
    """Where two torch.load'ed objects differ in structure (types, keys, lengths,
    tensor dtypes and shapes) or in any non-tensor value."""
    if type(a) is not type(b):
        return [f"{path}: {type(a).__name__} vs {type(b).__name__}"]
    if isinstance(a, dict):
        if path.endswith("ds_config"):  # the manifest stores JSON with sorted keys
            return [] if a == b else [f"{path}: {a} vs {b}"]
        out = [] if list(a) == list(b) else [f"{path}: keys {list(a)} vs {list(b)}"]
        out += [d for k in a if k in b for d in _differences(a[k], b[k], f"{path}/{k}")]
        if getattr(a, "_metadata", None) != getattr(b, "_metadata", None):
            out.append(f"{path}: state_dict _metadata differs")
        return out
    if isinstance(a, (list, tuple)):
        out = [] if len(a) == len(b) else [f"{path}: {len(a)} vs {len(b)} items"]
        return out + [d for i, (x, y) in enumerate(zip(a, b))
                      for d in _differences(x, y, f"{path}/{i}")]
    if torch.is_tensor(a):
        same = a.dtype == b.dtype and a.shape == b.shape
        return [] if same else [f"{path}: {a.dtype}{tuple(a.shape)} vs {b.dtype}{tuple(b.shape)}"]
    if hasattr(a, "__dict__") and not isinstance(a, type):  # loss scaler, fragment addresses
        return [] if vars(a) == vars(b) else [f"{path}: {vars(a)} vs {vars(b)}"]
    return [] if a == b else [f"{path}: {a!r} vs {b!r}"]


@pytest.mark.parametrize("stage", TRAINED_STAGES)
def test_export_is_deepspeeds_own_layout_holding_the_composite(runs, stage):
    r = runs[stage]
    header, layers = _composite(r["ckpt"])
    sources = {name: step for name, (step, _) in layers.items()}
    assert len(set(sources.values())) > 1 and max(sources.values()) == T, sources
    own, export = r["first"] / "ds", r["export"]
    files = sorted(str(p.relative_to(own)) for p in own.rglob("*") if p.is_file())
    assert sorted(str(p.relative_to(export)) for p in export.rglob("*") if p.is_file()) == sorted(
        files + ["layercheck_plan.json"])
    for name in ("latest", "zero_to_fp32.py", "zero_to_torch.py"):
        assert (export / name).read_bytes() == (own / name).read_bytes()
    assert os.access(export / "zero_to_fp32.py", os.X_OK)
    sub_groups = header["zero"]["sub_groups"]
    for name in (f for f in files if f.endswith(".pt")):
        mine = torch.load(export / name, weights_only=False)
        theirs = torch.load(own / name, weights_only=False)
        assert _differences(mine, theirs) == [], name
        if "optim_states" not in name:
            continue
        rank = int(name.split("zero_pp_rank_")[1].split("_")[0])
        for sg, got, ds in zip(sub_groups, _partitions(mine), _partitions(theirs)):
            step, shards = layers[sg["layer"]]
            k = sg["sub_group"]
            saved = {"master": shards[rank][f"master/sg{k}"],
                     **{f: shards[rank][f"optim/{f}/sg{k}"]
                        for f in ("exp_avg", "exp_avg_sq", "step")}}
            saved["step"] = torch.full_like(saved["step"], float(T))  # the default: all T
            for field, value in got.items():  # ZeRO-1/2 save the master without end padding
                expected = saved[field].reshape(-1)[:value.numel()].view(value.shape)
                assert torch.equal(value, expected), (name, k, field)
                if step == T:  # a layer written at T holds DeepSpeed's own state of T
                    assert torch.equal(value, ds[field]), (name, k, field)
            if step < T:  # a stale one holds its own older moments, counted as of T
                assert not torch.equal(got["exp_avg"], ds["exp_avg"]), (name, k)
                assert got["step"] == ds["step"] == T
    if stage in (1, 2):  # the whole module: the composite's masters, in the module's dtype
        module = torch.load(export / f"global_step{T}" / "mp_rank_00_model_states.pt",
                            weights_only=False)["module"]
        for pname, weight in _full_weights(header, layers).items():
            assert torch.equal(module[pname], weight), pname
        assert module["lm_head.weight"].data_ptr() == module["model.embed_tokens.weight"].data_ptr()


@pytest.mark.parametrize("stage", LOADED_STAGES)
def test_load_checkpoint_gives_the_composite_of_T(runs, stage):
    r = runs[stage]
    header, layers = _composite(r["ckpt"])
    for first, b in zip(_results(r["first"]), _results(r["loaded"])):
        # masters, moments, step counts and whole module weights equal the composite's shards
        assert b["problems"] == [], b["problems"]
        # counters, LR and scheduler are those of step T in the job that wrote the directory
        adam = b["loaded"].pop("adam_steps")
        assert b["loaded"] == {k: v for k, v in first["final"].items() if k != "adam_steps"}
        assert b["loaded"]["global_steps"] == T and b["loaded"]["scheduler"]["last_epoch"] == T
        assert b["loaded"]["group_lr"] == b["loaded"]["lr"]
        # every Adam step count is T (the default), although some layers are older
        assert adam == [float(T)] * len(header["zero"]["sub_groups"])
        assert any(layers[sg["layer"]][0] < T for sg in header["zero"]["sub_groups"])
        assert sorted(int(s) for s in b["losses"]) == list(range(T + 1, STEPS + 1))
        assert all(math.isfinite(v) for v in b["losses"].values())
        assert b["global_steps"] == STEPS


@pytest.mark.parametrize("stage", RESTORED_STAGES)
def test_loaded_export_trains_on_bit_for_bit_like_zerolayercheck_restore(runs, stage):
    """With --adam-step own each layer keeps its own Adam count, as restore() does."""
    r = runs[stage]
    header, layers = _composite(r["ckpt"])
    for a, b in zip(_results(r["restored"]), _results(r["loaded_own"])):
        assert b["problems"] == [], b["problems"]
        assert b["loaded"]["adam_steps"] == [float(layers[sg["layer"]][0])
                                             for sg in header["zero"]["sub_groups"]]
        assert a["restored_step"] == T and a["problems"] == [], a["problems"]
        assert b["loaded"] == a["loaded"]
        assert b["losses"] == a["losses"] and len(b["losses"]) == STEPS - T
        assert b["params"] == a["params"]
        assert b["final"] == a["final"] and b["lr"] == a["lr"]


@pytest.mark.parametrize("stage", TRAINED_STAGES)
def test_zero_to_fp32_and_the_hf_export_are_the_composites_weights(runs, stage, tmp_path):
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    r = runs[stage]
    header, layers = _composite(r["ckpt"])
    weights = _full_weights(header, layers)
    state = get_fp32_state_dict_from_zero_checkpoint(str(r["export"]))
    assert set(state) == set(weights) | {"lm_head.weight"}
    for name, weight in weights.items():
        assert torch.equal(state[name], weight), name
    assert torch.equal(state["lm_head.weight"], weights["model.embed_tokens.weight"])
    # the default format, from the same ZeRO directory: a model from_pretrained loads
    from transformers import Qwen2ForCausalLM
    assert main(["export", str(r["ckpt"]), "--step", str(T), "--out", str(tmp_path / "hf")]) == 0
    model = Qwen2ForCausalLM.from_pretrained(tmp_path / "hf")
    params = dict(model.named_parameters())
    for name, weight in weights.items():
        assert torch.equal(params[name], weight), name
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


def test_a_shard_damaged_on_one_rank_makes_the_layer_fall_back_on_every_rank(runs, tmp_path,
                                                                             capsys):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(runs[3]["ckpt"], ckpt)
    _, layers = _composite(ckpt)
    view = read_manifest(LocalStore(ckpt, create=False))
    name = "model.layers.1"
    newest, older = sorted((v for v in view.versions[name] if v.step <= T),
                           key=lambda v: v.step)[-1:-3:-1]
    damaged = ckpt / newest.shards[1].file
    data = bytearray(damaged.read_bytes())
    data[-5] ^= 0xFF
    damaged.write_bytes(bytes(data))
    assert main(["export", str(ckpt), "--step", str(T), "--format", "deepspeed",
                 "--out", str(tmp_path / "out")]) == 0
    err = capsys.readouterr().err
    assert f"layer {name}: skipping the version of step {newest.step}" in err and "checksum" in err
    plan = json.loads((tmp_path / "out" / "layercheck_plan.json").read_text())
    assert {l["layer"]: l["source_step"] for l in plan["layers"]}[name] == older.step
    k = next(sg["sub_group"] for sg in view.header["zero"]["sub_groups"] if sg["layer"] == name)
    for rank in range(2):
        optim = torch.load(tmp_path / "out" / f"global_step{T}" /
                           f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt", weights_only=False)
        saved = load_file(ckpt / older.shards[rank].file)
        got = _partitions(optim)[k]
        assert torch.equal(got["master"], saved[f"master/sg{k}"])
        assert torch.equal(got["exp_avg"], saved[f"optim/exp_avg/sg{k}"]), rank
        assert float(got["step"]) == T  # counted as of T (the default)
    # the training state of T itself damaged: exporting exactly T is refused
    state = ckpt / view.states[T].shards[0].file
    state.write_bytes(state.read_bytes()[:-3])
    assert main(["export", str(ckpt), "--step", str(T), "--format", "deepspeed",
                 "--out", str(tmp_path / "out2")]) == 2
    err = capsys.readouterr().err
    assert "training state: no committed version intact on every rank" in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "out2").exists()


def test_the_command_line_offers_the_formats_export_knows(tmp_path):
    from layercheck.tools import cli, export
    from layercheck.contract.errors import LayerCheckError
    from layercheck.storage.format import EXPORT_FORMATS
    from layercheck.storage.localstore import LocalStore
    commands = cli.build_parser()._subparsers._group_actions[0].choices
    offered = next(a.choices for a in commands["export"]._actions if a.dest == "format")
    assert tuple(offered) == EXPORT_FORMATS
    with pytest.raises(LayerCheckError, match="hf, deepspeed"):  # and export names the same
        export.export(LocalStore(tmp_path / "c"), tmp_path / "out", format="onnx")


@pytest.fixture(scope="module")
def plain_ckpt(tmp_path_factory) -> Path:
    """A checkpoint of plain LayerCheck (no ZeRO)."""
    from layercheck import LayerCheck, LayerCheckConfig
    from tests.conftest import optimizer_for, tiny_lm, train_step
    path = tmp_path_factory.mktemp("plain") / "ckpt"
    model = tiny_lm()
    opt, sched = optimizer_for(model, total=10)
    with LayerCheck(model, opt, path, LayerCheckConfig(warmup_steps=1), scheduler=sched) as lc:
        lc.restore()
        for _ in range(3):
            train_step(model, opt, sched)
            lc.step()
    return path


@pytest.mark.parametrize("argv,needle", [
    (["PLAIN", "--format", "deepspeed"], "not written by ZeroLayerCheck"),
    (["ZERO", "--format", "onnx"], "invalid choice: 'onnx'"),
    (["ZERO", "--format", "deepspeed", "--step", "999"], "step 999 is not a recoverable step"),
    (["ZERO", "--format", "deepspeed", "--step", "1"], "step 1 is not a recoverable step"),
    (["ZERO", "--format", "deepspeed", "--step", "-1"], "steps are >= 0"),
])
def test_bad_exports_are_one_line_and_exit_2(runs, plain_ckpt, tmp_path, capsys, argv, needle):
    paths = {"PLAIN": str(plain_ckpt), "ZERO": str(runs[3]["ckpt"])}
    argv = ["export", *[paths.get(a, a) for a in argv], "--out", str(tmp_path / "out")]
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2 and needle in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_without_deepspeed_the_export_says_so_in_one_line(runs, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "deepspeed", None)  # makes `import deepspeed` fail
    code = main(["export", str(runs[3]["ckpt"]), "--format", "deepspeed",
                 "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and "needs the deepspeed package" in err and "pip install deepspeed" in err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def _retiring(root: Path, versions: list):
    """A trainer's retention retiring ``versions``: drop records first, then every
    rank's files (for ``BeforeFirstRead``: after the reader's snapshot of the manifest,
    before it reads what it planned)."""
    def retire() -> None:
        from layercheck.storage.format import MANIFEST, encode_record
        store = LocalStore(root, create=False)
        store.append(MANIFEST, b"".join(encode_record({"kind": "drop", "file": v.key})
                                        for v in versions))
        assert store.delete_unread([s.file for v in versions for s in v.shards])
    return retire


def test_export_racing_retention_refuses_a_step_it_retired_instead_of_a_false_fallback(
        runs, tmp_path):
    """Issue 13, item 4, on the ZeRO path: the export plans exactly T, then retention
    retires T's state and the version of a layer that T's plan uses (as it does once
    newer versions commit). The export must read the manifest as it is now (it goes
    through ``read_consistent``): T is no longer recoverable, so it is refused clearly,
    never reported as damage (a read of the snapshot alone finds T's files missing:
    CorruptVersion) nor exported with a fallback to an older version. No torchrun job
    of its own: the module's ZeRO-3 directory."""
    from layercheck.contract.errors import CheckpointNotFound
    from layercheck.tools.export import export_deepspeed
    from layercheck.recovery import make_plan
    ckpt = tmp_path / "ckpt"
    shutil.copytree(runs[3]["ckpt"], ckpt)
    view = read_manifest(LocalStore(ckpt, create=False))
    plan = make_plan(LocalStore(ckpt, create=False), view, T, exact=True)
    used = plan.sources["model.layers.1"]
    assert plan.warnings == [] and len(view.versions["model.layers.1"]) > 1
    store = BeforeFirstRead(ckpt, _retiring(ckpt, [used, view.states[T]]), create=False)
    with pytest.raises(CheckpointNotFound, match=f"step {T} is not a recoverable step"):
        export_deepspeed(store, tmp_path / "out", step=T)
    assert store.meanwhile is None and not (tmp_path / "out").exists()  # it retired them
