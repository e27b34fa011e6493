"""A restore that fails leaves the model, optimizer and scheduler as they were (issue 27, 4-8).

Every check that can fail runs before the first byte is copied in: the
optimizer's and the scheduler's types and state layouts with the training
state, each layer against the live model and optimizer. Re-reads at the apply
(layers beyond ``restore_memory``) come first and are retried; the one write
after the apply (the timeline's ``resume`` record) says, when it fails, what
the objects now hold. Each test compares the live objects bit for bit.
"""
from __future__ import annotations

import warnings

import pytest
import torch

from layercheck import LayerCheck, LayerCheckConfig
from layercheck.contract.config import ConfigError
from layercheck.contract.errors import (LayerCheckError, ModelMismatch, RestoreIncomplete,
                                        TimelineNotRecorded)
from layercheck.storage.format import MANIFEST, checksum, decode_line, encode_record
from layercheck.storage.manifest import read_manifest
from layercheck.storage.localstore import LocalStore
from tests.conftest import every_layer_checkpoint, optimizer_for, tiny_lm, train_step
from tests.stores import FailingReads, FullAppends

EVERY_STEP = LayerCheckConfig(base_threshold=0, embedding_threshold=0, warmup_steps=2)


def _live(model, opt, sched=None):
    """Everything a restore may change: weights, buffers, optimizer state and
    hyper-parameters, the scheduler's state."""
    names = {id(p): n for n, p in model.named_parameters()}
    return ({n: t.detach().clone() for n, t in model.state_dict().items()},
            {(names[id(p)], k): (v.clone() if torch.is_tensor(v) else v)
             for p, s in opt.state.items() for k, v in s.items()},
            [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups],
            sched.state_dict() if sched is not None else None)


def _same(a, b):
    for part in (0, 1):
        assert a[part].keys() == b[part].keys()
        for key in a[part]:
            x, y = a[part][key], b[part][key]
            assert (torch.equal(x, y) if torch.is_tensor(x) else x == y), key
    assert a[2] == b[2] and a[3] == b[3]


def _checkpoint(directory, make, steps=4):
    """``directory`` trained ``steps`` steps (every layer at every step from 2) with
    the optimizer and scheduler ``make(model)`` builds."""
    torch.manual_seed(0)
    model = tiny_lm()
    opt, sched = make(model)
    with LayerCheck(model, opt, directory, EVERY_STEP, scheduler=sched) as lc:
        lc.restore()
        for _ in range(steps):
            train_step(model, opt, sched)
            lc.step()
    return directory


def _refused(directory, make, error, match, *, trained=True, config=None):
    """A restore of ``directory`` into what ``make`` builds (stepped once when
    ``trained``) raises ``error`` matching ``match``; everything is as it was."""
    model = tiny_lm(seed=4)
    opt, sched = make(model)
    if trained:
        train_step(model, opt, sched)
    before = _live(model, opt, sched)
    with LayerCheck(model, opt, directory, config, scheduler=sched) as lc:
        with pytest.raises(error, match=match) as info:
            lc.restore()
    _same(before, _live(model, opt, sched))
    return info.value


def adamw_lambda(model):
    return optimizer_for(model, total=20)


def adamw_step(model):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return opt, torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)


def adamw_sequential(model):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.SequentialLR(
        opt, [torch.optim.lr_scheduler.LinearLR(opt, 0.1, total_iters=2),
              torch.optim.lr_scheduler.StepLR(opt, step_size=2)], milestones=[2])
    return opt, sched


def sgd_lambda(model):
    opt = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)


# -- 5: another scheduler type ------------------------------------------------------
@pytest.mark.parametrize("saved, restored, live", [
    (adamw_step, adamw_lambda, "LambdaLR"), (adamw_step, adamw_sequential, "SequentialLR"),
    (adamw_lambda, adamw_step, "StepLR")])
def test_another_scheduler_type_is_refused_before_anything_changes(tmp_path, saved, restored,
                                                                   live):
    """StepLR saved, LambdaLR or SequentialLR restored raised KeyError ('lr_lambdas',
    '_schedulers') after the weights were copied; LambdaLR saved into StepLR was
    taken silently (StepLR's state got LambdaLR's fields)."""
    directory = _checkpoint(tmp_path / "c", saved)
    error = _refused(directory, restored, ModelMismatch, "scheduler")
    assert live in str(error) and "scheduler=None" in str(error)


def test_a_scheduler_of_another_layout_is_refused_in_an_older_checkpoint(tmp_path):
    """A checkpoint written before the scheduler's type was recorded: its saved state's
    layout (the fields load_state_dict needs) is still checked."""
    directory = _checkpoint(tmp_path / "c", adamw_step)
    _strip_state_records(directory, "scheduler_type", "optimizer")
    error = _refused(directory, adamw_sequential, ModelMismatch, "scheduler")
    assert "_schedulers" in str(error)


def test_the_same_scheduler_type_restores_and_trains_on(tmp_path):
    directory = _checkpoint(tmp_path / "c", adamw_sequential)
    model = tiny_lm(seed=4)
    opt, sched = adamw_sequential(model)
    with LayerCheck(model, opt, directory, scheduler=sched) as lc:
        assert lc.restore() == 4
    assert sched.last_epoch == 4
    train_step(model, opt, sched)


# -- 7: another optimizer type ------------------------------------------------------
@pytest.mark.parametrize("trained", [False, True])
@pytest.mark.parametrize("saved, restored, names", [
    (sgd_lambda, adamw_lambda, ("SGD", "AdamW")), (adamw_lambda, sgd_lambda, ("AdamW", "SGD"))])
def test_another_optimizer_type_is_refused_before_anything_changes(tmp_path, saved, restored,
                                                                   names, trained):
    """SGD saved, AdamW restored: the restore succeeded and the first step raised
    KeyError 'exp_avg'; AdamW saved, SGD restored: SGD's state held exp_avg."""
    directory = _checkpoint(tmp_path / "c", saved)
    error = _refused(directory, restored, ModelMismatch, "optimizer", trained=trained)
    assert all(name in str(error) for name in names) and "export" in str(error)


def test_an_older_checkpoint_without_the_optimizer_record_still_restores(tmp_path):
    directory = _checkpoint(tmp_path / "c", adamw_lambda)
    _strip_state_records(directory, "scheduler_type", "optimizer")
    model = tiny_lm(seed=4)
    opt, sched = adamw_lambda(model)
    with LayerCheck(model, opt, directory, scheduler=sched) as lc:
        assert lc.restore() == 4
    train_step(model, opt, sched)


def test_an_older_checkpoint_is_checked_against_the_live_optimizers_state_layout(tmp_path):
    """Without the record, a live optimizer that has state shows its layout: SGD's
    momentum saved, AdamW's moments live, is refused per parameter."""
    directory = _checkpoint(tmp_path / "c", sgd_lambda)
    _strip_state_records(directory, "scheduler_type", "optimizer")
    error = _refused(directory, adamw_lambda, ModelMismatch, "optimizer state")
    assert "momentum_buffer" in str(error) and "exp_avg" in str(error)


def _strip_state_records(directory, *keys):
    """Make every committed training state look as one written before ``keys`` were
    recorded: the document without them, the manifest record re-checksummed."""
    import json
    from safetensors.torch import load_file, save
    from safetensors import safe_open
    lines = (directory / MANIFEST).read_bytes().splitlines(keepends=True)
    out = []
    for line in lines:
        record = decode_line(line)
        if record["kind"] == "state":
            path = directory / record["file"]
            with safe_open(str(path), "pt") as f:
                metadata = f.metadata()
            doc = json.loads(metadata["state"])
            for key in keys:
                doc.pop(key, None)
            data = save(load_file(path), metadata={**metadata, "state": json.dumps(doc)})
            path.write_bytes(data)
            record = {**record, "bytes": len(data), "checksum": checksum(data)}
            line = encode_record(record)
        out.append(line)
    (directory / MANIFEST).write_bytes(b"".join(out))


# -- 4: a failed re-read ------------------------------------------------------------


@pytest.fixture()
def six(tmp_path):
    return every_layer_checkpoint(tmp_path / "six")


def _restore_into_fresh(directory, store=None, **config):
    model = tiny_lm(seed=4)
    opt, sched = optimizer_for(model, total=20)
    train_step(model, opt, sched)
    before = _live(model, opt, sched)
    lc = LayerCheck(model, opt, store or directory, LayerCheckConfig(**config), scheduler=sched)
    return lc, model, opt, sched, before


def _sizes(directory):
    view = read_manifest(LocalStore(directory))
    return [view.versions[name][-1].bytes for name in view.layer_names], view


def test_a_transient_error_on_a_re_read_is_retried_and_restores_the_same(six):
    """Every layer beyond restore_memory fails its second read once: it was
    ReadFailed after other layers were copied in; now each re-read is retried."""
    lc, model, opt, sched, _ = _restore_into_fresh(six, restore_memory=0)
    with lc:
        lc.restore()
    expected = _live(model, opt, sched)
    store = FailingReads(six, after=2, times=1)
    lc, model, opt, sched, _ = _restore_into_fresh(six, store, restore_memory=0)
    with lc:
        assert lc.restore() == 6
    assert store.failed == len(_sizes(six)[0])
    _same(expected, _live(model, opt, sched))


def test_storage_lost_between_the_plan_and_the_apply_changes_nothing(six):
    """Three layers kept in memory, the rest read again at the apply, and the storage
    stops answering after the plan: the kept layers were copied in before the first
    re-read failed. The re-reads now come first: nothing is copied."""
    sizes, _ = _sizes(six)
    store = FailingReads(six, after=2)
    lc, model, opt, sched, before = _restore_into_fresh(six, store,
                                                        restore_memory=sum(sizes[:3]))
    with lc:
        with pytest.raises(LayerCheckError, match="nothing was changed") as info:
            lc.restore()
    assert "cannot be read" in str(info.value)
    _same(before, _live(model, opt, sched))


def test_a_re_read_that_fails_for_good_midway_says_what_the_model_holds(six):
    """A fault that starts in the middle of the re-reads and outlasts the retries:
    the model cannot be put back without a second copy of it in memory, so the
    error names each layer the checkpoint's values were copied into, says that
    the optimizer's hyper-parameters, scheduler and RNGs are untouched, and that
    restore() again completes it, which it does."""
    sizes, view = _sizes(six)
    last = view.layer_names[-1]
    store = FailingReads(six, after=2, only={view.versions[last][-1].file})
    lc, model, opt, sched, before = _restore_into_fresh(six, store, restore_memory=0)
    with lc:
        with pytest.raises(RestoreIncomplete, match="call restore\\(\\) again") as info:
            lc.restore()
        message = str(info.value)
        assert last in message.split("still hold")[1]
        assert all(name in message.split("still hold")[0] for name in view.layer_names[:-1])
        now = _live(model, opt, sched)
        assert now[2] == before[2] and now[3] == before[3]  # hyper-parameters, scheduler
        with pytest.raises(LayerCheckError, match="restore"):
            lc.step()
        store.after = 10 ** 9  # the storage answers again
        assert lc.restore() == 6
    clean = _restore_into_fresh(six, restore_memory=0)
    with clean[0]:
        clean[0].restore()
    _same(_live(*clean[1:4]), _live(model, opt, sched))


def test_a_second_restore_that_fails_midway_keeps_step_from_training_on(six):
    """A restore that completed, then one of step 5 that stops midway: step() had gone
    on from the first restore's timeline with the model half step 5."""
    _, view = _sizes(six)
    last = view.layer_names[-1]
    store = FailingReads(six, after=10 ** 9, only={view.versions[last][-2].file})
    lc, model, opt, sched, _ = _restore_into_fresh(six, store, restore_memory=0)
    with lc:
        assert lc.restore() == 6
        store.reads.clear()
        store.after = 2
        with pytest.raises(RestoreIncomplete, match="step 5"):
            lc.restore(5, exact=True)
        with pytest.raises(LayerCheckError, match="call restore"):
            lc.step()


# -- 6: ENOSPC on the resume record ---------------------------------------------------


def test_a_full_disk_at_the_resume_record_says_what_the_objects_hold(six):
    """The resume record is the last thing restore writes, after the apply (written
    first, a restore that then failed would have abandoned later steps): a bare
    OSError left the caller guessing. Now the error says the objects hold the
    restored step completely, the directory is unchanged, and what to do; step()
    refuses until a restore is recorded."""
    clean = _restore_into_fresh(six)
    with clean[0]:
        clean[0].restore()
    store = FullAppends(six, full=False)
    lc, model, opt, sched, _ = _restore_into_fresh(six, store)
    manifest = (six / MANIFEST).read_bytes()
    with lc:
        store.full = True
        with pytest.raises(TimelineNotRecorded, match="No space left") as info:
            lc.restore()
        assert "hold step 6" in str(info.value) and "restore() again" in str(info.value)
        assert (six / MANIFEST).read_bytes() == manifest
        _same(_live(*clean[1:4]), _live(model, opt, sched))
        with pytest.raises(LayerCheckError, match="restore"):
            lc.step()
        store.full = False
        assert lc.restore() == 6
        train_step(model, opt, sched)
        lc.step()
        lc.flush()
    assert 7 in read_manifest(LocalStore(six)).states


# -- the RNGs: applied last, so nothing there may fail -----------------------------------
def test_cuda_rng_states_go_to_their_own_devices_and_only_to_those_present(monkeypatch):
    """A state saved by a process that saw 12 GPUs, restored by one that sees 2: the
    states were set in the order of their names (rng/cuda/10 to device 2) and for
    every saved device, which CUDA refuses for a device it has not. This machine has
    no GPU: torch.cuda's generator setter is replaced by one that refuses, as CUDA
    does, a device beyond device_count()."""
    from layercheck.snapshot import apply_rng, capture_rng
    tensors, scalars = capture_rng()
    saved = {i: torch.full((16,), i, dtype=torch.uint8) for i in range(12)}
    tensors.update({f"rng/cuda/{i}": t for i, t in saved.items()})
    applied = []

    def set_rng_state(state, device="cuda"):
        if device >= 2:
            raise RuntimeError(f"CUDA error: invalid device ordinal {device}")
        applied.append((device, state))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_rng_state", set_rng_state)
    monkeypatch.setattr(torch.cuda.random, "set_rng_state", set_rng_state)
    apply_rng(tensors, scalars)
    assert [(d, int(s[0])) for d, s in applied] == [(0, 0), (1, 1)]


# -- 8: an optimizer made with lr=0 ---------------------------------------------------
def test_an_optimizer_made_with_lr_0_is_refused_with_the_fix(tmp_path):
    """lr=0 in every group (no scheduler's initial_lr): lr_peak was 0 and the first
    step() raised ZeroDivisionError. Thresholds scale by lr / lr_peak, which no
    lr_peak of 0 defines: refused at construction, naming lr_peak and lr_scaling."""
    model = tiny_lm()
    opt = torch.optim.AdamW(model.parameters(), lr=0.0)
    with pytest.raises(ConfigError, match="lr_peak") as info:
        LayerCheck(model, opt, tmp_path / "c", EVERY_STEP)
    assert "lr_scaling=False" in str(info.value)
    assert not (tmp_path / "c" / MANIFEST).exists()


@pytest.mark.parametrize("config", [dict(lr_peak=1e-3), dict(lr_scaling=False)])
def test_an_optimizer_made_with_lr_0_trains_with_either_fix(tmp_path, config):
    model = tiny_lm()
    opt = torch.optim.AdamW(model.parameters(), lr=0.0)
    cfg = LayerCheckConfig(base_threshold=0, embedding_threshold=0, warmup_steps=2, **config)
    with LayerCheck(model, opt, tmp_path / "c", cfg) as lc:
        lc.restore()
        for step in range(4):
            for group in opt.param_groups:  # a hand-written warm-up from 0
                group["lr"] = 1e-3 * step / 3
            ids = torch.randint(0, 128, (2, 8))
            model(input_ids=ids, labels=ids).loss.backward()
            opt.step()
            opt.zero_grad()
            lc.step()
    assert sorted(read_manifest(LocalStore(tmp_path / "c")).states) == [2, 3, 4]
