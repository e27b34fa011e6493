"""What the My job page shows of an answer: the verdict's headline and text, the settings,
budget and bill tables and the frontier figure, and that as JSON-able data.

``summarise`` builds it from ``myjob.answer`` with ``dashboard.verdict``'s own tables and
figure; ``Summary.payload`` and ``Summary.of_payload`` carry it through
``dashboard.answerstore`` exactly (the tables through ``frame_payload``, the figure as
Plotly's JSON), so a page drawn from the store shows what a page that searched shows.
This module imports neither the search nor ``dashboard.verdict`` until ``summarise`` is
called: a page drawn from the store never loads the simulator's engine (numba, scipy,
the strategies), about a second of a cold start. No Streamlit here.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

import pandas as pd
import plotly.graph_objects as go

from .answerstore import frame_of, frame_payload

if TYPE_CHECKING:
    from .myjob import Answer

__all__ = ["Summary", "summarise"]

_FRAMES = ("settings", "budgets", "bill")


@dataclass(kw_only=True, frozen=True, eq=False)
class Summary:
    """The My job page's content for one job."""

    winner: str
    """The strategy to use."""
    setting: str
    """Its setting, as the command line prints it."""
    ratio: float
    """The share of the wall clock it keeps for useful training."""
    margin: float
    """Its lead over the runner-up, in ratio (0 when alone)."""
    runner_up: str | None
    """The second strategy, None when only one was compared."""
    runner_setting: str | None
    """The runner-up's setting."""
    text: str
    """The verdict in full (``sim.verdict.Verdict.text``)."""
    gpus: int
    """GPUs on the bill."""
    gpu_hour_usd: float
    """The price of a GPU-hour on the bill."""
    settings: pd.DataFrame
    """``dashboard.verdict.settings_frame``."""
    budgets: pd.DataFrame
    """``dashboard.verdict.budget_frame``."""
    bill: pd.DataFrame
    """``dashboard.verdict.bill_frame``."""
    figure: go.Figure
    """``dashboard.verdict.frontier_figure``."""

    def __post_init__(self) -> None:
        for name in _FRAMES:
            if not isinstance(getattr(self, name), pd.DataFrame):
                raise TypeError(f"Summary.{name} must be a DataFrame, not {type(getattr(self, name)).__name__}")
        if not isinstance(self.figure, go.Figure):
            raise TypeError(f"Summary.figure must be a plotly Figure, not {type(self.figure).__name__}")

    def cost(self, strategy: str) -> float:
        """The run's total dollars with ``strategy``."""
        return float(self.bill.set_index("strategy").at[strategy, "usd_total"])

    def payload(self) -> dict:
        """JSON-able data that ``of_payload`` reads back to an equal summary."""
        out = {f.name: getattr(self, f.name) for f in fields(self)
               if f.name not in (*_FRAMES, "figure")}
        out.update({name: frame_payload(getattr(self, name)) for name in _FRAMES})
        out["figure"] = self.figure.to_json()
        return out

    @classmethod
    def of_payload(cls, payload: dict) -> "Summary":
        """The summary ``payload`` wrote (raises on anything else)."""
        plain = {f.name: payload[f.name] for f in fields(cls) if f.name not in (*_FRAMES, "figure")}
        for name in ("ratio", "margin", "gpu_hour_usd"):
            plain[name] = float(plain[name])
        plain["gpus"] = int(plain["gpus"])
        # not validated again: Plotly wrote it from a validated figure, and its checks take
        # half a second of a cold start (the key and the JSON guard against other files)
        return cls(**plain, **{name: frame_of(payload[name]) for name in _FRAMES},
                   figure=go.Figure(json.loads(payload["figure"]), _validate=False))


def summarise(answer: "Answer") -> Summary:
    """What the page shows of ``answer`` (``myjob.answer``'s)."""
    from . import verdict                    # deferred: the search's modules (module doc)

    outcome, result, prices = answer.verdict, answer.result, answer.prices
    return Summary(winner=outcome.winner, setting=outcome.setting, ratio=float(outcome.ratio),
                   margin=float(outcome.margin), runner_up=outcome.runner_up,
                   runner_setting=outcome.runner_setting, text=outcome.text(),
                   gpus=int(prices.gpus), gpu_hour_usd=float(prices.gpu_hour_usd),
                   settings=verdict.settings_frame(result), budgets=verdict.budget_frame(result),
                   bill=verdict.bill_frame(result, prices), figure=verdict.frontier_figure(result))
