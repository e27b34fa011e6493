"""Results as a text table (with a header that says which model is in force), JSON, CSV,
and a Plotly figure."""
from __future__ import annotations

import json
import math
from typing import Any, Callable, Mapping

import pandas as pd

from .api import COLUMNS, LIMIT
from .dollars import BILL_COLUMNS
from .tables import WIDTH, Column, render
from .units import format_duration

__all__ = ["table", "header", "to_json", "to_csv", "figure", "stale_line", "ranking_note",
           "ranking_notes", "interval_text", "json_value", "json_clean", "bill_table", "RUN_TAIL",
           "leader_line", "stale_brief", "STALE_DOC"]

BOUNDS = ("ratio_at_phi_low", "ratio_at_phi_high")
RUN_TAIL = ("setting", *BILL_COLUMNS)
"""The keys a run's rows carry after ``COLUMNS``: the strategy's setting and its bill
(``sim.dollars.BILL_COLUMNS``)."""
"""The columns of the ratio at the stale cost factor's interval bounds."""


def header(scenario: Any, *, mtbf: str, seeds: int, protocol: str | None = None,
           budgets: Any = None, prices: Any = None) -> str:
    """What the numbers below rest on: the job, the failures, the cost model and its
    sources, the protocol (``protocol``: the comparison's, where it is not the
    scenario's own, with its ``budgets``), the accounting, the stale cost factor phi in
    force and the ``prices`` of the bill."""
    costs = scenario.costs
    sources = ", ".join(f"{n} {k}" for k, n in sorted(costs.sources().items(), key=lambda kv: -kv[1]))
    interval = f", every rollback strategy every {scenario.interval} steps" if scenario.interval else ""
    if protocol == "fair":
        interval = (" (every strategy at its own best setting on the same failures; budgets: "
                    f"{budgets.text() if budgets is not None else 'none'}; --protocol matched "
                    "for the paper's)")
    nodes = [f"failures: {scenario.failures.describe()}"] \
        if getattr(scenario.failures, "kind", None) == "nodes" else []
    return "\n".join([
        f"{scenario.name} ({scenario.workload.kind}), MTBF {mtbf}, "
        f"{format_duration(scenario.window_s)} window x {seeds} seeds", *nodes,
        f"costs: {costs.name} ({costs.description.rstrip('.')}; figures: {sources})",
        f"protocol: {protocol or scenario.protocol}{interval}; accounting: {scenario.accounting()}",
        stale_brief(scenario.stale_figure()), *([prices.line()] if prices is not None else [])])


STALE_DOC = "docs/stale-cost.md"
"""Where the stale cost factor, its measurement and its transfer are explained."""


def stale_brief(phi: Any, *, width: int = 120) -> str:
    """``stale_line`` in one line of at most ``width`` characters: phi, its interval, its
    source, the start of its method (cut at a word, "..."), and where to read how it was
    found (``STALE_DOC``); the method in full is in the JSON (``stale_cost``)."""
    low, high = phi.interval
    bounds = f"[{low:.3g}..{high:.3g}]" if phi.low is not None else "(no interval)"
    head, tail = f"stale cost phi: {phi.value:.3g} {bounds}; {phi.source}: ", f" ({STALE_DOC})"
    method = str(phi.method).split(": ")[0].split("; ")[0].rstrip(".")
    room = width - len(head) - len(tail)
    if len(method) > room:
        method = method[:max(room - 3, 0)].rsplit(" ", 1)[0] + "..."
    return head + method + tail


def stale_line(phi: Any) -> str:
    """phi, its interval and where it came from (measured on a trace, transferred, given)."""
    low, high = phi.interval
    bounds = f"interval {low:g}..{high:g}" if phi.low is not None else "no interval"
    return f"stale cost phi: {phi.value:g} ({bounds}); {phi.source}: {phi.method}"


def _firsts(df: pd.DataFrame) -> tuple[str, str, str]:
    """The strategy ranked first at phi's low bound, at its point and at its high bound."""
    rows = df[df["strategy"] != LIMIT]
    return tuple(str(rows.loc[rows[c].idxmax(), "strategy"])
                 for c in (BOUNDS[0], "effective_ratio", BOUNDS[1]))


def ranking_note(df: pd.DataFrame, phi: Any) -> str | None:
    """One line when the strategy ranked first depends on phi within its interval; None
    when it does not (or the table is empty)."""
    if df[df["strategy"] != LIMIT].empty:
        return None
    low, high = phi.interval
    at_low, at_point, at_high = _firsts(df)
    if at_low == at_point == at_high:
        return None
    return (f"the ranking depends on phi: first at phi {low:g} (low) is {at_low}, at "
            f"{phi.value:g} {at_point}, at {high:g} (high) {at_high}")


def ranking_notes(df: pd.DataFrame, phi: Any) -> list[str]:
    """``ranking_note`` for each MTBF of a sweep where the first strategy depends on phi."""
    notes = []
    for mtbf, group in df.groupby("mtbf_s", sort=True):
        note = ranking_note(group, phi)
        if note:
            notes.append(f"MTBF {format_duration(float(mtbf))}: {note}")
    return notes


RUN_COLUMNS = (Column("strategy", 15, left=True), Column("ratio", 7), Column("+-95%", 7),
               Column("phi low", 7), Column("phi high", 8), Column("useful h", 9),
               Column("stale h", 8), Column("stall h", 8), Column("lost h", 8),
               Column("recov h", 8), Column("failures", 9), Column("written TB", 11),
               Column("interval", 9), Column("setting", left=True))


def table(df: pd.DataFrame, *, width: int | None = WIDTH) -> str:
    """A fixed-width table: ratio +- ci95, the ratio at the stale cost factor's bounds
    (phi low, phi high), then where the time went (hours per run), and each strategy's
    setting where the table has one (``setting``: the fair comparison's best); in blocks
    of ``width`` columns (``sim.tables``; None: one line a row)."""
    has_setting = "setting" in df
    columns = RUN_COLUMNS if has_setting else RUN_COLUMNS[:-1]
    rows = []
    for row in df.to_dict("records"):
        setting = [str(row["setting"])] if has_setting else []
        if row["effective_ratio"] is None or pd.isna(row["effective_ratio"]):
            rows.append([row["strategy"], "-", *[""] * (len(columns) - 2 - len(setting)), *setting])
            continue
        ci = "" if row["ci95"] is None or math.isnan(row["ci95"]) else f"{row['ci95']:.4f}"
        rows.append([row["strategy"], f"{row['effective_ratio']:.4f}", ci,
                     f"{row['ratio_at_phi_low']:.4f}", f"{row['ratio_at_phi_high']:.4f}",
                     f"{row['useful_s'] / 3600:.1f}", f"{row['stale_s'] / 3600:.1f}",
                     f"{_hours(row['checkpoint_stall_s']):.1f}", f"{row['lost_work_s'] / 3600:.1f}",
                     f"{row['recovery_s'] / 3600:.1f}", f"{row['failures']:.1f}",
                     f"{row['bytes_written'] / 1e12:.2f}",
                     interval_text(row["interval"], row["storage_interval"]), *setting])
    return render(columns, rows, width=width)


BILL_COLUMNS_TEXT = (Column("strategy", 15, left=True), Column("stall", 6), Column("lost", 6),
                     Column("stale", 6), Column("restart", 7), Column("recovery", 8),
                     Column("GPU $", 9), Column("storage $", 9), Column("writes $", 9),
                     Column("total $", 9))


def bill_table(df: pd.DataFrame, *, width: int | None = WIDTH) -> str:
    """GPU hours per run by cause and what the run's failures and checkpointing cost
    (``sim.dollars``): one row per strategy of a table with ``BILL_COLUMNS``, then the
    verdict in dollars (``leader_line``: the cheapest, and by how much)."""
    rows = []
    for row in df.to_dict("records"):
        if pd.isna(row["usd_total"]):
            rows.append([row["strategy"], "-"])
            continue
        rows.append([row["strategy"], f"{row['gpu_h_stall']:.0f}", f"{row['gpu_h_lost_work']:.0f}",
                     f"{row['gpu_h_stale_work']:.0f}", f"{row['gpu_h_restart']:.0f}",
                     f"{row['gpu_h_recovery']:.0f}", f"{row['usd_gpu']:,.0f}",
                     f"{row['usd_storage']:,.2f}", f"{row['usd_writes']:,.2f}",
                     f"{row['usd_total']:,.0f}"])
    totals = {r["strategy"]: -float(r["usd_total"]) for r in df.to_dict("records")
              if r["strategy"] != LIMIT and not pd.isna(r["usd_total"])}
    verdict = leader_line(totals, what="the cheapest run", fmt=lambda v: f"${-v:,.0f}",
                          gap=lambda v: f"${v:,.0f} less than")
    return "\n".join(["GPU hours a run by cause, and dollars", render(BILL_COLUMNS_TEXT, rows, width=width),
                      *([verdict] if verdict else [])])


def leader_line(scores: Mapping[str, float], *, what: str = "the highest effective ratio",
                fmt: Callable[[float], str] = lambda v: f"{v:.4f}",
                gap: Callable[[float], str] = lambda v: f"{v:+.4f} ahead of",
                label: str = "verdict") -> str | None:
    """One line under a table: the name with the highest score, its score and its margin
    over the runner-up (``fmt`` and ``gap`` spell them); None without a score."""
    ranked = sorted(((v, k) for k, v in scores.items() if v is not None and not math.isnan(v)),
                    reverse=True)
    if not ranked:
        return None
    (top, name), rest = ranked[0], ranked[1:]
    line = f"{label}: {name} has {what}, {fmt(top)}"
    if rest:
        second, runner = rest[0]
        line += f", {gap(top - second)} {runner} ({fmt(second)})"
    return line


def _hours(seconds: float) -> float:
    """Hours to one decimal; a float sum that is zero up to rounding (an overlapped stall,
    -1e-13 s) prints 0.0, not -0.0."""
    return round(seconds / 3600, 1) + 0.0


def interval_text(every: Any, storage: Any) -> str:
    """A row's checkpoint interval: '106', GEMINI's '106/106' (memory/storage), '' for none."""
    if every is None or pd.isna(every):
        return ""
    return str(int(every)) + ("" if storage is None or pd.isna(storage) else f"/{int(storage)}")


def json_value(value: Any) -> Any:
    """A JSON-ready value: NaN -> None, numpy scalars -> Python numbers."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if hasattr(value, "item"):
        return json_value(value.item())
    return value


def rows(df: pd.DataFrame, *, extra: tuple[str, ...] = (),
         tail: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """JSON rows with exactly ``extra`` + ``COLUMNS`` + ``tail`` keys (NaN -> null)."""
    keys = [*extra, *COLUMNS, *tail]
    return [{k: json_value(r[k]) for k in keys} for r in df.to_dict("records")]


def to_json(df: pd.DataFrame, scenario: dict[str, Any], *, extra: tuple[str, ...] = (),
            tail: tuple[str, ...] = (), **more: Any) -> str:
    """``{"rows": ..., "scenario": ...}`` and any ``more`` top-level entries (a run's
    verdict); NaN anywhere is null (strict JSON)."""
    body = {"rows": rows(df, extra=extra, tail=tail), "scenario": scenario, **more}
    return json.dumps(json_clean(body), indent=2, default=_json_default, allow_nan=False)


def json_clean(value: Any) -> Any:
    """``value`` with every NaN float, at any depth, as None."""
    if isinstance(value, dict):
        return {k: json_clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_clean(v) for v in value]
    return json_value(value) if isinstance(value, float) or hasattr(value, "item") else value


def _json_default(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return None
    return json_value(value) if hasattr(value, "item") else str(value)


def to_csv(df: pd.DataFrame, *, extra: tuple[str, ...] = (), tail: tuple[str, ...] = ()) -> str:
    return df[[*extra, *COLUMNS, *tail]].to_csv(index=False)


def figure(df: pd.DataFrame, *, title: str | None = None):
    """Effective ratio against MTBF (hours, log axis), one line per strategy with a 95%
    band and, where they differ from it, open triangles at the ratio at the stale cost
    factor's bounds (up: phi low, down: phi high); the perfect checkpointer ('limit')
    dashed black."""
    import plotly.graph_objects as go
    from plotly.colors import qualitative
    fig = go.Figure()
    for i, (name, group) in enumerate(df.groupby("strategy", sort=False)):
        group = group.sort_values("mtbf_s")
        x, y = group["mtbf_s"] / 3600.0, group["effective_ratio"]
        ci = group["ci95"].fillna(0.0)
        if name == LIMIT:
            fig.add_trace(go.Scatter(x=x, y=y, name="limit (perfect checkpointer)", mode="lines",
                                     line={"color": "black", "dash": "dash"}))
            continue
        color = qualitative.Plotly[i % len(qualitative.Plotly)]
        fig.add_trace(go.Scatter(x=pd.concat([x, x[::-1]]), y=pd.concat([y + ci, (y - ci)[::-1]]),
                                 fill="toself", fillcolor=color, opacity=0.2, line={"width": 0},
                                 hoverinfo="skip", showlegend=False, legendgroup=name))
        fig.add_trace(go.Scatter(x=x, y=y, name=name, mode="lines+markers", legendgroup=name,
                                 line={"color": color}))
        for column, symbol in zip(BOUNDS, ("triangle-up-open", "triangle-down-open")):
            if column in group and not group[column].equals(group["effective_ratio"]):
                fig.add_trace(go.Scatter(
                    x=x, y=group[column], mode="markers", legendgroup=name, showlegend=False,
                    name=f"{name} at {column.removeprefix('ratio_at_').replace('_', ' ')}",
                    marker={"color": color, "symbol": symbol, "size": 8}))
    fig.update_layout(title=title or "Effective training time ratio vs MTBF",
                      xaxis_title="MTBF (hours)", yaxis_title="effective training time ratio",
                      xaxis_type="log", yaxis_range=[0, 1.02], template="plotly_white")
    return fig
