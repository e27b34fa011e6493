"""Only what trains: layer versions of a model with frozen parameters (issue 29).

A plain tiny Qwen2 with parameters frozen by ``requires_grad_(False)``; the
PEFT LoRA runs are in test_lora.py. Threshold 0 and warm-up 1: every layer
written at every step from step 1 (the base checkpoint) on.
"""
from __future__ import annotations

import torch
from safetensors import safe_open

from layercheck import LayerCheck, LayerCheckConfig
from layercheck.tools.cleanup import collect_garbage
from layercheck.storage.manifest import read_manifest
from layercheck.recovery import make_plan
from layercheck.storage.localstore import LocalStore
from tests.conftest import tiny_lm, train_step

EVERY_STEP = LayerCheckConfig(base_threshold=0, embedding_threshold=0, warmup_steps=1)
TRAINS = ("self_attn.q_proj", "self_attn.v_proj")


def frozen_model(seed: int = 0, *, every_parameter: bool = False):
    """A tiny Qwen2 whose only trainable parameters are q_proj and v_proj of each block;
    the optimizer holds those (or, ``every_parameter``, all: AdamW steps those with a
    gradient, so one unfrozen later trains)."""
    model = tiny_lm(seed=seed, layers=2)
    for name, p in model.named_parameters():
        p.requires_grad_(any(part in name for part in TRAINS))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad or every_parameter],
                            lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    return model, opt, sched


def run(directory, steps: int, *, model=None, restore: int = 0, config=EVERY_STEP,
        between=None):
    """Train ``steps`` steps with LayerCheck; ``restore``: the step restore() must return;
    ``between(step, model, opt)``: called before each step (to change what trains)."""
    if model is None:
        model, opt, sched = frozen_model()
    else:
        model, opt, sched = model
    with LayerCheck(model, opt, directory, config, scheduler=sched) as lc:
        assert lc.restore() == restore
        for t in range(restore + 1, restore + steps + 1):
            if between is not None:
                between(t, model, opt)
            train_step(model, opt, sched)
            lc.step()
    return model, opt


def keys(root, version) -> set[str]:
    with safe_open(root / version.file, "pt") as f:
        return set(f.keys())


def test_a_version_after_the_base_holds_only_what_trains(tmp_path):
    root = tmp_path / "c"
    model, _ = run(root, 4)
    view = read_manifest(LocalStore(root))
    block = view.versions["model.layers.0"]
    assert [v.step for v in block] == [1, 2, 3, 4]
    base, later = block[0], block[1:]
    trains = {n for n, p in model.named_parameters() if p.requires_grad and "layers.0." in n}
    assert base.base is None and keys(root, base) >= {f"param/{n}" for n in trains}
    assert len(base.frozen) == 8  # k (and its bias), o, gate, up, down, two norms
    for version in later:
        assert version.base == 1 and version.frozen == base.frozen
        params = {k for k in keys(root, version) if k.startswith("param/")}
        assert params == {f"param/{n}" for n in trains}  # nothing frozen written again
        optim = {k.split("/", 2)[2] for k in keys(root, version) if k.startswith("optim/")}
        assert optim == trains
        assert version.bytes < base.bytes / 2
    # a layer with nothing that trains writes (almost) nothing after the base
    norm = view.versions["model.norm"]
    assert norm[0].frozen == ("model.norm.weight",) and norm[-1].bytes < 200


def test_a_restore_from_partial_versions_continues_bit_for_bit(tmp_path):
    torch.manual_seed(1)
    reference, ref_opt = run(tmp_path / "ref", 8)
    torch.manual_seed(1)
    run(tmp_path / "c", 4)
    torch.manual_seed(99)  # another RNG state and other weights, frozen ones too
    model, opt = run(tmp_path / "c", 4, model=_other(seed=5), restore=4)
    for (name, p), q in zip(reference.named_parameters(), model.parameters()):
        assert torch.equal(p, q), name
    for p, q in zip(ref_opt.param_groups[0]["params"], opt.param_groups[0]["params"]):
        for field, value in ref_opt.state[p].items():
            assert torch.equal(value, opt.state[q][field]), field


def _other(seed: int):
    model, opt, sched = frozen_model(seed=seed)
    return model, opt, sched


def test_a_tensor_unfrozen_later_is_written_and_one_frozen_later_makes_a_full_version(tmp_path):
    root = tmp_path / "c"

    def between(t, model, opt):
        up = model.model.layers[0].mlp.up_proj.weight
        q = model.model.layers[0].self_attn.q_proj.weight
        if t == 3:  # up_proj starts training
            up.requires_grad_(True)
        if t == 5:  # q_proj stops
            q.requires_grad_(False)

    run(root, 6, model=frozen_model(every_parameter=True), between=between)
    block = read_manifest(LocalStore(root)).versions["model.layers.0"]
    up, q = "model.layers.0.mlp.up_proj.weight", "model.layers.0.self_attn.q_proj.weight"
    by_step = {v.step: v for v in block}
    assert up in by_step[2].frozen and f"param/{up}" not in keys(root, by_step[2])
    assert up not in by_step[3].frozen and f"param/{up}" in keys(root, by_step[3])
    assert by_step[3].base == by_step[4].base == 1
    full = by_step[5]  # q_proj frozen since step 5 only: its value at 1 is stale
    assert full.base is None and q in full.frozen and f"param/{q}" in keys(root, full)
    assert by_step[6].base == 5 and f"param/{q}" not in keys(root, by_step[6])


def test_plan_reads_the_full_version_and_gc_keeps_it(tmp_path):
    root = tmp_path / "c"
    run(root, 5)
    store = LocalStore(root)
    plan = make_plan(store, read_manifest(store))
    assert plan.sources["model.layers.1"].step == 5
    assert plan.bases["model.layers.1"].step == 1
    row = next(r for r in plan.to_dict()["layers"] if r["layer"] == "model.layers.1")
    assert row["frozen_from_step"] == 1 and row["frozen_tensors"] == 8
    collect_garbage(store, keep=1)
    view = read_manifest(store)
    assert [v.step for v in view.versions["model.layers.1"]] == [1, 5]
    assert (root / view.versions["model.layers.1"][0].file).exists()
    run(root, 1, restore=5)  # still restorable


def test_retention_keeps_the_full_versions_partial_ones_read(tmp_path):
    """The base checkpoint's, and one written later (q_proj frozen at step 3) that
    is no base checkpoint's: kept while every other version goes."""
    root = tmp_path / "c"
    config = LayerCheckConfig(base_threshold=0, embedding_threshold=0, warmup_steps=1,
                              keep_versions=1)

    def between(t, model, opt):
        if t == 3:
            model.model.layers[0].self_attn.q_proj.weight.requires_grad_(False)

    run(root, 5, config=config, between=between)
    view = read_manifest(LocalStore(root))
    assert [v.step for v in view.versions["model.layers.0"]] == [1, 3, 5]
    assert [v.step for v in view.versions["model.layers.1"]] == [1, 5]
    run(root, 2, restore=5, config=config)


def test_a_partial_version_whose_full_version_is_gone_is_passed_over(tmp_path):
    """Its frozen parameters are nowhere: the plan falls back (here to the full version
    itself being gone too, so nothing): it never restores a layer half-way."""
    import pytest
    from layercheck.contract.errors import CheckpointNotFound
    root = tmp_path / "c"
    run(root, 3)
    store = LocalStore(root)
    full = read_manifest(store).versions["model.layers.0"][0]
    (root / full.file).unlink()
    with pytest.raises(CheckpointNotFound, match="model.layers.0"):
        make_plan(store, read_manifest(store))


def test_a_write_budget_charges_a_layer_what_its_versions_after_the_base_cost(tmp_path):
    """The budget's size of a layer is the bytes its later versions write (what trains and
    its optimizer state), not the base's frozen weights, fresh and after a restore."""
    config = LayerCheckConfig(base_threshold=0, embedding_threshold=0, warmup_steps=1,
                              write_budget=1e6)
    root = tmp_path / "c"
    model, opt, sched = frozen_model()
    with LayerCheck(model, opt, root, config, scheduler=sched) as lc:
        lc.restore()
        for _ in range(2):
            train_step(model, opt, sched)
            lc.step()
        fresh = lc.policy.sizes.copy()
    partial = read_manifest(LocalStore(root)).versions["model.layers.0"][1]
    with safe_open(root / partial.file, "pt") as f:
        expected = sum(f.get_tensor(k).numel() * f.get_tensor(k).element_size() for k in f.keys())
    assert fresh[1] == expected
    model, opt, sched = frozen_model(seed=3)
    with LayerCheck(model, opt, root, config, scheduler=sched) as lc:
        lc.restore()
        assert list(lc.policy.sizes) == list(fresh)


class FailsOnce:
    """A LocalStore whose first write of ``path`` fails (ENOSPC)."""

    def __init__(self, root, path: str) -> None:
        self.inner, self.url, self.path, self.failed = LocalStore(root), str(root), path, False

    def write_atomic(self, path: str, data) -> None:
        import errno
        import os
        if path == self.path and not self.failed:
            self.failed = True
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
        self.inner.write_atomic(path, data)

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


def test_a_layer_whose_full_version_failed_writes_its_next_version_in_full(tmp_path):
    """Under on_error='warn' the base checkpoint's version of a block fails: the partial
    versions after it would name a full version that never committed, so its next
    version is full again, and the run is restorable from it on."""
    root = tmp_path / "c"
    store = FailsOnce(root, "layers/model.layers.0@000000001.safetensors")
    config = LayerCheckConfig(base_threshold=0, embedding_threshold=0, warmup_steps=1,
                              on_error="warn")
    model, opt, sched = frozen_model()
    with LayerCheck(model, opt, store, config, scheduler=sched) as lc:
        lc.restore()
        for t in range(1, 4):
            train_step(model, opt, sched)
            lc.step()
            if t == 1:
                lc.flush()  # the failure is known before step 2 is decided
    assert store.failed
    block = {v.step: v for v in read_manifest(LocalStore(root)).versions["model.layers.0"]}
    assert sorted(block) == [2, 3]
    assert block[2].base is None and f"param/{block[2].frozen[0]}" in keys(root, block[2])
    assert block[3].base == 2
    run(root, 1, restore=3, config=config)


class StudentTeacher(torch.nn.Module):
    """A student that trains and its teacher, frozen (``requires_grad`` False) but moved
    after every step as an average of the student (MoCo, DINO, BYOL)."""

    def __init__(self, seed: int = 0) -> None:
        import copy
        super().__init__()
        self.student = tiny_lm(seed=seed, layers=2)
        self.teacher = copy.deepcopy(self.student).requires_grad_(False)

    def forward(self, input_ids, labels):
        return self.student(input_ids=input_ids, labels=labels)

    def follow(self, momentum: float = 0.9) -> None:
        """MoCo's own update, through ``.data`` (which no autograd version counter sees)."""
        for t, s in zip(self.teacher.parameters(), self.student.parameters()):
            t.data.mul_(momentum).add_(s.data, alpha=1 - momentum)


def ema_run(directory, steps: int, *, seed: int = 0, restore: int = 0, pretrained=None,
            follow_from: int = 1):
    """The student trains, the teacher follows it from step ``follow_from`` on."""
    model = StudentTeacher(seed)
    opt = torch.optim.AdamW(model.student.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    with LayerCheck(model, opt, directory, EVERY_STEP, scheduler=sched,
                    pretrained=pretrained) as lc:
        assert lc.restore() == restore
        for t in range(restore + 1, restore + steps + 1):
            train_step(model, opt, sched)
            if t >= follow_from:
                model.follow()
            lc.step()
    return model


def assert_same(live, restored) -> None:
    for (name, p), q in zip(live.named_parameters(), restored.parameters()):
        assert torch.equal(p, q), name


def test_a_frozen_teacher_that_moves_every_step_is_restored_as_it_was(tmp_path):
    """Frozen is not unchanged: each teacher tensor changes at every step although it
    does not train; a restore of step 6 gives back its step-6 value, not step 1's."""
    torch.manual_seed(1)
    live = ema_run(tmp_path / "c", 6)
    assert_same(live, ema_run(tmp_path / "c", 0, seed=5, restore=6))
    teacher = read_manifest(LocalStore(tmp_path / "c")).versions["teacher"]
    assert all(v.base is None and not v.frozen for v in teacher[1:])  # moving: all written


def test_a_teacher_found_in_the_pretrained_file_is_written_once_it_moves(tmp_path):
    """pretrained=: the base checkpoint names the teacher's tensors by reference (they
    equal the pretrained file's then); once the teacher moves, its versions hold it."""
    StudentTeacher(0).student.save_pretrained(tmp_path / "pretrained")
    torch.manual_seed(1)
    live = ema_run(tmp_path / "c", 6, pretrained=tmp_path / "pretrained", follow_from=3)
    assert_same(live, ema_run(tmp_path / "c", 0, seed=5, restore=6,
                              pretrained=tmp_path / "pretrained"))
    teacher = {v.step: v for v in read_manifest(LocalStore(tmp_path / "c")).versions["teacher"]}
    assert teacher[1].refs and teacher[2].base == 1  # by reference, then left out
    assert teacher[3].base is None and not teacher[3].frozen  # moved: written


def test_a_frozen_tensor_changed_once_is_written_and_the_rest_still_left_out(tmp_path):
    """One frozen weight of a block is rescaled at step 3 (through ``.data``): versions
    from then on hold it, the block's other frozen weights stay in the full version."""
    root = tmp_path / "c"
    k = "model.layers.0.self_attn.k_proj.weight"

    def between(t, model, opt):
        if t == 3:
            model.model.layers[0].self_attn.k_proj.weight.data.mul_(1.5)

    torch.manual_seed(1)
    live, _ = run(root, 5, between=between)
    restored, _ = run(root, 0, model=_other(seed=5), restore=5)
    assert_same(live, restored)
    block = {v.step: v for v in read_manifest(LocalStore(root)).versions["model.layers.0"]}
    assert k in block[2].frozen and f"param/{k}" not in keys(root, block[2])
    for step in (3, 4, 5):
        assert block[step].base == 1 and len(block[step].frozen) == 7, step
        assert k not in block[step].frozen and f"param/{k}" in keys(root, block[step])
