"""layercheck: the library's own costs, from the trace and from the real writer and restore.

From the capture's trace: the drift tracking per step (``drift_s`` over the
compute) and the stall of the host copies of the chosen layers (the
``stall_s`` of the steps from the base checkpoint on, over the bytes they
wrote). Timed here with the job's own LayerCheck (``job.make_layercheck``:
``ZeroLayerCheck`` or ``FsdpLayerCheck`` on every rank) in a fresh folder: a base
checkpoint of every layer (the writer's files, fsyncs and commit), steps
that commit their training state alone, and a real ``restore()`` of the
composite.
"""
from __future__ import annotations

import statistics

from layercheck.contract.calibration import Figure

from .base import Bench, Mechanism, rate_figure

__all__ = ["LayerWise"]

COMMITS = 5
"""State-only commits timed per repeat (they take milliseconds)."""


class LayerWise(Mechanism):
    name = "layercheck"
    collective = True

    def measure(self, bench: Bench) -> dict[str, Figure]:
        ranks = bench.job.ranks
        writes, commits, plans, loads = [], [], [], []
        written = restored = 0
        for _ in range(bench.repeats):
            folder = bench.scratch("layercheck")
            w, c, r = self._once(bench, folder)
            written = sum(ranks.gather(w[0]))
            writes.append(ranks.max(w[1]))
            commits.extend(ranks.max(s) for s in c)
            restored = sum(ranks.gather(r.bytes))
            plans.append(ranks.max(r.plan_s))
            loads.append(ranks.max(r.load_s + r.restore_s))
        if not ranks.is_coordinator:
            return {}
        who = (f"{bench.job.integration} on {ranks.world_size} ranks (every rank's shards, the slowest "
               "rank's seconds)" if bench.zero else "LayerCheck on the capture's own model "
               "and optimizer")
        return {
            **self._from_trace(bench),
            "lc_write_gbps": rate_figure(written, writes, f"{who}: a base checkpoint of every "
                                         "layer, submit to commit (layer files and the state "
                                         "file written, fsynced, renamed, the manifest record "
                                         "appended and fsynced)"),
            "lc_commit_s": _median(commits, f"{who}: a step that commits its training state "
                                   "alone (state file, fsyncs, manifest line), submit to "
                                   f"commit; median of {len(commits)}"),
            "lc_load_fixed_s": _median(plans, f"{who}: restore()'s fixed part (manifest read, "
                                       "training state chosen, verified and checked); median "
                                       f"of {len(plans)}"),
            "lc_load_gbps": rate_figure(restored, loads, f"{who}: restore() of the composite "
                                        "(read, checksum, check and apply every layer, and the "
                                        "state), fixed part excluded"),
        }

    def _once(self, bench: Bench, folder) -> tuple[tuple[int, float], list[float], object]:
        from layercheck import LayerCheckConfig
        # a base of every layer at step 1, then nothing crosses: steps commit their state alone
        # (keep_versions=1 retires nothing here, every layer having its base alone; it
        # keeps the library's notice about unbounded directories out of a calibration)
        config = LayerCheckConfig(warmup_steps=1, smax=10 ** 9, base_threshold=1e30,
                                  embedding_threshold=1e30, lr_scaling=False, keep_versions=1)
        job = bench.job
        with job.make_layercheck(folder, config) as lc:
            lc.restore()
            lc.step()
            lc.flush()
            records = lc.drain_writes()
            base = (sum(r.bytes for r in records), max(r.persist_s for r in records))
            commits = []
            for _ in range(COMMITS):
                lc.step()
                start = _now()
                lc.flush()
                commits.append(_now() - start)
        with job.make_layercheck(folder, config) as lc:
            lc.restore()
            report = lc.restored
        return base, commits, report

    def _from_trace(self, bench: Bench) -> dict[str, Figure]:
        trace = bench.trace
        s, w = trace.steps, trace.writes
        compute = trace.compute_seconds()
        base = int(w.loc[w["reason"] == "base", "step"].min())
        stall = float(s.loc[s["step"] >= base, "stall_s"].sum())
        nbytes = int(w["bytes"].sum())
        scope = f"the capture's {trace.num_steps} steps ({trace.name})"
        return {
            "tracking_fraction": Figure(
                value=float(s["drift_s"].sum() / compute.sum()), source="measured",
                method=f"sum(drift_s) / sum(forward + backward + optimizer) over {scope}",
                seconds=float(s["drift_s"].sum())),
            "lc_snapshot_gbps": Figure(
                value=nbytes / stall / 1e9, source="measured",
                method=f"bytes of every layer write over the training-thread stall (stall_s) of "
                       f"steps {base} to {trace.num_steps} of {scope}: the host copies of the "
                       "chosen layers and each step's training state, queued for the writer",
                bytes=nbytes, seconds=stall),
        }


def _median(samples: list[float], method: str) -> Figure:
    return Figure(value=statistics.median(samples), source="measured", method=method,
                  samples=tuple(samples), seconds=statistics.median(samples))


def _now() -> float:
    import time
    return time.perf_counter()
