"""LayerCheckCallback in TRL's SFTTrainer and DPOTrainer, with and without a PEFT LoRA
adapter, on real runs of examples/trl_sft.py and examples/trl_dpo.py (a small Qwen2
pretrained in code, CPU): stop and resume bit for bit, SIGKILL and restart."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("trl", reason="TRL's trainers need the trl extra: pip install -e '.[trl]'")
pytest.importorskip("peft", reason="LoRA adapters need the trl extra: pip install -e '.[trl]'")

from layercheck import LayerCheckConfig  # noqa: E402
from layercheck.storage.manifest import read_manifest  # noqa: E402
from layercheck.recovery import make_plan  # noqa: E402
from layercheck.storage.localstore import LocalStore  # noqa: E402
from layercheck.trainer import LayerCheckCallback  # noqa: E402
from tests.layercheck.halting import HaltingRun, sigkill_drill  # noqa: E402
from tests.layercheck.test_trainer import StopAt, assert_same_training_state, losses  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
if str(EXAMPLES) not in sys.path:  # the scripts import tinychat from beside them
    sys.path.insert(0, str(EXAMPLES))
import tinychat  # noqa: E402
import trl_dpo  # noqa: E402
import trl_sft  # noqa: E402

SCRIPTS = {"sft": trl_sft, "dpo": trl_dpo}
EVERY_STEP = LayerCheckConfig(base_threshold=0, embedding_threshold=0, warmup_steps=0)
KINDS = pytest.mark.parametrize("kind", ["sft", "dpo"])
ADAPTERS = pytest.mark.parametrize("lora", [0, 4], ids=["full", "lora"])


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """The pretrained model every run of this file post-trains (built once)."""
    torch.set_num_threads(1)
    return tinychat.base_model(tmp_path_factory.mktemp("trl") / "base")


def trainer_of(kind: str, base: Path, out: Path, *callbacks, steps: int, lora: int):
    script = SCRIPTS[kind]
    return script.build_trainer(base, str(out), steps=steps, lora=lora,
                                lr=script.LORA_LR if lora else script.LR,
                                callbacks=list(callbacks))


# -- stop and resume: bit for bit ----------------------------------------------------
@KINDS
@ADAPTERS
def test_threshold_zero_stop_and_resume_equals_an_uninterrupted_run(base, tmp_path, kind, lora):
    steps, stop = 10, 6  # 16 batches an epoch: the resume skips 6 of them (mid-epoch)
    reference = trainer_of(kind, base, tmp_path / "ref", steps=steps, lora=lora)
    reference.train()

    first = LayerCheckCallback(tmp_path / "ckpt", EVERY_STEP)
    trainer = trainer_of(kind, base, tmp_path / "out", first, StopAt(stop), steps=steps, lora=lora)
    trainer.train(resume_from_checkpoint=first.resume_checkpoint())
    assert trainer.state.global_step == stop and first.restored_step == 0

    # a new process in all but name: another callback, another trainer, other weights
    again = LayerCheckCallback(tmp_path / "ckpt", EVERY_STEP)
    resumed = trainer_of(kind, base, tmp_path / "out", again, steps=steps, lora=lora)
    with torch.no_grad():
        for parameter in resumed.model.parameters():
            parameter.normal_()
    folder = again.resume_checkpoint()
    assert Path(folder).name == f"checkpoint-{stop}"
    resumed.train(resume_from_checkpoint=folder)

    assert again.restored_step == stop
    assert losses(resumed) == {s: v for s, v in losses(reference).items() if s > stop}
    assert_same_training_state(resumed, reference)
    trainable = {n for n, p in resumed.model.named_parameters() if p.requires_grad}
    assert bool(lora) == all("lora_" in n for n in trainable)  # the adapter alone trained


def test_a_negative_rank_is_refused_naming_the_fix(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["trl_sft.py", "--ckpt", "c", "--lora", "-1"])
    with pytest.raises(SystemExit) as exit_:
        tinychat.parse(tinychat.command_line("x", lr=1e-3, lora_lr=1e-2, threshold=1e-2))
    assert exit_.value.code == 2
    assert "--lora -1: give a rank of at least 1, or 0" in capsys.readouterr().err


def test_the_learning_rate_follows_the_kind_of_fine_tuning(monkeypatch):
    ap = tinychat.command_line("x", lr=1e-3, lora_lr=1e-2, threshold=1e-2)
    for argv, lr in ((["--ckpt", "c"], 1e-3), (["--ckpt", "c", "--lora", "4"], 1e-2),
                     (["--ckpt", "c", "--lora", "4", "--lr", "0.5"], 0.5)):
        monkeypatch.setattr(sys, "argv", ["trl_sft.py", *argv])
        assert tinychat.parse(ap).lr == lr


# -- SIGKILL mid-run, restart ----------------------------------------------------------------
STEPS = 60
KILL_AT = 30  # the child halts once this step is committed; the kill comes then


def _start(kind: str, base: Path, lora: int):
    script = EXAMPLES / f"trl_{kind}.py"

    def start(ckpt: Path, log: Path, **kw) -> HaltingRun:
        return HaltingRun(script, ["--ckpt", str(ckpt), "--base", str(base), "--steps",
                                   str(STEPS), "--lora", str(lora), "--losses", str(log)], **kw)
    return start


@pytest.mark.slow
@pytest.mark.parametrize("kind, lora", [  # each trainer and each adapter kind once; the rest drills
    pytest.param("sft", 0, id="full-sft"), pytest.param("dpo", 4, id="lora-dpo"),
    pytest.param("sft", 4, id="lora-sft", marks=pytest.mark.drill),
    pytest.param("dpo", 0, id="full-dpo", marks=pytest.mark.drill)])
def test_sigkill_mid_run_then_restart_finishes_within_one_percent(base, tmp_path, kind, lora):
    def killed(ckpt: Path) -> None:
        store = LocalStore(ckpt, create=False)
        view = read_manifest(store)
        assert view.latest_step() == KILL_AT
        if not lora:  # the composite is genuinely mixed: a trained layer is older than step 30
            assert max(make_plan(store, view).staleness().values()) > 0
        # (with LoRA every adapter's layer was written at step 30 in these runs: what is
        # older is frozen, so these resumes are exact; docs/trainer.md, "TRL")

    print(f"\n{kind} {'lora' if lora else 'full'}:")  # the figures of docs/trainer.md
    sigkill_drill(_start(kind, base, lora), tmp_path, kill_at=KILL_AT, steps=STEPS, killed=killed)
