"""The drift tracker's fused path (layercheck.drift.fusedsums): which tensors the kernel may read,
the kernel loaded on first use, the layout built once per set of entries."""
from __future__ import annotations

import importlib.util
import sys

import pytest
import torch

from layercheck.drift import fusedsums
from layercheck.drift.tracker import DriftTracker
from layercheck.drift.fusedsums import fusable

HAVE_NUMBA = importlib.util.find_spec("numba") is not None
needs_numba = pytest.mark.skipif(not HAVE_NUMBA, reason="numba is not installed")


def test_the_kernel_reads_only_contiguous_cpu_fp32_tensors():
    assert fusable(torch.zeros(4))
    assert not fusable(torch.zeros(4, device="meta"))  # stands in for a GPU tensor
    assert not fusable(torch.zeros(4, dtype=torch.bfloat16))
    assert not fusable(torch.zeros(4, 2)[:, 0])


def test_kernels_load_on_first_use_and_a_failed_import_means_the_torch_path(monkeypatch):
    import layercheck.drift.kernels
    lin = torch.nn.Linear(8, 8)
    opt = torch.optim.AdamW(lin.parameters(), lr=1e-2)
    tracker = DriftTracker(opt, [list(lin.parameters())])
    monkeypatch.setattr(fusedsums, "_kernels", None)  # as in a fresh process
    lin(torch.randn(2, 8)).sum().backward()
    opt.step()
    tracker.take()
    assert fusedsums._kernels is layercheck.drift.kernels and tracker.fused_params == (2 if HAVE_NUMBA else 0)
    # numba missing: the import fails once, is remembered, and the torch path measures
    monkeypatch.setattr(fusedsums, "_kernels", None)
    monkeypatch.setitem(sys.modules, "numba", None)
    monkeypatch.delitem(sys.modules, "layercheck.drift.kernels")
    before = {n: p.detach().clone() for n, p in lin.named_parameters()}
    lin(torch.randn(2, 8)).sum().backward()
    opt.step()
    drift, _, _ = tracker.take()
    assert fusedsums._kernels is False and tracker.fused_params == 0
    moved = sum(float((p.detach().double() - before[n].double()).abs().sum()) for n, p in lin.named_parameters())
    assert drift[0] == pytest.approx(moved / sum(float(p.detach().double().abs().sum()) for p in lin.parameters()), rel=1e-5)


@needs_numba
def test_the_fused_layout_is_built_once_per_set_of_entries(monkeypatch):
    """The fused pass's segments depend only on which tensors it reads: built at the
    first step that reads a given set, then reused (a step whose set differs builds
    its own once, and the first set's comes back unchanged). A parameter is read by
    the kernel only if its weights and both moments are: a restore may leave one
    moment non-contiguous beside a contiguous other, and the torch path takes it."""
    from layercheck.drift import kernels
    built = []

    class Counted(kernels.FusedPass):
        def __init__(self, extents):
            built.append([tuple(e) for e in extents])
            super().__init__(extents)

    monkeypatch.setattr(kernels, "FusedPass", Counted)
    a, b = torch.nn.Parameter(torch.ones(8)), torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.AdamW([a, b], lr=1e-2)
    tracker = DriftTracker(opt, [[a], [b]])
    for step in range(5):
        a.grad = torch.ones(8)
        b.grad = torch.ones(3)
        if step == 2:  # b's moment is swapped for one the kernel cannot read
            opt.state[b]["exp_avg"] = torch.zeros(3, 2)[:, 0].copy_(opt.state[b]["exp_avg"])
        opt.step()
        if step == 2:
            opt.state[b]["exp_avg"] = opt.state[b]["exp_avg"].contiguous()
        drift, _, _ = tracker.take()
        assert drift[0] > 0 and drift[1] > 0
        assert tracker.fused_params == (1 if step == 2 else 2)
    assert built == [[(8, 8, 8), (3, 3, 3)], [(8, 8, 8)]]
