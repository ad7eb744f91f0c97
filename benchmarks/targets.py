"""The performance targets of issue 7, checked against a run's summary."""
from __future__ import annotations

from dataclasses import dataclass

from benchmarks.peers import LABELS
from benchmarks.summary import REFERENCE_FRAMEWORK, Summary
from benchmarks.workloads import STEP_WORKLOADS


@dataclass(frozen=True)
class RatioTarget:
    workload: str
    peer: str
    minimum: float      # flowc steps/s over the peer's


@dataclass(frozen=True)
class Check:
    target: str
    measured: str       # "n/a (...)" when the run could not measure it
    met: bool | None    # None: not measured


RATIO_TARGETS = (
    RatioTarget("mlp_train", "torch_eager", 1.4),
    RatioTarget("mlp_predict", "torch_eager", 1.3),
    RatioTarget("lenet_train", "torch_eager", 1.1),
    RatioTarget("lenet_predict", "torch_compile", 1.1),
)
ROOFLINE_TARGETS = {"mlp_train": 0.80}                         # share of the sgemm ceiling
COLD_FIRST_CALL_TARGETS = {"mlp_train": 0.5, "lenet_train": 1.5}  # seconds, empty cache
MARK = {True: "✓", False: "✗", None: "–"}


def ratio_target(workload: str, peer: str) -> RatioTarget | None:
    return next((t for t in RATIO_TARGETS if t.workload == workload and t.peer == peer), None)


def evaluate(summary: Summary) -> list[Check]:
    checks = [_ratio_check(summary, t) for t in RATIO_TARGETS]
    checks += [_roofline_check(summary, w, share) for w, share in ROOFLINE_TARGETS.items()]
    checks += [_first_call_check(summary, w, s) for w, s in COLD_FIRST_CALL_TARGETS.items()]
    checks += [_compilations_check(summary)]
    return checks


def _ratio_check(summary: Summary, target: RatioTarget) -> Check:
    text = f"{STEP_WORKLOADS[target.workload].title} ≥ {target.minimum:g}× {LABELS[target.peer]}"
    ratio = summary.ratios.get(target.workload, {}).get(target.peer)
    if ratio is None:
        return Check(text, "n/a (not measured)", None)
    return Check(text, f"{ratio:.2f}×", ratio >= target.minimum)


def _roofline_check(summary: Summary, workload: str, share: float) -> Check:
    gflop = summary.gflop_per_step.get(workload, 0.0)
    text = f"{STEP_WORKLOADS[workload].title} ≥ {share:.0%} of the sgemm ceiling ({gflop:.3f} GFLOP per step)"
    achieved = summary.gflops.get(workload, {}).get(REFERENCE_FRAMEWORK)
    ceiling = summary.ceiling
    if achieved is None or ceiling is None:
        return Check(text, "n/a (not measured)", None)
    measured = achieved / ceiling[1]
    return Check(text, f"{measured:.0%} ({achieved:.0f} of {ceiling[1]:.0f} GFLOP/s)", measured >= share)


def _first_call_check(summary: Summary, workload: str, limit: float) -> Check:
    text = f"first call of the {STEP_WORKLOADS[workload].title} job, cold cache ≤ {limit:g} s"
    seconds = summary.first_call.get(workload, {}).get("cold", {}).get(REFERENCE_FRAMEWORK)
    if seconds is None:
        return Check(text, "n/a (not measured)", None)
    return Check(text, f"{seconds:.2f} s", seconds <= limit)


def _compilations_check(summary: Summary) -> Check:
    text = "compilations in a process started after the cache was filled = 0"
    counts = [per[REFERENCE_FRAMEWORK] for per in summary.warm_compilations.values() if REFERENCE_FRAMEWORK in per]
    if not counts:
        return Check(text, "n/a (not measured)", None)
    return Check(text, str(max(counts)), max(counts) == 0)
