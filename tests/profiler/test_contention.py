"""profiler/contention.py: a competing process is seen, a quiet interval is not."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from profiler.contention import (THRESHOLD_CORES, ContentionMeter, Lap, summarize, warning)

pytestmark = pytest.mark.skipif(not Path("/proc/stat").exists(), reason="needs Linux /proc/stat")

_BURN = "import time\nt = time.perf_counter()\nwhile time.perf_counter() - t < 30: pass\n"


def _cpu_s(pid: int) -> float:
    """utime + stime of a process, from /proc/<pid>/stat (fields 14 and 15)."""
    import os
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _sleep_laps(n: int, seconds: float) -> list[Lap]:
    meter = ContentionMeter()
    meter.start()
    laps = []
    for _ in range(n):
        time.sleep(seconds)
        laps.append(meter.lap())
    return laps


def test_a_process_burning_a_core_is_seen_as_another_job():
    # this process sleeps; an unrelated process (not a child: Popen and never reaped
    # during the laps) spins a whole core: the meter charges it to "other processes"
    burner = subprocess.Popen([sys.executable, "-c", _BURN])
    try:
        time.sleep(0.5)  # its interpreter is up and spinning
        before, t0 = _cpu_s(burner.pid), time.perf_counter()
        record = summarize(_sleep_laps(4, 0.5))
        burned = (_cpu_s(burner.pid) - before) / (time.perf_counter() - t0)
    finally:
        burner.kill()
        burner.wait()
    assert record["checked"]
    assert burned > 0.1  # it got some CPU, however loaded the machine is
    # the others include at least the burner (less a tick's resolution over 2 s)
    assert record["other_cores_mean"] >= burned - 0.05, (record, burned)
    if burned >= THRESHOLD_CORES + 0.2:
        assert record["contended"] >= 3, record
    line = warning(record, "capture of traces/x")
    assert line is not None and "capture of traces/x" in line and "quiet machine" in line


def test_the_job_s_own_cpu_is_not_contention():
    # the same busy loop inside the measured process is the job, not another one
    meter = ContentionMeter()
    meter.start()
    laps = []
    for _ in range(3):
        t = time.process_time()
        while time.process_time() - t < 0.4:  # CPU time, so a loaded machine only slows it
            pass
        laps.append(meter.lap())
    record = summarize(laps)
    assert record["checked"]
    own_s = sum(lap.own_s for lap in laps)
    assert own_s >= 1.15  # the loop was ours
    own = own_s / sum(lap.wall_s for lap in laps)
    # what others used is what the machine did besides us, whatever else runs here; the
    # loop itself (a whole core) must not appear in it
    busy = sum(lap.busy_s for lap in laps) / sum(lap.wall_s for lap in laps)
    assert record["other_cores_mean"] == pytest.approx(max(0.0, busy - own), abs=0.05)
    assert record["other_cores_mean"] < busy - 0.8 * own


def test_reaped_children_count_as_the_job_when_asked():
    meter = ContentionMeter(children=True)
    meter.start()
    subprocess.run([sys.executable, "-c", _BURN.replace("perf_counter", "process_time")
                    .replace("30", "0.8")], check=True)
    lap = meter.lap()
    assert lap.own_s >= 0.6  # the child's CPU, reaped by run()


def test_summary_from_given_laps_and_the_job_s_cpu_of_every_rank():
    laps = [Lap(wall_s=1.0, busy_s=2.0, own_s=1.0), Lap(wall_s=1.0, busy_s=1.1, own_s=1.0),
            Lap(wall_s=2.0, busy_s=4.0, own_s=1.0)]
    # two ranks: the job used 2 CPU-s in the first lap, so nothing else ran then
    record = summarize(laps, job_cpu_s=[2.0, 1.0, 2.0])
    assert record["other_cores_max"] == pytest.approx(1.0)
    assert record["contended_ranges"] == [[3, 3]]
    assert record["other_cores_mean"] == pytest.approx((0 + 0.1 + 2.0) / 4.0)
    assert THRESHOLD_CORES == 0.5
    with pytest.raises(ValueError, match="2 job CPU figures for 3 laps"):
        summarize(laps, job_cpu_s=[1.0, 1.0])


def test_quiet_or_unread_records_say_nothing(tmp_path):
    quiet = summarize([Lap(wall_s=1.0, busy_s=1.0, own_s=1.0)] * 40)
    assert quiet["contended"] == 0 and warning(quiet, "x") is None
    # a few contended steps (under 5%) are noise, not a verdict
    few = summarize([Lap(wall_s=1.0, busy_s=1.0, own_s=1.0)] * 39
                    + [Lap(wall_s=1.0, busy_s=3.0, own_s=1.0)])
    assert few["contended"] == 1 and warning(few, "x") is None
    unread = ContentionMeter(stat=tmp_path / "no-such-stat")
    unread.start()
    record = summarize([unread.lap()])
    assert record == {"checked": False, "method": record["method"],
                      "reason": "the machine's CPU counters (/proc/stat) could not be read"}
    assert warning(record, "x") is None
    with pytest.raises(RuntimeError, match="before start"):
        ContentionMeter().lap()


def test_a_worker_s_own_children_are_counted_though_never_reaped_here():
    # a "worker" leading its process group starts a child that burns CPU, then both are
    # SIGKILLed with the group: the child's CPU never reaches our os.times(), so
    # Descendants keeps what it last saw of it
    import os
    import signal
    from profiler.contention import Descendants
    leader = subprocess.Popen(
        [sys.executable, "-c",
         "import subprocess, sys, time\n"
         f"subprocess.Popen([sys.executable, '-c', {_BURN.replace('perf_counter', 'process_time')!r}])\n"
         "time.sleep(60)\n"], start_new_session=True)
    seen = Descendants()
    try:
        deadline = time.monotonic() + 20
        while seen.cpu_s < 0.5 and time.monotonic() < deadline:
            time.sleep(0.2)
            seen.sample({leader.pid})
    finally:
        os.killpg(leader.pid, signal.SIGKILL)
        leader.wait()
    assert seen.cpu_s >= 0.5  # the grandchild's burn, not the sleeping leader (our child)
    before = seen.cpu_s
    time.sleep(0.3)
    seen.sample({leader.pid})  # the group is killed (gone, or a zombie): what was seen stays
    assert seen.cpu_s >= before
