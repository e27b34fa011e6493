"""The ledger of a real run: the simulator's accounting applied to workers' event logs, by hand."""
from __future__ import annotations

import pytest

from profiler.failures.ledger import WorkerLog, account


def _step(t, job, step, compute=1.0, stall=0.0, tracking=0.0):
    """A step ending at t (its checkpoint's end): the worker's timestamps of a step whose
    compute took ``compute`` and whose checkpoint ``stall`` (tracking: of the stall, inside
    the optimizer phase)."""
    computed = t - (stall - tracking)
    return {"event": "step", "time": t, "job": job, "step": step,
            "begin": computed - compute - tracking, "computed": computed,
            "compute_s": compute, "stall_s": stall, "tracking_s": tracking}


def _resumed(t, job, step, sources=None):
    return {"event": "resumed", "time": t, "job": job, "step": step, "sources": sources or {}}


def test_a_rollback_run_by_hand():
    # worker 0: time 0 at t=100; steps of 1 s compute, a 0.5 s save after step 2
    w0 = WorkerLog(90.0, 104.2, [
        {"event": "ready", "time": 99.0}, _resumed(100.0, 0, 0), _step(101.0, 0, 1),
        _step(102.5, 0, 2, stall=0.5), _step(103.5, 0, 3)])
    # killed at 104.2 (0.7 s into step 4); the next worker is ready at 110, resumes step 2 at 111
    w1 = WorkerLog(104.2, None, [
        {"event": "ready", "time": 110.0}, _resumed(111.0, 0, 2), _step(112.0, 0, 3),
        _step(113.0, 0, 4), _step(120.5, 0, 5)])  # step 5 ends after the window
    led = account([w0, w1], window_s=20.0)
    assert led.useful_s == pytest.approx(4.0)  # steps 1, 2 of worker 0; 3, 4 of worker 1
    assert led.lost_work_s == pytest.approx(1.0 + 0.7)  # step 3 rolled back, 0.7 s in flight
    assert led.checkpoint_stall_s == pytest.approx(0.5)
    assert (led.restart_s, led.load_s, led.recovery_s) == pytest.approx((5.8, 1.0, 6.8))
    assert led.failures == 1 and led.resumed_at == [2] and led.stale_s == 0
    assert led.effective_ratio == pytest.approx(4.0 / 20.0)
    assert led.compute_median_s == pytest.approx(1.0)  # the run's own pace


def test_a_weight_update_held_for_a_snapshot_is_stall_not_compute():
    # CheckFreq: a save after step 1 returns at once (0.1 s), its snapshot copies during
    # step 2, whose update then waits 0.3 s: inside step 2's span, yet the checkpoint's
    held = {**_step(2.4, 0, 2, compute=1.3), "held_s": 0.3}
    w0 = WorkerLog(0.0, None, [_resumed(0.0, 0, 0), _step(1.1, 0, 1, stall=0.1), held,
                               _step(3.4, 0, 3)])
    led = account([w0], window_s=3.4)
    assert led.useful_s == pytest.approx(3.0)
    assert led.checkpoint_stall_s == pytest.approx(0.1 + 0.3)
    assert led.tracking_s == 0


def test_a_resumed_worker_s_slow_first_step_is_the_restart_s_warmup():
    # steps of 1 s; the worker resumed at step 2 takes 1.6 s for its first: 0.6 s warm-up
    w0 = WorkerLog(0.0, 4.5, [_resumed(0.0, 0, 0), _step(1.0, 0, 1), _step(2.0, 0, 2),
                              _step(3.0, 0, 3), _step(4.0, 0, 4)])
    w1 = WorkerLog(4.5, None, [{"event": "ready", "time": 8.0}, _resumed(8.5, 0, 2),
                               _step(10.1, 0, 3, compute=1.6), _step(11.1, 0, 4),
                               _step(12.3, 0, 5, compute=1.2)])
    led = account([w0, w1], window_s=13.0)
    assert led.warmup_s == pytest.approx(0.6)  # only the first step: step 5's 0.2 s is pace
    assert led.recovery_s == pytest.approx(4.0 + 0.6)
    assert led.useful_s == pytest.approx(2.0 + 1.0 + 1.0 + 1.2)
    assert led.lost_work_s == pytest.approx(2.0 + 0.5)
    # a worker restarted at the job's start re-runs step 1: its warm-up is step 1's own,
    # as in the capture (and the simulator), so it stays compute
    r0 = WorkerLog(0.0, 2.5, [_resumed(0.0, 0, 0), _step(1.0, 0, 1), _step(2.0, 0, 2)])
    r1 = WorkerLog(2.5, None, [_resumed(5.0, 0, 0), _step(6.6, 0, 1, compute=1.6)])
    fresh = account([r0, r1], window_s=7.0)
    assert fresh.warmup_s == 0 and fresh.useful_s == pytest.approx(1.6)


def test_stale_layers_discard_the_steps_after_their_copy():
    shares = {"a": 0.25, "b": 0.75}
    w0 = WorkerLog(0.0, 10.0, [_resumed(1.0, 0, 0), *[_step(1.0 + s, 0, s) for s in range(1, 8)]])
    # resumes at 6 from a composite: layer a's copy is of step 3, b's of step 6
    w1 = WorkerLog(10.0, None, [{"event": "ready", "time": 11.0},
                                _resumed(12.0, 0, 6, {"a": 3, "b": 6}), _step(13.0, 0, 7)])
    led = account([w0, w1], window_s=15.0, shares=shares)
    assert led.stale_s == pytest.approx(0.25 * 3)  # a's updates of steps 4, 5, 6
    assert led.useful_s == pytest.approx(7.0) and led.lost_work_s == pytest.approx(1.0 + 2.0)


def test_a_second_recovery_does_not_discard_twice():
    shares = {"a": 1.0}
    w0 = WorkerLog(0.0, 10.0, [_resumed(0.0, 0, 0), *[_step(float(s), 0, s) for s in range(1, 7)]])
    w1 = WorkerLog(10.0, 20.0, [_resumed(11.0, 0, 5, {"a": 2}), _step(12.0, 0, 6),
                                _step(13.0, 0, 7)])
    w2 = WorkerLog(20.0, None, [_resumed(21.0, 0, 7, {"a": 2})])
    led = account([w0, w1, w2], window_s=30.0, shares=shares)
    # first recovery: steps 3..5 discarded; second: only 6..7 (the job last resumed at 5)
    assert led.stale_s == pytest.approx(3.0 + 2.0)


def test_a_tiered_run_s_memory_restore_is_exact_and_a_later_composite_discards_all_since_its_copy():
    """tiered: a memory restore at the cut step has nothing stale and loses only the step in
    flight; a later composite (node and buddy lost) whose copy predates that restore
    discards every surviving update since its copy: the memory restore had kept them."""
    shares = {"a": 0.5, "b": 0.5}
    w0 = WorkerLog(0.0, 6.5, [_resumed(0.0, 0, 0), *[_step(float(s), 0, s) for s in range(1, 7)]])
    # processes lost: memory holds step 6, every layer of it
    w1 = WorkerLog(6.5, 20.0, [{**_resumed(8.0, 0, 6, {"a": 6, "b": 6}), "tiers": {"memory": 2}},
                               *[_step(8.0 + s - 6, 0, s) for s in range(7, 12)]])
    # node and buddy lost: the durable composite of step 11, a's copy of step 2, b's of 11
    w2 = WorkerLog(20.0, None, [{**_resumed(22.0, 0, 11, {"a": 2, "b": 11}),
                                 "tiers": {"storage": 2}}, _step(23.0, 0, 12)])
    led = account([w0, w1, w2], window_s=24.0, shares=shares)
    assert led.resumed_at == [6, 11] and led.recovered_from == ["memory", "storage"]
    assert led.lost_work_s == pytest.approx(0.5 + (20.0 - 13.0))  # in flight only
    # a's updates of steps 3..11 (the first restore discarded none of them)
    assert led.stale_s == pytest.approx(0.5 * 9)
    # a rolled-back step's number, trained again, is counted afresh
    w2 = WorkerLog(20.0, 30.0, [_resumed(22.0, 0, 9, {"a": 2, "b": 9}), _step(23.0, 0, 10)])
    w3 = WorkerLog(30.0, None, [_resumed(31.0, 0, 10, {"a": 2, "b": 10})])
    led = account([w0, w1, w2, w3], window_s=32.0, shares=shares)
    assert led.stale_s == pytest.approx(0.5 * 7 + 0.5 * 1)  # 3..9, then the new 10


def test_a_finished_job_is_never_rolled_back_and_the_next_starts_at_step_one():
    w0 = WorkerLog(0.0, 9.0, [_resumed(0.0, 0, 0), _step(1.0, 0, 1), _step(2.0, 0, 2),
                              {"event": "job_done", "time": 2.1, "job": 0},
                              _resumed(2.2, 1, 0), _step(3.2, 1, 1)])
    w1 = WorkerLog(9.0, None, [_resumed(12.0, 1, 0), _step(13.0, 1, 1),
                               {"event": "job_done", "time": 13.1, "job": 1},
                               _resumed(13.2, 2, 0)])
    led = account([w0, w1], window_s=20.0)
    assert led.jobs_done == 2 and led.useful_s == pytest.approx(3.0)
    assert led.resumed_at == [0]  # a recovery; the start of job 2 is not one
    assert (led.restart_s, led.load_s) == (3.0, 0.0)  # no ready event: all of it restart and led.lost_work_s == pytest.approx(1.0 + (9.0 - 3.2))


def test_a_worker_killed_while_restarting_extends_the_recovery():
    w0 = WorkerLog(0.0, 5.0, [_resumed(0.0, 0, 0), _step(1.0, 0, 1)])
    w1 = WorkerLog(5.0, 8.0, [])  # killed before it was ready
    w2 = WorkerLog(8.0, None, [{"event": "ready", "time": 9.0}, _resumed(10.0, 0, 0)])
    led = account([w0, w1, w2], window_s=12.0)
    assert led.failures == 2 and led.recovery_s == pytest.approx(5.0)
    assert led.restart_s == pytest.approx(3.0 + 1.0) and led.load_s == pytest.approx(1.0)


def test_no_time_zero_without_a_start():
    with pytest.raises(ValueError, match="never started"):
        account([WorkerLog(0.0, 1.0, [])], window_s=10.0)


@pytest.mark.slow
def test_the_ledger_of_a_real_killed_run_adds_up_and_agrees_with_its_logs(tmp_path):
    """A real run (the tiny job under deepspeed, saves every 2 steps, killed at 2 s and
    32 s of a 40 s window; a restart of the tiny job takes ~8 s on a quiet machine, so the
    second worker resumes and trains): the ledger read back from the run's folder against
    what its raw logs say directly."""
    from profiler.config import CaptureConfig
    from profiler.failures.ledger import SUPERVISOR_LOG, _lines, read_run
    from profiler.failures.supervisor import RunSpec, supervise
    from tests.profiler.conftest import TINY

    config = CaptureConfig(**{**TINY, "warmup_steps": 1})
    window, kills, every = 40.0, (2.0, 32.0), 2
    spec = RunSpec(strategy="deepspeed", config=config, device="cpu", interval=every,
                   failures_s=kills, window_s=window, root=tmp_path)
    workers = supervise(spec, say=lambda _: None)
    assert workers == read_run(tmp_path)                    # what it returns is its folder
    import json
    from profiler.failures.supervisor import CONTENTION_FILE
    record = json.loads((tmp_path / CONTENTION_FILE).read_text())  # what else ran meanwhile
    assert record["checked"] and record["laps"] == 1 and record["other_cores_mean"] >= 0
    led = account(workers, window_s=window)

    supervisor = _lines(tmp_path / SUPERVISOR_LOG)
    (start,) = [e["start"] for e in supervisor if e["event"] == "window"]
    end = start + window
    killed = [e["time"] for e in supervisor if e["event"] == "kill"][:len(kills)]
    # on time, to a quarter second: a loaded machine wakes the supervisor late (2.1 s
    # seen at load 18), and what follows reads each kill's own logged time
    assert [abs(t - start - k) < 0.25 for t, k in zip(killed, kills)] == [True, True], \
        [t - start for t in killed]
    assert led.failures == 2
    # the parts add up to the window, with little left over (job switches, a cut step)
    assert 0 <= led.other_s < 0.1 * window
    steps = [e for w in workers for e in w.events if e["event"] == "step" and e["time"] <= end]
    assert led.steps_done == len(steps)
    # the timestamps and the process's own timers tell the same story: a timer never
    # holds more than its span of the timestamps, and the spans' excess (the batch's fetch
    # before the timed phases, the bookkeeping around the save: a few ms a step, more
    # where the process waits for a core on a loaded machine) stays small in all
    for timer, start_at, end_at, sign in (("compute_s", "begin", "computed", -1),
                                          ("stall_s", "computed", "time", +1)):
        excess = [e[end_at] - e[start_at] + sign * e["tracking_s"] - e[timer] for e in steps]
        assert min(excess) >= -1e-3, timer
        assert max(excess) < 1.0 and sum(excess) < 0.05 * window, (timer, max(excess), sum(excess))
    # every step's compute is either kept or lost; lost also holds what was in flight
    in_flight = sum(k - max(e["time"] for e in w.events if e["event"] in ("resumed", "step")
                            and e["time"] <= k)
                    for w, k in zip(workers, killed) if any(e["event"] == "resumed" for e in w.events))
    computed = sum(e["computed"] - e["begin"] - e["tracking_s"] for e in steps)
    # (less a resumed worker's first-step warm-up, which is recovery)
    assert led.useful_s + led.lost_work_s + led.warmup_s == pytest.approx(computed + in_flight,
                                                                          abs=1e-6)
    # recovery: from each kill to the next worker's resume, read straight from the logs
    # (a worker killed before it resumed: its recovery runs to its own kill)
    resumes = [next((e["time"] for e in w.events if e["event"] == "resumed"), w.killed)
               for w in workers[1:]]
    assert led.recovery_s - led.warmup_s == pytest.approx(
        sum(min(r, end) - k for r, k in zip(resumes, killed)))
    # each recovery resumed at the newest save the killed worker had logged (or the one in
    # flight at the kill): a multiple of the interval, in the job it was killed in; or at
    # the next job's start, where the kill fell after the job's end was made durable
    # (``job.json``) and before its ``job_done`` line
    assert led.resumed_at, "no worker resumed after a kill: is the machine this loaded?"
    recoveries = [(w, next(e for e in after.events if e["event"] == "resumed"))
                  for w, after in zip(workers, workers[1:])
                  if any(e["event"] == "resumed" and e["time"] <= end for e in after.events)]
    assert [e["step"] for _, e in recoveries] == led.resumed_at
    for w, resumed in recoveries:
        got = resumed["step"]
        last = [e for e in w.events if e["event"] in ("resumed", "step")][-1]
        if resumed["job"] == last["job"] + 1:
            assert last["event"] == "step" and last["step"] == config.steps and got == 0
            continue
        assert resumed["job"] == last["job"]
        logged = [e["step"] for e in w.events if e["event"] == "step" and e["job"] == last["job"]
                  and e["step"] % every == 0 and e["step"] < config.steps]
        durable = max(logged + [last["step"] if last["event"] == "resumed" else 0])
        assert got % every == 0 and durable <= got <= durable + every
