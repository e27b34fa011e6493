"""Adam/AdamW's step fused with the drift sums (layercheck.drift.fusedstep, layercheck.drift.stepkernel):
the optimizer's numbers against torch's own steps, the sums against weight copies, and
what stays torch's (state, hooks, schedulers, the calls it does not fuse)."""
from __future__ import annotations

import copy
import sys
import warnings

import numpy as np
import pytest
import torch

pytest.importorskip("numba")  # the fused step needs it; without it attach() warns (tested below)
from layercheck import LayerCheck, LayerCheckConfig  # noqa: E402
from layercheck.drift import fusedstep as fusedstep_module  # noqa: E402
from layercheck.drift import stepkernel  # noqa: E402
from layercheck.drift.tracker import DriftTracker  # noqa: E402
from layercheck.drift.fusedstep import FusedStep  # noqa: E402
from layercheck.backends.layermap import LayerMap  # noqa: E402
from tests.conftest import tiny_lm  # noqa: E402

SIZES = [70_001, 30_522, 385, 7, 16, 4096]  # tails of 1-15 elements beyond a 16-wide vector
VECTOR = {"AVX512": 16, "AVX2": 8}.get(torch.backends.cpu.get_cpu_capability())
"""torch's fp32 vector width here; its fused step's last numel % VECTOR elements of a
tensor run a scalar loop (None: not an x86 build whose vector loop we reproduce)."""

CASES = {
    "adamw": (torch.optim.AdamW, dict(weight_decay=0.01)),
    "adam-l2": (torch.optim.Adam, dict(weight_decay=0.01)),
    "adam": (torch.optim.Adam, dict()),
    "maximize-large-lerp": (torch.optim.AdamW, dict(maximize=True, betas=(0.3, 0.99))),
}


def _params(seed: int = 0) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(n, generator=g) * 0.05) for n in SIZES]


def _gradients(params, step: int) -> None:
    g = torch.Generator().manual_seed(100 + step)
    for p in params:
        p.grad = torch.randn(p.shape, generator=g) * 1e-3


def _ulps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """fp32 ulps between same-signed values."""
    return (a.view(torch.int32).long() - b.view(torch.int32).long()).abs()


@pytest.mark.parametrize("case", CASES)
def test_the_step_is_torchs_fused_step_bit_for_bit_but_its_scalar_tail(case):
    """Against torch.optim.Adam(W)(fused=True), 4 steps from the same start: every
    element torch's vector loop steps is equal bit for bit (weights, moments, step
    counts); the last numel % VECTOR elements, which torch's scalar loop steps,
    round the second moment in another order there, so they stay within a few ulps
    (the elements are independent: a difference never spreads)."""
    cls, kw = CASES[case]
    mine, theirs = _params(), _params()
    ours = cls(mine, lr=1e-3, **kw)
    assert FusedStep.attach(ours) is not None
    reference = cls(theirs, lr=1e-3, fused=True, **kw)
    for step in range(4):
        _gradients(mine, step)
        _gradients(theirs, step)
        ours.step()
        reference.step()
    for p, q in zip(mine, theirs):
        a, b = ours.state[p], reference.state[q]
        assert a["step"] == b["step"] == 4 and a["step"].dtype == b["step"].dtype
        for x, y in ((p.detach(), q.detach()), (a["exp_avg"], b["exp_avg"]),
                     (a["exp_avg_sq"], b["exp_avg_sq"])):
            if VECTOR is not None:
                body = x.numel() - x.numel() % VECTOR
                assert torch.equal(x[:body], y[:body])
            assert int(_ulps(x, y).max()) <= 4
        assert torch.equal(a["exp_avg"], b["exp_avg"])  # the first moment has no tail rounding


@pytest.mark.parametrize("case", ["adamw", "adam", "maximize-large-lerp"])
def test_one_step_is_within_an_ulp_of_torchs_default_step_with_equal_moments(case):
    """Against the default (for-loop) step from the same state: equal moments; weights
    one rounding apart at most: the default path's torch.sqrt is not correctly rounded
    (the fused step's is), which moves an update u by an ulp of u, and the new weight
    by at most an ulp of itself beyond that (both well under 1e-6 of the update)."""
    cls, kw = CASES[case]
    mine, theirs = _params(), _params()
    ours, reference = cls(mine, lr=1e-3, **kw), cls(theirs, lr=1e-3, foreach=False, **kw)
    FusedStep.attach(ours)
    differ = 0
    for step in range(3):  # start each step from the same state: copy torch's into ours
        _gradients(mine, step)
        _gradients(theirs, step)
        ours.step()
        reference.step()
        for p, q in zip(mine, theirs):
            assert torch.equal(ours.state[p]["exp_avg"], reference.state[q]["exp_avg"])
            assert torch.equal(ours.state[p]["exp_avg_sq"], reference.state[q]["exp_avg_sq"])
            bound = torch.finfo(torch.float32).eps * (p.detach().abs() + 1e-3 * 4)  # lr |u| <= 4
            assert bool(((p.detach() - q.detach()).abs() <= bound).all())
            differ += int((p.detach() != q.detach()).sum())
            with torch.no_grad():
                p.copy_(q)
    assert differ > 0  # two paths compared, not one with itself


def test_the_sums_are_the_change_of_the_stored_weights():
    """take(): per parameter sum |w(t) - w(t-1)| and sum |w(t)| of the stored fp32
    values, against float64 sums over copies (the kernel's fp32 block sums: 4e-6)."""
    params = _params()
    opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01)
    fused = FusedStep.attach(opt)
    for step in range(3):
        _gradients(params, step)
        before = [p.detach().double() for p in params]
        opt.step()
        ids, moved, size = fused.take()
        assert ids == [id(p) for p in params] and fused.take() is None
        for p, b, m, s in zip(params, before, moved, size):
            assert m == pytest.approx(float((p.detach().double() - b).abs().sum()), rel=4e-6)
            assert s == pytest.approx(float(p.detach().double().abs().sum()), rel=4e-6)


def test_tracker_drift_is_the_copy_reference_and_the_exact_trackers_value():
    """The tracker with fused_step: d_l equals a float64 reference over weight copies
    (1e-6), and the existing exact tracker's value on the same steps to within what
    that one leaves out: it recomputes the update from the moments, not the change of
    the fp32 weights, which rounding moves by up to half an ulp (1e-3 here)."""
    torch.manual_seed(0)
    model = tiny_lm(tied=False)
    layer_map = LayerMap.auto(model)
    layers = [[p for _, p in layer_map.parameters(i)] for i in range(len(layer_map))]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    fused = DriftTracker(opt, layers, fused_step=True)
    exact = DriftTracker(opt, layers)
    for _ in range(4):
        ids = torch.randint(0, 128, (2, 10))
        model(input_ids=ids, labels=ids).loss.backward()
        before = [[p.detach().double() for p in ps] for ps in layers]
        opt.step()
        opt.zero_grad(set_to_none=True)
        reference = np.array([sum(float((p.detach().double() - b).abs().sum()) for p, b in zip(ps, bs))
                              / sum(float(p.detach().double().abs().sum()) for p in ps)
                              for ps, bs in zip(layers, before)])
        d_fused, _, _ = fused.take()
        d_exact, _, _ = exact.take()
        assert fused.step_params == sum(len(ps) for ps in layers) and fused.fused_params == 0
        np.testing.assert_allclose(d_fused, reference, rtol=1e-6)
        np.testing.assert_allclose(d_fused, d_exact, rtol=1e-3)


def test_the_state_is_torchs_and_a_plain_adamw_goes_on_from_it():
    params = _params()
    opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01)
    FusedStep.attach(opt)
    for step in range(2):
        _gradients(params, step)
        opt.step()
    plain_params = [torch.nn.Parameter(p.detach().clone()) for p in params]
    plain = torch.optim.AdamW(plain_params, lr=1e-3, weight_decay=0.01, fused=True)
    plain.load_state_dict(copy.deepcopy(opt.state_dict()))  # load_state_dict keeps same tensors
    plain.param_groups[0]["fused"] = True  # the loaded group says None: the state dict's
    assert type(opt) is torch.optim.AdamW
    for step in range(2, 4):
        _gradients(params, step)
        _gradients(plain_params, step)
        opt.step()
        plain.step()
    for p, q in zip(params, plain_params):
        body = p.numel() - p.numel() % (VECTOR or 1)
        assert torch.equal(p.detach()[:body], q.detach()[:body]) if VECTOR else True
        assert int(_ulps(p.detach(), q.detach()).max()) <= 4


def test_hooks_run_once_around_the_fused_step_and_calls_it_cannot_fuse_run_torchs():
    params = _params()
    opt = torch.optim.AdamW(params, lr=1e-3)
    fused = FusedStep.attach(opt)
    calls = []
    opt.register_step_pre_hook(lambda *_: calls.append("pre"))
    opt.register_step_post_hook(lambda *_: calls.append(("post", fused.take() is not None)))
    _gradients(params, 0)
    opt.step()
    params[0].grad = torch.randn(2 * params[0].numel())[::2]  # not contiguous: not for the kernel
    opt.step()
    _gradients(params, 1)
    loss = opt.step(closure=lambda: torch.tensor(1.5))  # a closure: torch's own step
    assert float(loss) == 1.5
    assert calls == ["pre", ("post", True), "pre", ("post", False), "pre", ("post", False)]
    assert (fused.fused_calls, fused.torch_calls) == (1, 2)
    assert all(int(opt.state[p]["step"]) == 3 for p in params)


def test_an_amsgrad_group_is_stepped_by_torch_and_measured_after_it():
    lin = torch.nn.Linear(8, 8)
    opt = torch.optim.AdamW(lin.parameters(), lr=1e-2, amsgrad=True)
    tracker = DriftTracker(opt, [list(lin.parameters())], fused_step=True)
    lin(torch.randn(4, 8)).sum().backward()
    before = [p.detach().double() for p in lin.parameters()]
    opt.step()
    drift, _, _ = tracker.take()
    moved = sum(float((p.detach().double() - b).abs().sum()) for p, b in zip(lin.parameters(), before))
    size = sum(float(p.detach().double().abs().sum()) for p in lin.parameters())
    assert tracker.step_params == 0 and tracker._in_step.torch_calls == 1
    assert drift[0] == pytest.approx(moved / size, rel=1e-5)


@pytest.mark.parametrize("scheduler_first", [True, False], ids=["scheduler-first", "scheduler-after"])
def test_an_lr_scheduler_before_or_after_sees_the_steps_and_remove_restores(scheduler_first):
    params = _params()
    opt = torch.optim.AdamW(params, lr=1e-3)
    make = lambda: torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 ** s)  # noqa: E731
    scheduler = make() if scheduler_first else None
    original = opt.__dict__.get("step")
    fused = FusedStep.attach(opt)
    scheduler = scheduler or make()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "lr_scheduler.step() before optimizer.step()" and kin
        for step in range(3):
            _gradients(params, step)
            opt.step()
            scheduler.step()
    assert fused.fused_calls == 3 and opt.param_groups[0]["lr"] == pytest.approx(1e-3 / 8)
    fused.remove()
    _gradients(params, 3)
    opt.step()  # torch's own step again, through whatever wrapped ours
    assert fused.fused_calls == 3 and int(opt.state[params[0]]["step"]) == 4
    if scheduler_first:
        assert opt.__dict__.get("step") is original


@pytest.mark.parametrize("what", ["sgd", "replaced-step", "no-numba"])
def test_attach_refuses_what_it_can_never_fuse_with_a_warning_that_says_why(what, monkeypatch):
    lin = torch.nn.Linear(4, 4)
    opt = (torch.optim.SGD if what == "sgd" else torch.optim.AdamW)(lin.parameters(), lr=1e-2)
    if what == "replaced-step":
        opt.step = lambda *a, **k: None
    if what == "no-numba":
        import layercheck.drift as layercheck
        monkeypatch.setitem(sys.modules, "layercheck.drift.stepkernel", None)  # import fails
        monkeypatch.delattr(layercheck, "stepkernel")
    with pytest.warns(UserWarning, match="fused_step does not apply: .*(SGD|replaced|numba)"):
        assert FusedStep.attach(opt) is None


def test_dtensor_parameters_are_refused_by_their_class():
    class Shard(torch.Tensor):  # stands in for FSDP2's DTensor: a tensor subclass
        pass
    p = torch.nn.Parameter(torch.zeros(4).as_subclass(Shard))
    assert "not plain tensors" in fusedstep_module._refusal(torch.optim.AdamW([p], lr=1e-2))


def test_layercheck_with_fused_step_records_the_drift_of_the_stored_weights(tmp_path):
    torch.manual_seed(0)
    model = tiny_lm(tied=False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    lc = LayerCheck(model, opt, str(tmp_path / "ck"), LayerCheckConfig(fused_step=True,
                                                                     warmup_steps=1))
    lc.restore()
    ids = torch.randint(0, 128, (2, 10))
    model(input_ids=ids, labels=ids).loss.backward()
    before = {n: p.detach().double() for n, p in model.named_parameters()}
    opt.step()
    report = lc.step()
    params = dict(model.named_parameters())
    for i, layer in enumerate(lc.layer_map):
        moved = sum(float((params[n].detach().double() - before[n]).abs().sum()) for n in layer.params)
        size = sum(float(params[n].detach().double().abs().sum()) for n in layer.params)
        assert report.drift[i] == pytest.approx(moved / size, rel=1e-6)
    assert lc.drift.step_params == len(params)
    lc.close()
    assert "step" not in opt.__dict__  # close() gave the optimizer its own step back


def test_the_kernel_does_not_depend_on_the_number_of_threads(monkeypatch):
    from layercheck.drift import kernels
    monkeypatch.setattr(kernels, "PER_THREAD", 4096)  # cut even this small step into pieces
    results = []
    for threads in (1, 2, 3):
        g = torch.Generator().manual_seed(0)
        params = [torch.nn.Parameter(torch.randn(n, generator=g)) for n in (1 << 20, 70_001, 7)]
        m = [torch.zeros_like(p) for p in params]
        v = [torch.zeros_like(p) for p in params]
        steps = [torch.tensor(0.0) for _ in params]
        _gradients(params, 0)
        ptr = np.array([[p.data_ptr(), p.grad.data_ptr(), a.data_ptr(), b.data_ptr()]
                        for p, a, b in zip(params, m, v)], dtype=np.int64)
        plan = stepkernel.AdamPass([p.numel() for p in params])
        assert len(plan.plan.pieces(3)) - 1 > 3
        sums = plan.run(ptr, np.array([s.data_ptr() for s in steps], dtype=np.int64),
                        np.zeros(len(params), dtype=np.int64),
                        np.array([[1e-3, 0.9, 0.999, 1e-8, 0.01, 1.0, 0.0]]), threads)
        results.append((sums, [p.detach().clone() for p in params]))
    for (sums, weights) in results[1:]:
        assert all(np.array_equal(a, b) for a, b in zip(sums, results[0][0]))
        assert all(torch.equal(a, b) for a, b in zip(weights, results[0][1]))


def test_the_config_takes_only_a_boolean_and_round_trips():
    from layercheck.contract.config import ConfigError
    with pytest.raises(ConfigError, match="fused_step='yes': use True or False"):
        LayerCheckConfig(fused_step="yes")
    config = LayerCheckConfig(fused_step=True)
    assert LayerCheckConfig.from_dict(config.to_dict()) == config


def test_a_gradscalers_scale_on_a_fused_adamw_leaves_the_step_to_torch():
    """AMP's GradScaler hands a fused AdamW its scale as attributes (grad_scale,
    found_inf) for torch's kernel to unscale with: such a step is torch's."""
    params = _params()
    opt = torch.optim.AdamW(params, lr=1e-3, fused=True)
    fused = FusedStep.attach(opt)
    _gradients(params, 0)
    opt.grad_scale, opt.found_inf = torch.tensor(4.0), torch.tensor(0.0)
    before = params[0].grad.clone()
    opt.step()
    assert (fused.fused_calls, fused.torch_calls) == (0, 1)
    assert torch.equal(params[0].grad, before / 4)  # torch's kernel unscaled the gradient
