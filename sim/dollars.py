"""What failures and checkpointing cost a run, in GPU hours by cause and in dollars.

    prices = Prices()                                   # every default with its source
    bill(row, footprint, prices, window_s=30 * 86400)   # one strategy's row of a table

GPU hours: each second of a run that is not useful training holds every GPU of the
job, so a cause's GPU hours are its seconds x ``gpus`` / 3600, by cause:

- **stall**: checkpointing on the training thread (``checkpoint_stall_s``);
- **lost work**: training a failure rolled back (``lost_work_s``);
- **stale work**: what stale layers' discarded updates cost at phi (``stale_lost_s``);
- **detection and restart**: each failure's restart of the job (``restart_s`` a
  failure; a recovery cut short by another failure is counted whole here and
  so a few seconds too much: the rest of ``recovery_s`` never goes below zero);
- **recovery**: the rest of ``recovery_s`` (loading, LowDiff's replay, warm-up).

Dollars: those GPU hours at ``gpu_hour_usd``; durable storage, the bytes kept
(``Footprint.stored_bytes`` of the ``keep`` newest recovery points) for the run's
months at ``storage_usd_per_gb_month``; the writes, every byte written to durable
storage at ``write_usd_per_gb`` (a run's ``bytes_written`` times the share of what its
checkpoints move that is durable on the failure-free job: GEMINI's copies to a peer's
memory are not written). A month is 730 hours, as cloud price lists bill it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from layercheck.contract.calibration import Figure

from .errors import SimError
from .strategies import Footprint

__all__ = ["Prices", "Bill", "bill", "PRICES", "HOURS_PER_MONTH", "CAUSES", "BILL_COLUMNS"]

HOURS_PER_MONTH = 730.0
"""A month of storage as AWS's price lists bill it (8,760 hours a year / 12)."""
S3_PUT_USD = 0.005 / 1000
S3_PART_BYTES = 8 * 1024 ** 2
PRICES: dict[str, Figure] = {
    "gpu_hour_usd": Figure(value=2.7447, source="published", method=(
        "AWS EC2 On-Demand, p4d.24xlarge (8x A100 40 GB, the paper's GPU) in us-east-1: "
        "$21.957642 an instance-hour, $2.7447 a GPU-hour, as recorded by "
        "github.com/datareceipts/data-receipts 109-gpu-pricing/hyperscalers.json (before AWS's "
        "price cut of that year the same instance listed at $32.77)")),
    "gpus": Figure(value=8, source="published", method=(
        "the paper's server: one node of 8 A100 40 GB (shared/design/LAYERCHECK.md); "
        "--gpus sets the job's")),
    "storage_usd_per_gb_month": Figure(value=0.023, source="published", method=(
        "Amazon S3 Standard, the first 50 TB a month, us-east-1: $0.023 per GB-month "
        "(aws.amazon.com/s3/pricing)")),
    "write_usd_per_gb": Figure(value=S3_PUT_USD * 1e9 / S3_PART_BYTES, source="derived", method=(
        "Amazon S3 PUT requests at $0.005 per 1,000 (aws.amazon.com/s3/pricing), one per "
        "8 MiB part (boto3's default multipart chunk): 1e9 / 8,388,608 = 119.2 requests a "
        "GB, $0.000596 a GB written")),
    "keep": Figure(value=2, source="assumed", method=(
        "the newest recovery point and the one before it, so that a damaged newest one "
        "still has a fallback (layercheck's keep_versions=2; a rollback strategy's two "
        "newest checkpoints)")),
}
"""Every price's default, with where it comes from."""
CAUSES = ("stall", "lost_work", "stale_work", "restart", "recovery")
"""The causes of GPU hours a bill names, in order (module doc)."""
BILL_COLUMNS = (*(f"gpu_h_{c}" for c in CAUSES), "usd_gpu", "usd_storage", "usd_writes", "usd_total")
"""The columns a bill adds to a result row: GPU hours per run by cause, then dollars per
run (GPU time not spent training, storage, writes, their sum)."""


MAX_PRICE_USD = 1e9
"""The most any one price may be: far above any real price, low enough that a bill's sums stay
finite in float64."""
MAX_KEEP = 1_000_000
"""The most recovery points a bill keeps: more than a job of the simulator's million steps
can make."""


@dataclass(frozen=True, kw_only=True)
class Prices:
    """What an hour of the job's GPUs, a GB-month of storage and a GB written cost."""

    gpu_hour_usd: float = PRICES["gpu_hour_usd"].value
    gpus: int = int(PRICES["gpus"].value)
    storage_usd_per_gb_month: float = PRICES["storage_usd_per_gb_month"].value
    write_usd_per_gb: float = PRICES["write_usd_per_gb"].value
    keep: int = int(PRICES["keep"].value)
    """Recovery points kept on storage (the newest ``keep``)."""

    def __post_init__(self) -> None:
        for name, flag in (("gpu_hour_usd", "--gpu-hour-usd"),
                           ("storage_usd_per_gb_month", "--storage-usd-per-gb-month"),
                           ("write_usd_per_gb", "--write-usd-per-gb")):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not 0 <= value <= MAX_PRICE_USD:
                raise SimError(f"{flag} must be a price in dollars from 0 to {MAX_PRICE_USD:.0e}, "
                               f"got {value!r}")
        for name, flag, top in (("gpus", "--gpus", 2**53), ("keep", "--keep", MAX_KEEP)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= top:
                raise SimError(f"{flag} must be a whole number from 1 to {top:,}, got {value!r}")

    def sources(self) -> dict[str, dict[str, Any]]:
        """Each price with its value and where it comes from (given: set for this run)."""
        out = {}
        for name, figure in PRICES.items():
            value = getattr(self, name)
            record = figure if math.isclose(value, figure.value, rel_tol=1e-12) else Figure(
                value=float(value), source="given", method="given for this run")
            out[name] = {**record.to_dict(), "value": value}
        return out

    def line(self) -> str:
        """One line for a report's header."""
        given = [n for n, s in self.sources().items() if s["source"] == "given"]
        return (f"prices: {self.gpus} GPUs at ${self.gpu_hour_usd:g} a GPU-hour, storage "
                f"${self.storage_usd_per_gb_month:g} a GB-month ({self.keep} recovery points "
                f"kept), writes ${self.write_usd_per_gb:.3g} a GB"
                + (f"; given: {', '.join(given)}" if given else
                   " (AWS on-demand A100, S3 Standard and S3 PUTs: docs/sim-fair.md, Hours and dollars)"))


@dataclass(frozen=True, kw_only=True)
class Bill:
    """One strategy's run in GPU hours by cause and in dollars (module doc)."""

    strategy: str
    gpu_hours: Mapping[str, float]
    """Per cause (``CAUSES``), GPU hours per run."""
    usd_gpu: float
    usd_storage: float
    usd_writes: float

    @property
    def usd_total(self) -> float:
        return self.usd_gpu + self.usd_storage + self.usd_writes

    def row(self) -> dict[str, float]:
        """``BILL_COLUMNS`` of this bill."""
        return {**{f"gpu_h_{c}": float(self.gpu_hours[c]) for c in CAUSES},
                "usd_gpu": self.usd_gpu, "usd_storage": self.usd_storage,
                "usd_writes": self.usd_writes, "usd_total": self.usd_total}


def bill(row: Mapping[str, Any], footprint: Footprint, prices: Prices, *, window_s: float,
         restart_s: float) -> Bill:
    """The bill of one result row (``sim.api.COLUMNS``: seconds and counts per run) of a
    strategy whose checkpoints occupy ``footprint``, over a run of ``window_s``, each
    failure's restart taking ``restart_s``."""
    seconds = {"stall": max(float(row["checkpoint_stall_s"]), 0.0),
               "lost_work": float(row["lost_work_s"]),
               "stale_work": float(row["stale_lost_s"])}
    restart = min(float(row["failures"]) * restart_s, float(row["recovery_s"]))
    seconds["restart"] = restart
    seconds["recovery"] = float(row["recovery_s"]) - restart
    hours = {c: seconds[c] / 3600 * prices.gpus for c in CAUSES}
    months = window_s / 3600 / HOURS_PER_MONTH
    return Bill(strategy=str(row["strategy"]), gpu_hours=hours,
                usd_gpu=sum(hours.values()) * prices.gpu_hour_usd,
                usd_storage=footprint.stored_bytes(prices.keep) / 1e9 * months
                * prices.storage_usd_per_gb_month,
                usd_writes=float(row["bytes_written"]) * footprint.durable_share / 1e9
                * prices.write_usd_per_gb)
