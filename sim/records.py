"""Real failure records, for replay onto a job of N nodes (``sim.nodes``) and for
fitting a per-node law (``sim.fitting``).

Two shipped records (``SHIPPED``; files and attribution in ``sim/data/failures/``),
found by name wherever the package is installed, and any file by path:

- ``lanl``: LANL's node failures, 1996-2005, 22 systems; one system is a
  ``NodeRecord`` (``read_lanl(path, system=18)``);
- ``philly``: Microsoft Philly's interruptions of multi-GPU jobs, 2017; not a record
  of nodes (it does not say which machine failed), an ``InterruptionRecord`` for
  fitting only;
- a CSV of one's own: columns ``node`` and ``time`` (or ``time_s``), one failure a
  row, seconds or units (``read_node_csv``).

Every record carries the attribution its publisher asks for, which every report
that uses it prints.
"""
from __future__ import annotations

import io
import math
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np
import pandas as pd

from layercheck.contract.userfile import read_csv_bytes

from .errors import SimError
from .units import parse_duration

__all__ = ["NodeRecord", "InterruptionRecord", "SHIPPED", "LANL_ATTRIBUTION",
           "PHILLY_ATTRIBUTION", "record_path", "read_record", "read_lanl", "lanl_systems",
           "read_philly", "read_node_csv", "MAX_NODES"]

MAX_NODES = 1_000_000
"""The most nodes a job may have, and the node numbers a record may name (0 to
MAX_NODES - 1): a draw opens a stream per 64 nodes (55-80 us each here), so a
million nodes cost about a second a run before any failure (the work bound,
``sim.workbound.MAX_STREAMS``, counts them over a call's runs)."""

SHIPPED = {"lanl": "lanl-1996-2005.csv.xz", "philly": "philly-interruptions.csv"}
"""The records shipped with the package, by the name ``--failure-log`` takes."""
LANL_ATTRIBUTION = ("Los Alamos National Laboratory, LA-UR-05-7318 (node failures 1996-2005), "
                    "as republished in Derek-Jones/ESEUR-code-data (reliability/); we "
                    "recognize Los Alamos for providing these data")
PHILLY_ATTRIBUTION = ("Microsoft Philly traces, msr-fiddle/philly-traces (CC-BY-4.0): Jeon et "
                      "al., \"Analysis of Large-Scale Multi-Tenant GPU Clusters for DNN Training "
                      "Workloads\", USENIX ATC 2019; interruptions derived via "
                      "marwage/philly-traces (analysis/jobs.json)")
_LANL_COLUMNS = ("System", "nodes", "nodenumz", "Prob Started")
_PHILLY_COLUMNS = ("job_id", "num_gpus", "attempt_len_s", "restart_gap_s")


@dataclass(frozen=True, kw_only=True, eq=False)
class NodeRecord:
    """Failures of the nodes of one system, in seconds from the start of its record."""

    name: str
    """What the record is, e.g. 'LANL system 18'."""
    nodes: int
    """Nodes in the system (those that never failed included)."""
    times_s: np.ndarray
    """Each failure's start, seconds from the record's start, ascending (float64)."""
    node: np.ndarray
    """Each failure's node, 0 .. nodes - 1 (int64)."""
    span_s: float
    """Seconds the record covers: a failure at t is in [0, span_s)."""
    attribution: str
    """Who published the record and how to credit them."""

    def __post_init__(self) -> None:
        times = np.asarray(self.times_s, dtype=np.float64)
        node = np.asarray(self.node, dtype=np.int64)
        object.__setattr__(self, "times_s", times)
        object.__setattr__(self, "node", node)
        if isinstance(self.nodes, bool) or not isinstance(self.nodes, (int, np.integer)) \
                or self.nodes < 1:
            raise SimError(f"record {self.name}: nodes={self.nodes!r} must be a positive integer")
        object.__setattr__(self, "nodes", int(self.nodes))
        if times.ndim != 1 or times.shape != node.shape or times.size == 0:
            raise SimError(f"record {self.name}: give one node per failure time, at least one")
        if not (math.isfinite(self.span_s) and self.span_s > 0):
            raise SimError(f"record {self.name}: span_s={self.span_s!r} must be positive seconds")
        if not np.all(np.isfinite(times)) or times[0] < 0 or times[-1] >= self.span_s \
                or (np.diff(times) < 0).any():
            raise SimError(f"record {self.name}: failure times must be ascending, in [0, span_s)")
        if node.min() < 0 or node.max() >= self.nodes:
            raise SimError(f"record {self.name}: node numbers must be 0 .. {self.nodes - 1}")
        if not self.attribution.strip():
            raise SimError(f"record {self.name}: a record needs its attribution (who to credit)")

    @property
    def failures(self) -> int:
        return int(self.times_s.size)

    @property
    def node_mtbf_s(self) -> float:
        """One node's mean time between failures: nodes x span / failures."""
        return self.nodes * self.span_s / self.failures


@dataclass(frozen=True, kw_only=True, eq=False)
class InterruptionRecord:
    """Interruptions of jobs (Philly): how long each attempt ran before it was interrupted,
    the job's GPUs and the gap before its next attempt. Which machine failed is not known."""

    name: str
    gpus: np.ndarray
    """Each interruption's job size, GPUs (int64)."""
    attempt_s: np.ndarray
    """Seconds the attempt ran before the interruption."""
    restart_gap_s: np.ndarray
    """Seconds from the interruption to the job's next attempt."""
    jobs: int
    """Jobs with at least one interruption."""
    attribution: str

    @property
    def failures(self) -> int:
        return int(self.attempt_s.size)


def record_path(name_or_path: str | Path) -> Path:
    """A shipped record's file by name (``SHIPPED``), else the path as given."""
    if str(name_or_path) in SHIPPED:
        return Path(str(resources.files("sim").joinpath("data", "failures",
                                                        SHIPPED[str(name_or_path)])))
    return Path(name_or_path)


def read_record(name_or_path: str | Path, *, system: int | None = None
                ) -> NodeRecord | InterruptionRecord:
    """Any record by name or path, its kind told by its columns: LANL's release (give
    ``system``), Philly's interruptions, or a CSV of ``node`` and ``time`` columns."""
    path = record_path(name_or_path)
    columns = _columns(path)
    if set(_LANL_COLUMNS) <= set(columns):
        if system is None:
            raise SimError(f"{path.name} holds several LANL systems: choose one with --system "
                           f"N ({_systems_text(path)})")
        return read_lanl(path, system=system)
    if system is not None:
        raise SimError(f"--system picks a LANL system; {path.name} is not LANL's record")
    if set(_PHILLY_COLUMNS) <= set(columns):
        return read_philly(path)
    return read_node_csv(path)


def _read_csv(path: Path, **options) -> pd.DataFrame:
    """A record's CSV (decompressed by its suffix), read bounded: a FIFO, a device or a
    file past ``layercheck.contract.userfile``'s bound is an ``OSError`` naming it."""
    return pd.read_csv(io.BytesIO(read_csv_bytes(path)), **options)


def _columns(path: Path) -> list[str]:
    try:
        return [c.strip() for c in _read_csv(path, nrows=0).columns]
    except FileNotFoundError:
        raise SimError(f"failure record {path}: no such file; give a path or one of "
                       f"{', '.join(SHIPPED)} (the shipped records)") from None
    except (OSError, UnicodeDecodeError, ValueError, EOFError) as exc:
        raise SimError(f"failure record {path}: cannot read it as CSV ({exc})") from None


def _lanl_frame(path: Path) -> pd.DataFrame:
    try:
        frame = _read_csv(path, usecols=list(_LANL_COLUMNS))
    except (OSError, ValueError, EOFError) as exc:
        raise SimError(f"LANL record {path}: cannot read it ({exc})") from None
    # a value that is not a number or a date is missing (NaN/NaT), which the readers refuse
    for column in ("System", "nodes", "nodenumz"):
        frame[column] = pd.to_numeric(frame[column], errors="coerce")
    frame["start"] = pd.to_datetime(frame["Prob Started"], format="%m/%d/%Y %H:%M", errors="coerce")
    frame = frame[frame["System"].notna()]
    if frame.empty:
        raise SimError(f"LANL record {path}: no row names its system")
    return frame


def lanl_systems(path: str | Path = "lanl") -> pd.DataFrame:
    """One row per LANL system: nodes (NaN where the release does not say), failures."""
    frame = _lanl_frame(record_path(path))
    return frame.groupby("System").agg(nodes=("nodes", "first"), failures=("start", "size")) \
        .reset_index().rename(columns={"System": "system"})


def _systems_text(path: Path) -> str:
    rows = lanl_systems(path)
    rows = rows[rows["nodes"].notna()].sort_values("nodes", ascending=False).head(4)
    return "the largest: " + ", ".join(f"{int(r.system)} ({int(r.nodes)} nodes, {int(r.failures)} "
                                      "failures)" for r in rows.itertuples())


def read_lanl(path: str | Path = "lanl", *, system: int) -> NodeRecord:
    """One LANL system's node failures: node ``nodenumz`` (0-based), time ``Prob Started``
    (minute resolution), over the span from its first failure to its last plus one mean gap
    (so that the failure rate is the gaps' and a cyclic replay's wrap is an average gap)."""
    frame = _lanl_frame(record_path(path))
    rows = frame[frame["System"] == system]
    if rows.empty:
        raise SimError(f"LANL system {system!r} is not in the record: {_systems_text(record_path(path))}")
    numbers = rows[["nodes", "nodenumz"]]
    if numbers.isna().any().any() or rows["start"].isna().any() or (numbers % 1 != 0).any().any():
        raise SimError(f"LANL system {system} lacks node counts, node numbers or start times "
                       "in the release: choose another --system")
    if ((numbers < 0) | (numbers >= MAX_NODES)).any().any() or (rows["nodes"] < 1).any():
        raise SimError(f"LANL system {system}: its node counts and node numbers must be "
                       f"integers from 0 to {MAX_NODES - 1:,} (node counts from 1)")
    seconds = (rows["start"] - rows["start"].min()).dt.total_seconds().to_numpy()
    return _from_starts(f"LANL system {system}", int(rows["nodes"].iloc[0]), seconds,
                        rows["nodenumz"].to_numpy(dtype=np.int64), LANL_ATTRIBUTION)


def read_philly(path: str | Path = "philly") -> InterruptionRecord:
    """Philly's interruptions: one row per interrupted attempt."""
    path = record_path(path)
    try:
        frame = _read_csv(path, usecols=list(_PHILLY_COLUMNS))
    except (OSError, ValueError) as exc:
        raise SimError(f"Philly record {path}: cannot read it ({exc})") from None
    for column in _PHILLY_COLUMNS[1:]:
        frame[column] = pd.to_numeric(frame[column], errors="coerce")
    if frame.empty or frame.isna().any().any() or (frame["attempt_len_s"] <= 0).any() \
            or (frame["num_gpus"] % 1 != 0).any():
        raise SimError(f"Philly record {path}: every row needs a positive attempt_len_s, a "
                       "num_gpus and a restart_gap_s")
    return InterruptionRecord(name="Microsoft Philly 2017 interruptions",
                              gpus=frame["num_gpus"].to_numpy(dtype=np.int64),
                              attempt_s=frame["attempt_len_s"].to_numpy(dtype=np.float64),
                              restart_gap_s=frame["restart_gap_s"].to_numpy(dtype=np.float64),
                              jobs=int(frame["job_id"].nunique()), attribution=PHILLY_ATTRIBUTION)


def read_node_csv(path: str | Path, *, nodes: int | None = None) -> NodeRecord:
    """A record of one's own: columns ``node`` (0-based integers) and ``time`` or
    ``time_s`` (seconds, or with units); the system has max(node) + 1 nodes unless
    ``nodes`` says more. Attribution: the file itself."""
    path = Path(path)
    try:
        frame = _read_csv(path, dtype=str)
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise SimError(f"failure record {path}: cannot read it as CSV ({exc})") from None
    cols = {c.strip().lower(): c for c in frame.columns}
    time_col = next((cols[n] for n in ("time_s", "time") if n in cols), None)
    if "node" not in cols or time_col is None:
        raise SimError(f"failure record {path}: a record of nodes needs columns 'node' and "
                       "'time' (or 'time_s'); a list of the job's failure times goes without "
                       "--nodes")
    try:
        node = np.array([_node_number(text) for text in frame[cols["node"]]], dtype=np.int64)
        times = np.array([parse_duration(str(t), what=f"{path} time", allow_zero=True)
                          for t in frame[time_col]])
    except (ValueError, SimError) as exc:
        raise SimError(f"failure record {path}: {exc}") from None
    if times.size < 2:
        raise SimError(f"failure record {path}: needs at least two failures to have a rate")
    order = np.argsort(times, kind="stable")
    count = int(node.max()) + 1 if nodes is None else nodes
    return _from_starts(path.stem, count, times[order] - times[order][0], node[order],
                        f"the record {path.name} (given by the user)")


def _node_number(text: object) -> int:
    """A record's node: an integer from 0 to MAX_NODES - 1 (``ValueError`` naming the range)."""
    try:
        node = int(str(text).strip())
    except ValueError:
        node = None
    if node is None or not 0 <= node < MAX_NODES:
        raise ValueError(f"node {str(text)[:40]!r} must be an integer from 0 to {MAX_NODES - 1:,}")
    return node


def _from_starts(name: str, nodes: int, seconds: np.ndarray, node: np.ndarray,
                 attribution: str) -> NodeRecord:
    order = np.argsort(seconds, kind="stable")
    seconds, node = seconds[order], node[order]
    n, observed = seconds.size, float(seconds[-1] - seconds[0])
    if n < 2 or observed <= 0:
        raise SimError(f"record {name}: needs failures at two or more different times")
    return NodeRecord(name=name, nodes=nodes, times_s=seconds - seconds[0], node=node,
                      span_s=observed * n / (n - 1), attribution=attribution)
