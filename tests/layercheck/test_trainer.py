"""LayerCheckCallback on real Hugging Face Trainer runs (tiny models, CPU): stop and
resume bit for bit, SIGKILL and restart, and the errors of misuse."""
from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import uuid
import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from transformers import Trainer, TrainerCallback  # noqa: E402

from layercheck import LayerCheck, LayerCheckConfig  # noqa: E402
from layercheck.contract.errors import LayerCheckError, ModelMismatch  # noqa: E402
from layercheck.storage.manifest import read_manifest  # noqa: E402
from layercheck.recovery import make_plan  # noqa: E402
from layercheck.storage.localstore import LocalStore  # noqa: E402
from layercheck.tiers import TierConfig  # noqa: E402
from layercheck.trainer import LayerCheckCallback  # noqa: E402
from tests.layercheck.halting import HaltingRun, sigkill_drill  # noqa: E402
from tests.layercheck.tinytrainer import Tokens, arguments, tiny_llama  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "finetune_trainer.py"
EVERY_STEP = LayerCheckConfig(base_threshold=0, embedding_threshold=0, warmup_steps=0)
class StopAt(TrainerCallback):
    """Ends training after step ``n`` (the Trainer's own way: should_training_stop)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.n:
            control.should_training_stop = True


def trainer_for(tmp: Path, *callbacks, steps: int, accumulation: int = 1, seed: int = 0) -> Trainer:
    return Trainer(tiny_llama(seed), arguments(tmp / "out", steps=steps, accumulation=accumulation),
                   train_dataset=Tokens(), callbacks=list(callbacks))


def losses(trainer: Trainer) -> dict[int, float]:
    return {e["step"]: e["loss"] for e in trainer.state.log_history if "loss" in e}


def assert_same_training_state(a: Trainer, b: Trainer) -> None:
    pa, pb = dict(a.model.named_parameters()), dict(b.model.named_parameters())
    assert pa.keys() == pb.keys()
    for name in pa:
        assert torch.equal(pa[name], pb[name]), name
    sa, sb = a.optimizer.state, b.optimizer.state
    for name in pa:
        for key, value in sa[pa[name]].items():
            assert torch.equal(value, sb[pb[name]][key]), (name, key)
    assert a.lr_scheduler.get_last_lr() == b.lr_scheduler.get_last_lr()
    assert a.state.global_step == b.state.global_step and a.state.epoch == b.state.epoch


# -- stop and resume: bit for bit --------------------------------------------------
@pytest.mark.parametrize("stop, accumulation", [(7, 1), (5, 1), (7, 2)],
                         ids=["mid-epoch", "epoch-boundary", "grad-accumulation"])
def test_threshold_zero_stop_and_resume_equals_an_uninterrupted_run(tmp_path, stop, accumulation):
    steps = 12  # 5 optimizer steps per epoch: the run spans three epochs of reshuffled data
    reference = trainer_for(tmp_path, steps=steps, accumulation=accumulation)
    reference.train()

    first = LayerCheckCallback(tmp_path / "ckpt", EVERY_STEP)
    trainer = trainer_for(tmp_path, first, StopAt(stop), steps=steps, accumulation=accumulation)
    assert first.resume_checkpoint() is None and not (tmp_path / "ckpt").exists()
    trainer.train(resume_from_checkpoint=first.resume_checkpoint())
    assert trainer.state.global_step == stop and first.restored_step == 0

    # a new process in all but name: another callback, another Trainer, other initial weights
    again = LayerCheckCallback(tmp_path / "ckpt", EVERY_STEP)
    resumed = trainer_for(tmp_path, again, steps=steps, accumulation=accumulation, seed=7)
    folder = again.resume_checkpoint()
    assert Path(folder).name == f"checkpoint-{stop}"
    resumed.train(resume_from_checkpoint=folder)

    assert again.restored_step == stop
    assert losses(resumed) == {s: v for s, v in losses(reference).items() if s > stop}
    assert_same_training_state(resumed, reference)


def test_warmup_from_lr_zero_with_weight_decay(tmp_path):
    """The Trainer's warm-up schedules give the first step LR 0: nothing moves, drift is 0."""
    args = arguments(tmp_path / "out", steps=3)
    args.warmup_steps = 2
    callback = LayerCheckCallback(tmp_path / "ckpt", EVERY_STEP)
    drift = {}

    class Watch(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            report = callback.layercheck.last_report
            drift[report.step] = (report.lr, report.drift.copy())

    Trainer(tiny_llama(), args, train_dataset=Tokens(), callbacks=[callback, Watch()]).train()
    assert drift[1][0] == 0 and not drift[1][1].any() and drift[2][1].all()
    assert read_manifest(LocalStore(tmp_path / "ckpt")).latest_step() == 3


def test_resuming_from_the_trainers_own_checkpoint_restores_that_steps_composite(tmp_path):
    args = arguments(tmp_path / "out", steps=8)
    args.save_strategy, args.save_steps = "steps", 4
    first = Trainer(tiny_llama(), args, train_dataset=Tokens(), callbacks=[
        LayerCheckCallback(tmp_path / "ckpt", EVERY_STEP), StopAt(6)])
    first.train()
    callback = LayerCheckCallback(tmp_path / "ckpt", EVERY_STEP)
    trainer = Trainer(tiny_llama(seed=7), args, train_dataset=Tokens(), callbacks=[callback])
    trainer.train(resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-4"))
    assert callback.restored_step == 4 and trainer.state.global_step == 8
    assert read_manifest(LocalStore(tmp_path / "ckpt")).resumes[-1] == 4  # 5, 6 abandoned


def test_a_url_directory_resumes_through_a_local_folder(tmp_path):
    url = f"memory://layercheck-trainer-{uuid.uuid4().hex}"
    trainer_for(tmp_path, LayerCheckCallback(url, EVERY_STEP), StopAt(4), steps=8).train()
    callback = LayerCheckCallback(url, EVERY_STEP)
    trainer = trainer_for(tmp_path, callback, steps=8)
    with pytest.raises(LayerCheckError, match=r"resume_checkpoint\(into="):
        callback.resume_checkpoint()
    folder = callback.resume_checkpoint(into=tmp_path / "resume")
    trainer.train(resume_from_checkpoint=folder)
    assert callback.restored_step == 4 and trainer.state.global_step == 8


# -- SIGKILL mid-run, restart -----------------------------------------------------------
STEPS = 100
KILL_AT = 50  # the child halts once this step is committed; the kill comes then


def _example(ckpt: Path, log: Path, **kw) -> HaltingRun:
    return HaltingRun(EXAMPLE, ["--ckpt", str(ckpt), "--steps", str(STEPS), "--losses", str(log)],
                      **kw)


@pytest.mark.slow
def test_sigkill_mid_run_then_restart_finishes_within_one_percent(tmp_path):
    def killed(ckpt: Path) -> None:
        store = LocalStore(ckpt, create=False)
        view = read_manifest(store)
        assert view.latest_step() == KILL_AT
        # the composite is genuinely mixed: some layer comes from before the resume step
        assert max(make_plan(store, view).staleness().values()) > 0

    sigkill_drill(_example, tmp_path, kill_at=KILL_AT, steps=STEPS, killed=killed)


# -- the memory tier: SIGKILL, restart at the failure step --------------------------------------
TIERS_WORKER = ROOT / "tests" / "layercheck" / "trainer_tiers_worker.py"


def _tiers_run(work: Path, out: str, halt_at: int | None = None) -> HaltingRun:
    return HaltingRun(TIERS_WORKER, ["--ckpt", str(work / "ckpt"), "--tier", str(work / "mem"),
                                     "--out", str(work / out), "--steps", "12"],
                      halt_at=halt_at, stdout=subprocess.DEVNULL,
                      stderr=open(work.with_suffix(".err"), "ab"))


def test_with_tiers_a_sigkilled_run_resumes_at_the_failure_step_bit_identical(tmp_path):
    """LayerCheckCallback(tiers=...): a Trainer run SIGKILLed once step 7 is committed
    resumes at step 7 from the memory tier (storage's layers are of step 2), its model,
    optimizer, scheduler, RNGs and Trainer state equal to the failure-free run's at
    step 7, and ends as that run ends (``trainer_tiers_worker.py``)."""
    (tmp_path / "clean").mkdir()
    (tmp_path / "crash").mkdir()
    clean = _tiers_run(tmp_path / "clean", "out.json")
    crash = _tiers_run(tmp_path / "crash", "first.json", halt_at=7)
    assert crash.wait_for("restored")["step"] == 0
    crash.wait_for("halted")
    crash.kill()
    assert clean.wait() == 0, (tmp_path / "clean.err").read_text()[-3000:]
    reference = json.loads((tmp_path / "clean" / "out.json").read_text())
    store = LocalStore(tmp_path / "crash" / "ckpt", create=False)
    # storage alone: the composite of step 7, every layer stale since the base (step 2)
    assert set(make_plan(store, read_manifest(store)).staleness().values()) == {5}

    again = _tiers_run(tmp_path / "crash", "again.json")
    assert again.wait() == 0, (tmp_path / "crash.err").read_text()[-3000:]
    resumed = json.loads((tmp_path / "crash" / "again.json").read_text())
    assert resumed["restored_step"] == 7
    assert resumed["restored_state"] == reference["states"]["7"]
    assert resumed["restored_digest"] == reference["digests"]["7"]
    assert set(map(tuple, resumed["sources"].values())) == {("memory", 7)}
    assert sorted(map(int, resumed["digests"])) == list(range(8, 13))
    end, reference_end = resumed["digests"]["12"], reference["digests"]["12"]
    assert {part: end[part] for part in ("model", "optimizer", "scheduler", "rng")} == {
        part: reference_end[part] for part in ("model", "optimizer", "scheduler", "rng")}
    # the Trainer adds a step's flops to total_flos after on_step_end: a resume lacks those
    # of the failure step, as from storage (docs/trainer.md); the rest is the same
    lagging = ("total_flos",)
    assert {k: v for k, v in resumed["states"]["12"].items() if k not in lagging} == {
        k: v for k, v in reference["states"]["12"].items() if k not in lagging}


def test_with_tiers_a_run_resumes_from_memory_before_storage_holds_a_step(tmp_path):
    """Within the warm-up storage holds no step, the memory tier every one: a fresh
    train() over it is refused, resume_checkpoint() resumes at the last step, and the
    run ends as an uninterrupted one (threshold 0 after the warm-up: bit for bit)."""
    config = dataclasses.replace(EVERY_STEP, warmup_steps=50)
    tiers = TierConfig(folder=str(tmp_path / "mem"), budget_bytes=64 << 20)
    first = LayerCheckCallback(tmp_path / "ckpt", config, tiers=tiers)
    trainer_for(tmp_path, first, StopAt(4), steps=8).train()
    assert read_manifest(LocalStore(tmp_path / "ckpt", create=False)).latest_step() is None

    fresh = LayerCheckCallback(tmp_path / "ckpt", config, tiers=tiers)
    with pytest.raises(LayerCheckError, match="up to step 4.*resume_checkpoint"):
        trainer_for(tmp_path, fresh, steps=8).train()

    again, sources = LayerCheckCallback(tmp_path / "ckpt", config, tiers=tiers), {}

    class Sources(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            sources.update(again.layercheck.tiers.last.sources)

    resumed = trainer_for(tmp_path, again, Sources(), steps=8, seed=7)
    folder = again.resume_checkpoint()
    assert Path(folder).name == "checkpoint-4"
    resumed.train(resume_from_checkpoint=folder)
    assert again.restored_step == 4 and set(sources.values()) == {("memory", 4)}
    reference = trainer_for(tmp_path, steps=8)
    reference.train()
    assert losses(resumed) == {s: v for s, v in losses(reference).items() if s > 4}
    assert_same_training_state(resumed, reference)


# -- misuse ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A layercheck directory of 4 Trainer steps (threshold 0)."""
    tmp = tmp_path_factory.mktemp("trained")
    trainer_for(tmp, LayerCheckCallback(tmp / "ckpt", EVERY_STEP), steps=4).train()
    return tmp / "ckpt"


def _copy(trained: Path, tmp_path: Path) -> Path:
    target = tmp_path / "ckpt"
    shutil.copytree(trained, target, ignore=shutil.ignore_patterns(".lock"))
    return target


def test_a_fresh_trainer_over_a_used_directory_is_refused(trained, tmp_path):
    callback = LayerCheckCallback(_copy(trained, tmp_path), EVERY_STEP)
    trainer = trainer_for(tmp_path, callback, steps=8)
    with pytest.raises(LayerCheckError, match=r"holds checkpoints up to step 4 but the Trainer "
                       r"starts at step 0: resume with .*callback\.resume_checkpoint\(\)"):
        trainer.train()
    assert read_manifest(LocalStore(tmp_path / "ckpt")).latest_step() == 4  # nothing abandoned


def test_a_directory_of_another_model_is_refused_before_the_trainer_loads_it(trained, tmp_path):
    callback = LayerCheckCallback(_copy(trained, tmp_path), EVERY_STEP)
    Trainer(tiny_llama(layers=3), arguments(tmp_path / "out", steps=8), train_dataset=Tokens(),
            callbacks=[callback])
    with pytest.raises(ModelMismatch, match="different model.*use another checkpoint directory"):
        callback.resume_checkpoint()


def test_a_directory_of_another_dtype_is_refused_before_the_trainer_loads_it(trained, tmp_path):
    """Issue 13 item 6 on the Trainer path: an fp32 directory resumed into a bf16 model
    was cast silently; it is refused, naming the dtype, before anything is loaded."""
    model = tiny_llama().to(torch.bfloat16)
    before = [p.detach().clone() for p in model.parameters()]
    callback = LayerCheckCallback(_copy(trained, tmp_path), EVERY_STEP)
    Trainer(model, arguments(tmp_path / "out", steps=8), train_dataset=Tokens(),
            callbacks=[callback])
    with pytest.raises(ModelMismatch, match=r"another dtype \(bf16 against fp32\?\)"):
        callback.resume_checkpoint()
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_a_trainer_resumed_at_a_step_the_directory_cannot_restore_is_refused(trained, tmp_path):
    folder = LayerCheckCallback(_copy(trained, tmp_path), EVERY_STEP).resume_checkpoint()
    other = LayerCheckCallback(tmp_path / "other", EVERY_STEP)  # not the directory of that folder
    trainer = trainer_for(tmp_path, other, steps=8)
    with pytest.raises(LayerCheckError, match=r"resumed at step 4 but .*other cannot restore "
                       r"that step .*resume_from_checkpoint=callback\.resume_checkpoint\(\)"):
        trainer.train(resume_from_checkpoint=folder)


def test_a_directory_written_without_the_callback_names_the_plain_loop(tmp_path):
    model = tiny_llama()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with LayerCheck(model, opt, tmp_path / "ckpt", EVERY_STEP) as lc:
        lc.restore()
        model(input_ids=torch.zeros(1, 4, dtype=torch.long), labels=torch.zeros(
            1, 4, dtype=torch.long)).loss.backward()
        opt.step()
        lc.step()
    with pytest.raises(LayerCheckError, match=r"carries no Trainer state.*LayerCheck\.restore\(\)"):
        LayerCheckCallback(tmp_path / "ckpt").resume_checkpoint()


def test_into_a_folder_it_did_not_write_is_refused(trained, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    with pytest.raises(LayerCheckError, match="not written by resume_checkpoint.*new or empty"):
        LayerCheckCallback(_copy(trained, tmp_path)).resume_checkpoint(into=mine)
    assert (mine / "notes.txt").read_text() == "keep me"


def test_constructor_arguments_are_checked():
    with pytest.raises(TypeError, match=r"LayerCheckConfig\(\.\.\.\)"):
        LayerCheckCallback("ckpt", {"smax": 10})
    with pytest.raises(TypeError, match=r"LayerMap\.auto\(model\)"):
        LayerCheckCallback("ckpt", layer_map={"a": ["b"]})


def test_every_url_of_a_local_directory_resumes_from_that_directory(trained, tmp_path,
                                                                   monkeypatch):
    """Issue 27, items 2 and 3, where the Trainer chooses the store: a file:// or local://
    URL of a local directory is that directory (not ./localhost/..., and a missing one is
    not created by asking), and resumes into a folder of its own."""
    ckpt = _copy(trained, tmp_path)
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    for form in (f"file://localhost{ckpt}", f"local://{ckpt}"):
        folder = LayerCheckCallback(form, EVERY_STEP).resume_checkpoint()
        assert Path(folder).name == "checkpoint-4" and Path(folder).parent.parent == ckpt, form
    for form in (f"file://localhost{tmp_path}/absent", f"local://{tmp_path}/absent"):
        assert LayerCheckCallback(form, EVERY_STEP).resume_checkpoint() is None
    assert not (tmp_path / "absent").exists() and list(elsewhere.iterdir()) == []


def test_fused_step_takes_over_the_trainers_adamw_and_trains_as_torchs_fused_adamw(tmp_path):
    """LayerCheckConfig(fused_step=True) through the callback: the AdamW the Trainer
    creates (its for-loop step) is stepped by layercheck.drift.fusedstep, and the run equals
    the Trainer's own optim="adamw_torch_fused" run bit for bit (every tensor of this
    model is a multiple of 16 elements: no scalar tail, layercheck.drift.fusedstep)."""
    pytest.importorskip("numba")
    args = arguments(tmp_path / "ref", steps=6)
    args.optim = "adamw_torch_fused"
    reference = Trainer(tiny_llama(), args, train_dataset=Tokens())
    reference.train()

    fused = LayerCheckCallback(tmp_path / "ckpt", LayerCheckConfig(fused_step=True, warmup_steps=2))
    args = arguments(tmp_path / "out", steps=6)
    args.optim = "adamw_torch"
    measured = []

    class Watch(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            measured.append(fused.layercheck.drift.step_params)

    trainer = Trainer(tiny_llama(), args, train_dataset=Tokens(), callbacks=[fused, Watch()])
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # e.g. the LR scheduler's call-order check
        trainer.train()
    assert measured == [len(list(trainer.model.parameters()))] * 6  # every step fused
    inner = trainer.optimizer.optimizer
    assert "_layercheck_fused_step" not in inner.__dict__  # given back at the end
    assert losses(trainer) == losses(reference)
    for (name, p), q in zip(trainer.model.named_parameters(), reference.model.parameters()):
        assert torch.equal(p, q), name
