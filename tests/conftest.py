"""Shared fixtures: tiny real models and a deterministic training loop; the
no-silent-skips policy (tests/skip_policy.py) for every run.

Torch-free at import: the simulator's and the dashboard's tests run in an
environment without torch, under this conftest too. The helpers below import
torch when called.
"""
from __future__ import annotations

import os
import sys

import pytest

from tests.skip_policy import SkipPolicy

# Every process a test starts (torchrun ranks, killed runs, workers) inherits this:
# one that dies of SIGABRT or SIGSEGV prints every thread's Python stack to its
# stderr, which the tests put in their failure message. A rare rank abort in a
# gloo/DCP job ("terminate called without an active exception") printed only that
# line; the next one names its frame.
os.environ.setdefault("PYTHONFAULTHANDLER", "1")


@pytest.fixture(autouse=True)
def _main_module_given_back():
    """``__main__`` as each test found it. Streamlit's ``AppTest`` leaves the page script
    as ``__main__``; a rank that a later test in the same process spawns would run that
    page first, outside any session, and die before its own code."""
    main = sys.modules.get("__main__")
    yield
    if main is not None and sys.modules.get("__main__") is not main:
        sys.modules["__main__"] = main


def pytest_configure(config) -> None:
    config.pluginmanager.register(SkipPolicy.from_file(), "layercheck-skip-policy")


def tiny_lm(*, tied: bool = True, layers: int = 3, seed: int = 0):
    """A small Qwen2 causal LM built from a config (random weights, real architecture)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM
    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=128, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=64, tie_word_embeddings=tied)
    return Qwen2ForCausalLM(config)


def optimizer_for(model, *, lr: float = 1e-3, weight_decay: float = 0.01, total: int = 100):
    import torch
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    warm = max(1, total // 10)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * max(0.0, (total - s) / total))
    return opt, sched


def train_step(model, opt, sched, *, vocab: int = 128) -> float:
    """One step on data drawn from the global RNG (so RNG restore matters)."""
    import torch
    ids = torch.randint(0, vocab, (4, 12))
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    sched.step()
    opt.zero_grad(set_to_none=True)
    return float(loss.detach())


def checkpointed_run(directory, config, steps: int, *, total: int = 20):
    """A fresh tiny model trained ``steps`` steps with LayerCheck(``config``) into
    ``directory``; returns the closed LayerCheck and its step reports."""
    from layercheck import LayerCheck
    model = tiny_lm()
    opt, sched = optimizer_for(model, total=total)
    reports = []
    with LayerCheck(model, opt, directory, config, scheduler=sched) as lc:
        lc.restore()
        for _ in range(steps):
            train_step(model, opt, sched)
            reports.append(lc.step())
    return lc, reports


def every_layer_checkpoint(directory, steps: int = 6):
    """``directory`` holding ``steps`` steps of the tiny model (seed 0) with every
    layer written at every step from the base on (thresholds 0, warm-up 2): each
    layer has a version at steps 2..``steps``, so that damage to the newest one has
    an older one to fall back to. Returns ``directory``."""
    from layercheck import LayerCheckConfig
    checkpointed_run(directory, LayerCheckConfig(base_threshold=0, embedding_threshold=0,
                                                 warmup_steps=2), steps)
    return directory


def in_a_fresh_python(fn, *args):
    """``fn(*args)`` run in a newly started Python (multiprocessing's spawn): its result
    returned here, its exception raised here. For a test of process-wide state that
    another test file may have left in this process: torch.distributed's default
    group, above all, which the profiler's in-process DeepSpeed engine keeps up for
    the life of the process (``profiler/engine.py::one_rank_group``), so that a
    pytest-xdist worker that ran a profiler file first has one. ``fn`` must be a
    module-level function, and its result picklable."""
    import multiprocessing
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(fn, args)
