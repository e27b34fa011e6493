"""Bands and rules several strategies' figures share (``FigureSpec.band``, ``Figure.band``).

Rules (relative, ``Band.around`` a value) say where a figure carried from elsewhere
plausibly lies; the paper's bands (absolute) where the paper's own figure does, each from
the paper's numbers or a hardware spec (a judgment says so).
"""
from __future__ import annotations

from layercheck.contract.band import Band

__all__ = ["PAPER", "STORAGE_RULE", "COPY_RULE", "LOAD_FIXED_RULE", "WRITE_BAND", "READ_BAND",
           "READ_FIXED_BAND", "COPY_BAND"]

PAPER = "LayerCheck (IEEE CLUSTER 2026)"
"""The paper whose server the default cost model is (``shared/design/LAYERCHECK.md``)."""

STORAGE_RULE = Band(low=1 / 3, high=3.0, relative=True, reason=(
    "a storage rate carried from elsewhere: this machine's two calibrations of one model "
    "(traces/minilm-200steps and minilm-1000steps, their costs.json) measured DeepSpeed's save at "
    "0.42 and 1.10 GB/s on the same disk, 2.6x apart; a third to three times"))
COPY_RULE = Band(low=0.5, high=2.0, relative=True, reason=(
    "a copy to host memory carried from elsewhere: the same two calibrations measured "
    "host_copy_gbps at 9.5 and 5.1 GB/s and snapshot_gbps at 3.1 and 2.0 GB/s (up to 1.9x "
    "apart); half to twice"))
LOAD_FIXED_RULE = Band(low=0.0, high=0.5, reason=(
    "0 where the load is timed whole and folded into its rate (how calibrate measures "
    "load_fixed_s), up to the 0.48 s restore plan measured here (minilm-200steps "
    "lc_load_fixed_s)"))


WRITE_BAND = Band(low=1.12, high=12.0, reason=(
    "low: the write-bound derivation itself (LowDiff's 3,837 GB in at most its 3,432 s); "
    "high: LowDiff writing only during its published checkpoint share, 9.3% of the run "
    "(3,837 GB / 319 s)"))
READ_BAND = Band(low=14.9, high=22.3, reason=(
    "the published recoveries are whole seconds (Qwen2.5-7B 10 s, Llama-3.2-1B 5 s): lines "
    "through their +-0.5 s ends put the 89.3 GB between them in 6 s to 4 s"))
READ_FIXED_BAND = Band(low=3.34, high=4.72, reason=(
    "the intercepts of those lines: 4.5 s - 17.3 GB / 14.9 GB/s, 5.5 s - 17.3 GB / 22.3 GB/s"))
COPY_BAND = Band(low=50.0, high=200.0, reason=(
    "low: the 8 GPUs in pairs behind 4 PCIe 4.0 x16 switch uplinks (the DGX A100 layout) at "
    "half their 25 GB/s; high: each GPU its own x16 link at 25 GB/s"))
