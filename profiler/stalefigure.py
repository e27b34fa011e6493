"""The stale-cost figures of a staleness study (``profiler.stalecost``): phi of the
composite (``stale_cost`` in a costs.json) and of its parts, with their provenance."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from layercheck.contract.calibration import Figure
from sim.calibrated import read_calibration

from .errors import ProfilerError

__all__ = ["stale_cost_figure", "set_stale_cost", "carry_stale_cost", "summary_text", "PART_WORDS",
           "RULE_WORDS"]

PART_WORDS = {
    "composite": "the composite LayerCheck restores (every stale layer as it was)",
    "blocks": "the composite with only its non-embedding layers (blocks, head, norms) stale",
    "embedding": "the composite with only its embedding layers stale",
}
RULE_WORDS = {
    "lr": "Delta / S, both in learning-rate-weighted steps (sums of lr / lr_peak)",
    "relative": "(Delta / S) / (Delta_c / S_c) in steps, the lost-work control of the same "
                "replicate the yardstick",
    "steps": "Delta / S in steps",
}
KEYS = {"composite": "stale_cost", "blocks": "stale_cost_blocks", "embedding": "stale_cost_embedding"}


def stale_cost_figure(doc: dict[str, Any], part: str = "composite") -> Figure:
    """phi of ``part`` (``composite``: the ``stale_cost`` figure) from a study document:
    the mean over its replicates at the main threshold and the figure horizon, with
    the interval and n (``profiler.replicates``) and the control's reading beside it."""
    fig = doc["summary"]["figures"].get(KEYS[part])
    if fig is None:
        raise ProfilerError(f"the study has no reading of the {part} at its figure's horizon for "
                            "its main threshold; give a longer job or another --figure-horizon")
    cfg = doc["config"]
    name = doc.get("trace") or f"{cfg['capture']['model']}, {cfg['capture']['steps']} steps"
    control = {clock: doc["summary"]["control"][clock].get(f"{fig['threshold']:g}", {}).get(
        fig["horizon"]) for clock in ("steps", "lr")}
    after = "the job's end" if fig["horizon"] == "end" else f"{fig['horizon']} steps after the failure"
    spread = "" if fig["sd"] is None else f"replicates' sd {fig['sd']:.3g}, "
    censored = f"; censored readings: {', '.join(fig['censored'])}" if fig["censored"] else ""
    control_words = "" if None in control.values() else (
        "; the lost-work control (every layer and its Adam state S_c steps old, no replay: "
        "phi = 1 by definition) reads Delta_c / S_c = " + " and ".join(
            f"{c['value']:.2f} [{c['low']:.2f}, {c['high']:.2f}] {words}"
            for c, words in ((control["steps"], "in steps"),
                             (control["lr"], "in learning-rate-weighted steps")))
        + f" (n = {control['steps']['n']})")
    method = (f"python -m profiler staleness on {name} ({doc['model'].get('label')}): phi of "
              f"{PART_WORDS[part]} at threshold {fig['threshold']:g}, {after}, read as "
              f"{RULE_WORDS[fig['rule']]}; mean of n = {fig['n']} replicates (failure steps "
              f"{fig['failure_steps']} x data orders {fig['draws']}; mean S {fig['staleness']:.1f} "
              f"steps); interval: 95% t-interval over the replicates with the held-out bootstrap's "
              f"variance added ({spread}evaluation se {fig['se_eval']:.3g}){control_words}{censored}")
    return Figure(value=fig["value"], low=fig["low"], high=fig["high"], source="measured",
                  method=method)


def set_stale_cost(costs: Path, doc: dict[str, Any]) -> None:
    """Put the study's ``stale_cost`` figure into ``costs`` (a costs.json), keeping every
    other figure."""
    _put(costs, stale_cost_figure(doc))


def summary_text(doc: dict[str, Any]) -> str:
    """The study's readings as lines a person reads: phi per threshold, part and horizon
    with its interval and n, the control on both clocks, and the figure."""
    summary = doc["summary"]
    lines = [f"phi read as {RULE_WORDS[summary['rule']]}; 95% t-intervals over n replicates"]
    for k, parts in summary["phi"].items():
        for part, per in parts.items():
            for name, e in per.items():
                if e is None:
                    continue
                lines.append(f"  threshold {k:>6}  {part:<9}  horizon {name:>4}: phi {e['value']:7.3f} "
                             f"[{e['low']:.3f}, {e['high']:.3f}]  n = {e['n']}  (S {e['staleness']:.1f} "
                             f"steps, {e['staleness_lr']:.1f} lr-steps)")
    for clock, per in summary["control"].items():
        for k, horizons in per.items():
            read = ", ".join(f"{n}: {c['value']:.2f} [{c['low']:.2f}, {c['high']:.2f}] n = {c['n']}"
                             for n, c in horizons.items())
            lines.append(f"the lost-work control on the {clock} clock (threshold {k}): {read}")
    cond = summary["well_conditioned"]
    lines.append(f"rule {cond['rule']} well conditioned ({cond['criterion']}): "
                 f"{'yes' if cond['holds'] else 'NO'}")
    fig = summary["figure"]
    if fig is not None:
        lines.append(f"stale_cost = {fig['value']:.3f} [{fig['low']:.3f}, {fig['high']:.3f}], "
                     f"n = {fig['n']} (threshold {fig['threshold']:g}, horizon {fig['horizon']})")
    return "\n".join(lines)


def carry_stale_cost(folder: Path) -> Figure:
    """Write into the costs.json of the trace at ``folder`` the shipped capture's stale cost
    factor carried over by the trace's composition (``profiler.calibrate.
    transferred_stale_cost``), unless its own is measured (kept: ProfilerError). Returns
    the figure written."""
    from layercheck.contract.calibration import COSTS_FILE
    from layercheck.contract.trace import read_trace

    from .calibrate import transferred_stale_cost
    trace = read_trace(folder)
    costs = Path(folder) / COSTS_FILE
    if not costs.is_file():
        raise ProfilerError(f"{folder}: no {COSTS_FILE} to carry the stale cost into; "
                            "calibrate the trace first (python -m profiler calibrate)")
    calibration = read_calibration(costs)
    if calibration.figures["stale_cost"].source == "measured":
        raise ProfilerError(f"{folder}: its stale_cost is measured on its own job; it is kept "
                            "(leave the trace out of --transfer-to)")
    figure = transferred_stale_cost(trace)
    _put(costs, figure)
    return figure


def _put(costs: Path, figure: Figure) -> None:
    """``figure`` as the ``stale_cost`` of the costs.json at ``costs``, the file otherwise as
    it was (figures an older file lacks stay filled in on reading, not written)."""
    read_calibration(costs)  # refuses a file that is not a calibration
    data = json.loads(Path(costs).read_text())
    data["figures"]["stale_cost"] = figure.to_dict()
    Path(costs).write_text(json.dumps(data, indent=2) + "\n")
