"""LayerCheckCallback in TRL's GRPOTrainer (layercheck.rlstate), on real runs of
examples/trl_grpo.py (a small Qwen2 pretrained in code, a rule-based reward, a frozen
reference model, CPU): stop and resume bit for bit across an epoch, the reference and
the generations guarded, SIGKILL and restart."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("trl", reason="TRL's trainers need the trl extra: pip install -e '.[trl]'")
pytest.importorskip("peft", reason="LoRA adapters need the trl extra: pip install -e '.[trl]'")

from layercheck import LayerCheckConfig  # noqa: E402
from layercheck.contract.errors import LayerCheckError  # noqa: E402
from layercheck.storage.manifest import read_manifest  # noqa: E402
from layercheck.recovery import make_plan  # noqa: E402
from layercheck.rlstate import generation_span  # noqa: E402
from layercheck.storage.localstore import LocalStore  # noqa: E402
from layercheck.trainer import LayerCheckCallback  # noqa: E402
from tests.layercheck.halting import HaltingRun, sigkill_drill  # noqa: E402
from tests.layercheck.test_trainer import StopAt, assert_same_training_state, losses  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
if str(EXAMPLES) not in sys.path:  # the scripts import tinychat from beside them
    sys.path.insert(0, str(EXAMPLES))
import tinychat  # noqa: E402
import trl_grpo  # noqa: E402

EVERY_STEP = LayerCheckConfig(base_threshold=0, embedding_threshold=0, warmup_steps=0)
ADAPTERS = pytest.mark.parametrize("lora", [0, 4], ids=["full", "lora"])


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """The pretrained model every run of this file post-trains (built once)."""
    torch.set_num_threads(1)
    return tinychat.base_model(tmp_path_factory.mktemp("grpo") / "base")


def grpo(base: Path, out: Path, *callbacks, steps: int, lora: int = 0):
    return trl_grpo.build_trainer(base, str(out), steps=steps, lora=lora,
                                  lr=trl_grpo.LORA_LR if lora else trl_grpo.LR,
                                  callbacks=list(callbacks))


def resume(callback: LayerCheckCallback, trainer) -> None:
    trainer.train(resume_from_checkpoint=callback.resume_checkpoint(trainer=trainer))


# -- stop and resume: bit for bit --------------------------------------------------------
@ADAPTERS
def test_threshold_zero_stop_and_resume_in_a_later_epoch_equals_an_uninterrupted_run(
        base, tmp_path, lora):
    # 64 prompts, 4 a step: 16 steps an epoch, so the resume at 18 is inside the second,
    # whose prompt order TRL's sampler draws from a generator a new trainer starts afresh
    steps, stop = 20, 18
    reference = grpo(base, tmp_path / "ref", steps=steps, lora=lora)
    reference.train()
    assert reference.ref_model is None if lora else reference.ref_model is not None

    first = LayerCheckCallback(tmp_path / "ckpt", EVERY_STEP)
    resume(first, grpo(base, tmp_path / "out", first, StopAt(stop), steps=steps, lora=lora))

    again = LayerCheckCallback(tmp_path / "ckpt", EVERY_STEP)
    resumed = grpo(base, tmp_path / "out", again, steps=steps, lora=lora)
    with torch.no_grad():  # a new process in all but name: other weights
        for parameter in resumed.model.parameters():
            parameter.normal_()
    resume(again, resumed)

    assert again.restored_step == stop
    assert losses(resumed) == {s: v for s, v in losses(reference).items() if s > stop}
    rewards = {e["step"]: e["reward"] for e in reference.state.log_history if "reward" in e}
    assert [e["reward"] for e in resumed.state.log_history if "reward" in e] == \
        [rewards[s] for s in range(stop + 1, steps + 1)]  # the same completions sampled
    assert_same_training_state(resumed, reference)


def test_a_resume_refuses_a_reference_model_that_changed(base, tmp_path):
    callback = LayerCheckCallback(tmp_path / "ckpt", EVERY_STEP)
    resume(callback, grpo(base, tmp_path / "out", callback, StopAt(2), steps=4))

    again = LayerCheckCallback(tmp_path / "ckpt", EVERY_STEP)
    trainer = grpo(base, tmp_path / "out", again, steps=4)
    with torch.no_grad():  # as if the folder the reference is loaded from had changed
        next(trainer.ref_model.parameters()).add_(1e-3)
    with pytest.raises(LayerCheckError, match="ref_model: crc32c?:[0-9a-f]{8} at step 2, "
                       "crc32c?:[0-9a-f]{8} now.*folder the reference is loaded from"):
        resume(again, trainer)


class Counting:
    """A stateful reward function: it pays the rule-based reward plus a bonus that
    grows with every call (its state), as a curriculum would."""

    __name__ = "counting"

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, completions, answer, **kwargs):
        self.calls += 1
        return [r + 1e-3 * self.calls for r in tinychat.count_reward(completions, answer)]

    def state_dict(self) -> dict:
        return {"calls": self.calls}

    def load_state_dict(self, state: dict) -> None:
        self.calls = state["calls"]


def test_a_stateful_reward_function_is_carried_and_loaded_back(base, tmp_path):
    def trainer(out: Path, *callbacks, reward):
        made = grpo(base, out, *callbacks, steps=6)
        made.reward_funcs = [reward]
        return made

    first = LayerCheckCallback(tmp_path / "ckpt", EVERY_STEP)
    resume(first, trainer(tmp_path / "out", first, StopAt(4), reward=Counting()))
    again, reward = LayerCheckCallback(tmp_path / "ckpt", EVERY_STEP), Counting()
    resume(again, trainer(tmp_path / "out", again, reward=reward))
    assert again.restored_step == 4 and reward.calls == 6  # 4 restored, then 2 more calls


def test_grpo_without_the_trainer_is_refused_naming_the_call(base, tmp_path):
    callback = LayerCheckCallback(tmp_path / "ckpt", EVERY_STEP)
    trainer = grpo(base, tmp_path / "out", callback, steps=2)
    with pytest.raises(LayerCheckError, match=r"resume_checkpoint\(trainer=trainer\)"):
        trainer.train(resume_from_checkpoint=callback.resume_checkpoint())
    with pytest.raises(LayerCheckError, match="not a trainer this callback is attached to"):
        callback.resume_checkpoint(trainer=grpo(base, tmp_path / "other", steps=2))


@pytest.mark.parametrize("changes, span", [({"num_iterations": 2}, 2),
                                           ({"steps_per_generation": 3}, 3),
                                           ({"gradient_accumulation_steps": 2,
                                             "steps_per_generation": 3}, 3)])
def test_an_interval_inside_a_generation_is_refused_naming_the_interval(base, tmp_path,
                                                                      changes, span):
    from trl import GRPOConfig
    args = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=4,
                      num_generations=4, use_cpu=True, bf16=False, report_to="none", **changes)
    assert generation_span(args) == span
    model, tokenizer = tinychat.load(base)
    with pytest.raises(LayerCheckError, match=rf"interval={span}\) or a multiple"):
        trl_grpo.GRPOTrainer(model=model, args=args, processing_class=tokenizer,
                             reward_funcs=tinychat.count_reward,
                             train_dataset=tinychat.grpo_dataset(8, 0),
                             callbacks=[LayerCheckCallback(tmp_path / "ckpt", EVERY_STEP)])
    ok = LayerCheckCallback(tmp_path / "ckpt", LayerCheckConfig(interval=2 * span))
    trl_grpo.GRPOTrainer(model=model, args=args, processing_class=tokenizer,
                         reward_funcs=tinychat.count_reward,
                         train_dataset=tinychat.grpo_dataset(8, 0), callbacks=[ok])


def test_a_reference_model_that_moves_is_refused(base, tmp_path):
    from trl import GRPOConfig
    args = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, beta=0.04,
                      num_generations=4, sync_ref_model=True, use_cpu=True, bf16=False,
                      report_to="none")
    model, tokenizer = tinychat.load(base)
    with pytest.raises(LayerCheckError, match="set sync_ref_model=False"):
        trl_grpo.GRPOTrainer(model=model, args=args, processing_class=tokenizer,
                             reward_funcs=tinychat.count_reward,
                             train_dataset=tinychat.grpo_dataset(8, 0),
                             callbacks=[LayerCheckCallback(tmp_path / "ckpt", EVERY_STEP)])


# -- SIGKILL mid-run, restart ----------------------------------------------------------------
STEPS = 60
KILL_AT = 30  # the child halts once this step is committed; the kill comes then


@pytest.mark.slow
@pytest.mark.parametrize("lora", [pytest.param(4, id="lora"),  # the full model: a drill
                                  pytest.param(0, id="full", marks=pytest.mark.drill)])
def test_sigkill_mid_run_then_restart_finishes_within_one_percent(base, tmp_path, lora):
    def start(ckpt: Path, log: Path, **kw) -> HaltingRun:
        return HaltingRun(EXAMPLES / "trl_grpo.py", [
            "--ckpt", str(ckpt), "--base", str(base), "--steps", str(STEPS), "--lora", str(lora),
            "--losses", str(log)], **kw)

    def killed(ckpt: Path) -> None:
        store = LocalStore(ckpt, create=False)
        view = read_manifest(store)
        assert view.latest_step() == KILL_AT
        if not lora:  # the composite is genuinely mixed: a trained layer is older than step 30
            assert max(make_plan(store, view).staleness().values()) > 0

    print(f"\ngrpo {'lora' if lora else 'full'}:")  # the figures of docs/trainer.md
    sigkill_drill(start, tmp_path, kill_at=KILL_AT, steps=STEPS, killed=killed)


def test_a_step_committed_without_the_trainer_resumes_with_it(tmp_path):
    # a directory written before trainer= was given (a DPO run, say) recorded no checksum
    # of the reference: nothing to check it against, so the resume goes on
    from tests.layercheck.test_trainer import trainer_for
    from tests.layercheck.tinytrainer import tiny_llama
    first = LayerCheckCallback(tmp_path / "ckpt", EVERY_STEP)
    trainer_for(tmp_path, first, StopAt(2), steps=4).train(
        resume_from_checkpoint=first.resume_checkpoint())
    again = LayerCheckCallback(tmp_path / "ckpt", EVERY_STEP)
    trainer = trainer_for(tmp_path, again, steps=4)
    trainer.ref_model = tiny_llama(seed=1)  # a frozen model the trainer holds from now on
    resume(again, trainer)
    assert again.restored_step == 2 and trainer.state.global_step == 4
