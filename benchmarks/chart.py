"""The PNG chart of a run: steps/s per workload and framework (grouped bars, log scale) and the
flowc/peer ratios against their targets.  matplotlib is optional (the `bench` extra)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

from benchmarks.peers import FRAMEWORKS, LABELS
from benchmarks.summary import REFERENCE_FRAMEWORK, Summary
from benchmarks.targets import ratio_target
from benchmarks.workloads import STEP_WORKLOADS


def write_chart(summary: Summary, path: Path) -> str | None:
    """Draw the chart into `path`; return why not (matplotlib missing, nothing measured) or None."""
    if importlib.util.find_spec("matplotlib") is None:
        return "matplotlib is not installed (pip install -e '.[bench]'): no chart"
    if not summary.steps:
        return "no step benchmarks in this run: no chart"
    import matplotlib
    matplotlib.use("Agg")           # files only: no display needed
    import matplotlib.pyplot as plt

    workloads = list(summary.steps)
    figure, (rates, ratios) = plt.subplots(1, 2, figsize=(13, 5), gridspec_kw={"width_ratios": [3, 2]})
    _grouped_bars(rates, workloads, summary.frameworks, summary.steps)
    rates.set_yscale("log")
    lowest = min(v for per in summary.steps.values() for v in per.values())
    rates.set_ylim(bottom=lowest / 3)      # log-scale bars need a floor below the smallest
    rates.set_ylabel("steps/s (log scale, higher is better)")
    rates.set_title("Steps per second, median over rounds")
    peers = [f for f in summary.frameworks if f != REFERENCE_FRAMEWORK]
    _grouped_bars(ratios, workloads, peers, summary.ratios)
    ratios.set_yscale("log")              # 2x faster and 2x slower look alike; the reference's 30x fits
    ratios.axhline(1.0, color="black", linewidth=0.8)
    _target_marks(ratios, workloads, peers)
    ratios.set_ylabel("flowc steps/s ÷ peer steps/s (log scale)")
    ratios.set_title("flowc / peer (median of per-round ratios); — target")
    for axes in (rates, ratios):
        axes.set_ylim(top=axes.get_ylim()[1] * 2.5)     # room for the value labels above the bars
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return None


def _short(value: float) -> str:
    return f"{value:.0f}" if value >= 100 else f"{value:.3g}"


def _color(framework: str) -> str:
    """The same colour for a framework in both panels."""
    names = list(FRAMEWORKS)
    return f"C{names.index(framework) if framework in names else len(names)}"


def _offsets(count: int) -> tuple[list[float], float]:
    width = 0.8 / max(count, 1)
    return [(i - (count - 1) / 2) * width for i in range(count)], width


def _grouped_bars(axes, workloads: list[str], frameworks: list[str], values: dict[str, dict[str, float]]) -> None:
    offsets, width = _offsets(len(frameworks))
    for offset, framework in zip(offsets, frameworks):
        xs = [i + offset for i, w in enumerate(workloads) if framework in values.get(w, {})]
        ys = [values[w][framework] for w in workloads if framework in values.get(w, {})]
        bars = axes.bar(xs, ys, width, label=LABELS.get(framework, framework), color=_color(framework))
        axes.bar_label(bars, fmt=_short, fontsize=7, rotation=90, padding=2)
    axes.set_xticks(range(len(workloads)), [STEP_WORKLOADS[w].title if w in STEP_WORKLOADS else w for w in workloads])
    axes.legend(fontsize=8)


def _target_marks(axes, workloads: list[str], peers: list[str]) -> None:
    offsets, width = _offsets(len(peers))
    for offset, peer in zip(offsets, peers):
        for i, workload in enumerate(workloads):
            target = ratio_target(workload, peer)
            if target:
                x = i + offset
                axes.plot([x - width / 2, x + width / 2], [target.minimum] * 2, color="red", linewidth=2)
