"""Run a training script in a child process that reports its steps and halts on cue,
so that a test kills it at a known step instead of after a time or a line count.

Parent side::

    child = HaltingRun(script, [args...], halt_at=90)
    child.wait_for("restored")   # {"event": "restored", "step": t}: what restore() returned
    child.wait_for("halted")     # step 90's checkpoint is committed; the child waits
    child.kill()                 # SIGKILL

Child side (``python -m tests.layercheck.halting --report-fd FD [--halt-at N] SCRIPT
ARGS...``): wraps the public ``LayerCheck.restore`` and ``LayerCheck.step`` (which
the plain loop and the Trainer callback both call), reports one JSON line per event
on the pipe ``FD``, and at step N waits for that step's writes to commit
(``flush()``), reports ``halted`` and sleeps until it is killed, as the profiler's
drill worker does. Then it runs SCRIPT as ``__main__``.
"""
from __future__ import annotations

import argparse
import json
import os
import runpy
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[2]


class HaltingRun:
    """The parent's handle on a child started under this module (see the module doc)."""

    def __init__(self, script: Path, args: list[str], *, halt_at: int | None = None,
                 env: dict[str, str] | None = None, **popen: Any) -> None:
        read, write = os.pipe()
        command = [sys.executable, "-m", "tests.layercheck.halting", "--report-fd", str(write)]
        if halt_at is not None:
            command += ["--halt-at", str(halt_at)]
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
               "HF_HUB_OFFLINE": "1", **(env or {})}
        try:
            self.proc = subprocess.Popen([*command, str(script), *args], env=env, cwd=ROOT,
                                         pass_fds=(write,), **popen)
        finally:
            os.close(write)
        self._fd, self._buffer = read, b""
        self.events: list[dict[str, Any]] = []

    def wait_for(self, event: str, timeout: float = 600) -> dict[str, Any]:
        """The next reported event named ``event`` (earlier ones are kept in ``events``);
        AssertionError if the child ends first or nothing comes within ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            while b"\n" in self._buffer:
                line, self._buffer = self._buffer.split(b"\n", 1)
                self.events.append(json.loads(line))
                if self.events[-1]["event"] == event:
                    return self.events[-1]
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self._fd], [], [], max(left, 0))
            assert ready, f"no '{event}' from the child within {timeout} s ({self.events[-1:]})"
            chunk = os.read(self._fd, 65536)
            if not chunk:
                code = self.proc.wait()
                raise AssertionError(f"the child ended (exit {code}) before reporting '{event}'")
            self._buffer += chunk

    def steps(self) -> list[int]:
        """The steps reported so far, in order."""
        return [e["step"] for e in self.events if e["event"] == "step"]

    def kill(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self.close()

    def wait(self, timeout: float = 600) -> int:
        """Wait for the child to end, reading every event it reported; its exit status."""
        code = self.proc.wait(timeout=timeout)
        while chunk := os.read(self._fd, 65536):
            self._buffer += chunk
        for line in self._buffer.split(b"\n"):
            if line:
                self.events.append(json.loads(line))
        self._buffer = b""
        self.close()
        return code

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def sigkill_drill(start: Callable[..., HaltingRun], tmp: Path, *, kill_at: int, steps: int,
                  killed: Callable[[Path], None] = lambda ckpt: None,
                  tolerance: float = 0.01) -> dict[str, float]:
    """The kill-and-restart drill of a training script that prints a JSON summary last
    (``final_loss``, ``eval_loss``, ``resumed_at``, ``global_step``) and appends one JSON
    line per logged step to ``--losses``: a failure-free run beside one SIGKILLed once
    step ``kill_at`` is committed, then that one started again. ``start(ckpt, log,
    halt_at=None, **popen)`` starts a run. ``killed(ckpt)`` inspects the directory
    between the kill and the restart. Asserts that the restart resumes at ``kill_at``,
    runs every later step once, that both runs agree bit for bit before the failure,
    and that the resumed run ends within ``tolerance`` of the failure-free one; returns
    the relative gaps (``final_loss``, ``eval_loss``)."""
    clean = start(tmp / "clean", tmp / "clean.jsonl", stdout=open(tmp / "clean.out", "wb"),
                  stderr=subprocess.DEVNULL)
    crash = start(tmp / "ckpt", tmp / "crash.jsonl", halt_at=kill_at, stdout=subprocess.DEVNULL,
                  stderr=subprocess.DEVNULL)
    assert crash.wait_for("restored")["step"] == 0
    crash.wait_for("halted")
    crash.kill()
    killed_at = max(e["step"] for e in _logged(tmp / "crash.jsonl"))
    assert killed_at == kill_at - 1  # halted inside the step's callback, before its log line
    killed(tmp / "ckpt")

    again = start(tmp / "ckpt", tmp / "crash.jsonl", stdout=open(tmp / "again.out", "wb"),
                  stderr=subprocess.PIPE)
    _, err = again.proc.communicate(timeout=300)
    assert again.wait() == 0, err.decode()[-3000:]
    assert clean.wait(timeout=300) == 0
    assert [e["step"] for e in again.events if e["event"] == "restored"] == [kill_at]
    assert again.steps() == list(range(kill_at + 1, steps + 1))
    summary = json.loads((tmp / "again.out").read_text().splitlines()[-1])
    reference = json.loads((tmp / "clean.out").read_text().splitlines()[-1])
    assert summary["resumed_at"] == kill_at and summary["global_step"] == steps

    log = _logged(tmp / "crash.jsonl")
    second = log[[e["step"] for e in log].index(killed_at) + 1:]
    assert [e["step"] for e in second] == list(range(kill_at + 1, steps + 1))
    clean_log = {e["step"]: e["loss"] for e in _logged(tmp / "clean.jsonl")}
    # before the failure both runs are the same computation, in separate processes
    assert all(clean_log[e["step"]] == e["loss"] for e in log[:killed_at])
    gaps = {key: abs(summary[key] - reference[key]) / reference[key]
            for key in ("final_loss", "eval_loss")}
    print(f"\nfailure-free {reference}\nresumed      {summary}\nrelative gaps {gaps}")
    assert all(gap <= tolerance for gap in gaps.values()), (gaps, summary, reference)
    return gaps


def _logged(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _child(argv: list[str]) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--report-fd", type=int, required=True)
    ap.add_argument("--halt-at", type=int)
    ap.add_argument("script")
    ap.add_argument("args", nargs=argparse.REMAINDER)
    opts = ap.parse_args(argv)
    report = os.fdopen(opts.report_fd, "w", buffering=1)

    def say(event: str, step: int) -> None:
        report.write(json.dumps({"event": event, "step": step}) + "\n")
        report.flush()

    from layercheck import LayerCheck
    restore, step = LayerCheck.restore, LayerCheck.step

    def reporting_restore(self, *args: Any, **kwargs: Any) -> int:
        restored = restore(self, *args, **kwargs)
        say("restored", restored)
        return restored

    def reporting_step(self, *args: Any, **kwargs: Any):
        done = step(self, *args, **kwargs)
        say("step", done.step)
        if done.step == opts.halt_at:
            self.flush()  # the failure strikes once step t's checkpoint is committed
            say("halted", done.step)
            while True:
                time.sleep(3600)
        return done

    LayerCheck.restore, LayerCheck.step = reporting_restore, reporting_step
    sys.argv = [opts.script, *opts.args]
    # as `python SCRIPT` would: the script's folder first on the path, so that it
    # imports the modules beside it (examples/trl_sft.py imports examples/tinychat.py)
    sys.path.insert(0, str(Path(opts.script).resolve().parent))
    runpy.run_path(opts.script, run_name="__main__")


if __name__ == "__main__":
    _child(sys.argv[1:])
