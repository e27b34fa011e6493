"""The paper's own figure: Qwen2.5-7B's effective training time ratio at MTBF 0.5 h, the
paper's values beside ours under each protocol and accounting, and the arithmetic of both.

The paper (LayerCheck, IEEE CLUSTER 2026) simulates MTBF 0.01-3 h "with measured
per-iteration time, checkpoint overhead and recovery time" and, at 0.5 h, reports
LayerCheck 92.3%, LowDiff 88.8%, GEMINI 84.5% (``PAPER_RATIOS``). ``paper_figure`` runs
ours: each strategy on the ``qwen2.5-7b`` preset under each protocol, with stale layers
counted at the cost model's phi (and its interval) and as useful (phi 0, the paper's
accounting), with the number of seeds and the 95% band, and each strategy's first-order
terms (``sim.firstorder``). ``implied`` does the paper's side: what its ratios leave for
stall and rework once its own recovery times are taken out. Nothing here is fitted to
the paper's ratios; ``python -m sim paper`` prints it (docs/sim-paper.md, "The paper's own
figure").
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from layercheck.contract.calibration import Figure

from .api import DAY, Scenario, simulate
from .firstorder import FirstOrder, first_order
from .paper import PUBLISHED_RUNS, PUBLISHED_SHARES
from .presets import ITERATIONS, PUBLISHED, compute_seconds
from .report import interval_text, json_value, leader_line
from .strategies import PROTOCOLS, LayerCheck, LayerCheckSync, LowDiff
from .tables import WIDTH, Column, render
from .units import format_duration

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["PAPER_MTBF_S", "PAPER_PRESET", "PAPER_RATIOS", "PAPER_SOURCE", "AS_PUBLISHED",
           "PAPER_RECOVERY_S",
           "STRATEGIES", "ACCOUNTINGS", "Cell", "Implied", "PaperFigure", "paper_figure",
           "implied", "gemini_readings", "lowdiff_write_rate"]

PAPER_PRESET = "qwen2.5-7b"
PAPER_MTBF_S = 1800.0
PAPER_RATIOS: dict[str, float] = {"layercheck": 0.923, "lowdiff": 0.888, "gemini": 0.845}
"""The paper's effective training time ratios of Qwen2.5-7B at MTBF 0.5 h."""
PAPER_SOURCE = (
    "LayerCheck (Sun et al., IEEE CLUSTER 2026, arXiv 2609.27193), its failure-regime "
    "figure: effective training time ratio of Qwen2.5-7B at MTBF 0.5 h, LayerCheck 92.3%, "
    "LowDiff 88.8%, GEMINI 84.5%; the figure spans MTBF 0.01-3 h, simulated from measured "
    "per-iteration time, checkpoint overhead and recovery time (docs/sim-paper.md)")
AS_PUBLISHED: dict[str, str] = {LayerCheck.name: LayerCheckSync.name}
"""The simulator's strategy whose published checkpoint share a figure's strategy reads: the
paper ran LayerCheck synchronously (``layercheck-sync``)."""
PAPER_RECOVERY_S: dict[str, float] = {"layercheck": 10.0, "lowdiff": 34.0, "gemini": 346.0}
"""The paper's recovery times of Qwen2.5-7B (matched freshness; restart excluded):
LayerCheck 10 s, LowDiff 34 s, the rollback methods 346-364 s with their 53 steps of
replay (GEMINI: the low end, the most favourable reading)."""
STRATEGIES = ("layercheck", "layercheck-sync", "lowdiff", "gemini", "checkfreq", "deepspeed")
"""The table's rows: the paper's three (LayerCheck as the library runs it and as the
paper's implementation did), and the two baselines the figure does not give."""
ACCOUNTINGS = ("stale counted", "stale as useful")
"""phi from the cost model (with its interval), and phi 0 (the paper's accounting)."""


def paper_ratio(strategy: str) -> float | None:
    """The paper's value for ``strategy`` (LayerCheck's for both of ours), None if absent."""
    return PAPER_RATIOS.get(strategy.removesuffix("-sync"))


@dataclass(frozen=True, kw_only=True)
class Cell:
    """One strategy under one protocol and accounting: the simulator's figures."""

    strategy: str
    protocol: str
    accounting: str
    phi: float
    ratio: float
    ci95: float
    """Half-width of the 95% t-interval over the seeds (NaN with one seed)."""
    ratio_at_phi_low: float
    ratio_at_phi_high: float
    shares: dict[str, float]
    """Mean share of the window: stall, rework (lost), recovery, stale counted as lost."""
    first_order: float
    """The closed form's ratio at this phi (``sim.firstorder``)."""


@dataclass(frozen=True, kw_only=True)
class Implied:
    """What one of the paper's ratios leaves for stall and rework: with failures every M
    and R s of recovery each, ratio = (1 - x)(1 - R/M), so x = 1 - ratio / (1 - R/M)."""

    strategy: str
    ratio: float
    recovery_s: float
    mtbf_s: float = PAPER_MTBF_S

    @property
    def remainder(self) -> float:
        return 1 - self.ratio / (1 - self.recovery_s / self.mtbf_s)


def implied() -> list[Implied]:
    """The paper's three ratios with its own recovery times (``PAPER_RECOVERY_S``)."""
    return [Implied(strategy=s, ratio=r, recovery_s=PAPER_RECOVERY_S[s]) for s, r in PAPER_RATIOS.items()]


def gemini_readings(recovery_s: float = PAPER_RECOVERY_S["layercheck"]) -> dict[str, float]:
    """GEMINI's figure against its published inputs. Per iteration (its 747.9 min run) its
    stall share alone caps the ratio at compute / run; at the interval Young's rule gives
    for the checkpoint cost that run implies (its time per iteration less the compute),
    1 - C/tau - tau/2M - R/M = 1 - sqrt(2C/M) - R/M. R is not published for GEMINI's
    recovery from memory: ``recovery_s`` (default LayerCheck's 10 s full load)."""
    step = compute_seconds(PAPER_PRESET)
    per_iteration = PUBLISHED_RUNS[PAPER_PRESET, "gemini"] * 60 / ITERATIONS
    cost = per_iteration - step
    tau = math.sqrt(2 * cost * PAPER_MTBF_S)
    return {"step_s": step, "per_iteration_s": per_iteration, "per_iteration_cap": step / per_iteration,
            "checkpoint_s": cost, "young_interval_steps": tau / step,
            "young_ratio": 1 - math.sqrt(2 * cost / PAPER_MTBF_S) - recovery_s / PAPER_MTBF_S,
            "recovery_s": recovery_s}


def lowdiff_write_rate() -> dict[str, float]:
    """The storage write rate LowDiff's figure needs: at its ratio its 7B run (compute 1,692 x
    6.25 s) may take at most compute / (1 - x) with x what the figure leaves for its stall
    (``implied``), and its 19,259 GB (the storage table) must be written within it."""
    x = next(i.remainder for i in implied() if i.strategy == LowDiff.name)
    compute = compute_seconds(PAPER_PRESET) * ITERATIONS
    run = compute / (1 - x)
    written = PUBLISHED[PAPER_PRESET].lowdiff_total_gb
    return {"stall_share": x, "compute_s": compute, "run_s": run, "written_gb": written,
            "gbps": written / run}


@dataclass(frozen=True, kw_only=True)
class PaperFigure:
    """Our side of the paper's figure and the paper's, with the arithmetic of both."""

    mtbf_s: float
    seeds: int
    window_s: float
    seed: int
    phi: Figure
    cells: list[Cell]
    terms: dict[tuple[str, str], FirstOrder]
    """(protocol, strategy): the first-order terms."""
    intervals: dict[tuple[str, str], str]
    """(protocol, strategy): the checkpoint interval the simulator used ('' for LayerCheck)."""

    @property
    def at_paper_mtbf(self) -> bool:
        return math.isclose(self.mtbf_s, PAPER_MTBF_S)

    def cell(self, strategy: str, protocol: str, accounting: str) -> Cell:
        return next(c for c in self.cells if (c.strategy, c.protocol, c.accounting)
                    == (strategy, protocol, accounting))

    def to_dict(self) -> dict:
        low, high = self.phi.interval
        paper = {"source": PAPER_SOURCE, "mtbf_s": PAPER_MTBF_S, "ratios": PAPER_RATIOS,
                 "recovery_s": PAPER_RECOVERY_S,
                 "shares": {k: list(v) for k, v in PUBLISHED_SHARES.items()},
                 "implied": [{**dataclasses.asdict(i), "remainder": i.remainder} for i in implied()],
                 "gemini": gemini_readings(), "lowdiff": lowdiff_write_rate()}
        return {"preset": PAPER_PRESET, "mtbf_s": self.mtbf_s, "seeds": self.seeds,
                "window_s": self.window_s, "seed": self.seed,
                "stale_cost": {**self.phi.to_dict(), "low": low, "high": high},
                "paper": paper if self.at_paper_mtbf else None,
                "rows": [{**{k: json_value(v) for k, v in dataclasses.asdict(c).items()},
                          "paper": paper_ratio(c.strategy) if self.at_paper_mtbf else None,
                          "interval": self.intervals[c.protocol, c.strategy]} for c in self.cells],
                "first_order": [{"protocol": p, **t.to_dict()} for (p, _), t in self.terms.items()]}

    def frame(self) -> "pd.DataFrame":
        """One row per cell (strategy, protocol, accounting): the paper's value, the
        simulator's ratio with its band and phi bounds, the shares and the first order
        (``--csv``)."""
        import pandas as pd
        return pd.DataFrame([{"strategy": c.strategy, "protocol": c.protocol,
                              "accounting": c.accounting, "phi": c.phi,
                              "paper": paper_ratio(c.strategy) if self.at_paper_mtbf else None,
                              "ratio": c.ratio, "ci95": c.ci95,
                              "ratio_at_phi_low": c.ratio_at_phi_low,
                              "ratio_at_phi_high": c.ratio_at_phi_high,
                              **{f"{k}_share": v for k, v in c.shares.items()},
                              "first_order": c.first_order,
                              "interval": self.intervals[c.protocol, c.strategy]}
                             for c in self.cells])

    def verdicts(self) -> list[str]:
        """A verdict line per protocol and accounting: who ranks first, by how much."""
        out = []
        for p in PROTOCOLS:
            for a in ACCOUNTINGS:
                line = leader_line({c.strategy: c.ratio for c in self.cells
                                    if (c.protocol, c.accounting) == (p, a)},
                                   fmt=lambda v: f"{v:.3f}", gap=lambda v: f"{v:+.3f} ahead of",
                                   label=f"verdict ({p}, {a})", what="the highest ratio")
                if line:
                    out.append(line)
        return out

    def text(self, *, width: int | None = WIDTH) -> str:
        """The table (blocks of ``width`` columns, ``sim.tables``; None: one line a row)
        with a verdict line per protocol and accounting, the first-order terms, and the
        paper's own arithmetic."""
        phi, (low, high) = self.phi.value, self.phi.interval
        lines = [f"The paper's figure: {PAPER_PRESET} at MTBF {format_duration(self.mtbf_s)}; ours: "
                 f"{self.seeds} seeds x {format_duration(self.window_s)}, ratio +-95% band",
                 f"paper: {PAPER_SOURCE}" if self.at_paper_mtbf else
                 f"paper: published at MTBF {format_duration(PAPER_MTBF_S)} only",
                 f"stale counted: phi {phi:.3g} [{low:.3g}..{high:.3g}] ({self.phi.source}); "
                 "stale as useful: phi 0 (the paper's accounting)", ""]
        columns = [Column("strategy", 15, left=True), Column("protocol", 8, left=True),
                   Column("paper", 6), Column("stale counted [phi bounds]", 30),
                   Column("as useful", 13)]
        rows = []
        for s in dict.fromkeys(c.strategy for c in self.cells):
            pub = paper_ratio(s) if self.at_paper_mtbf else None
            for p in PROTOCOLS:
                a, b = self.cell(s, p, ACCOUNTINGS[0]), self.cell(s, p, ACCOUNTINGS[1])
                rows.append([s, p, "-" if pub is None else f"{pub:.3f}",
                             f"{_pm(a)} [{a.ratio_at_phi_low:.3f}..{a.ratio_at_phi_high:.3f}]", _pm(b)])
        lines += [render(columns, rows, keep=2, width=width), *self.verdicts()]
        lines += ["", f"first order: ratio ~ (1 - s)(1 - (W + R)/M) - phi S/M, M = {self.mtbf_s:g} s "
                  "(sim.firstorder; the simulator's ratio in brackets; W first: the share of "
                  "failures before the job's first recovery point x their W, s)"]
        columns = [Column("protocol", 8, left=True), Column("strategy", 15, left=True),
                   Column("every", 7), Column("s", 6), Column("W s", 6), Column("R s", 6),
                   Column("S s", 6), Column("phi 0", 13), Column(f"phi {phi:.3g}", 13),
                   Column("W first", 11)]
        rows = []
        for (p, s), t in self.terms.items():
            a, b = self.cell(s, p, ACCOUNTINGS[0]), self.cell(s, p, ACCOUNTINGS[1])
            rows.append([p, s, self.intervals[p, s], f"{t.stall_share:.3f}", f"{t.rework_s:.0f}",
                         f"{t.recovery_s:.0f}", f"{t.stale_s:.0f}", f"{t.ratio(0.0):.3f} ({b.ratio:.3f})",
                         f"{t.ratio(phi):.3f} ({a.ratio:.3f})",
                         f"{t.start_share:.1%} x {t.start_rework_s:.0f}"])
        lines.append(render(columns, rows, keep=2, width=width))
        if self.at_paper_mtbf:
            lines += ["", "the paper's side: with its recovery R, x = 1 - ratio/(1 - R/M) is left for "
                      "stall and rework"]
            for i in implied():
                share = PUBLISHED_SHARES.get(AS_PUBLISHED.get(i.strategy, i.strategy))
                note = f"; its published checkpoint share {share[0]:.1%}-{share[1]:.1%}" if share else ""
                lines.append(f"{i.strategy:<16} {i.ratio:.3f}  R {i.recovery_s:>4.0f} s  x = "
                             f"{i.remainder:+.1%}{note}")
            w = lowdiff_write_rate()
            lines.append(f"lowdiff: within {w['run_s']:,.0f} s ({w['compute_s']:,.0f} s compute / (1 - "
                         f"{w['stall_share']:.3f})) its {w['written_gb']:,.0f} GB need {w['gbps']:.2f} GB/s")
            g = gemini_readings()
            lines.append(f"gemini: per iteration ({g['per_iteration_s']:.2f} s an iteration for "
                         f"{g['step_s']:.2f} s compute) at most {g['per_iteration_cap']:.3f}; at "
                         f"Young's interval for C = {g['checkpoint_s']:.2f} s ({g['young_interval_steps']:.0f} "
                         f"steps) with R {g['recovery_s']:.0f} s: {g['young_ratio']:.3f}")
        return "\n".join(lines)


def _pm(cell: Cell) -> str:
    band = "n/a" if math.isnan(cell.ci95) else f"{cell.ci95:.3f}"
    return f"{cell.ratio:.3f}+-{band}"


def paper_figure(*, mtbf_s: float = PAPER_MTBF_S, seeds: int = 10, window_s: float = 30 * DAY,
                 seed: int = 0, strategies: tuple[str, ...] = STRATEGIES,
                 progress: Callable[[int, int], None] | None = None) -> PaperFigure:
    """Each of ``strategies`` on the paper's preset at ``mtbf_s``, under each protocol, at
    the cost model's phi and at phi 0: two simulations a protocol, on the same failures.
    ``progress(done, total)`` is called as each simulation ends."""
    base = Scenario.from_preset(PAPER_PRESET, seed=seed, window_s=window_s)
    phi = base.stale_figure()
    cells, terms, intervals = [], {}, {}
    window, done = float(window_s), 0
    if progress is not None:
        progress(0, len(PROTOCOLS) * len(ACCOUNTINGS))
    for protocol in PROTOCOLS:
        scenario = dataclasses.replace(base, protocol=protocol)
        for accounting, stale in zip(ACCOUNTINGS, (None, 0.0)):
            run = dataclasses.replace(scenario, stale_cost=stale)
            value = run.stale_figure().value
            df = simulate(run, mtbf_s=mtbf_s, strategies=list(strategies), seeds=seeds)
            if progress is not None:
                done += 1
                progress(done, len(PROTOCOLS) * len(ACCOUNTINGS))
            for s in strategies:     # after simulate: its checks (work bound, seeds) come first
                if (protocol, s) not in terms:
                    terms[protocol, s] = first_order(scenario.schedule(s, mtbf_s), mtbf_s)
            for row in df.itertuples(index=False):
                cells.append(Cell(
                    strategy=row.strategy, protocol=protocol, accounting=accounting, phi=value,
                    ratio=row.effective_ratio, ci95=row.ci95, ratio_at_phi_low=row.ratio_at_phi_low,
                    ratio_at_phi_high=row.ratio_at_phi_high,
                    shares={"stall": row.checkpoint_stall_s / window, "rework": row.lost_work_s / window,
                            "recovery": row.recovery_s / window, "stale": row.stale_lost_s / window},
                    first_order=terms[protocol, row.strategy].ratio(value)))
                intervals[protocol, row.strategy] = interval_text(row.interval, row.storage_interval)
    return PaperFigure(mtbf_s=float(mtbf_s), seeds=seeds, window_s=float(window_s), seed=seed,
                       phi=phi, cells=cells, terms=terms, intervals=intervals)
