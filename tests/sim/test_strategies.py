import numpy as np
import pytest

from sim.costs import CostModel
from sim.errors import SimError
from sim.strategies import CHECKFREQ_OVERHEAD, NATIVE_DIFF_BATCH, STRATEGIES, Cadence, get_strategy
from sim.theory import daly_interval_s
from sim.workload import LayerWrites, Workload

from .conftest import BASE_STEP, SMALL_COSTS, small_workload

COSTS = CostModel()
EVERY10 = Cadence(every=10, storage_every=20)


def _schedule(name, workload=None, costs=COSTS, cadence=EVERY10):
    strategy = get_strategy(name)
    return strategy.schedule(workload or small_workload(), costs, cadence if strategy.rollback else None)


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_no_charge_at_the_jobs_end(name):
    s = _schedule(name)
    n = s.steps
    assert s.snap[n] == s.persist[n] == s.bytes[n] == 0 and not s.commit[n]
    assert s.recover.shape == (n + 1,) and (s.recover >= COSTS.restart_s).all()


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_resuming_at_the_jobs_start_costs_only_the_restart(name):
    """No checkpoint to load: the restarted process built the initial model."""
    s = _schedule(name)
    assert s.recover[0] == COSTS.restart_s and (s.recover[1:] > COSTS.restart_s).all()
    if s.recover_backup is not None:
        assert s.recover_backup[0] == COSTS.restart_s


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_a_resume_past_the_start_pays_the_new_process_s_warmup(name):
    """The restarted process's first step is slower (Workload.warmup_s): every resume
    past the job's start pays it; a resume at the start re-runs step 1, which holds it."""
    import dataclasses
    cold = small_workload()
    warm = dataclasses.replace(cold, warmup_s=0.75)
    a, b = _schedule(name, cold), _schedule(name, warm)
    assert b.recover[0] == a.recover[0] == COSTS.restart_s
    np.testing.assert_allclose(b.recover[1:], a.recover[1:] + 0.75)
    if a.recover_backup is not None:
        assert b.recover_backup[0] == COSTS.restart_s
        np.testing.assert_allclose(b.recover_backup[1:], a.recover_backup[1:] + 0.75)


def test_a_workload_s_warmup_is_seconds_at_least_zero():
    for bad in (-0.1, float("nan"), float("inf")):
        with pytest.raises(SimError, match="warmup_s=.* must be a finite number of seconds >= 0"):
            Workload(name="w", compute_s=np.ones(4), full_bytes=4, warmup_s=bad)


def test_a_capture_s_warmup_is_its_first_forward_and_backward_beyond_the_median():
    from pathlib import Path
    from layercheck.contract.trace import read_trace
    from sim.workload import warmup_from
    root = Path(__file__).resolve().parents[2] / "traces"
    captured = read_trace(root / "minilm-200steps")
    passes = (captured.steps["forward_s"] + captured.steps["backward_s"]).to_numpy()
    expected = max(0.0, passes[0] - float(np.median(passes[1:])))
    assert warmup_from(captured) == pytest.approx(expected)
    assert Workload.from_trace(captured).warmup_s == pytest.approx(expected)
    # the optimizer's first step (Adam's moments allocated) is not a restart's cost
    optimizer = captured.steps["optimizer_s"].to_numpy()
    whole = captured.compute_seconds()
    if optimizer[0] > np.median(optimizer[1:]):
        assert warmup_from(captured) < whole[0] - float(np.median(whole[1:]))
    synthetic = read_trace(root / "qwen2.5-7b-synthetic")
    assert warmup_from(synthetic) == 0.0 and Workload.from_trace(synthetic).warmup_s == 0.0


def test_deepspeed_stalls_for_the_write_checkfreq_for_the_snapshot():
    ds, cf = _schedule("deepspeed"), _schedule("checkfreq")
    assert list(np.flatnonzero(ds.commit)) == [10, 20, 30]
    assert ds.snap[10] == pytest.approx(20e9 / (COSTS.save_gbps * 1e9)) and ds.persist[10] == 0
    # CheckFreq's 0.2 s snapshot hides behind the next step's compute (1-3 s): no stall,
    # and the persist starts once it is done
    assert cf.snap[10] == 0
    assert cf.persist[10] == pytest.approx(20e9 / 100e9 + 20e9 / (COSTS.persist_gbps * 1e9))
    costs = COSTS.with_overrides(async_load_gbps=2.0)
    assert _schedule("checkfreq", costs=costs).recover[5] == pytest.approx(30 + 4 + 10)


def test_checkfreq_snapshot_overlaps_up_to_one_iteration():
    """CheckFreq's snapshot runs beside the next forward and backward pass: training
    stalls only for what is left of it after the next step's compute."""
    w = Workload(name="flat", compute_s=np.full(40, 2.0), full_bytes=int(20e9))
    slow = COSTS.with_overrides(snapshot_gbps=4.0)                     # a 5 s snapshot
    s = _schedule("checkfreq", w, slow)
    assert s.snap[10] == pytest.approx(5.0 - 2.0)
    assert s.persist[10] == pytest.approx(2.0 + slow.persist_s(20e9))
    fast = _schedule("checkfreq", w, COSTS.with_overrides(snapshot_gbps=20.0))   # 1 s: hidden
    assert fast.snap[10] == 0


def test_lowdiff_replays_diffs_since_the_full_checkpoint():
    s = _schedule("lowdiff")
    replay = s.recover - COSTS.restart_s - COSTS.load_s(20e9)
    assert replay[10] == pytest.approx(0, abs=1e-9) and replay[14] == pytest.approx(4 * 0.1 * 20e9 / 22.9e9)
    # before the first full checkpoint the diffs replay onto the initial model
    assert s.recover[4] == pytest.approx(COSTS.restart_s + 4 * 0.1 * 20e9 / 22.9e9)
    # full saves are synchronous (primary tier); the batches reach storage through the
    # queue-fed writer (the non-blocking tier), recovered the same way
    assert list(np.flatnonzero(s.commit)) == [10, 20, 30]
    assert list(np.flatnonzero(np.isfinite(s.backup))) == list(range(2, 40, 2))
    np.testing.assert_array_equal(s.recover_backup, s.recover)
    assert s.backup_probability == 0 and (s.persist == 0).all()


def test_lowdiff_write_does_not_stall_training_until_its_queue_fills():
    """Writes slower than the steps: training stalls only for compression while the
    queue has room; with a queue of 2 batches it waits once 2 are pending."""
    w = Workload(name="flat", compute_s=np.full(40, 1.0), full_bytes=int(20e9))
    slow = COSTS.with_overrides(persist_gbps=0.5, diff_batch=1)        # 4 s per 1 s step
    compression = 0.1 * 20e9 / (slow.diff_snapshot_gbps * 1e9)
    lowdiff = get_strategy("lowdiff")
    s = lowdiff.schedule(w, slow, Cadence(every=50))                   # no full save
    np.testing.assert_allclose(s.snap[1:40], compression)
    # the backlog grows: batch i waits for the i-1 before it (4 s each)
    assert s.backup[1] == pytest.approx(4.0)
    assert s.backup[5] == pytest.approx(5 * 4.0 - 4 * (1.0 + compression))
    bounded = STRATEGIES["lowdiff"](queue_batches=2).schedule(w, slow, Cadence(every=50))
    np.testing.assert_allclose(bounded.snap[1:3], compression)         # room in the queue
    assert (bounded.snap[3:40] > compression + 1.0).all()               # full: it waits
    with pytest.raises(SimError, match="queue_batches"):
        STRATEGIES["lowdiff"](queue_batches=0)


def test_lowdiff_full_save_waits_for_the_writers_backlog():
    w = Workload(name="flat", compute_s=np.full(40, 1.0), full_bytes=int(20e9))
    slow = COSTS.with_overrides(persist_gbps=0.5, diff_batch=1)
    s = get_strategy("lowdiff").schedule(w, slow, Cadence(every=10))
    compression = 0.1 * 20e9 / (slow.diff_snapshot_gbps * 1e9)
    # the writer started at step 1's hand-off and wrote 9 batches of 4 s; step 10's compute ends
    backlog = (1.0 + compression) + 9 * 4.0 - (9 * (1.0 + compression) + 1.0)
    assert s.snap[10] == pytest.approx(backlog + slow.save_s(20e9) + compression)


def test_gemini_tiers_are_ordered():
    s = _schedule("gemini")
    assert list(np.flatnonzero(np.isfinite(s.backup))) == [20]
    assert list(np.flatnonzero(s.commit)) == [10, 20, 30]
    assert s.backup_probability == COSTS.peer_loss_probability
    # the paper's peer link (4.19 GB/s) is slower than its storage reads (17.9): never slower
    assert (s.recover <= s.recover_backup).all()
    fast_peer = _schedule("gemini", costs=COSTS.with_overrides(peer_gbps=50.0))
    assert fast_peer.recover[5] == pytest.approx(30 + 4 + 20 / 50)


def test_layercheck_commits_only_from_the_base_checkpoint():
    custom = Workload.custom(iteration_s=1.0, iterations=10, full_bytes=10**9)
    with pytest.raises(SimError, match="needs a trace"):
        get_strategy("layercheck").schedule(custom, COSTS)
    w = small_workload()
    s = _schedule("layercheck", w, SMALL_COSTS)
    assert not s.commit[:BASE_STEP].any() and s.commit[BASE_STEP:-1].all()
    bytes_ = np.concatenate(([0.0], w.layers.bytes_per_step))
    assert s.bytes[BASE_STEP] == 20e9 and (s.bytes[:BASE_STEP] == 0).all()
    i = BASE_STEP + 1
    assert s.persist[i] == pytest.approx(bytes_[i] / 2e9 + 0.4)       # writer + state commit
    assert s.snap[1] == pytest.approx(0.05 * w.compute_s[0])          # tracking, from step 1
    assert s.snap[i] == pytest.approx(0.05 * w.compute_s[i - 1] + bytes_[i] / 100e9)
    sync = _schedule("layercheck-sync", w, SMALL_COSTS)
    assert (sync.persist == 0).all()
    np.testing.assert_allclose(sync.snap, s.snap + s.persist)


def test_layercheck_opportunities_follow_its_interval():
    w = small_workload()
    layers = LayerWrites(written=w.layers.written, nbytes=w.layers.nbytes, params=w.layers.params,
                         interval=4)
    w4 = Workload(name="w4", compute_s=w.compute_s, full_bytes=w.full_bytes, layers=layers)
    s = _schedule("layercheck", w4, SMALL_COSTS)
    assert list(np.flatnonzero(s.commit)) == [4, 8, 12, 16, 20, 24, 28, 32, 36]


def test_stale_s_by_hand():
    """Two layers, params 1:3. Layer 0 written at 2 and 5, layer 1 at 2 only; unit steps."""
    written = np.zeros((8, 2), dtype=bool)
    written[1] = True
    written[4, 0] = True
    layers = LayerWrites(written=written, nbytes=np.array([1.0, 3.0]), params=np.array([1.0, 3.0]))
    w = Workload(name="hand", compute_s=np.ones(8), full_bytes=4, layers=layers)
    s = get_strategy("layercheck").schedule(w, COSTS)
    assert s.stale_s(6, 0) == pytest.approx(0.25 * 1 + 0.75 * 4)     # ages 1 and 4
    assert s.stale_s(6, 4) == pytest.approx(0.25 * 1 + 0.75 * 2)     # layer 1 equal to its copy at 4
    assert s.stale_s(2, 0) == 0 and s.stale_s(0, 0) == 0
    assert _schedule("deepspeed", w).stale_s(6, 0) == 0


def test_after_a_restore_the_stale_layers_are_the_resumed_run_s_by_hand():
    """The same run, resumed at 4: the restarted policy writes layer 0 3 steps after its
    last write (at 7, not at 5 as the uninterrupted run did), layer 1 2 steps after (6, 8)."""
    written = np.zeros((8, 2), dtype=bool)
    written[1] = True
    written[4, 0] = True
    restarted = np.minimum(np.arange(9)[:, None] + np.array([3, 2]), 9)
    layers = LayerWrites(written=written, nbytes=np.array([1.0, 3.0]), params=np.array([1.0, 3.0]),
                         restarted=restarted)
    w = Workload(name="hand", compute_s=np.ones(8), full_bytes=4, layers=layers)
    s = get_strategy("layercheck").schedule(w, COSTS)
    assert s.stale_s(6, 0) == pytest.approx(0.25 * 1 + 0.75 * 4)     # from the start: as recorded
    assert s.stale_s(5, 4) == pytest.approx(0.25 * 1 + 0.75 * 1)     # neither rewritten since 4
    assert s.stale_s(6, 4) == pytest.approx(0.25 * 2)                # layer 1 written at 6
    assert s.stale_s(7, 4) == pytest.approx(0.75 * 1)                # layer 0 at 7, layer 1 at 6
    with pytest.raises(SimError, match="restarted must be"):
        LayerWrites(written=written, nbytes=np.ones(2), params=np.ones(2), restarted=restarted[1:])
    with pytest.raises(SimError, match="restarted must be"):       # a write at or before its reset
        LayerWrites(written=written, nbytes=np.ones(2), params=np.ones(2),
                    restarted=np.zeros((9, 2), dtype=int))


def test_cadences_by_protocol():
    w = small_workload(steps=400)
    ds, cf, gem, low = (get_strategy(n) for n in ("deepspeed", "checkfreq", "gemini", "lowdiff"))
    assert ds.cadence("matched", w, COSTS, mtbf_s=3600.0).every == round(w.staleness)
    assert ds.cadence("native", w, COSTS, mtbf_s=3600.0, interval=7).every == 7
    step = w.compute_s.mean()
    daly = round(daly_interval_s(COSTS.save_s(20e9), 3600.0) / step)
    assert ds.cadence("native", w, COSTS, mtbf_s=3600.0).every == daly
    k = cf.cadence("native", w, COSTS, mtbf_s=3600.0).every

    def overhead(k):   # the snapshot overlaps one iteration
        stall = max(0.0, COSTS.snapshot_s(20e9) - step)
        return (stall + max(0.0, COSTS.persist_s(20e9) - k * step)) / (k * step)
    assert overhead(k) <= CHECKFREQ_OVERHEAD < overhead(k - 1)
    g = gem.cadence("native", w, COSTS, mtbf_s=3600.0)
    assert g.every == int(np.ceil(COSTS.peer_s(20e9) / step)) and g.storage_every >= g.every
    native = low.cadence("native", w, COSTS, mtbf_s=3600.0)
    replay = 0.1 * 20e9 / (COSTS.diff_replay_gbps * 1e9)
    assert native.every == min(w.steps, round(np.sqrt(2 * COSTS.save_s(20e9) * 3600.0 / (step * replay))))
    assert low.cadence("native", w, COSTS, mtbf_s=60.0).every == round(
        np.sqrt(2 * COSTS.save_s(20e9) * 60.0 / (step * replay)))
    assert native.batch == NATIVE_DIFF_BATCH == 1
    assert get_strategy("layercheck").cadence("native", w, COSTS, mtbf_s=3600.0) is None
    custom = Workload.custom(iteration_s=1.0, iterations=10, full_bytes=10**9)
    with pytest.raises(SimError, match="needs a trace"):
        ds.cadence("matched", custom, COSTS, mtbf_s=3600.0)


def test_unknown_strategy_and_bad_cadence():
    with pytest.raises(SimError, match="choose from"):
        get_strategy("gemeni")
    with pytest.raises(SimError, match="whole number"):
        Cadence(every=0)
    with pytest.raises(SimError, match="cadence"):
        get_strategy("deepspeed").schedule(small_workload(), COSTS)


def test_each_strategy_says_what_its_checkpoints_occupy(workload):
    full = float(workload.full_bytes)
    fp = {name: get_strategy(name).schedule(workload, SMALL_COSTS, Cadence(every=5, storage_every=10))
          .footprint for name in ("deepspeed", "checkfreq", "gemini")}
    assert fp["deepspeed"].host_bytes == 0 and fp["checkfreq"].host_bytes == full
    assert fp["gemini"].host_bytes == 2 * full                 # its copy and its peer's
    assert fp["deepspeed"].durable_bytes == fp["deepspeed"].moved_bytes == 7 * full  # 5..35
    assert fp["gemini"].durable_bytes == 3 * full               # its storage tier: 10, 20, 30
    assert fp["gemini"].moved_bytes == 10 * full and fp["gemini"].durable_share == pytest.approx(0.3)
    assert fp["checkfreq"].stored_bytes(2) == 2 * full
    lowdiff = get_strategy("lowdiff").schedule(workload, SMALL_COSTS, Cadence(every=10, batch=1))
    diff = SMALL_COSTS.diff_bytes(full)
    assert lowdiff.footprint.point_bytes == pytest.approx(full + 10 * diff)
    assert lowdiff.footprint.host_bytes >= diff            # at least the batch being written
    lc = get_strategy("layercheck").schedule(workload, SMALL_COSTS).footprint
    assert lc.host_bytes == pytest.approx(full) and lc.base_bytes == full  # the base checkpoint


def test_a_native_interval_past_the_job_is_the_job_without_overflow():
    """An MTBF whose Daly interval is inf in float64 (an API caller's 1e307 s, past the
    command line's range) gives the whole job, not an OverflowError from floor(inf)."""
    w = small_workload(steps=400)
    ds = get_strategy("deepspeed")
    assert ds.cadence("native", w, COSTS, mtbf_s=1e307).every == w.steps
    assert ds.cadence("native", w, COSTS, mtbf_s=1e18).every == w.steps
