"""A job of N nodes: its failures are the superposition of its nodes' failure processes.

A synchronous job stops when any of its nodes fails, so its failure times are the
merge of every node's own (independent) failure times, plus those of failure
domains (a rack, a switch) that take several nodes at once. The merge is drawn,
never approximated by one distribution scaled: a Weibull node is not a Weibull job
(superposed renewal processes tend to a Poisson process as N grows, whatever the
node's shape: the tests show it).

Each node is a stationary renewal process: the job starts on nodes that have been
in service, so a node's first failure is the renewal process's forward recurrence
time (for a Weibull node of shape k and scale s: s G^(1/k), G ~ Gamma(1/k), exact),
later ones its gaps. The job's failure rate is then exactly N / node MTBF + the
domains' rates at every instant, which is what ``job_mtbf_s`` and the work bound
use. A replayed record (``sim.records.NodeRecord``) maps the job's nodes onto the
record's, from a random start per seed.

Common random numbers: every strategy of a call faces the same events (the caller
draws once per seed). Inside a draw, nodes come in blocks of ``BLOCK``, each block
(and each domain's block of instances) from its own stream, keyed by its index
under the caller's seed; so node i fails at the same times whatever the job's
size, and a job of 2N nodes sees the failures of the job of N and more.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .errors import SimError
from .failures import MAX_RUN_FAILURES, FailureModel, log_gamma, weibull_from_exponential
from .records import MAX_NODES, NodeRecord
from .units import DURATION_RANGE, format_duration, is_duration, parse_duration

__all__ = ["DOMAINS", "Domain", "FailureEvents", "NodeFailures", "BLOCK", "MAX_NODES",
           "NODE_SHAPES"]

DOMAINS = ("node", "rack", "switch", "simultaneous")
"""Event codes (``FailureEvents.domain``): one node; a rack or a switch domain (the
nodes behind it); several nodes of a replayed record failing at the same instant
(the record does not say what they shared)."""
BLOCK = 64
"""Nodes (or domain instances) drawn from one random stream."""
NODE_SHAPES = (0.01, 20.0)
"""The Weibull shapes a node may have (field studies report 0.5 to 0.8). A node's
first failure is s G^(1/k), G ~ Gamma(1/k): below 0.01 its logarithm passes what
float64 holds (about e^(1/k) MTBFs), and above 20 numpy's Gamma(1/k) variates
underflow to 0 often enough (one in 10^15 at 20, one in a million at 50) to put a
node's failure at time 0."""
CHUNK = 1 << 20
"""The most gap variates one draw of a block takes at once (8 MB)."""


@dataclass(frozen=True, eq=False)
class FailureEvents:
    """One job's failures, ascending in time."""

    times_s: np.ndarray
    """float64, seconds from the job's start."""
    nodes_lost: np.ndarray
    """int64, nodes the event takes (1: a node; k: a domain of k nodes)."""
    domain: np.ndarray
    """int8, code into ``DOMAINS``."""
    first_node: np.ndarray
    """int64, the lowest node the event takes; a domain takes the contiguous nodes
    first_node .. first_node + nodes_lost - 1 (nodes are packed into racks and racks
    into switches in order); a simultaneous record event, its lowest node."""

    def __post_init__(self) -> None:
        n = len(self.times_s)
        if not all(len(a) == n for a in (self.nodes_lost, self.domain, self.first_node)):
            raise SimError("FailureEvents: times_s, nodes_lost, domain and first_node must "
                           "have one entry per event")

    def __len__(self) -> int:
        return len(self.times_s)

    def scaled(self, factor: float) -> "FailureEvents":
        """The same events with every time multiplied by ``factor``."""
        return FailureEvents(self.times_s * factor, self.nodes_lost, self.domain, self.first_node)

    def before(self, time_s: float) -> "FailureEvents":
        """The events before ``time_s``."""
        n = int(np.searchsorted(self.times_s, time_s, side="left"))
        return FailureEvents(self.times_s[:n], self.nodes_lost[:n], self.domain[:n],
                             self.first_node[:n])

    @classmethod
    def merge(cls, times, nodes_lost, domain, first_node) -> "FailureEvents":
        """Events from several sources in one ascending sequence; events at the same
        instant are one event (the job stops once) that takes all their nodes, coded
        'simultaneous' when more than one source took part."""
        times = np.asarray(times, dtype=np.float64)
        order = np.argsort(times, kind="stable")
        times, lost = times[order], np.asarray(nodes_lost, dtype=np.int64)[order]
        code, first = np.asarray(domain, dtype=np.int8)[order], np.asarray(first_node, dtype=np.int64)[order]
        if times.size < 2 or (np.diff(times) > 0).all():
            return cls(times, lost, code, first)
        starts = np.flatnonzero(np.concatenate(([True], np.diff(times) > 0)))
        width = np.diff(np.concatenate((starts, [times.size])))
        merged = np.where(width > 1, np.int8(DOMAINS.index("simultaneous")), code[starts])
        return cls(times[starts], np.add.reduceat(lost, starts), merged.astype(np.int8),
                   np.minimum.reduceat(first, starts))


@dataclass(frozen=True, kw_only=True)
class Domain:
    """A failure domain: one instance takes ``size`` nodes at once (exponential gaps)."""

    name: str
    """'rack' or 'switch' (``DOMAINS``)."""
    size: int
    """Nodes behind one instance: nodes d*size .. (d+1)*size - 1 of the job."""
    mtbf_s: float
    """One instance's mean time between failures, seconds."""
    source: str = "given by the user"
    """Where the rate comes from (a report prints it)."""

    def __post_init__(self) -> None:
        if self.name not in DOMAINS[1:-1]:
            raise SimError(f"domain {self.name!r}: use one of {', '.join(DOMAINS[1:-1])}")
        if isinstance(self.size, bool) or not isinstance(self.size, (int, np.integer)) \
                or not 2 <= self.size <= MAX_NODES:
            raise SimError(f"{self.name} size={self.size!r}: a domain takes at least 2 nodes (a "
                           f"single node's failures are the node law's) and at most {MAX_NODES:,} "
                           "(a job's most)")
        if not is_duration(self.mtbf_s):
            raise SimError(f"{self.name} mtbf={self.mtbf_s!r} must be a positive duration from "
                           f"{DURATION_RANGE}, e.g. 5000d")

    @classmethod
    def parse(cls, text: str) -> "Domain":
        """``KIND:SIZE:MTBF`` (the command line's ``--domain``), e.g. ``rack:32:3000d``."""
        kind, size, mtbf = text.split(":") if text.count(":") == 2 else ("", "", "")
        try:
            return cls(name=kind, size=int(size), mtbf_s=parse_duration(mtbf, what="MTBF"),
                       source=f"given: --domain {text}")
        except ValueError as exc:        # SimError is one; int() of a bad size the other
            detail = str(exc) if isinstance(exc, SimError) else (
                "give KIND:SIZE:MTBF, e.g. rack:32:3000d (kind rack or switch, SIZE nodes it "
                "takes, MTBF of one instance)")
            raise SimError(f"--domain {text!r}: {detail}") from None

    def instances(self, nodes: int) -> int:
        """Instances a job of ``nodes`` packed nodes spans."""
        return -(-nodes // self.size)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "size": int(self.size), "mtbf_s": float(self.mtbf_s),
                "source": self.source}


@dataclass(frozen=True, kw_only=True)
class NodeFailures:
    """The failures of a job of ``nodes`` nodes, each failing on its own by ``node_law``
    (every ``node_mtbf_s`` on average), plus its ``domains``."""

    nodes: int
    node_law: FailureModel | NodeRecord = field(default_factory=FailureModel)
    """exponential or weibull (a ``FailureModel``; its shape is the node's), or a
    ``NodeRecord`` replayed (its nodes' own times)."""
    node_mtbf_s: float | None = None
    """One node's MTBF (required for exponential and weibull; a record has its own)."""
    domains: tuple[Domain, ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.nodes, bool) or not isinstance(self.nodes, (int, np.integer)) \
                or not 1 <= self.nodes <= MAX_NODES:
            raise SimError(f"nodes={self.nodes!r} must be an integer from 1 to {MAX_NODES:,}")
        law = self.node_law
        if isinstance(law, NodeRecord):
            if self.node_mtbf_s is not None:
                raise SimError(f"a replayed record ({law.name}) fails at its own rate (node MTBF "
                               f"{format_duration(law.node_mtbf_s)}): leave out the node MTBF")
        elif isinstance(law, FailureModel) and law.kind in ("exponential", "weibull"):
            m = self.node_mtbf_s
            low, high = NODE_SHAPES
            if law.kind == "weibull" and not low <= law.shape <= high:
                raise SimError(f"node Weibull shape {law.shape!r}: give a shape from {low:g} to "
                               f"{high:g} (field studies report 0.5 to 0.8)")
            if m is None or not is_duration(m):
                raise SimError(f"node MTBF {m!r}: exponential and weibull nodes need a positive "
                               f"node MTBF from {DURATION_RANGE}, e.g. --node-mtbf 5000h")
        else:
            raise SimError("a node's law is exponential or weibull (a FailureModel) or a "
                           "failure record (sim.records, --failure-log with --nodes); a list of "
                           "job failure times is a job's log, not a node's: drop --nodes")
        object.__setattr__(self, "domains", tuple(self.domains))
        if not all(isinstance(d, Domain) for d in self.domains):
            raise SimError("domains must be Domain objects (sim.nodes.Domain)")

    # -- rates ---------------------------------------------------------------
    @property
    def kind(self) -> str:
        return "nodes"

    @property
    def record(self) -> NodeRecord | None:
        return self.node_law if isinstance(self.node_law, NodeRecord) else None

    @property
    def node_mean_s(self) -> float:
        """One node's mean time between failures (given, or the record's)."""
        return self.record.node_mtbf_s if self.record is not None else float(self.node_mtbf_s)

    def job_mtbf_s(self) -> float:
        """1 / the job's failure rate: N / node MTBF + each domain's instances / its MTBF.
        Exact for stationary nodes at every instant; for a record, the rate of its node
        failures (failures at the same instant merge, so slightly fewer events)."""
        rate = self.nodes / self.node_mean_s
        rate += sum(d.instances(self.nodes) / d.mtbf_s for d in self.domains)
        return 1.0 / rate

    @property
    def own_mtbf_s(self) -> float:
        """The MTBF a run uses when none is given: the job's (``job_mtbf_s``)."""
        return self.job_mtbf_s()

    def expected_failures(self, *, mtbf_s: float | None, window_s: float) -> float:
        """Failures a run over ``window_s`` draws on average (the work bound): the rate is
        constant, so window / job MTBF exactly (at ``mtbf_s`` when one is given)."""
        return window_s / (mtbf_s if mtbf_s is not None else self.job_mtbf_s())

    @property
    def streams(self) -> int:
        """Random streams one draw opens (one per block of nodes or domain instances, one per
        copy of a record): what a draw costs before any failure (the work bound's count)."""
        units = -(-self.nodes // self.record.nodes) if self.record is not None else \
            -(-self.nodes // BLOCK)
        return units + sum(-(-d.instances(self.nodes) // BLOCK) for d in self.domains)

    # -- draws ---------------------------------------------------------------
    def draw(self, rng: np.random.Generator, horizon_s: float,
             limit: int = MAX_RUN_FAILURES) -> FailureEvents:
        """The job's failure events in [0, horizon_s), from the seed behind ``rng`` (its
        streams are keyed by block under that seed, not drawn from ``rng`` in turn: the
        same seed gives the same events whatever was drawn before). ``SimError`` once more
        than ``limit`` node failures are drawn."""
        if not (math.isfinite(horizon_s) and horizon_s > 0):
            raise SimError(f"horizon {horizon_s!r} must be positive seconds")
        seq = rng.bit_generator.seed_seq
        budget = _Budget(limit, horizon_s)
        if self.record is not None:
            parts = [_replay(self.record, self.nodes, horizon_s, seq, budget)]
        else:
            shape = self.node_law.shape if self.node_law.kind == "weibull" else 1.0
            parts = [_renewal(self.nodes, 1, shape, float(self.node_mtbf_s), horizon_s,
                              (seq, 0), 0, budget)]
        for k, dom in enumerate(self.domains):
            parts.append(_renewal(self.nodes, dom.size, 1.0, dom.mtbf_s, horizon_s, (seq, 1 + k),
                                  DOMAINS.index(dom.name), budget))
        cat = lambda i: np.concatenate([p[i] for p in parts])  # noqa: E731
        return FailureEvents.merge(cat(0), cat(1), cat(2), cat(3))

    def events(self, rng: np.random.Generator, *, mtbf_s: float | None, window_s: float,
               limit: int = MAX_RUN_FAILURES) -> FailureEvents:
        """Events in [0, window_s); with ``mtbf_s`` every time is scaled so that the job's
        MTBF is ``mtbf_s`` (one seed: coupled events across MTBFs, as ``FailureModel``)."""
        if mtbf_s is not None and not (math.isfinite(mtbf_s) and mtbf_s > 0):
            raise SimError(f"mtbf={mtbf_s!r} must be a positive duration, e.g. 0.5h")
        factor = 1.0 if mtbf_s is None else mtbf_s / self.job_mtbf_s()
        events = self.draw(rng, window_s / factor, limit).scaled(factor)
        return events.before(window_s)          # a time rounded up to the window's end

    def failure_times(self, rng: np.random.Generator, *, mtbf_s: float | None,
                      window_s: float, limit: int = MAX_RUN_FAILURES) -> np.ndarray:
        """The events' times (what the engine runs against)."""
        return self.events(rng, mtbf_s=mtbf_s, window_s=window_s, limit=limit).times_s

    def describe(self) -> str:
        """One line for a report's header (with a record's attribution)."""
        if self.record is not None:
            law = f"replaying {self.record.name} (node MTBF {format_duration(self.node_mean_s)})"
        else:
            shape = f" shape {self.node_law.shape:g}" if self.node_law.kind == "weibull" else ""
            law = f"{self.node_law.kind}{shape}, node MTBF {format_duration(self.node_mean_s)}"
        parts = [f"{self.nodes:,} nodes, {law}"]
        parts += [f"{d.name} of {d.size} nodes every {format_duration(d.mtbf_s)} ({d.source})"
                  for d in self.domains]
        line = "; ".join(parts) + f"; job MTBF {format_duration(self.job_mtbf_s())}"
        return line + (f"; data: {self.record.attribution}" if self.record is not None else "")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (a report's ``scenario.failures``), with the record's attribution."""
        law = self.node_law
        out: dict[str, Any] = {"kind": "nodes", "nodes": int(self.nodes),
                               "job_mtbf_s": self.job_mtbf_s(), "node_mtbf_s": self.node_mean_s,
                               "domains": [d.to_dict() for d in self.domains]}
        if self.record is not None:
            out.update(node_law="record", record=self.record.name,
                       attribution=self.record.attribution)
        else:
            out.update(node_law=law.kind, shape=law.shape if law.kind == "weibull" else 1.0)
        return out


class _Budget:
    """Counts failures drawn so far and refuses past the limit (the work bound's guarantee)."""

    def __init__(self, limit: int, horizon_s: float) -> None:
        self.limit, self.horizon_s, self.drawn = limit, horizon_s, 0

    def add(self, n: int) -> None:
        self.drawn += n
        if self.drawn > self.limit:
            raise SimError(f"a run drew more than {self.limit:,} failures before its "
                           f"{self.horizon_s:.3g}s window ended, the simulator's limit per run "
                           "(docs/sim.md, Work limits): use fewer nodes, a higher node MTBF or a "
                           "shorter window")


def _stream(seq: np.random.SeedSequence, kind: int, block: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence(seq.entropy,
                                                        spawn_key=(*seq.spawn_key, kind, block)))


def _renewal(nodes: int, size: int, shape: float, mean_s: float, horizon_s: float, streams,
             code: int, budget: _Budget):
    """Stationary renewal processes (Weibull ``shape``, mean ``mean_s``) of the units that
    ``nodes`` packed nodes span, ``size`` nodes a unit (1: the nodes themselves): every
    failure in [0, horizon_s) as (times, nodes lost, code, first node). Unit u takes
    nodes u*size .. (u+1)*size - 1 (the last unit what is left). Block b of units draws
    from stream ``streams`` + (b,): first the forward recurrence times, then rows of
    gaps, so a unit's times depend on no other block and on no horizon."""
    seq, kind = streams
    units = -(-nodes // size)
    log_scale = math.log(mean_s) - float(log_gamma(1.0 + 1.0 / shape))
    expected = horizon_s / mean_s
    # rows of gaps a draw takes at once: most units pass the horizon in one (4 standard
    # deviations of a Poisson count), at most CHUNK variates
    rows = int(min(max(1, math.ceil(expected + 4 * math.sqrt(expected) + 1)), CHUNK // BLOCK))
    out_t, out_u = [], []
    for b in range(-(-units // BLOCK)):
        g = _stream(seq, kind, b)
        real = min(BLOCK, units - b * BLOCK)     # the last block draws BLOCK, keeps these
        gamma = g.standard_gamma(1.0 / shape, BLOCK)
        with np.errstate(divide="ignore"):       # a variate of 0: a failure at time 0
            t = np.exp(np.log(gamma) / shape + log_scale)[:real]
        alive = t < horizon_s
        if not alive.any():                      # the usual block of a big job: no failure
            continue
        chunks = [t[None, :]]
        budget.add(int(alive.sum()))
        while (t < horizon_s).any():
            gaps = weibull_from_exponential(g.standard_exponential((rows, BLOCK)), shape, log_scale)
            cum = t + np.cumsum(gaps[:, :real], axis=0)
            chunks.append(cum)
            t = cum[-1]
            budget.add(int((cum < horizon_s).sum()))
        times = np.concatenate(chunks)
        unit = np.broadcast_to(b * BLOCK + np.arange(real), times.shape)
        keep = times < horizon_s
        out_t.append(times[keep])
        out_u.append(unit[keep])
    times = np.concatenate(out_t) if out_t else np.zeros(0)
    unit = np.concatenate(out_u).astype(np.int64) if out_u else np.zeros(0, dtype=np.int64)
    first = unit * size
    return times, np.minimum(size, nodes - first), np.full(unit.size, code, dtype=np.int8), first


def _replay(record: NodeRecord, nodes: int, horizon_s: float, seq, budget: _Budget):
    """The record's failures mapped onto ``nodes`` job nodes: copy c of the record (job
    nodes c*M .. c*M + M - 1 for a record of M nodes) takes a random permutation of the
    record's nodes and a random start in its span (stream (0, c)), and plays cyclically;
    failures at the same instant stay together, so the record's co-failures do too."""
    m, span = record.nodes, record.span_s
    cycles = math.ceil(horizon_s / span)
    out_t, out_n = [], []
    for c in range(-(-nodes // m)):
        g = _stream(seq, 0, c)
        perm, start = g.permutation(m), g.uniform(0.0, span)
        job_node = np.full(m, -1, dtype=np.int64)
        count = min(m, nodes - c * m)
        job_node[perm[:count]] = c * m + np.arange(count)
        mine = job_node[record.node] >= 0
        rel = (record.times_s[mine] - start) % span
        who = job_node[record.node[mine]]
        whole = rel.size * (cycles - 1)          # every cycle but the last is kept whole:
        budget.add(whole)                        # counted before it is allocated
        times = (rel[None, :] + span * np.arange(cycles)[:, None]).ravel()
        who = np.tile(who, cycles)
        keep = times < horizon_s
        budget.add(int(keep.sum()) - whole)
        out_t.append(times[keep])
        out_n.append(who[keep])
    times, who = np.concatenate(out_t), np.concatenate(out_n)
    return times, np.ones(times.size, dtype=np.int64), np.zeros(times.size, dtype=np.int8), who
