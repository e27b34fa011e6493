"""LayerCheckConfig: every knob of the library, validated on construction.

Importable without torch: the dashboard and the simulator read and rebuild
configs from traces.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping, Sequence

__all__ = ["LayerCheckConfig", "ConfigError"]


class ConfigError(ValueError):
    """A configuration value is out of range; the message says what to change."""


@dataclass(frozen=True, kw_only=True)
class LayerCheckConfig:
    """How LayerCheck decides what to write and how it writes it.

    The defaults are the paper's (LayerCheck, IEEE CLUSTER 2026): base
    threshold 1e-3 for blocks, head and norm, 1e-2 for embeddings, Smax 1000,
    200 warm-up steps, a checkpoint opportunity after every optimizer step.
    """

    base_threshold: float = 1e-3
    """Drift threshold K for transformer blocks, the output head and norms,
    at the peak learning rate."""

    embedding_threshold: float = 1e-2
    """Drift threshold K for embedding layers, at the peak learning rate."""

    thresholds: Mapping[str, float] = field(default_factory=dict)
    """Per-layer override of the base threshold, by layer name (see
    ``LayerMap.names``). ``0`` writes the layer at every opportunity,
    ``math.inf`` only when Smax forces it."""

    smax: int = 1000
    """Staleness guard: a layer whose last saved copy is ``smax`` steps old is
    written at the next opportunity whatever its drift."""

    warmup_steps: int = 200
    """Selective persistence is off for this many steps; at the first
    opportunity at or after it every layer is written once (the base
    checkpoint, the fallback for layers that rarely cross K)."""

    interval: int = 1
    """A checkpoint opportunity every ``interval`` optimizer steps. The small
    training state (step, scheduler, RNG, extra) is committed at each one."""

    lr_scaling: bool = True
    """Scale thresholds by ``lr(t) / lr_peak`` so warm-up and decay do not
    change how often layers are written (the paper's rule; our choice of
    normalisation)."""

    write_budget: float | None = None
    """Budget mode (``layercheck.contract.budget``): at most this many bytes written per
    optimizer step on average, counted from the base checkpoint on (the base
    itself is not counted). A controller scales every threshold up or down by
    one factor, starting from the thresholds above, so that the run stays within
    it; ``smax`` still forces writes, so staleness stays bounded. For a share of
    your storage's write bandwidth W (bytes/s) at S seconds per step, use
    ``share * W * S`` (``python -m sim tune --max-write-share`` does this from a
    trace). None (default): fixed thresholds, the paper's rule."""

    lr_peak: float | None = None
    """The learning rate at which thresholds equal their base values. None:
    the largest ``initial_lr`` (set by torch LR schedulers) or ``lr`` of the
    optimizer's parameter groups when LayerCheck is created; where that is 0 (an
    optimizer made with lr=0 for a hand-written warm-up), LayerCheck refuses
    and asks for it (``policy.lr_peak``)."""

    drift_sampling: int = 1
    """1 (default): d_l is computed from every element, exactly. n > 1: each
    tensor of at least 65,536 elements is represented by one block of 64
    elements of every run of 64 n (block t mod n at step t, so n consecutive
    steps read every element once), which cuts
    the tracking cost about n-fold for an estimate of the mean (accuracy and
    cost measured in docs/benchmarks.md). Smaller tensors are always exact."""

    fused_step: bool = False
    """True: LayerCheck runs a ``torch.optim.Adam``/``AdamW`` optimizer's step itself
    (``layercheck.drift.fusedstep``), one pass that updates the weights and moments and
    sums each layer's drift on the way, instead of a second pass over them after
    the step: exact drift at no extra read of the tensors. The step's results are
    torch's ``fused=True`` CPU step (bit for bit but for each tensor's last
    ``numel % 16`` elements, 8 on AVX2: a few ulps there), the optimizer and its state
    stay torch's. It applies to CPU fp32 tensors without AMSGrad (and under ZeRO to
    DeepSpeed's inner torch optimizer); any other step runs torch's own step and
    is measured after it as usual, and where it cannot apply at all (another
    optimizer, FSDP2's DTensors, a GPU's tensors, numba missing) a warning says so."""

    keep_versions: int | None = None
    """Automatic retention. None: every committed version stays (prune later with
    ``python -m layercheck gc``). k: each layer keeps its k newest versions and
    its base-checkpoint version; older ones are deleted as soon as a newer one
    commits, and the steps that needed them stop being recoverable. Versions a
    restore passed over as damaged do not count towards k and are not deleted."""

    layers: Mapping[str, Sequence[str]] | None = None
    """Explicit layer map: layer name -> parameter-name prefixes. None: detect
    layers from the model's structure (see ``layercheck.backends.layermap``)."""

    queue_bytes: int = 2 << 30
    """Host memory that snapshots waiting for the background writer may hold.
    When full, ``step()`` blocks until the writer catches up (backpressure).
    A single snapshot larger than this is still accepted when the queue is
    empty."""

    restore_memory: int | None = None
    """Host memory a restore may hold verified layer files in, from its plan (where
    each chosen file is read, verified and checked against the live model) to its
    apply (where the tensors, views of those bytes, are copied into the live
    objects; a fresh optimizer keeps its moments as read, in memory of their
    own): each file is then read once. Layers beyond it are read and verified
    again at the apply. None (default): half of the memory available when
    ``restore()`` starts (``MemAvailable`` in /proc/meminfo; 1 GiB where that is
    unknown). 0: keep nothing, read every layer twice."""

    restore_threads: int = 2
    """Files a restore reads at once (each rank's own). 1: one after another. More
    than the cores pays only on storage that serves parallel reads: from the page
    cache the reads compete with the checksums for the cores (measured on 2 cores:
    docs/benchmarks.md, Restore)."""

    on_error: Literal["raise", "warn"] = "raise"
    """What a failed background write does: ``raise`` re-raises it from the
    next ``step()``/``close()`` (training stops, nothing half-written is
    committed); ``warn`` logs loudly and rewrites the layers at the next
    opportunity."""

    def __post_init__(self) -> None:
        _check_threshold("base_threshold", self.base_threshold)
        _check_threshold("embedding_threshold", self.embedding_threshold)
        for name, value in dict(self.thresholds).items():
            _check_threshold(f"thresholds[{name!r}]", value)
        _check_int("smax", self.smax, minimum=1)
        _check_int("warmup_steps", self.warmup_steps, minimum=0)
        _check_int("interval", self.interval, minimum=1)
        if self.warmup_steps > self.smax:
            raise ConfigError(
                f"warmup_steps={self.warmup_steps} exceeds smax={self.smax}: no layer may be "
                "older than smax, so shorten the warm-up or raise smax")
        if self.write_budget is not None and (
                isinstance(self.write_budget, bool) or not isinstance(self.write_budget, (int, float))
                or not (math.isfinite(self.write_budget) and self.write_budget > 0)):
            raise ConfigError(f"write_budget={self.write_budget!r} must be a positive number of "
                              "bytes per step (e.g. 2e9 for 2 GB), or None for fixed thresholds")
        if self.lr_peak is not None and not (math.isfinite(self.lr_peak) and self.lr_peak > 0):
            raise ConfigError(f"lr_peak={self.lr_peak!r} must be a positive number, or None "
                              "to take it from the optimizer")
        _check_int("queue_bytes", self.queue_bytes, minimum=1)
        _check_int("drift_sampling", self.drift_sampling, minimum=1)
        if not isinstance(self.fused_step, bool):
            raise ConfigError(f"fused_step={self.fused_step!r}: use True or False")
        if self.restore_memory is not None:
            _check_int("restore_memory", self.restore_memory, minimum=0)
        _check_int("restore_threads", self.restore_threads, minimum=1)
        if self.keep_versions is not None:
            _check_int("keep_versions", self.keep_versions, minimum=1)
        if self.on_error not in ("raise", "warn"):
            raise ConfigError(f"on_error={self.on_error!r}: use 'raise' or 'warn'")
        if self.layers is not None:
            if not self.layers:
                raise ConfigError("layers={} names no layer: give name -> parameter prefixes, "
                                  "or None to detect layers automatically")
            for name, prefixes in self.layers.items():
                if isinstance(prefixes, str) or not all(isinstance(p, str) for p in prefixes):
                    raise ConfigError(f"layers[{name!r}] must be a list of parameter-name "
                                      f"prefixes, got {prefixes!r}")

    def restore_bytes(self) -> int:
        """``restore_memory``, or its default: half of MemAvailable, else 1 GiB."""
        if self.restore_memory is not None:
            return self.restore_memory
        try:
            with open("/proc/meminfo", "rb") as meminfo:
                for line in meminfo:
                    if line.startswith(b"MemAvailable:"):
                        return int(line.split()[1]) * 1024 // 2
        except (OSError, ValueError, IndexError):
            pass
        return 1 << 30

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (inf thresholds become the string 'inf')."""
        out = dataclasses.asdict(self)
        out["thresholds"] = {k: _json_float(v) for k, v in dict(self.thresholds).items()}
        out["base_threshold"] = _json_float(self.base_threshold)
        out["embedding_threshold"] = _json_float(self.embedding_threshold)
        if self.layers is not None:
            out["layers"] = {k: list(v) for k, v in self.layers.items()}
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "LayerCheckConfig":
        """Inverse of ``to_dict``; unknown keys are an error that names them."""
        # the same shape as profiler.config.CaptureConfig.from_dict: each config
        # refuses unknown keys with its own error class; the check is four lines
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown LayerCheckConfig keys {unknown}; known: {sorted(known)}")
        kwargs = dict(data)
        for key in ("base_threshold", "embedding_threshold"):
            if key in kwargs:
                kwargs[key] = float(kwargs[key])
        if "thresholds" in kwargs:
            kwargs["thresholds"] = {k: float(v) for k, v in kwargs["thresholds"].items()}
        return cls(**kwargs)


def _check_threshold(name: str, value: float) -> None:
    if not isinstance(value, (int, float)) or math.isnan(value) or value < 0:
        raise ConfigError(f"{name}={value!r} must be a number >= 0 "
                          "(0 writes at every opportunity, inf only when smax forces)")


def _check_int(name: str, value: int, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{name}={value!r} must be an integer >= {minimum}")


def _json_float(value: float) -> float | str:
    return "inf" if math.isinf(value) else float(value)
