"""The analysis figures as small PNG files, drawn headless (matplotlib figures without pyplot)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from flowcore._fs import atomic_write
from flowcore.extras import require

__all__ = ["DPI", "cosine_histogram_figure", "frequency_figure", "lexical_figure"]

DPI = 100


def _figure(columns: int = 1, height: float = 3.4):
    """A figure 6.4 inches wide and its axes; without pyplot it never opens a window nor needs a display."""
    require("matplotlib", "the figures of flowcore analyze", "analysis")
    from matplotlib.figure import Figure

    figure = Figure(figsize=(6.4, height))
    return figure, figure.subplots(1, columns)


def _save(figure, path) -> Path:
    """`figure` as a PNG at `path`, written atomically like every output."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.tight_layout()
    atomic_write(path, lambda stream: figure.savefig(stream, dpi=DPI, format="png"))
    return path


def cosine_histogram_figure(isotropy: dict[str, dict], path, title: str) -> Path:
    """Overlaid random-pair cosine densities, one per calibration, each 99th percentile dashed.

    Args:
        isotropy: {calibration: `Isotropy.to_json()`}: its `histogram` and its `thresholds`' p99.

    Example:
        >>> cosine_histogram_figure({"none": iso.to_json()}, "cosines.png", "STS-B")
    """
    figure, axes = _figure(height=4)
    for index, (name, measured) in enumerate(isotropy.items()):
        counts = np.asarray(measured["histogram"], dtype=np.float64)
        edges = np.linspace(-1.0, 1.0, len(counts) + 1)
        density = counts / max(counts.sum(), 1) / np.diff(edges)
        color = f"C{index}"
        axes.stairs(density, edges, label=name, color=color, linewidth=1.4)
        axes.axvline(measured["thresholds"]["p99"], color=color, linestyle="--", linewidth=0.8)
    axes.set_xlabel("cosine of a random pair (dashed: 99th percentile, a suggested threshold)")
    axes.set_ylabel("density")
    axes.set_xlim(-1, 1)
    axes.set_title(title)
    axes.legend(fontsize="small")
    return _save(figure, path)


def frequency_figure(buckets: dict[str, list[dict]], path, title: str, k: str = "3") -> Path:
    """Mean ℓ2 norm and k-NN distance of token embeddings by frequency bucket, a line per source.

    Args:
        buckets: {source: [`FrequencyBucket.to_json()`, ...]}, e.g. {"wordfreq": [...]}.
        k: which k-NN distance to draw.

    Example:
        >>> frequency_figure({"wordfreq": [b.to_json() for b in stats]}, "frequency.png", "all-MiniLM-L6-v2")
    """
    figure, (left, right) = _figure(columns=2)
    for index, (source, rows) in enumerate(buckets.items()):
        labels = [_bucket_label(row) for row in rows]
        positions = np.arange(len(rows))
        left.plot(positions, [row["mean_norm"] for row in rows], marker="o", color=f"C{index}", label=source)
        right.plot(positions, [row["knn_distance"][k] for row in rows], marker="o", color=f"C{index}", label=source)
        for axes in (left, right):
            axes.set_xticks(positions, labels, fontsize="small")
    left.set_ylabel("mean ℓ2 norm")
    right.set_ylabel(f"mean {k}-NN ℓ2 distance")
    for axes in (left, right):
        axes.set_xlabel("frequency rank")
        axes.legend(fontsize="small")
    figure.suptitle(title)
    return _save(figure, path)


def lexical_figure(bias: dict[str, float], path, title: str) -> Path:
    """Spearman ×100 of each similarity with edit distance, as bars (gold, the human reference, in grey).

    Args:
        bias: {name: Spearman ×100} (`lexical_bias`).

    Example:
        >>> lexical_figure(lexical_bias({"gold": gold, "none": cosines}, distances), "lexical.png", "STS-B")
    """
    figure, axes = _figure()
    names = list(bias)
    colors = ["0.6" if name == "gold" else f"C{index}" for index, name in enumerate(names)]
    bars = axes.bar(names, [bias[name] for name in names], color=colors)
    axes.bar_label(bars, fmt="%.1f", fontsize="small")
    axes.axhline(0, color="black", linewidth=0.6)
    axes.set_ylabel("Spearman x100 with edit distance")
    axes.set_title(title)
    return _save(figure, path)


def _bucket_label(row: dict) -> str:
    return "–".join(f"{value // 1000}K" if value >= 1000 and value % 1000 == 0 else str(value)
                    for value in (row["start"], row["stop"]))
