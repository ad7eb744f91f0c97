"""From pytest-benchmark JSON files to medians and flowc/peer ratios (pure functions, no framework imports).

Each benchmark records who and what it measured in `extra_info` (framework, workload, kind, round,
...), so the files can come from any number of processes and rounds.  Per framework and workload
the summary takes the median over rounds of each round's median; a flowc/peer ratio is the
median over rounds of the ratio within a round, because a round runs the two frameworks one
right after the other and what slows the machine down then slows both.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any, Iterable

from benchmarks.peers import FRAMEWORKS
from benchmarks.workloads import STEP_WORKLOADS

REFERENCE_FRAMEWORK = "flowc"
_WORKLOAD_ORDER = list(STEP_WORKLOADS)
_CACHE_ORDER = ["cold", "warm", "sync", "async", "b1", "b100"]


@dataclass(frozen=True)
class Sample:
    """One benchmark of one framework in one round."""
    framework: str
    workload: str
    kind: str                   # "steps", "sgemm", "first_call", "io", "overhead" or "serve"
    round: int
    median_s: float             # pytest-benchmark's median seconds per timed call
    steps_per_call: int = 1
    gflop_per_step: float | None = None
    variant: str = ""           # "cold" / "warm" (first_call), "sync" / "async" (io), "b1" / "b100" (serve)
    first_call_s: tuple[float, ...] = ()
    compilations: tuple[int | None, ...] = ()
    overhead_s: float | None = None     # "overhead": mean call time minus mean time inside the kernels
    kernel_s: float | None = None       # "overhead": mean time inside the kernels per call

    @property
    def rate(self) -> float:
        """Steps (or products, for sgemm) per second."""
        return self.steps_per_call / self.median_s


def samples_from_run(run: dict[str, Any]) -> list[Sample]:
    """The samples of one pytest-benchmark JSON document; benchmarks without our extra_info are ignored."""
    samples = []
    for bench in run.get("benchmarks", []):
        info = bench.get("extra_info", {})
        if "framework" not in info or "kind" not in info:
            continue
        samples.append(Sample(
            framework=info["framework"], workload=info.get("workload", ""), kind=info["kind"],
            # call_s: a call timed by the program that made it (the exported library's C caller)
            round=int(info.get("round", 0)), median_s=float(info.get("call_s", bench["stats"]["median"])),
            steps_per_call=int(info.get("steps_per_call", 1)), gflop_per_step=info.get("gflop"),
            variant=info.get("variant", ""), first_call_s=tuple(info.get("first_call_s", ())),
            compilations=tuple(info.get("compilations", ())),
            overhead_s=info.get("overhead_s"), kernel_s=info.get("kernel_s")))
    return samples


@dataclass
class Summary:
    frameworks: list[str]                                   # those measured, in FRAMEWORKS order
    rounds: int
    steps: dict[str, dict[str, float]] = field(default_factory=dict)      # workload -> framework -> steps/s
    gflops: dict[str, dict[str, float]] = field(default_factory=dict)     # workload -> framework -> GFLOP/s
    gflop_per_step: dict[str, float] = field(default_factory=dict)
    sgemm: dict[str, float] = field(default_factory=dict)                 # framework -> GFLOP/s
    ratios: dict[str, dict[str, float]] = field(default_factory=dict)     # workload -> peer -> flowc/peer
    first_call: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)  # workload -> cache -> fw -> s
    warm_compilations: dict[str, dict[str, int]] = field(default_factory=dict)       # workload -> fw -> most seen
    io: dict[str, dict[str, float]] = field(default_factory=dict)         # framework -> sync/async/speedup
    overhead: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)  # workload -> fw -> s
    serve: dict[str, dict[str, float]] = field(default_factory=dict)      # "b1"/"b100" -> fw -> s per call

    @property
    def ceiling(self) -> tuple[str, float] | None:
        """(framework, GFLOP/s) of the fastest sgemm measured in the run: the machine's ceiling."""
        if not self.sgemm:
            return None
        best = max(self.sgemm, key=self.sgemm.__getitem__)
        return best, self.sgemm[best]

    def to_json(self) -> dict[str, Any]:
        ceiling = self.ceiling
        return {
            "frameworks": self.frameworks, "rounds": self.rounds,
            "steps_per_s": self.steps, "gflop_per_s": self.gflops, "gflop_per_step": self.gflop_per_step,
            "sgemm_gflop_per_s": self.sgemm,
            "sgemm_ceiling": None if ceiling is None else {"framework": ceiling[0], "gflop_per_s": ceiling[1]},
            "flowc_over_peer": self.ratios, "first_call_s": self.first_call,
            "compilations_after_cache_filled": self.warm_compilations, "async_vs_sync": self.io,
            "per_call_overhead_s": self.overhead, "serve_s_per_call": self.serve,
        }


def _median(values: Iterable[float]) -> float:
    return statistics.median(list(values))


def _rank(items: list[str], name: str) -> tuple[int, str]:
    return (items.index(name), "") if name in items else (len(items), name)


def _report_order(key: tuple[str, str, str]) -> tuple:
    """Workloads in STEP_WORKLOADS order, cold before warm, frameworks in FRAMEWORKS order."""
    workload, variant, framework = key
    return _rank(_WORKLOAD_ORDER, workload), _rank(_CACHE_ORDER, variant), _rank(list(FRAMEWORKS), framework)


def _by(samples: Iterable[Sample], kind: str) -> dict[tuple[str, str, str], dict[int, Sample]]:
    """(workload, variant, framework) -> round -> sample, for one kind, in report order."""
    table: dict[tuple[str, str, str], dict[int, Sample]] = {}
    for s in samples:
        if s.kind == kind:
            table.setdefault((s.workload, s.variant, s.framework), {})[s.round] = s
    return {key: table[key] for key in sorted(table, key=_report_order)}


def _paired_ratio(ours: dict[int, Sample], theirs: dict[int, Sample]) -> float:
    """Median over rounds of ours/theirs (rates); ratio of the medians if no round has both."""
    common = sorted(set(ours) & set(theirs))
    if common:
        return _median(ours[r].rate / theirs[r].rate for r in common)
    return _median(s.rate for s in ours.values()) / _median(s.rate for s in theirs.values())


def summarize(samples: list[Sample]) -> Summary:
    # A framework only the serving row has (the exported library, "flowc_c") gets no column elsewhere.
    present = {s.framework for s in samples if s.kind != "serve"}
    frameworks = [f for f in FRAMEWORKS if f in present] + sorted(present - set(FRAMEWORKS))
    summary = Summary(frameworks=frameworks, rounds=len({s.round for s in samples}))
    _summarize_steps(summary, _by(samples, "steps"))
    for (_, _, framework), rounds in _by(samples, "sgemm").items():
        summary.sgemm[framework] = _median(s.rate * (s.gflop_per_step or 0.0) for s in rounds.values())
    _summarize_first_calls(summary, _by(samples, "first_call"))
    _summarize_io(summary, _by(samples, "io"))
    for (workload, _, framework), rounds in _by(samples, "overhead").items():
        measured = [s for s in rounds.values() if s.overhead_s is not None and s.kernel_s is not None]
        if measured:
            summary.overhead.setdefault(workload, {})[framework] = {
                "overhead_s": _median(s.overhead_s or 0.0 for s in measured),
                "kernel_s": _median(s.kernel_s or 0.0 for s in measured)}
    for (_, variant, framework), rounds in _by(samples, "serve").items():
        summary.serve.setdefault(variant, {})[framework] = _median(s.median_s for s in rounds.values())
    return summary


def _summarize_steps(summary: Summary, table: dict[tuple[str, str, str], dict[int, Sample]]) -> None:
    for (workload, _, framework), rounds in table.items():
        rate = _median(s.rate for s in rounds.values())
        summary.steps.setdefault(workload, {})[framework] = rate
        gflop = next(iter(rounds.values())).gflop_per_step
        if gflop:
            summary.gflop_per_step[workload] = gflop
            summary.gflops.setdefault(workload, {})[framework] = rate * gflop
    for (workload, variant, framework), rounds in table.items():
        ours = table.get((workload, variant, REFERENCE_FRAMEWORK))
        if framework != REFERENCE_FRAMEWORK and ours:
            summary.ratios.setdefault(workload, {})[framework] = _paired_ratio(ours, rounds)


def _summarize_first_calls(summary: Summary, table: dict[tuple[str, str, str], dict[int, Sample]]) -> None:
    for (workload, cache, framework), rounds in table.items():
        seconds = [t for s in rounds.values() for t in s.first_call_s]
        if seconds:
            summary.first_call.setdefault(workload, {}).setdefault(cache, {})[framework] = _median(seconds)
        counts = [c for s in rounds.values() for c in s.compilations if c is not None]
        if cache == "warm" and counts:
            summary.warm_compilations.setdefault(workload, {})[framework] = max(counts)


def _summarize_io(summary: Summary, table: dict[tuple[str, str, str], dict[int, Sample]]) -> None:
    for (workload, variant, framework), rounds in table.items():
        summary.io.setdefault(framework, {})[variant] = _median(s.rate for s in rounds.values())
        if variant == "async" and (workload, "sync", framework) in table:
            summary.io[framework]["speedup"] = _paired_ratio(rounds, table[(workload, "sync", framework)])
