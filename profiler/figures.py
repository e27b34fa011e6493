"""The drift heatmap of a trace as a PNG (``python -m profiler heatmap TRACE``).

Four panels over the steps of the run: the accumulator as a share of its
threshold, A_l(t) / K_l(t) (a layer is written when it reaches 1, then drops
to 0: the waves), over the whole run and zoomed on 100 steps; the per-step drift d_l(t) on a log scale; and the
parameter-weighted staleness of the checkpoint, with a drill's failure steps
marked. matplotlib is needed here only (``pip install -c constraints.txt
matplotlib``); the trace reader itself stays torch- and plot-free.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from layercheck.contract.decision import recorded_config, threshold_matrix
from layercheck.contract.trace import Trace

from .errors import ProfilerError

__all__ = ["threshold_matrix", "heatmap_png"]
"""``threshold_matrix``: K_l(t) as recorded, ``k_scale`` included (``layercheck.contract.decision``)."""


def heatmap_png(trace: Trace, path: Path, *, title: str | None = None,
                zoom: int = 100) -> Path:
    """Write the figure to ``path``; the second panel zooms on ``zoom`` steps
    in the middle of the run, where dense waves are hard to see in the first."""
    plt = _pyplot()
    share = trace.accumulator_matrix() / np.maximum(threshold_matrix(trace), 1e-30)
    n = trace.num_steps
    first = max(1, n // 2 - zoom // 2)
    last = min(n, first + zoom - 1)
    fig, axes = plt.subplots(4, 1, figsize=(12, 11),
                             gridspec_kw={"height_ratios": [3, 3, 3, 1.4]})
    _share_panel(fig, axes[0], trace, share, 1, n, "accumulated drift as a share of the "
                 "threshold, A_l(t) / K_l(t) (the layer is written at 1, then reset)")
    _share_panel(fig, axes[1], trace, share, first, last, f"the same, steps {first}-{last}")
    _drift_panel(fig, axes[2], trace)
    _staleness_panel(axes[3], trace, np.arange(1, n + 1))
    fig.suptitle(title or trace.name, fontsize=12)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _share_panel(fig, ax, trace: Trace, share: np.ndarray, first: int, last: int,
                 title: str) -> None:
    extent = (first - 0.5, last + 0.5, len(trace.layer_names) - 0.5, -0.5)
    im = ax.imshow(np.clip(share[first - 1:last].T, 0, 1.5), aspect="auto", cmap="viridis",
                   interpolation="nearest", extent=extent, vmin=0, vmax=1.5)
    fig.colorbar(im, ax=ax, pad=0.01, label="A / K")
    warmup = recorded_config(trace).warmup_steps
    if first < warmup:
        ax.axvline(warmup, color="white", lw=1, ls=":")
        ax.annotate("warm-up: no selective writes", (first + 2, -0.5), color="black",
                    fontsize=8, va="top")
    _layer_ticks(ax, trace)
    ax.set_title(title, fontsize=10)


def _drift_panel(fig, ax, trace: Trace) -> None:
    drift = trace.drift_matrix()
    extent = (0.5, trace.num_steps + 0.5, len(trace.layer_names) - 0.5, -0.5)
    im = ax.imshow(np.log10(np.maximum(drift.T, 1e-12)), aspect="auto", cmap="magma",
                   interpolation="nearest", extent=extent)
    fig.colorbar(im, ax=ax, pad=0.01, label="log10 d")
    _layer_ticks(ax, trace)
    ax.set_title("per-step drift d_l(t) = mean|w(t) - w(t-1)| / mean|w(t)| (follows the LR "
                 "schedule; K_l(t) is scaled by it too)", fontsize=10)


def _layer_ticks(ax, trace: Trace) -> None:
    ax.set_yticks(range(len(trace.layer_names)), _short(trace.layer_names), fontsize=8)


def _staleness_panel(ax, trace: Trace, steps: np.ndarray) -> None:
    stale = trace.weighted_staleness()
    ax.plot(steps, stale, lw=1, color="tab:blue")
    ax.set_ylabel("steps")
    ax.set_title("parameter-weighted staleness of the checkpoint", fontsize=10)
    for i, t in enumerate((trace.drill or {}).get("failure_steps", [])):
        ax.axvline(t, color="tab:red", lw=1, ls="--", label="drill failure" if i == 0 else None)
    if trace.drill:
        ax.legend(loc="upper left", fontsize=8)
    ax.set_xlabel("step")
    ax.set_xlim(0.5, trace.num_steps + 0.5)
    # the colorbars above take width; keep the line panel aligned with the maps
    ax.figure.colorbar(ax.scatter([], []), ax=ax, pad=0.01).ax.set_visible(False)


def _short(names: list[str]) -> list[str]:
    return [n.replace("bert.encoder.layer.", "block ").replace("model.layers.", "block ")
            .replace("bert.embeddings", "embeddings").replace("model.embed_tokens", "embeddings")
            for n in names]


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise ProfilerError("the heatmap needs matplotlib: pip install -c constraints.txt "
                            "matplotlib") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt
