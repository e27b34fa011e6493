"""The snapshot's host copies (layercheck.backends.hostcopy): at once on the CPU; on a GPU, pinned
memory filled on a side stream that the writer waits for (StepJob.ready) and the next
step's work waits for on the GPU. The CUDA tests skip only where there is no GPU
(tests/allowed_skips.txt); what runs everywhere is the CPU path and the writer's
wait, with a real writer and real files."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from layercheck import LayerCheck, LayerCheckConfig
from layercheck.backends import hostcopy
from layercheck.storage.localstore import LocalStore
from layercheck.storage.writer import LayerSnapshot, StepJob, Writer
from tests.conftest import tiny_lm

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_a_cpu_tensor_is_copied_when_host_returns_and_leaves_nothing_to_fence():
    t = torch.arange(12, dtype=torch.float32).view(3, 4).t()  # not contiguous
    out = hostcopy.host(t)
    assert out.is_contiguous() and torch.equal(out, t)
    t.add_(1)  # the copy is the training loop's no more
    assert torch.equal(out, t - 1)
    assert hostcopy.fence() is None


def test_the_writer_reads_a_snapshot_only_once_its_copies_are_ready(tmp_path):
    """A job submitted before its tensors hold their values (a GPU's copies still
    under way) is written with the values it has after ``ready`` returned: here a
    thread fills the tensor late, and ``ready`` waits for that thread."""
    tensor = torch.zeros(1024)
    filled = threading.Event()

    def fill() -> None:
        time.sleep(0.3)
        tensor.fill_(7.0)
        filled.set()
    threading.Thread(target=fill, daemon=True).start()
    store = LocalStore(tmp_path)
    writer = Writer(store, queue_bytes=1 << 20, on_error="raise")
    snap = LayerSnapshot(0, "layer", "base", {"param/w": tensor}, tensor.numel() * 4, (), None, ())
    writer.submit(StepJob(step=1, layers=[snap], state=None, nbytes=tensor.numel() * 4,
                          ready=filled.wait))
    writer.close()
    (path,) = (tmp_path / "layers").iterdir()
    assert torch.equal(load_file(path)["param/w"], torch.full((1024,), 7.0))


def test_a_cpu_layercheck_submits_jobs_with_nothing_to_wait_for(tmp_path, monkeypatch):
    submitted = []
    model = tiny_lm(tied=False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    lc = LayerCheck(model, opt, str(tmp_path / "ck"), LayerCheckConfig(warmup_steps=0))
    monkeypatch.setattr(lc.writer, "submit", lambda job: submitted.append(job))
    lc.restore()
    ids = torch.randint(0, 128, (2, 10))
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    lc.step()
    assert submitted and all(job.ready is None for job in submitted)
    lc.writer.close()


@needs_cuda
def test_a_cuda_tensor_goes_to_pinned_memory_and_is_right_after_the_fence():
    t = torch.randn(1 << 20, device="cuda")
    want = t.cpu()
    out = hostcopy.host(t)
    assert out.is_pinned() and out.device.type == "cpu"
    done = hostcopy.fence()
    t.mul_(0)  # queued after the fence: the GPU runs it once the copy is done
    done.wait()
    assert torch.equal(out, want)
    assert hostcopy.fence() is None  # the fence took every pending copy


@needs_cuda
def test_a_cuda_layercheck_restores_what_it_saved(tmp_path):
    torch.manual_seed(0)
    model = tiny_lm(tied=False).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    config = LayerCheckConfig(base_threshold=0, embedding_threshold=0, warmup_steps=0)
    with LayerCheck(model, opt, str(tmp_path / "ck"), config) as lc:
        lc.restore()
        for _ in range(3):
            ids = torch.randint(0, 128, (2, 10), device="cuda")
            model(input_ids=ids, labels=ids).loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            lc.step()
        saved = {n: p.detach().clone() for n, p in model.named_parameters()}
        moments = {n: opt.state[p]["exp_avg"].clone() for n, p in model.named_parameters()}
    fresh = tiny_lm(tied=False).cuda()
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=1e-2)
    with LayerCheck(fresh, fresh_opt, str(tmp_path / "ck"), config) as lc:
        assert lc.restore() == 3
    for n, p in fresh.named_parameters():
        assert p.is_cuda and torch.equal(p, saved[n]), n
        assert torch.equal(fresh_opt.state[p]["exp_avg"], moments[n]), n


@needs_cuda
def test_drift_on_the_gpu_is_the_copy_reference_and_counts_the_gpus_time():
    from layercheck.drift.tracker import DriftTracker
    from layercheck.backends.layermap import LayerMap
    torch.manual_seed(0)
    model = tiny_lm(tied=False).cuda()
    layer_map = LayerMap.auto(model)
    layers = [[p for _, p in layer_map.parameters(i)] for i in range(len(layer_map))]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    tracker = DriftTracker(opt, layers)
    ids = torch.randint(0, 128, (2, 10), device="cuda")
    model(input_ids=ids, labels=ids).loss.backward()
    before = [[p.detach().double() for p in ps] for ps in layers]
    opt.step()
    assert tracker.hook_seconds() > 0
    drift, _, seconds = tracker.take()
    reference = [sum(float((p.detach().double() - b).abs().sum()) for p, b in zip(ps, bs))
                 / sum(float(p.detach().double().abs().sum()) for p in ps)
                 for ps, bs in zip(layers, before)]
    np.testing.assert_allclose(drift, reference, rtol=1e-4)
    assert seconds > 0
