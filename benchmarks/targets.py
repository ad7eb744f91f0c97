"""The performance targets, each with the issue that set it, checked against a run's summary.

Issue 19 replaced issue 7's table: its targets are the speed ratios against PyTorch, the shares
of the sgemm ceiling, the MLP predict per-call overhead and the ResNet block; issue 7's first-call
and cache targets still stand and keep their number.  A target is only judged (✓/✗) on a run taken
on an idle machine (benchmarks/machine.py): otherwise it shows what was measured and "not judged".
"""
from __future__ import annotations

from dataclasses import dataclass

from benchmarks.peers import LABELS
from benchmarks.summary import REFERENCE_FRAMEWORK, Summary
from benchmarks.workloads import STEP_WORKLOADS

NOT_JUDGED_BUSY = "not judged (busy machine)"
NOT_JUDGED_UNKNOWN = "not judged (machine load unknown)"


@dataclass(frozen=True)
class RatioTarget:
    workload: str
    peer: str
    minimum: float      # flowc steps/s over the peer's
    issue: int = 19


@dataclass(frozen=True)
class CeilingTarget:
    workload: str
    share: float        # of the sgemm ceiling measured in the same run
    issue: int = 19


@dataclass(frozen=True)
class OverheadTarget:
    workload: str
    limit_s: float      # flowc's per-call time outside its kernels (benchmarks/test_bench_overhead.py)
    issue: int = 19


@dataclass(frozen=True)
class FirstCallTarget:
    workload: str
    limit_s: float      # first call in a fresh process, empty cache
    issue: int = 7


@dataclass(frozen=True)
class Check:
    target: str
    measured: str       # "n/a (...)" when the run could not measure it
    met: bool | None    # None: not measured, or not judged
    issue: int = 0
    verdict: str = ""   # what the "met" column says instead of ✓/✗/– ("not judged (busy machine)")

    @property
    def mark(self) -> str:
        return self.verdict or MARK[self.met]


RATIO_TARGETS = (
    RatioTarget("lenet_train", "torch_eager", 1.1),
    RatioTarget("lenet_predict", "torch_eager", 1.2),
    RatioTarget("lenet_predict", "torch_compile", 1.1),
    RatioTarget("mlp_train", "torch_eager", 1.4),
    RatioTarget("resnet_block_train", "torch_eager", 1.1),
    RatioTarget("wide_and_deep_train", "torch_eager", 1.5, issue=15),   # 10^6-row tables, batch 512, sparse updates
    RatioTarget("resnet18_train", "torch_eager", 1.1, issue=15),        # 32x32, batch 32
    RatioTarget("resnet50_predict", "torch_eager", 1.0, issue=15),      # 224x224, batch 1: latency
    RatioTarget("resnet50_predict", "torch_compile", 0.8, issue=15),
    RatioTarget("bert_small_train", "torch_eager", 1.2, issue=15),      # batch 8, seq 128, hidden 256, 4 layers
    RatioTarget("bert_small_train", "torch_compile", 1.0, issue=15),
    RatioTarget("bert_small_predict", "torch_eager", 1.2, issue=15),
)
CEILING_TARGETS = (CeilingTarget("lenet_train", 0.85), CeilingTarget("mlp_predict", 0.95))
OVERHEAD_TARGETS = (OverheadTarget("mlp_predict", 20e-6),)
FIRST_CALL_TARGETS = (FirstCallTarget("mlp_train", 0.5), FirstCallTarget("lenet_train", 1.5))
COMPILATIONS_ISSUE = 7
MARK = {True: "✓", False: "✗", None: "–"}


def ratio_target(workload: str, peer: str) -> RatioTarget | None:
    return next((t for t in RATIO_TARGETS if t.workload == workload and t.peer == peer), None)


def not_judged(busy: bool | None) -> str:
    """The verdict for every target of a run whose machine was busy (True) or not measured (None); "" if idle."""
    return "" if busy is False else NOT_JUDGED_BUSY if busy else NOT_JUDGED_UNKNOWN


def evaluate(summary: Summary, busy: bool | None = False) -> list[Check]:
    """Every target's check; on a busy machine (or an unmeasured one: `busy` None) none is judged.

    Example:
        for check in evaluate(summary, busy=load.busy):
            print(check.target, check.measured, check.mark)
    """
    checks = [_ratio_check(summary, t) for t in RATIO_TARGETS]
    checks += [_ceiling_check(summary, t) for t in CEILING_TARGETS]
    checks += [_overhead_check(summary, t) for t in OVERHEAD_TARGETS]
    checks += [_first_call_check(summary, t) for t in FIRST_CALL_TARGETS]
    checks += [_compilations_check(summary)]
    verdict = not_judged(busy)
    if verdict:
        checks = [Check(c.target, c.measured, None, c.issue, verdict if c.met is not None else "")
                  for c in checks]
    return checks


def _title(workload: str) -> str:
    return STEP_WORKLOADS[workload].title


def _ratio_check(summary: Summary, target: RatioTarget) -> Check:
    text = f"{_title(target.workload)} ≥ {target.minimum:g}× {LABELS[target.peer]}"
    ratio = summary.ratios.get(target.workload, {}).get(target.peer)
    if ratio is None:
        return Check(text, "n/a (not measured)", None, target.issue)
    return Check(text, f"{ratio:.2f}×", ratio >= target.minimum, target.issue)


def _ceiling_check(summary: Summary, target: CeilingTarget) -> Check:
    gflop = summary.gflop_per_step.get(target.workload, STEP_WORKLOADS[target.workload].gflop)
    text = f"{_title(target.workload)} ≥ {target.share:.0%} of the sgemm ceiling ({gflop:.3f} GFLOP per step)"
    achieved = summary.gflops.get(target.workload, {}).get(REFERENCE_FRAMEWORK)
    ceiling = summary.ceiling
    if achieved is None or ceiling is None:
        return Check(text, "n/a (not measured)", None, target.issue)
    measured = achieved / ceiling[1]
    return Check(text, f"{measured:.0%} ({achieved:.0f} of {ceiling[1]:.0f} GFLOP/s)", measured >= target.share,
                 target.issue)


def _overhead_check(summary: Summary, target: OverheadTarget) -> Check:
    text = f"{_title(target.workload)} per-call overhead (call time − kernel time) < {target.limit_s * 1e6:g} µs"
    overhead = summary.overhead.get(target.workload, {}).get(REFERENCE_FRAMEWORK)
    if overhead is None:
        return Check(text, "n/a (not measured)", None, target.issue)
    return Check(text, f"{overhead['overhead_s'] * 1e6:.1f} µs", overhead["overhead_s"] < target.limit_s,
                 target.issue)


def _first_call_check(summary: Summary, target: FirstCallTarget) -> Check:
    text = f"first call of the {_title(target.workload)} job, cold cache ≤ {target.limit_s:g} s"
    seconds = summary.first_call.get(target.workload, {}).get("cold", {}).get(REFERENCE_FRAMEWORK)
    if seconds is None:
        return Check(text, "n/a (not measured)", None, target.issue)
    return Check(text, f"{seconds:.2f} s", seconds <= target.limit_s, target.issue)


def _compilations_check(summary: Summary) -> Check:
    text = "compilations in a process started after the cache was filled = 0"
    counts = [per[REFERENCE_FRAMEWORK] for per in summary.warm_compilations.values() if REFERENCE_FRAMEWORK in per]
    if not counts:
        return Check(text, "n/a (not measured)", None, COMPILATIONS_ISSUE)
    return Check(text, str(max(counts)), max(counts) == 0, COMPILATIONS_ISSUE)
