"""Update-path drift against a reference computed from weight copies."""
from __future__ import annotations

import importlib.util
import math
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from layercheck import LayerCheck, LayerCheckConfig
from layercheck.drift import tracker as drift_module
from layercheck.drift import fusedsums
from layercheck.drift.tracker import BLOCK, DriftTracker, _Entry
from layercheck.drift.fusedsums import fusable
from layercheck.backends.layermap import LayerMap
from tests.conftest import in_a_fresh_python, tiny_lm


def _reference(before, model, layer_map):
    out = []
    params = dict(model.named_parameters())
    for layer in layer_map:
        moved = sum(float((params[n].detach().double() - before[n].double()).abs().sum()) for n in layer.params)
        size = sum(float(params[n].detach().double().abs().sum()) for n in layer.params)
        out.append(moved / size)
    return np.array(out)


def _trackers(opt, layer_map, **kw):
    return DriftTracker(opt, [[p for _, p in layer_map.parameters(i)] for i in range(len(layer_map))], **kw)


HAVE_NUMBA = importlib.util.find_spec("numba") is not None
needs_numba = pytest.mark.skipif(not HAVE_NUMBA, reason="numba is not installed")
VARIANTS = [(torch.optim.AdamW, 0.0, False), (torch.optim.AdamW, 0.1, False),
            (torch.optim.AdamW, 0.1, True), (torch.optim.Adam, 0.05, False)]


@pytest.mark.parametrize("fused", [pytest.param(True, marks=needs_numba), False],
                         ids=["fused", "foreach"])
@pytest.mark.parametrize("opt_cls,wd,amsgrad", VARIANTS)
def test_drift_matches_copy_reference(opt_cls, wd, amsgrad, fused):
    # The reference differences fp32 weights, so it carries up to half an ulp of w
    # per element (6e-8 for a norm weight near 1). At lr 1e-2 that is < 1e-5 of an
    # update, so rtol 1e-5 tests our arithmetic rather than the reference's rounding.
    torch.manual_seed(0)
    model = tiny_lm(tied=False)
    layer_map = LayerMap.auto(model)
    opt = opt_cls(model.parameters(), lr=1e-2, weight_decay=wd, amsgrad=amsgrad)
    tracker = _trackers(opt, layer_map, fused=fused)
    for step in range(4):
        ids = torch.randint(0, 128, (2, 10))
        model(input_ids=ids, labels=ids).loss.backward()
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        opt.step()
        opt.zero_grad()
        drift, lr, _ = tracker.take()
        # the fused kernel measures every parameter, or none
        assert tracker.fused_params == (len(list(model.parameters())) if fused else 0)
        np.testing.assert_allclose(drift, _reference(before, model, layer_map), rtol=1e-5)
        assert lr == pytest.approx(1e-2)


def test_parameters_without_gradient_do_not_drift():
    torch.manual_seed(0)
    model = tiny_lm(tied=False, layers=2)
    layer_map = LayerMap.auto(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tracker = DriftTracker(opt, [[p for _, p in layer_map.parameters(i)] for i in range(len(layer_map))])
    ids = torch.randint(0, 128, (2, 10))
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    tracker.take()
    head = layer_map.index["lm_head"]
    for p in model.parameters():  # a second step where only the head has a gradient
        p.grad = None
    model.lm_head.weight.grad = torch.ones_like(model.lm_head.weight)
    opt.step()
    drift, _, _ = tracker.take()
    assert drift[head] > 0
    assert np.count_nonzero(drift) == 1


def test_other_optimizers_use_an_exact_copy():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    with pytest.warns(UserWarning, match="copy of the previous weights"):
        tracker = DriftTracker(opt, [list(model[0].parameters()), list(model[1].parameters())])
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    model(torch.randn(3, 4)).sum().backward()
    opt.step()
    drift, _, _ = tracker.take()
    ref0 = sum(float((p.detach() - before[f"0.{n}"]).abs().sum()) for n, p in model[0].named_parameters()) / \
        sum(float(p.detach().abs().sum()) for p in model[0].parameters())
    assert drift[0] == pytest.approx(ref0, rel=1e-6)


def test_sampled_drift_estimates_the_exact_value_on_large_tensors():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256))
    layers = [list(model[0].parameters()), list(model[2].parameters())]
    exact_opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    exact = DriftTracker(exact_opt, layers, sampling=1)
    sampled = DriftTracker(exact_opt, layers, sampling=16)
    for _ in range(3):
        x = torch.randn(32, 1024)
        model(x).pow(2).mean().backward()
        exact_opt.step()
        exact_opt.zero_grad()
        d_exact, _, _ = exact.take()
        d_sampled, _, _ = sampled.take()
        np.testing.assert_allclose(d_sampled, d_exact, rtol=0.02)
        assert not np.array_equal(d_sampled, d_exact)  # it really sampled


# -- the fused kernel (layercheck.drift.kernels) against the torch path --------------------------

def _flat_parts(sizes, seed=0):
    """ZeRO-style flat fp32 partitions: 1-D contiguous views of one buffer."""
    gen = torch.Generator().manual_seed(seed)
    buf = torch.randn(sum(sizes), generator=gen)
    parts, offset = [], 0
    for n in sizes:
        parts.append(torch.nn.Parameter(buf[offset:offset + n]))
        offset += n
    return parts


def _flat_loss(parts, gen):
    # a loss whose gradient leaves some elements at exactly zero (m = v = 0 there)
    return sum((p[::3] * torch.randn(p[::3].shape, generator=gen)).sum() + p[:50].pow(2).sum()
               for p in parts)


@needs_numba
@pytest.mark.parametrize("opt_cls,wd,amsgrad", VARIANTS)
@pytest.mark.parametrize("sampling", [1, 4])
def test_fused_and_torch_paths_agree(opt_cls, wd, amsgrad, sampling):
    parts = _flat_parts([70_001, 200_000, 1_000, 5])  # over and under CHUNK and SAMPLE_MIN
    layers = [parts[:2], parts[2:]]
    opt = opt_cls(parts, lr=1e-3, weight_decay=wd, amsgrad=amsgrad)
    fused = DriftTracker(opt, layers, sampling=sampling)
    plain = DriftTracker(opt, layers, sampling=sampling, fused=False)
    gen = torch.Generator().manual_seed(1)
    for _ in range(5):
        _flat_loss(parts, gen).backward()
        opt.step()
        opt.zero_grad()
        a, _, _ = fused.take()
        b, _, _ = plain.take()
        assert fused.fused_params == 4 and plain.fused_params == 0
        assert np.all(a > 0)
        np.testing.assert_allclose(a, b, rtol=2e-6)


@needs_numba
@pytest.mark.parametrize("torch_threads", [1, 2])
def test_the_pass_takes_no_more_threads_than_torch_trains_with(torch_threads, monkeypatch):
    """Numba must not fight torch for the cores: the pass runs on torch's own
    OpenMP team, sized by torch's thread count (the calling thread included),
    and hires no helper threads of its own."""
    from layercheck.drift import kernels, parallel as passthreads
    teams, hired = [], []
    run, crew_run = passthreads.Team.run, passthreads.Crew.run
    monkeypatch.setattr(passthreads.Team, "run", lambda self, *args: teams.append(args[-1]) or run(self, *args))
    monkeypatch.setattr(passthreads.Crew, "run", lambda self, pieces, work, helpers:
                        hired.append(helpers) or crew_run(self, pieces, work, helpers=helpers))
    parts = _flat_parts([4 * kernels.PER_THREAD])  # enough to be worth several threads
    opt = torch.optim.AdamW(parts, lr=1e-3)
    tracker = DriftTracker(opt, [parts])
    before = torch.get_num_threads()
    torch.set_num_threads(torch_threads)
    try:
        _flat_loss(parts, torch.Generator().manual_seed(0)).backward()
        opt.step()
    finally:
        torch.set_num_threads(before)
    tracker.take()
    assert tracker.fused_params == 1
    assert teams == ([] if torch_threads == 1 else [torch_threads]) and hired == []


@needs_numba
@pytest.mark.parametrize("sampling", [1, 16])
def test_flat_partitions_match_copy_reference(sampling):
    parts = _flat_parts([300_007, 65_536, 17])
    # lr 1e-2: the reference's own rounding (half an ulp of w) stays < 1e-5 of an update
    opt = torch.optim.AdamW(parts, lr=1e-2, weight_decay=0.01)
    tracker = DriftTracker(opt, [parts[:1], parts[1:]], sampling=sampling)
    gen = torch.Generator().manual_seed(2)
    for _ in range(3):
        _flat_loss(parts, gen).backward()
        before = [p.detach().clone() for p in parts]
        opt.step()
        opt.zero_grad()
        drift, _, _ = tracker.take()
        moved = [float((p.detach().double() - b.double()).abs().sum()) for p, b in zip(parts, before)]
        size = [float(p.detach().double().abs().sum()) for p in parts]
        ref = np.array([moved[0] / size[0], sum(moved[1:]) / sum(size[1:])])
        assert tracker.fused_params == 3
        np.testing.assert_allclose(drift, ref, rtol=1e-5 if sampling == 1 else 0.05)


def _one_step_against_reference(model, **tracker_kw):
    layer_map = LayerMap.auto(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    tracker = _trackers(opt, layer_map, **tracker_kw)
    ids = torch.randint(0, 128, (2, 10))
    model(input_ids=ids, labels=ids).loss.backward()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt.step()
    drift, _, _ = tracker.take()
    np.testing.assert_allclose(drift, _reference(before, model, layer_map), rtol=1e-5)
    return tracker


def test_fallback_for_a_non_contiguous_parameter():
    torch.manual_seed(0)
    model = tiny_lm(tied=False, layers=2)
    # the kernel reads memory linearly, so it must leave this one to torch
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().t().contiguous().t())
    assert not model.lm_head.weight.is_contiguous()
    tracker = _one_step_against_reference(model)
    assert tracker.fused_params == (len(list(model.parameters())) - 1 if HAVE_NUMBA else 0)


def test_fallback_for_other_dtypes():
    torch.manual_seed(0)
    assert _one_step_against_reference(tiny_lm(tied=False, layers=2).double()).fused_params == 0
    assert not fusable(torch.zeros(4, device="meta"))  # stands in for a GPU tensor
    assert not fusable(torch.zeros(4, dtype=torch.bfloat16))
    assert fusable(torch.zeros(4))


def test_fallback_without_numba(monkeypatch):
    monkeypatch.setattr(fusedsums, "_kernels", False)  # as if `import numba` had failed
    torch.manual_seed(0)
    assert _one_step_against_reference(tiny_lm(tied=False, layers=2)).fused_params == 0


def test_drift_imports_and_works_without_numba():
    code = ("import sys; sys.modules['numba'] = None\n"  # makes `import numba` fail
            "import torch\n"
            "from layercheck.drift.tracker import DriftTracker\n"
            "lin = torch.nn.Linear(8, 8)\n"
            "opt = torch.optim.AdamW(lin.parameters(), lr=1e-2)\n"
            "t = DriftTracker(opt, [list(lin.parameters())])\n"
            "lin(torch.randn(2, 8)).sum().backward(); opt.step()\n"
            "d, _, _ = t.take(); assert d[0] > 0 and t.fused_params == 0\n"
            "assert 'layercheck.drift.kernels' not in sys.modules\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr


def test_a_zero_learning_rate_moves_nothing():
    # a warm-up that starts at lr 0 (Hugging Face's linear warm-up does), with weight decay
    for fused in (True, False):
        torch.manual_seed(0)
        lin = torch.nn.Linear(16, 16)
        opt = torch.optim.AdamW(lin.parameters(), lr=0.0, weight_decay=0.01)
        tracker = DriftTracker(opt, [list(lin.parameters())], fused=fused)
        lin(torch.randn(4, 16)).sum().backward()
        opt.step()
        drift, _, _ = tracker.take()
        assert drift[0] == 0.0


@needs_numba
def test_kernel_is_accurate_over_millions_of_terms_and_ignores_thread_count():
    from layercheck.drift import kernels
    assert kernels.TINY == np.float32(drift_module._TINY)
    gen = torch.Generator().manual_seed(3)
    n = 1 << 22  # 4 M terms of ~0.8: a float32 running sum would be off by ~1e-3
    w = torch.randn(n, generator=gen)
    m = torch.randn(n, generator=gen) * 1e-3
    v = torch.rand(n, generator=gen) * 1e-6
    m[:1000] = v[:1000] = 0.0  # untouched rows
    ptr = np.array([[w.data_ptr(), m.data_ptr(), v.data_ptr()], [w.data_ptr(), 0, 0]], dtype=np.int64)
    eps_c, alpha = np.float32(1e-8), np.float32(0.1)
    plan = kernels.FusedPass([kernels.Extent(n, n, n)] * 2)
    args = (ptr, np.array([eps_c] * 2), np.array([alpha] * 2), 0)
    moved, size = plan.run(*args, threads=2)
    # the same fp32 element arithmetic, summed in float64 by torch
    q = (1.0 / ((v + kernels.TINY).sqrt() + eps_c)) * m + alpha * w
    np.testing.assert_allclose(moved[0], float(q.abs().sum(dtype=torch.float64)), rtol=1e-6)
    np.testing.assert_allclose(size, float(w.abs().sum(dtype=torch.float64)), rtol=1e-7)
    assert moved[1] == 0.0
    again = plan.run(*args, threads=1)
    assert np.array_equal(again[0], moved) and np.array_equal(again[1], size)


def test_rotating_blocks_cover_every_element_once_in_n_steps():
    n, sampling = 5 * BLOCK * 4 + 17, 4  # the tail beyond the last whole run is never read
    p = torch.nn.Parameter(torch.zeros(n))
    entry = _Entry(p, {}, 0, span=BLOCK * sampling, take=BLOCK, scale=1.0)
    seen = torch.zeros(n)
    for phase in range(sampling):
        entry.view(seen, phase).add_(1.0)
    assert torch.equal(seen[:n - 17], torch.ones(n - 17)) and not seen[n - 17:].any()


# -- frozen parameters and LoRA adapters, through LayerCheck.step() -----------------------
# d_l is over ALL elements of layer l: a frozen tensor does not move, but it is part of
# the layer's size (mean |w|), and of what a layer version saves and restores.
class LoRALinear(torch.nn.Module):
    """A frozen base weight and bias plus a trainable low-rank update B A (LoRA)."""

    def __init__(self, width: int, rank: int) -> None:
        super().__init__()
        self.base = torch.nn.Linear(width, width)
        self.base.requires_grad_(False)
        self.lora_a = torch.nn.Parameter(torch.randn(rank, width) / width ** 0.5)
        self.lora_b = torch.nn.Parameter(torch.zeros(width, rank))  # LoRA's init: B A = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + (x @ self.lora_a.T) @ self.lora_b.T


class LoRANet(torch.nn.Module):
    """A frozen embedding, LoRA blocks, a trainable norm and head."""

    def __init__(self, vocab: int = 64, width: int = 32, rank: int = 4, blocks: int = 3) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.embed.requires_grad_(False)
        self.blocks = torch.nn.ModuleList(LoRALinear(width, rank) for _ in range(blocks))
        self.norm = torch.nn.LayerNorm(width)
        self.head = torch.nn.Linear(width, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for block in self.blocks:
            x = x + torch.tanh(block(x))
        return self.head(self.norm(x))


def _lora(seed: int):
    torch.manual_seed(seed)
    model = LoRANet()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2,
                            weight_decay=0.1)
    return model, opt


def _lora_step(model, opt) -> None:
    ids = torch.randint(0, 64, (4, 12))
    logits = model(ids[:, :-1])
    torch.nn.functional.cross_entropy(logits.reshape(-1, 64), ids[:, 1:].reshape(-1)).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def _qwen_step(model, opt) -> None:
    ids = torch.randint(0, 128, (2, 10))
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def _frozen_qwen(seed: int, optimizer_holds_frozen: bool):
    torch.manual_seed(seed)
    model = tiny_lm(tied=False)
    model.model.layers[0].mlp.up_proj.weight.requires_grad_(False)
    model.model.layers[1].post_attention_layernorm.weight.requires_grad_(False)
    params = [p for p in model.parameters() if optimizer_holds_frozen or p.requires_grad]
    return model, torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1)


def _copy_reference(before: dict, model, lc) -> np.ndarray:
    """mean |w(t) - w(t-1)| / mean |w(t)| over every element of each layer, frozen
    ones included, from copies of the weights (float64)."""
    params = dict(model.named_parameters())
    out = []
    for i in range(len(lc.layer_map)):
        names = [n for n, _ in lc.layer_map.parameters(i)]
        moved = sum(float((params[n].detach().double() - before[n].double()).abs().sum())
                    for n in names)
        size = sum(float(params[n].detach().double().abs().sum()) for n in names)
        count = sum(params[n].numel() for n in names)
        out.append((moved / count) / (size / count))
    return np.array(out)


@pytest.mark.parametrize("case", ["frozen, outside the optimizer", "frozen, inside the optimizer",
                                  "lora"])
def test_step_reports_drift_relative_to_the_whole_layer_frozen_tensors_included(tmp_path, case):
    if case == "lora":
        model, opt = _lora(0)
        train = _lora_step
    else:
        model, opt = _frozen_qwen(0, optimizer_holds_frozen=case.endswith("inside the optimizer"))
        train = _qwen_step
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    with LayerCheck(model, opt, tmp_path / "c", LayerCheckConfig(warmup_steps=2)) as lc:
        lc.restore()
        # some layer holds frozen and trainable tensors together: the case that matters
        assert any(frozen & names and names - frozen for names in
                   ({n for n, _ in lc.layer_map.parameters(i)} for i in range(len(lc.layer_map))))
        for _ in range(4):
            before = {n: p.detach().clone() for n, p in model.named_parameters()}
            train(model, opt)
            report = lc.step()
            np.testing.assert_allclose(report.drift, _copy_reference(before, model, lc),
                                       rtol=1e-5)
        assert all(torch.equal(p, before[n]) for n, p in model.named_parameters() if n in frozen)


def test_lora_save_and_restore_round_trip_is_bit_for_bit(tmp_path):
    """Every layer version holds the frozen tensors too: a model built from another seed
    (other base weights) restores the trained one exactly and trains on identically."""
    every_step = LayerCheckConfig(base_threshold=0, embedding_threshold=0, warmup_steps=2)
    model, opt = _lora(0)
    with LayerCheck(model, opt, tmp_path / "c", every_step) as lc:
        lc.restore()
        for _ in range(5):
            _lora_step(model, opt)
            lc.step()
    rng = torch.get_rng_state()
    other, other_opt = _lora(1)
    assert not torch.equal(other.blocks[0].base.weight, model.blocks[0].base.weight)
    with LayerCheck(other, other_opt, tmp_path / "c", every_step) as lc:
        assert lc.restore() == 5
    for trained, restored in ((model, other), (opt, other_opt)):
        a, b = trained.state_dict(), restored.state_dict()
        if isinstance(trained, torch.optim.Optimizer):
            a, b = a["state"], b["state"]
            assert a.keys() == b.keys() and len(a) == 10  # 3 x (A, B), norm and head (w, b)
            a = {f"{i}/{k}": v for i, s in a.items() for k, v in s.items()}
            b = {f"{i}/{k}": v for i, s in b.items() for k, v in s.items()}
        assert a.keys() == b.keys()
        assert all(torch.equal(a[k], b[k]) for k in a), [k for k in a if not torch.equal(a[k], b[k])]
    assert torch.equal(torch.get_rng_state(), rng)  # restored with the rest
    for m, o in ((model, opt), (other, other_opt)):  # so the same batches follow
        torch.set_rng_state(rng)
        for _ in range(3):
            _lora_step(m, o)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), other.parameters()))


def _two_steps_match_the_copy_reference(model, opt, *, rtol: float) -> None:
    """Two real steps of ``model`` under ``opt``: the tracker's d_l equals the
    copy-based reference (weights before and after each step) to ``rtol``."""
    layer_map = LayerMap.auto(model)
    tracker = _trackers(opt, layer_map)
    for _ in range(2):
        ids = torch.randint(0, 128, (2, 10))
        model(input_ids=ids, labels=ids).loss.backward()
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        opt.step()
        opt.zero_grad()
        drift, _, _ = tracker.take()
        np.testing.assert_allclose(drift, _reference(before, model, layer_map), rtol=rtol)


def test_float64_parameters_are_measured_in_float64():
    """The torch path computes in the parameters' own dtype: fp64 weights give the copy
    reference to ~1e-13 (an fp32 pass would be off by ~1e-7)."""
    torch.manual_seed(0)
    model = tiny_lm(tied=False, layers=2).double()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    _two_steps_match_the_copy_reference(model, opt, rtol=1e-9)


def test_the_copy_fallback_samples_large_tensors_too():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.GELU(), torch.nn.Linear(512, 8))
    layers = [list(model[0].parameters()), list(model[2].parameters())]
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    with pytest.warns(UserWarning, match="copy of the previous weights"):
        exact = DriftTracker(opt, layers)
        sampled = DriftTracker(opt, layers, sampling=8)
    for _ in range(3):
        model(torch.randn(16, 512)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        d_exact, _, _ = exact.take()
        d_sampled, _, _ = sampled.take()
        np.testing.assert_allclose(d_sampled, d_exact, rtol=0.05)
        assert not np.array_equal(d_sampled, d_exact)  # the 512x512 weight was sampled


@needs_numba
def test_sampled_layers_split_over_param_groups_agree_on_both_paths():
    """The usual decay / no-decay split puts one layer's tensors in two groups; with
    sampling=2 a tensor of whole runs stands for exactly twice its sampled sum."""
    big, small = _flat_parts([131_072, 1_000])
    opt = torch.optim.AdamW([{"params": [big], "weight_decay": 0.1},
                             {"params": [small], "weight_decay": 0.0, "lr": 3e-3}], lr=1e-3)
    fused = DriftTracker(opt, [[big, small]], sampling=2)
    plain = DriftTracker(opt, [[big, small]], sampling=2, fused=False)
    exact = DriftTracker(opt, [[big, small]], fused=False)
    gen = torch.Generator().manual_seed(4)
    for _ in range(4):
        _flat_loss([big, small], gen).backward()
        before = [big.detach().clone(), small.detach().clone()]
        opt.step()
        opt.zero_grad()
        a, _, _ = fused.take()
        b, _, _ = plain.take()
        c, _, _ = exact.take()
        np.testing.assert_allclose(a, b, rtol=2e-6)
        np.testing.assert_allclose(b, c, rtol=0.05)
        assert b[0] != c[0]  # it sampled
        # each group's own LR and decay: the exact tracker equals the copy reference
        moved = sum(float((p.detach().double() - q.double()).abs().sum()) for p, q in zip((big, small), before))
        size = sum(float(p.detach().double().abs().sum()) for p in (big, small))
        assert c[0] == pytest.approx(moved / size, rel=2e-4)  # lr 1e-3: the copy rounds


# -- the rest of the tracker's contract ----------------------------------------------------

def _sgd_tracker(params_by_layer, **kw):
    opt = torch.optim.SGD([p for ps in params_by_layer for p in ps], lr=1.0)
    with pytest.warns(UserWarning):
        return opt, DriftTracker(opt, params_by_layer, **kw)


def test_layers_of_zero_small_and_infinite_weight():
    """d = moved / size, also when both are below 1; a layer that moved to all zeros
    drifted infinitely (however little it moved), one that is and stays zero not at
    all; weights that overflowed give NaN; none of it warns."""
    import warnings
    ws = [torch.nn.Parameter(torch.full((4,), v)) for v in (0.125, 0.0, 0.125)]
    opt, tracker = _sgd_tracker([[w] for w in ws])
    for w, g in zip(ws, (0.125, 0.0, 0.0625)):
        w.grad = torch.full((4,), g)  # moves 0.5, 0 and 0.25 in all
    opt.step()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        drift, _, _ = tracker.take()
    assert drift[0] == math.inf and drift[1] == 0.0 and drift[2] == 1.0
    inf = torch.nn.Parameter(torch.full((4,), math.inf))
    opt = torch.optim.AdamW([inf], lr=1e-2)
    tracker = DriftTracker(opt, [[inf]])
    inf.grad = torch.ones(4)
    opt.step()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        drift, _, _ = tracker.take()  # inf / inf
    assert math.isnan(drift[0])


def test_time_lr_and_fused_count_before_and_after_steps():
    lin = torch.nn.Linear(8, 8)
    opt = torch.optim.AdamW(lin.parameters(), lr=3e-3)
    tracker = DriftTracker(opt, [list(lin.parameters())])
    assert tracker.fused_params == 0 and tracker.seconds == 0.0
    drift, lr, seconds = tracker.take()  # no step yet: nothing moved, no LR
    assert drift.tolist() == [0.0] and math.isnan(lr) and 0.0 <= seconds < 0.5
    for _ in range(2):
        lin(torch.randn(2, 8)).sum().backward()
        opt.step()
        assert 0.0 < tracker.seconds < 0.5  # the hook's own time, so far this step
        drift, lr, seconds = tracker.take()
        assert drift[0] > 0 and lr == 3e-3 and 0.0 < seconds < 0.5 and tracker.seconds == 0.0


def _make_sgd_tracker(lin):
    return DriftTracker(torch.optim.SGD(lin.parameters(), lr=0.1), [list(lin.parameters())])


def test_the_copy_warning_names_the_optimizer():
    lin = torch.nn.Linear(2, 2)
    with pytest.warns(UserWarning) as record:
        _make_sgd_tracker(lin)
    (w,) = record.list
    assert str(w.message) == ("layercheck: drift for SGD is measured by keeping a copy of the "
                              "previous weights (exact, one extra model copy in memory); Adam and "
                              "AdamW need no copy")


def test_sampling_below_one_is_refused_with_the_fix():
    lin = torch.nn.Linear(2, 2)
    opt = torch.optim.AdamW(lin.parameters())
    with pytest.raises(ValueError) as err:
        DriftTracker(opt, [list(lin.parameters())], sampling=0)
    assert str(err.value) == "sampling=0: use 1 (every element) or more"


def test_given_groups_decide_what_is_tracked_and_the_rest_is_frozen():
    a, b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
    opt = torch.optim.AdamW(list(a.parameters()) + list(b.parameters()), lr=1e-2)
    group = opt.param_groups[0]
    tracker = DriftTracker(opt, [list(a.parameters()), list(b.parameters())],
                           groups={id(p): group for p in a.parameters()})
    (a(torch.randn(2, 4)).sum() + b(torch.randn(2, 4)).sum()).backward()
    opt.step()
    drift, _, _ = tracker.take()
    assert drift[0] > 0 and drift[1] == 0.0  # b moved, but the tracker was told it is frozen


def test_sampling_starts_at_sample_min_elements_and_is_off_by_default():
    from layercheck.drift.tracker import SAMPLE_MIN
    gen = torch.Generator().manual_seed(5)
    at, below = (torch.nn.Parameter(torch.randn(n, generator=gen)) for n in (SAMPLE_MIN, SAMPLE_MIN - 1))
    opt = torch.optim.AdamW([at, below], lr=1e-2)
    default, sampled = (DriftTracker(opt, [[at], [below]], fused=False, **kw) for kw in ({}, {"sampling": 2}))
    (at.pow(2).sum() + below.pow(2).sum() + at[::3].sum() + below[::5].sum()).backward()
    before = [at.detach().clone(), below.detach().clone()]
    opt.step()
    d_default, _, _ = default.take()
    d_sampled, _, _ = sampled.take()
    exact = [float((p.detach().double() - b.double()).abs().sum() / p.detach().double().abs().sum())
             for p, b in zip((at, below), before)]
    np.testing.assert_allclose(d_default, exact, rtol=1e-5)  # the default measures every element
    assert d_sampled[1] == d_default[1]  # below SAMPLE_MIN: whole
    assert d_sampled[0] != d_default[0]  # at SAMPLE_MIN: sampled
    np.testing.assert_allclose(d_sampled[0], exact[0], rtol=0.05)


@pytest.mark.parametrize("fused", [pytest.param(True, marks=needs_numba), False], ids=["fused", "foreach"])
def test_take_k_reads_block_k_mod_n_of_every_run(fused):
    """With sampling=n, step k's pass reads block k mod n of each run of n blocks (the
    module doc): a step that moves only those elements is seen, one that moves only the
    others is not. Adam with beta1 = 0 moves exactly the elements with a gradient."""
    n = 4
    p = torch.nn.Parameter(torch.ones(BLOCK * n * 300))
    opt = torch.optim.AdamW([p], lr=1e-2, betas=(0.0, 0.999), weight_decay=0.0)
    tracker = DriftTracker(opt, [[p]], sampling=n, fused=fused)
    block = torch.arange(p.numel()) // BLOCK % n
    for k in range(3 * n):
        if k % 2 == 0:
            p.grad = (block == k % n).float()  # moves only the block take k reads
        else:
            p.grad = (block != k % n).float()  # moves everything but that block
        opt.step()
        drift, _, _ = tracker.take()
        assert (drift[0] > 0) == (k % 2 == 0), k


def test_hook_calls_of_one_step_add_up():
    """Under ZeRO-3 the hook runs once per partition within a step: the sums of every
    call count (moved and |w| alike), and so do the tensors the kernel measured."""
    lin = torch.nn.Linear(8, 8)
    opt = torch.optim.AdamW(lin.parameters(), lr=1e-2)
    tracker = DriftTracker(opt, [list(lin.parameters())])
    moved = size = 0.0
    for _ in range(2):  # two calls before one take()
        before = {n: p.detach().clone() for n, p in lin.named_parameters()}
        lin(torch.randn(2, 8)).sum().backward()
        opt.step()
        opt.zero_grad()
        moved += sum(float((p.detach().double() - before[n].double()).abs().sum())
                     for n, p in lin.named_parameters())
        size += sum(float(p.detach().double().abs().sum()) for p in lin.parameters())
    drift, _, _ = tracker.take()
    assert drift[0] == pytest.approx(moved / size, rel=1e-5)
    assert tracker.fused_params == (4 if HAVE_NUMBA else 0)


@needs_numba
def test_the_kernel_measures_every_fusable_tensor_whatever_comes_first():
    """A layer without gradient this step, or one the kernel cannot read, ahead of the
    others: every fusable tensor is still measured by the kernel."""
    gen = torch.Generator().manual_seed(6)
    gapped = torch.nn.Parameter(torch.randn(64, 64, generator=gen)[:, ::2])  # not contiguous
    idle, busy = (torch.nn.Parameter(torch.randn(100, generator=gen)) for _ in range(2))
    opt = torch.optim.AdamW([gapped, idle, busy], lr=1e-2)
    tracker = DriftTracker(opt, [[gapped], [idle], [busy]])
    (gapped.sum() + busy.pow(2).sum()).backward()
    opt.step()  # idle has no gradient: Adam leaves it
    drift, _, _ = tracker.take()
    assert tracker.fused_params == 2  # idle (its size) and busy, not the gapped view
    assert drift[1] == 0.0 and drift[0] > 0 and drift[2] > 0


def test_local_hands_over_a_dtensors_shard_and_a_plain_tensor_itself():
    from layercheck.backends.source import local
    plain = torch.arange(4.0)
    assert local(plain) is plain
    # in a fresh Python: this one may hold a group another test file left up
    assert in_a_fresh_python(_local_of_a_one_rank_dtensor) == ("DTensor", "Tensor",
                                                               [0.0, 1.0, 2.0, 3.0])


def _local_of_a_one_rank_dtensor() -> tuple[str, str, list[float]]:
    """The types of a DTensor on a one-rank mesh and of what ``local`` makes of it,
    and its values."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    from layercheck.backends.source import local
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        sharded = distribute_tensor(torch.arange(4.0), init_device_mesh("cpu", (1,)), [Shard(0)])
        shard = local(sharded)
        return type(sharded).__name__, type(shard).__name__, shard.tolist()
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("opt_cls,fused", [(torch.optim.SGD, False), (torch.optim.AdamW, False),
                                           pytest.param(torch.optim.AdamW, True, marks=needs_numba)])
def test_a_sampled_tensor_counts_for_all_its_elements_next_to_a_whole_one(opt_cls, fused):
    """Every element of both tensors moves alike, so a sampled estimate is exact if
    and only if each sampled tensor stands for exactly its element count (n / elements
    read, the tail after the last whole run included) next to a tensor read whole."""
    big = torch.nn.Parameter(torch.ones(2 * BLOCK * 512 + 255))  # sampled, with a tail
    small = torch.nn.Parameter(torch.full((1000,), 2.0))  # under SAMPLE_MIN: whole
    kw = {"lr": 0.5} if opt_cls is torch.optim.SGD else {"lr": 0.5, "weight_decay": 0.0}
    opt = opt_cls([big, small], **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # SGD: the copy fallback's notice
        sampled = DriftTracker(opt, [[big, small]], sampling=2, fused=fused)
        exact = DriftTracker(opt, [[big, small]], fused=fused)
    for _ in range(3):
        big.grad, small.grad = torch.ones_like(big), torch.ones_like(small)
        opt.step()
        a, _, _ = sampled.take()
        b, _, _ = exact.take()
        np.testing.assert_allclose(a, b, rtol=1e-6)


def test_adam_with_decoupled_weight_decay_is_measured_as_adamw():
    torch.manual_seed(0)
    model = tiny_lm(tied=False, layers=2)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2, weight_decay=0.1, decoupled_weight_decay=True)
    _two_steps_match_the_copy_reference(model, opt, rtol=1e-5)


def test_a_hook_call_measures_only_what_that_call_stepped():
    """ZeRO-3 steps one partition per call: tensors tracked but not in this call's
    param groups are left for their own call, and those after them are still measured."""
    other, mine = torch.nn.Parameter(torch.ones(8)), torch.nn.Parameter(torch.ones(8))
    opt_other, opt = torch.optim.AdamW([other], lr=1e-2), torch.optim.AdamW([mine], lr=1e-2)
    tracker = DriftTracker(opt, [[other], [mine]],
                           groups={id(other): opt_other.param_groups[0], id(mine): opt.param_groups[0]})
    other.grad, mine.grad = torch.ones(8), torch.ones(8)
    opt.step()  # the hook sees only `mine` stepped
    drift, _, _ = tracker.take()
    # AdamW from w = 1: w(1) = 1 - lr wd - lr = 0.9899 (first step: m / sqrt(v) = 1)
    assert drift[0] == 0.0 and drift[1] == pytest.approx(0.0101 / 0.9899, rel=1e-4)
    # and the kernel measured `mine` although a tensor not stepped came first
    assert tracker.fused_params == (1 if HAVE_NUMBA else 0)


@pytest.mark.parametrize("fused", [pytest.param(True, marks=needs_numba), False], ids=["fused", "foreach"])
# numpy says so when the fused path casts that eps to fp32 (inf, as Adam's own fp32 sum is)
@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")
@pytest.mark.parametrize("eps,wd,grad", [(1e42, 0.0, 1.0), (1e-8, 1e-50, 0.0)],
                         ids=["eps-beyond-fp32", "decay-below-fp32"])
def test_an_update_too_small_for_fp32_weights_is_no_drift(fused, eps, wd, grad):
    """Both paths do fp32 element arithmetic, as the optimizer does (module doc): where
    an fp32 step leaves the weights exactly as they were, both report drift 0, as the
    copy reference does. Two such steps: an eps that is infinite in fp32 (eps * c too;
    every update is m / inf = 0), and a decay too small for fp32 (lr wd / scale is 0
    there) on a parameter whose gradient is 0 (m = v = 0)."""
    w = torch.nn.Parameter(torch.linspace(0.5, 2.0, 256))
    opt = torch.optim.AdamW([w], lr=1e-2, eps=eps, weight_decay=wd)
    tracker = DriftTracker(opt, [[w]], fused=fused)
    for _ in range(2):
        w.grad = torch.full_like(w, grad)
        before = w.detach().clone()
        opt.step()
        drift, _, _ = tracker.take()
        assert torch.equal(w.detach(), before)  # the copy reference: nothing moved
        assert drift[0] == 0.0 and tracker.fused_params == (1 if fused else 0)


def test_the_seconds_of_every_hook_call_of_a_step_add_up(monkeypatch):
    """take() returns the seconds spent in the hook and in take(): under ZeRO-3 the
    hook runs once per partition within a step, and each call's time counts. A clock
    that advances one second per reading makes each hook call take exactly 1 s."""
    lin = torch.nn.Linear(4, 4)
    opt = torch.optim.AdamW(lin.parameters(), lr=1e-2)
    tracker = DriftTracker(opt, [list(lin.parameters())])
    readings = iter(range(1000))
    monkeypatch.setattr(drift_module, "time", type("Clock", (), {
        "perf_counter": staticmethod(lambda: float(next(readings)))}))
    for _ in range(2):  # two calls before one take()
        lin(torch.randn(2, 4)).sum().backward()
        opt.step()
    assert tracker.seconds == 2.0
    _, _, seconds = tracker.take()
    assert seconds == 3.0 and tracker.seconds == 0.0  # and 1 s in take() itself
