"""The My job page: a job as a user describes it, turned into ``python -m sim``'s flags,
and the simulator's own verdict, frontier and bill for it.

A ``Job`` says what a person knows (the model or a trace, GPUs, step time, storage
bandwidth, a failure rate or a shipped failure record, budgets, a GPU-hour price);
``Job.argv`` writes it as the command line that answers the same question, and
``inputs`` reads that command line with the simulator's own flag vocabulary
(``sim.scenarioargs``), so the page and ``python -m sim`` cannot drift apart: the
default ``Job()`` is ``python -m sim --mtbf 0.5h``, and both name the same winner.
``answer`` runs ``sim.fair.compare`` and ``sim.verdict.judge``, imported only then (the
search's engine is about a second of a cold start, which a page drawn from
``dashboard.answerstore`` does without); ``store_key`` names an answer there. The tables
and the figure come from ``dashboard.verdict``. No Streamlit here.
"""
from __future__ import annotations

import argparse
import shlex
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from sim.architectures import BYTES_PER_PARAM
from sim.budgets import Budgets
from sim.dollars import Prices
from sim.errors import SimError
from sim.presets import DEFAULT_PRESET, PRESET_NAMES
from sim.scenarioargs import (add_budget_args, add_price_args, add_scenario_args, budgets_of,
                              mtbf_of, prices_of, scenario_of)

if TYPE_CHECKING:
    from sim.fair import FairResult
    from sim.verdict import Verdict

__all__ = ["Job", "Inputs", "Answer", "MODELS", "FAILURES", "RECORDS", "parser", "inputs",
           "answer", "cli_defaults", "store_key"]

MODELS = ("preset", "trace", "size")
"""How the job's model is given: a built-in preset, a trace folder, or a size and a step time."""
FAILURES = ("job MTBF", "one GPU's MTBF", "failure record")
"""How its failures are given: the job's MTBF, one GPU's (the job's is it / GPUs), or a
shipped record of node failures replayed (LANL's, sim/data/failures/)."""
RECORDS = ("lanl",)


def parser() -> argparse.ArgumentParser:
    """``python -m sim``'s flags for one comparison (the shared vocabulary of
    ``sim.scenarioargs`` and ``--mtbf``), raising ``SimError`` on a bad one."""
    p = _Parser(prog="python -m sim", add_help=False)
    p.add_argument("--mtbf")
    add_scenario_args(p, fair=True)
    add_budget_args(p)
    add_price_args(p)
    return p


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        raise SimError(message)


def cli_defaults() -> argparse.Namespace:
    """The command line's defaults (seeds, window, steps of a sized job ...)."""
    return parser().parse_args([])


def _hours(value: float) -> str:
    return f"{value:g}h"


@dataclass(kw_only=True, frozen=True)
class Job:
    """A job as its owner describes it. Every field is one ``python -m sim`` flag (or
    none where it is the command line's default); ``Job()`` is the command line's own
    default job: the qwen2.5-7b preset failing every half hour."""

    model: str = "preset"
    """One of MODELS."""
    preset: str = DEFAULT_PRESET
    """With model "preset": its name (sim.presets)."""
    trace: str | None = None
    """With model "trace": a trace folder (its layers, steps and costs.json)."""
    params_billion: float = 7.6
    """With model "size": parameters in billions; the checkpoint is 14 bytes a parameter
    (bf16 weights, fp32 master weights and Adam's two moments)."""
    step_s: float = 6.0
    """With model "size": compute seconds a step."""
    steps: int | None = None
    """With model "size": steps in the job (None: the command line's default)."""
    gpus: int | None = None
    """GPUs in the job: the bill's, and with ``gpu_mtbf_h`` the failure rate's (None: the
    price list's default of 8). A failure record's job is its nodes (the command line
    refuses --gpus beside --nodes), billed at the price list's GPUs."""
    write_gbps: float | None = None
    """Storage write bandwidth, GB/s (None: the cost model's)."""
    read_gbps: float | None = None
    """Storage read bandwidth during recovery, GB/s (None: the cost model's)."""
    failures: str = "job MTBF"
    """One of FAILURES."""
    mtbf_h: float = 0.5
    """With failures "job MTBF": hours between the job's failures."""
    gpu_mtbf_h: float = 50_000.0
    """With failures "one GPU's MTBF": hours between one GPU's failures."""
    record: str = "lanl"
    """With failures "failure record": a shipped record (RECORDS)."""
    system: int = 18
    """The record's system (LANL numbers its clusters)."""
    nodes: int = 1024
    """With a record: the job's nodes, each replaying a node of the record."""
    max_tb: float | None = None
    """Budget: durable TB written over the job."""
    max_host_gb: float | None = None
    """Budget: host memory the checkpoints may hold at once, GB."""
    max_write_share: float | None = None
    """Budget: share of the storage's write bandwidth over the job's compute time (0..1)."""
    gpu_hour_usd: float | None = None
    """The price of a GPU-hour (None: the price list's, sim.dollars)."""
    seeds: int | None = None
    """Failure sequences simulated (None: the command line's default)."""
    window_d: float | None = None
    """Days of wall clock a run (None: the command line's default)."""

    def __post_init__(self) -> None:
        for name, allowed in (("model", MODELS), ("failures", FAILURES), ("record", RECORDS)):
            if getattr(self, name) not in allowed:
                raise SimError(f"{name} {getattr(self, name)!r}: choose one of {', '.join(allowed)}")
        if self.model == "preset" and self.preset not in PRESET_NAMES:
            raise SimError(f"preset {self.preset!r}: choose one of {', '.join(PRESET_NAMES)}")
        if self.model == "trace" and not self.trace:
            raise SimError("model 'trace' needs a trace folder: pick one, or describe the model by size")
        for name in ("params_billion", "step_s", "mtbf_h", "gpu_mtbf_h"):
            if not getattr(self, name) > 0:
                raise SimError(f"{name.replace('_', ' ')} {getattr(self, name)!r}: give a positive number")
        for name in ("max_tb", "max_host_gb", "write_gbps", "read_gbps", "gpu_hour_usd"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise SimError(f"{name.replace('_', ' ')} {value!r}: give a positive number, or "
                               "leave it empty for none")
        if self.max_write_share is not None and not 0 < self.max_write_share <= 1:
            raise SimError(f"write share {self.max_write_share!r}: give a fraction in (0, 1], e.g. 0.05")

    def argv(self) -> list[str]:
        """The ``python -m sim`` arguments that describe this job (defaults left out)."""
        out: list[str] = []
        if self.model == "preset" and self.preset != DEFAULT_PRESET:
            out += ["--preset", self.preset]
        elif self.model == "trace":
            out += ["--trace", str(self.trace)]
        elif self.model == "size":
            out += ["--iteration-time", f"{self.step_s:g}s",
                    "--checkpoint-gb", f"{self.params_billion * BYTES_PER_PARAM:g}"]
            if self.steps is not None:
                out += ["--iterations", str(self.steps)]
        if self.failures == "job MTBF":
            out += ["--mtbf", _hours(self.mtbf_h)]
        elif self.failures == "one GPU's MTBF":
            out += ["--gpu-mtbf", _hours(self.gpu_mtbf_h)]
        else:
            out += ["--nodes", str(self.nodes), "--failure-log", self.record, "--system", str(self.system)]
        if self.failures != "failure record" and (self.gpus is not None
                                                  or self.failures == "one GPU's MTBF"):
            out += ["--gpus", str(self.gpus if self.gpus is not None else cli_prices().gpus)]
        for flag, value in (("--write-gbps", self.write_gbps), ("--read-gbps", self.read_gbps),
                            ("--max-gb", None if self.max_tb is None else self.max_tb * 1000),
                            ("--max-host-gb", self.max_host_gb),
                            ("--max-write-share", self.max_write_share),
                            ("--gpu-hour-usd", self.gpu_hour_usd), ("--seeds", self.seeds),
                            ("--window", None if self.window_d is None else f"{self.window_d:g}d")):
            if value is not None:
                out += [flag, f"{value:g}" if isinstance(value, float) else str(value)]
        return out

    def command(self) -> str:
        """The command line that prints this page's verdict, table and bill."""
        return shlex.join(["python", "-m", "sim", *self.argv()])


def cli_prices() -> Prices:
    """The price list's defaults (``sim.dollars``)."""
    return Prices()


class Inputs(NamedTuple):
    """What ``python -m sim`` builds from a command line."""
    scenario: object
    mtbf_s: float | None
    budgets: Budgets
    prices: Prices
    seeds: int


def inputs(argv: list[str]) -> Inputs:
    """The scenario, MTBF, budgets, prices and seeds of a command line, read exactly as
    ``python -m sim`` reads them (a bad value is a ``SimError`` naming the flag)."""
    args = parser().parse_args(argv)
    return Inputs(scenario=scenario_of(args), mtbf_s=mtbf_of(args, args.mtbf),
                  budgets=budgets_of(args), prices=prices_of(args), seeds=args.seeds)


class Answer(NamedTuple):
    result: FairResult
    verdict: Verdict
    prices: Prices


def answer(argv: list[str], *, bands: bool = False) -> Answer:
    """``python -m sim``'s comparison of a command line: every strategy at its own best
    setting within the budgets on the same failures, and the verdict (``bands``: also
    vary every cost figure across its band, as the command does unless --no-bands)."""
    from sim.fair import compare              # deferred: the search's engine (module doc)
    from sim.verdict import judge

    given = inputs(argv)
    result = compare(given.scenario, mtbf_s=given.mtbf_s, budgets=given.budgets, seeds=given.seeds)
    return Answer(result=result, verdict=judge(result, bands=bands), prices=given.prices)


def store_key(argv: list[str], *, bands: bool, stamp: float = 0.0) -> dict:
    """What an answer to ``argv`` depends on besides the code (``dashboard.answerstore``
    adds that): the command line, the bands, and ``stamp``, the trace folder's newest
    modification time when the job names a trace."""
    return {"page": "myjob", "argv": list(argv), "bands": bool(bands), "stamp": float(stamp)}
