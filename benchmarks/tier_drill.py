"""The kill drill: a training run SIGKILLed at random moments, again and again; every restart
restores the failure-free run's state bit for bit.

    python benchmarks/tier_drill.py [--kills 100] [--steps 600] [--seed 0] [--out FILE]

The job is the tiers tests' worker (``tests/layercheck/tiers_worker.py``: an MLP
with dropout under AdamW and a schedule, LayerCheck with its memory tier over a
durable directory). First the failure-free run records the digest of the whole
training state (parameters, optimizer state, schedule, RNG) after every step.
Then one directory and one memory-tier folder are trained on by a run that is
SIGKILLed at a random moment (one kill in ten uniform over the failure-free run's
start-up, restore and first step: in imports or in the restore itself; the others,
once the run has committed its first step after the restore, uniform over the
failure-free run's time for 5 steps (its mean step): in steps, in memory-tier and durable
writes), and
restarted, ``--kills`` times; a last run goes to the end. Each restart that
restores step T (> 0) must hold exactly the failure-free digest of step T, and
the last run must end on the failure-free final digest. Printed: per restart the
step restored and where its layers came from; the count of kills that struck
before a restore finished; failures (exit status 1 if any).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "layercheck" / "tiers_worker.py"


STEPS_PER_RUN = 5
"""A run once training is killed within about this many steps' time."""


def wait_for_a_step(proc: subprocess.Popen, drill: Path, out: str) -> None:
    """Until the run has restored and committed a step after its restore in the memory
    tier (or ended): past its start-up and its first step's warm-up."""
    restored = drill / out / "restored0.json"
    while proc.poll() is None:
        if restored.exists():
            step = json.loads(restored.read_text())["restored_step"]
            for marker in (drill / "mem" / "rank0").glob("slot*.json"):
                try:
                    if json.loads(marker.read_text())["step"] > step:
                        return
                except (OSError, ValueError):
                    pass
        time.sleep(0.005)


def command(work: Path, out: str, steps: int) -> list[str]:
    return [sys.executable, str(WORKER), "--dir", str(work / "ckpt"), "--tier", str(work / "mem"),
            "--out", str(work / out), "--steps", str(steps)]


def environment() -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kills", type=int, default=100)
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help="write the drill's record as JSON here")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="lc-tier-drill-"))
    env, failures, record = environment(), [], []
    try:
        start = time.perf_counter()
        proc = subprocess.Popen(command(work / "ref", "out", args.steps), env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for_a_step(proc, work / "ref", "out")
        training = time.perf_counter()
        assert proc.wait() == 0, "the failure-free run failed"
        per_step = (time.perf_counter() - training) / (args.steps - 1)
        reference = json.loads((work / "ref" / "out" / "rank0.json").read_text())["digests"]
        print(f"failure-free run: {args.steps} steps, its first after {training - start:.1f} s, "
              f"then {per_step * 1e3:.1f} ms a step", flush=True)
        ready = training - start
        drill = work / "drill"
        for n in range(args.kills + 1):
            out = f"run{n}"
            proc = subprocess.Popen(command(drill, out, args.steps), env=env,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            last = n == args.kills
            if not last and rng.random() < 0.1:  # in its start-up or its restore
                delay = rng.uniform(0.0, ready)
            elif not last:  # once it trains (a step after its restore committed): in its
                # steps and writes, within the next STEPS_PER_RUN steps' time, about
                wait_for_a_step(proc, drill, out)
                delay = rng.uniform(0.0, per_step * STEPS_PER_RUN)
            try:
                proc.wait(timeout=None if last else delay)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
            stderr = proc.stderr.read().decode(errors="replace")
            restored = drill / out / "restored0.json"
            if not restored.exists():
                record.append({"run": n, "restored": None})
                if last or proc.returncode not in (-signal.SIGKILL,):
                    failures.append(f"run {n}: no restore (exit {proc.returncode}): "
                                    f"{stderr[-2000:]}")
                continue
            report = json.loads(restored.read_text())
            step = report["restored_step"]
            tiers = sorted({tier for tier, _ in (report.get("sources") or {}).values()})
            record.append({"run": n, "restored": step, "tiers": tiers})
            print(f"run {n}: restored step {step} from {', '.join(tiers) or '-'}"
                  f"{' (killed)' if proc.returncode == -signal.SIGKILL else ''}", flush=True)
            if step and report["restored_digest"] != reference[str(step)]:
                failures.append(f"run {n}: the state restored at step {step} is not the "
                                "failure-free run's")
            if last and step < args.steps:
                final = json.loads((drill / out / "rank0.json").read_text())["digests"]
                if final[str(args.steps)] != reference[str(args.steps)]:
                    failures.append("the last run did not end on the failure-free state")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    early = sum(r["restored"] is None for r in record)
    print(f"{args.kills} kills: {len(record) - early} restores checked bit for bit, {early} "
          f"kills struck before a restore finished; {len(failures)} failures")
    for failure in failures:
        print("FAILURE:", failure)
    if args.out:
        Path(args.out).write_text(json.dumps({"kills": args.kills, "steps": args.steps,
                                              "seed": args.seed, "runs": record,
                                              "failures": failures}, indent=2) + "\n")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
