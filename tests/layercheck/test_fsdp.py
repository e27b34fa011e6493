"""LayerCheck under PyTorch FSDP2, for real: two ranks under torchrun, gloo, CPU.

Each job is ``fsdp_worker.py`` (a tiny Qwen2 model, ``fully_shard`` per block
then the root, AdamW in two groups). Two jobs are shared by several tests
(module fixtures, each run once): a run killed with SIGKILL once step 9 is
committed and resumed to the end (``killed``), and a threshold-0 run of 10
steps that a second job resumes at step 5 (``threshold_zero``).
"""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from layercheck.tools.cli import main as cli
from layercheck.tools.dcpcheckpoint import FsdpFacts, fqn
from layercheck.contract.errors import CorruptVersion, LayerCheckError
from layercheck.storage.manifest import read_manifest
from layercheck.storage.localstore import LocalStore
from tests.layercheck.torchrun import Torchrun, assert_ranks_fall_back_together, digest

HAVE_NUMBA = importlib.util.find_spec("numba") is not None
JOB = Torchrun(Path(__file__).with_name("fsdp_worker.py"))
ONE = Torchrun(Path(__file__).with_name("fsdp_worker.py"), ranks=1)
STEPS = 12
LAYERS = ["model.embed_tokens", "model.layers.0", "model.layers.1", "model.layers.2", "model.norm"]


@pytest.fixture(scope="module")
def killed(tmp_path_factory):
    """A job killed once step 9 is committed, then resumed (``--check``) to step 12."""
    root = tmp_path_factory.mktemp("killed")
    ckpt, out = root / "ckpt", root / "out"
    killed_at = JOB.kill_mid_run(ckpt, out, "--steps", str(STEPS), "--smax", "4", at=9)
    JOB.run("--dir", str(ckpt), "--out", str(out), "--steps", str(STEPS), "--smax", "4", "--check")
    return {"ckpt": ckpt, "out": out, "killed_at": killed_at, "ranks": JOB.results(out)}


@pytest.fixture(scope="module")
def threshold_zero(tmp_path_factory):
    """Threshold 0 (every layer at every step): 10 uninterrupted steps, then a second
    job that restores exactly step 5 and trains 6..10 again."""
    root = tmp_path_factory.mktemp("zero")
    ckpt = root / "ckpt"
    common = ("--dir", str(ckpt), "--steps", "10", "--threshold", "0")
    JOB.run(*common, "--out", str(root / "whole"), "--check-drift",
            "--save-final", str(root / "final.safetensors"))
    whole = JOB.results(root / "whole")
    JOB.run(*common, "--out", str(root / "resumed"), "--restore-step", "5", "--check")
    return {"root": root, "ckpt": ckpt, "whole": whole, "resumed": JOB.results(root / "resumed")}


def test_sigkill_then_resume_restores_every_rank_its_saved_shards(killed):
    assert killed["killed_at"] == 9
    view = read_manifest(LocalStore(killed["ckpt"]))
    for r in killed["ranks"]:
        # resumed at the newest step every rank had committed; nothing replayed
        assert r["restored_step"] == 9
        # every parameter's local shard, both moments (DTensors placed as the
        # parameter), the step count and the whole gathered weight: exactly as saved
        assert r["problems"] == [], r["problems"]
        assert sorted(int(s) for s in r["losses"]) == list(range(10, STEPS + 1))
    # mixed staleness: the restore took layers from different steps
    sources = killed["ranks"][0]["sources"]
    assert sources == killed["ranks"][1]["sources"] and len(set(sources.values())) > 1, sources
    assert all(len(v.shards) == 2 for vs in view.versions.values() for v in vs)
    assert killed["ranks"][0]["params"] == killed["ranks"][1]["params"]


def test_the_header_records_which_layers_each_fully_shard_unit_holds(killed):
    units = {u["unit"]: u["layers"] for u in killed["ranks"][0]["units"]}
    # one unit per block is one layer; the root unit is split into its layers
    assert units == {"": ["model.embed_tokens", "model.norm"], "model.layers.0": ["model.layers.0"],
                     "model.layers.1": ["model.layers.1"], "model.layers.2": ["model.layers.2"]}
    header = read_manifest(LocalStore(killed["ckpt"])).header
    assert header["world_size"] == 2 and header["fsdp"]["units"] == killed["ranks"][0]["units"]
    assert header["fsdp"]["aliases"] == {"lm_head.weight": "model.embed_tokens.weight"}


def test_threshold_zero_resume_is_bit_for_bit_the_uninterrupted_run(threshold_zero):
    for whole, resumed in zip(threshold_zero["whole"], threshold_zero["resumed"]):
        assert resumed["restored_step"] == 5 and resumed["problems"] == []
        assert resumed["losses"] == {s: whole["losses"][s] for s in resumed["losses"]}
        assert len(resumed["losses"]) == 5
        assert resumed["params"] == whole["params"]
        assert resumed["lr"] == whole["lr"]


def test_drift_summed_over_ranks_equals_the_whole_layers_drift(threshold_zero):
    """Each rank reads only its local shards (with the fused kernel where numba is
    installed); the all-reduced d_l equals the drift of the gathered layers."""
    for r in threshold_zero["whole"]:
        measured, reference = np.array(r["drift"]), np.array(r["reference_drift"])
        assert measured.shape == reference.shape == (10, len(LAYERS))
        # exact update against fp32-rounded copies (see test_zero); a missing rank's
        # share would be off by ~50%
        np.testing.assert_allclose(measured, reference, rtol=1e-4)
        assert r["fused"] == [38] * 10 or not HAVE_NUMBA  # every parameter's local shard
    a, b = threshold_zero["whole"]
    assert a["drift"] == b["drift"] and a["written"] == b["written"]
    assert a["written"][-1] == list(range(len(LAYERS)))


def test_hf_export_of_an_fsdp_directory_is_the_whole_model(threshold_zero, tmp_path):
    """At threshold 0 every layer was written at the last step: the composite is the
    live model, and the export joins every rank's slices into it exactly."""
    assert cli(["export", str(threshold_zero["ckpt"]), "--out", str(tmp_path / "hf")]) == 0
    exported = load_file(tmp_path / "hf" / "model.safetensors")
    final = load_file(threshold_zero["root"] / "final.safetensors")
    assert exported.keys() == final.keys()
    for name, weight in final.items():
        assert torch.equal(exported[name], weight), name
    assert (tmp_path / "hf" / "config.json").exists()


def test_a_corrupt_shard_on_one_rank_makes_both_ranks_fall_back(killed, tmp_path):
    assert_ranks_fall_back_together(JOB, killed["ckpt"], tmp_path, STEPS)


def test_dcp_export_loads_into_a_fresh_fsdp_model_and_trains_on_as_a_restore(killed, tmp_path):
    """The DCP export of step 9 (mixed staleness), loaded with dcp.load into a
    fresh FSDP2 model and optimizer: every rank's weights, Adam moments and step
    counts equal the saved shards, and training on from it is bit for bit the
    run that restored step 9 with layercheck."""
    export = tmp_path / "dcp"
    assert cli(["export", str(killed["ckpt"]), "--step", "9", "--format", "dcp",
                "--out", str(export)]) == 0
    assert (export / ".metadata").exists() and (export / "layercheck_plan.json").exists()
    JOB.run("--dir", str(tmp_path / "unused"), "--out", str(tmp_path / "out"), "--steps",
            str(STEPS), "--dcp-load", str(export), "--check-composite", str(killed["ckpt"]))
    for loaded, restored in zip(JOB.results(tmp_path / "out"), killed["ranks"]):
        assert loaded["loaded_step"] == 9 and loaded["problems"] == []
        assert loaded["losses"] == restored["losses"]
        assert loaded["params"] == restored["params"]
        assert loaded["lr_at_start"] == restored["lr_at_start"]


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_dcp_export_reshards_into_one_process(killed, tmp_path):
    """Another world size is the DCP export's job: the 2-rank composite loads into a
    plain model and optimizer in one process, whole tensors equal to the joined shards."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    from layercheck.tools.dcpcheckpoint import assemble
    from layercheck.recovery import make_plan
    from tests.layercheck.fsdp_worker import build
    export = tmp_path / "dcp"
    assert cli(["export", str(killed["ckpt"]), "--step", "9", "--format", "dcp",
                "--out", str(export)]) == 0
    model, optimizer, scheduler = build(STEPS, shard=False)
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd, "layercheck": {"step": 0}}
    dcp.load(state, checkpoint_id=str(export), no_dist=True)
    set_state_dict(model, optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optim"])
    store = LocalStore(killed["ckpt"])
    view = read_manifest(store)
    composite = assemble(store, view, make_plan(store, view, 9),
                         FsdpFacts.from_header(view.header, ""))
    assert state["layercheck"]["step"] == 9
    for name, p in model.named_parameters():
        assert torch.equal(p.detach(), composite.weights[name]), name
        for field in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(optimizer.state[p][field], composite.optimizer[name][field])


@pytest.fixture(scope="module")
def refused(killed, tmp_path_factory):
    """What a one-rank job on the two-rank directory is refused (``--refusals``)."""
    out = tmp_path_factory.mktemp("refused")
    JOB.run("--dir", str(killed["ckpt"]), "--out", str(out), "--refusals", ranks=1)
    return JOB.results(out, ranks=1)[0]["refusals"]


def test_an_unsharded_model_and_an_optimizer_made_first_are_refused_with_the_fix(refused):
    # another world size is no longer refused (issue 30): see the elastic tests below
    assert "fully_shard(model, mesh=mesh)" in refused["unsharded"]
    assert "create the optimizer after fully_shard" in refused["optimizer_first"]


def test_a_refused_setup_leaves_no_process_group_open(refused):
    """FsdpLayerCheck makes two gloo groups before it looks at the model; a refusal
    must destroy them (a gloo group alive at exit can abort the process), whether the
    model (its source), the optimizer or the directory is refused."""
    assert refused["groups_left"] == {"unsharded": 0, "optimizer_first": 0}


def test_dcp_export_needs_an_fsdp_directory(tmp_path, capsys):
    from layercheck import LayerCheck, LayerCheckConfig
    from tests.conftest import optimizer_for, tiny_lm, train_step
    model = tiny_lm()
    opt, sched = optimizer_for(model)
    with LayerCheck(model, opt, tmp_path / "plain", LayerCheckConfig(warmup_steps=1),
                    scheduler=sched) as lc:
        lc.restore()
        train_step(model, opt, sched)
        lc.step()
    assert cli(["export", str(tmp_path / "plain"), "--format", "dcp",
                "--out", str(tmp_path / "out")]) == 2
    assert "not written by FsdpLayerCheck" in capsys.readouterr().err


def test_shards_that_do_not_tile_the_header_shape_are_refused():
    facts = FsdpFacts(world_size=2, shapes={"w": (5, 3)}, dims={"w": 0}, param_groups=(("w",),),
                      aliases={})
    assert facts.whole("w", [torch.zeros(3, 3), torch.zeros(2, 3)]).shape == (5, 3)
    with pytest.raises(CorruptVersion, match="join to"):
        facts.whole("w", [torch.zeros(3, 3), torch.zeros(3, 3)])
    with pytest.raises(LayerCheckError, match="mixes two models"):
        facts.whole("v", [torch.zeros(1)])


def test_fqn_drops_the_wrappers_state_dict_keys_leave_out():
    assert fqn("model.layers.0._checkpoint_wrapped_module.mlp.up_proj.weight") == \
        "model.layers.0.mlp.up_proj.weight"
    assert fqn("_orig_mod.lm_head.weight") == "lm_head.weight"


# --- issue 30: resuming at another world size ------------------------------------------
ELASTIC = ("--steps", str(STEPS), "--smax", "4", "--data-ranks", "2", "--learnable",
           "--lr", "1e-2")
"""Every run sees the global batch of 2 ranks, whatever its world size (``--data-ranks``),
of sequences it can learn (``--learnable``: a loss that falls, so 1% says something)."""


@pytest.fixture(scope="module")
def elastic(tmp_path_factory):
    """FSDP2 on 2 ranks killed once step 5 is committed, resumed in one process (a plain
    LayerCheck on the unsharded model, as a user debugging on one machine would), killed
    once step 7 is, resumed on 2 ranks to the end; and the same job without failures."""
    root = tmp_path_factory.mktemp("elastic")
    ckpt = root / "ckpt"
    JOB.run("--dir", str(root / "free"), "--out", str(root / "free-out"), *ELASTIC)
    first = JOB.kill_mid_run(ckpt, root / "o1", *ELASTIC, at=5)
    # a higher threshold there: some layers stay as the 2 ranks wrote them, so the last
    # restore composes versions of both layouts
    second = ONE.kill_mid_run(ckpt, root / "o2", *ELASTIC, "--plain", "--check-elastic",
                              "--threshold", "0.03", at=7)
    JOB.run("--dir", str(ckpt), "--out", str(root / "o3"), *ELASTIC, "--check-elastic")
    return {"ckpt": ckpt, "killed_at": (first, second), "free": JOB.results(root / "free-out"),
            "one": ONE.results(root / "o2")[0], "two": JOB.results(root / "o3")}


def test_fsdp2_resumes_in_one_process_and_back_on_two_ranks_exactly(elastic):
    """Each resumed rank's weights, Adam moments and step counts equal its rows of the
    composite's whole tensors (every rank's slices joined offline, each version by its
    own layout), bit for bit: 2 ranks -> 1 process, then 1 process -> 2 ranks."""
    assert elastic["killed_at"] == (5, 7)
    one = elastic["one"]
    assert one["restored_step"] == 5 and one["problems"] == [], one["problems"]
    assert one["layouts"] == [0]  # every layer from the 2-rank versions
    for rank in elastic["two"]:
        assert rank["restored_step"] == 7 and rank["problems"] == [], rank["problems"]
        assert rank["layouts"] == [0, 1], rank["sources"]  # a composite of both layouts
    view = read_manifest(LocalStore(elastic["ckpt"]))
    assert {k: (v.world_size, v.backend) for k, v in view.layouts.items()} == {
        0: (2, "fsdp"), 1: (1, None)}
    # the one process wrote in its layout, the 2-rank job after it in the header's again
    for versions in view.versions.values():
        for v in versions:
            assert v.layout == (1 if 5 < v.step <= 7 else 0), v
            assert len(v.shards) == (0 if v.layout == 1 else 2)


def test_a_run_resumed_at_other_world_sizes_ends_within_1_percent_of_the_failure_free_loss(
        elastic):
    two, free = elastic["two"][0], elastic["free"][0]
    assert sorted(int(s) for s in two["global_losses"]) == list(range(8, STEPS + 1))
    assert free["global_losses"][str(STEPS)] < 0.92 * free["global_losses"]["1"]  # it learns
    last = str(STEPS)
    assert abs(two["global_losses"][last] - free["global_losses"][last]) <= \
        0.01 * free["global_losses"][last], (two["global_losses"], free["global_losses"])
    assert elastic["two"][0]["params"] == elastic["two"][1]["params"]


FROZEN = (*ELASTIC, "--freeze", "model.layers.0.self_attn")
"""Part of a layer frozen (its attention, outside the optimizer), as a fine-tune freezes."""


@pytest.fixture(scope="module")
def frozen_elastic(tmp_path_factory):
    """One process (a plain LayerCheck, which writes the frozen parameters once, then
    partial versions that leave them out) killed once step 5 is committed, resumed by
    FSDP2 on 2 ranks to the end."""
    root = tmp_path_factory.mktemp("frozen")
    ckpt = root / "ckpt"
    killed = ONE.kill_mid_run(ckpt, root / "o1", *FROZEN, "--plain", at=5)
    JOB.run("--dir", str(ckpt), "--out", str(root / "o2"), *FROZEN, "--check-elastic",
            "--scramble-frozen")  # the frozen weights equal the saved ones only if restored
    return {"ckpt": ckpt, "killed_at": killed, "two": JOB.results(root / "o2")}


def test_a_partial_version_of_one_process_resumes_on_two_fsdp2_ranks_exactly(frozen_elastic):
    """The layer with frozen parameters comes from a partial version (its frozen tensors
    in an older full one): each rank's rows of the trained and the frozen parameters,
    and the trained ones' Adam state, equal the composite's; the frozen ones have none."""
    assert frozen_elastic["killed_at"] == 5
    view = read_manifest(LocalStore(frozen_elastic["ckpt"]))
    for rank in frozen_elastic["two"]:
        assert rank["restored_step"] == 5 and rank["problems"] == [], rank["problems"]
        assert rank["layouts"] == [0], rank["sources"]
    chosen = frozen_elastic["two"][0]["sources"]["model.layers.0"]
    version = next(v for v in view.versions["model.layers.0"] if v.step == chosen)
    assert version.frozen and version.base is not None and version.base < chosen, version


def test_exports_of_a_partial_version_hold_its_frozen_parameters(frozen_elastic, tmp_path):
    """hf of step 5 (the one process's partial versions) and dcp of the newest step: the
    frozen attention is in both, as trained (it never moved: the final weights' digests)."""
    ckpt, final = str(frozen_elastic["ckpt"]), frozen_elastic["two"][0]["params"]
    frozen = [n for n in final if n.startswith("model.layers.0.self_attn")]
    assert cli(["export", ckpt, "--step", "5", "--out", str(tmp_path / "hf")]) == 0
    weights = load_file(tmp_path / "hf" / "model.safetensors")
    assert frozen and all(digest(weights[n]) == final[n] for n in frozen), sorted(weights)
    assert cli(["export", ckpt, "--format", "dcp", "--out", str(tmp_path / "dcp")]) == 0
    import torch.distributed.checkpoint as dcp
    from tests.layercheck.fsdp_worker import build
    from torch.distributed.checkpoint.state_dict import get_state_dict
    model, optimizer, _ = build(STEPS, shard=False, freeze=("model.layers.0.self_attn",))
    model_sd, _ = get_state_dict(model, optimizer)
    dcp.load({"model": model_sd}, checkpoint_id=str(tmp_path / "dcp"), no_dist=True)
    assert all(digest(model_sd[n]) == final[n] for n in frozen)


MESH = ("--steps", str(STEPS), "--smax", "4", "--data-ranks", "6", "--learnable", "--lr", "1e-2")
"""The global batch of 6 ranks' micro-batches: whole at 1, 2 and 3 ranks."""


@pytest.fixture(scope="module")
def elastic_mesh(tmp_path_factory):
    """FSDP2 on 2 ranks killed at step 5, resumed by FsdpLayerCheck on a 1-rank mesh,
    killed at step 7, resumed on 3 ranks (uneven row chunks) to the end."""
    root = tmp_path_factory.mktemp("mesh")
    ckpt = root / "ckpt"
    JOB.run("--dir", str(root / "free"), "--out", str(root / "free-out"), *MESH)
    first = JOB.kill_mid_run(ckpt, root / "o1", *MESH, at=5)
    second = ONE.kill_mid_run(ckpt, root / "o2", *MESH, "--check-elastic", "--threshold",
                              "0.03", at=7)
    JOB.run("--dir", str(ckpt), "--out", str(root / "o3"), *MESH, "--check-elastic", ranks=3)
    return {"ckpt": ckpt, "killed_at": (first, second), "free": JOB.results(root / "free-out"),
            "one": ONE.results(root / "o2")[0], "three": JOB.results(root / "o3", ranks=3)}


def test_fsdp2_resumes_on_a_one_rank_mesh_then_on_three_ranks_exactly(elastic_mesh):
    assert elastic_mesh["killed_at"] == (5, 7)
    one = elastic_mesh["one"]
    assert one["restored_step"] == 5 and one["problems"] == [] and one["layouts"] == [0]
    for rank in elastic_mesh["three"]:
        assert rank["restored_step"] == 7 and rank["problems"] == [], rank["problems"]
        assert rank["layouts"] == [0, 1], rank["sources"]
    view = read_manifest(LocalStore(elastic_mesh["ckpt"]))
    assert {k: (v.world_size, v.backend) for k, v in view.layouts.items()} == {
        0: (2, "fsdp"), 1: (1, "fsdp"), 2: (3, "fsdp")}
    last = str(STEPS)
    resumed, free = elastic_mesh["three"][0]["global_losses"], elastic_mesh["free"][0]["global_losses"]
    assert abs(resumed[last] - free[last]) <= 0.01 * free[last], (resumed, free)
    assert len({json.dumps(r["params"]) for r in elastic_mesh["three"]}) == 1


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_a_dcp_export_of_a_composite_of_two_layouts_loads_whole(elastic, tmp_path):
    """Step 7's composite takes layers from the 2-rank and the one-process layout: the DCP
    export joins each version by its own layout, and a plain model loads it whole."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    from layercheck.tools.dcpcheckpoint import assemble
    from layercheck.recovery import make_plan
    from tests.layercheck.fsdp_worker import build
    export = tmp_path / "dcp"
    assert cli(["export", str(elastic["ckpt"]), "--step", "7", "--format", "dcp",
                "--out", str(export)]) == 0
    store = LocalStore(elastic["ckpt"])
    view = read_manifest(store)
    plan = make_plan(store, view, 7)
    assert {v.layout for v in plan.sources.values()} == {0, 1}
    model, optimizer, _ = build(STEPS, shard=False)
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd, "layercheck": {"step": 0}}
    dcp.load(state, checkpoint_id=str(export), no_dist=True)
    set_state_dict(model, optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optim"])
    composite = assemble(store, view, plan, None)
    for name, p in model.named_parameters():
        assert torch.equal(p.detach(), composite.weights[name]), name
        for field in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(optimizer.state[p][field], composite.optimizer[name][field])


@pytest.mark.slow
@pytest.mark.parametrize("writer", ["fsdp", "plain"])
def test_a_frozen_attention_that_moves_is_restored_on_two_fsdp2_ranks_as_it_was(tmp_path, writer):
    """A frozen attention moved after every step from step 2 (through ``.data``, as an EMA
    teacher is), written by FSDP2 on 2 ranks (every version holds every parameter) or by
    one process (partial versions, which hold a frozen tensor once it moves): a restore
    of step 6 on 2 FSDP2 ranks, the frozen weights scrambled first, gives each weight
    back as it was at step 6."""
    ckpt, moving = tmp_path / "c", ("--steps", "6", "--threshold", "0", "--freeze",
                                    "model.layers.0.self_attn", "--move-frozen", "2")
    first = ONE if writer == "plain" else JOB
    first.run("--dir", str(ckpt), "--out", str(tmp_path / "o1"), *moving,
              *(("--plain",) if writer == "plain" else ()))
    JOB.run("--dir", str(ckpt), "--out", str(tmp_path / "o2"), *moving, "--scramble-frozen")
    trained = first.results(tmp_path / "o1")[0]["params"]
    frozen = [n for n in trained if n.startswith("model.layers.0.self_attn")]
    assert len(frozen) == 7
    for rank in JOB.results(tmp_path / "o2"):
        assert rank["restored_step"] == 6
        assert all(rank["params"][n] == trained[n] for n in frozen), writer
