"""The Markdown report of a run: steps/s, GFLOP/s against the sgemm ceiling, flowc/peer ratios,
first-call latency, async vs sync, per-call overhead, and the targets with ✓/✗ (on an idle
machine; a busy one gets "not judged")."""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from benchmarks.machine import MachineLoad, machine_load_from_json
from benchmarks.peers import C_FRAMEWORK, FRAMEWORKS, LABELS
from benchmarks.summary import REFERENCE_FRAMEWORK, Summary
from benchmarks.targets import MARK, evaluate, not_judged, ratio_target
from benchmarks.workloads import BATCH, BERT_ZOO, RESNET_BATCH, RESNET_ZOO, STEP_WORKLOADS, WDL_BATCH

NOT_MEASURED = "–"


@dataclass
class RunInfo:
    """What the tables cannot say by themselves."""
    date: str = ""
    machine: str = ""
    threads: int | None = None
    sgemm_size: int | None = None
    missing: dict[str, str] = field(default_factory=dict)    # framework -> why it did not run
    environment: dict[str, str] = field(default_factory=dict)  # settings every framework ran with
    machine_load: MachineLoad | None = None     # busy or idle: targets are judged on an idle machine only
    commit: str = ""      # the code measured (git describe of the checkout)
    warning: str = ""
    # benchmarks/scaling.py's rows: the train jobs on 1 rank and on 2 MPI ranks of one thread each
    scaling: list[dict[str, Any]] = field(default_factory=list)

    @property
    def busy(self) -> bool | None:
        """True: the machine was busy; False: idle; None: not measured (neither judges targets)."""
        return None if self.machine_load is None else self.machine_load.busy


def run_info_from_json(data: dict[str, Any]) -> RunInfo:
    """The RunInfo that `dataclasses.asdict` wrote (run.json, bench.json's "run")."""
    known = {f.name: data[f.name] for f in fields(RunInfo) if f.name in data}
    known["machine_load"] = machine_load_from_json(data.get("machine_load"))
    return RunInfo(**known)


def _label(framework: str) -> str:
    return LABELS.get(framework, framework)


def _title(workload: str) -> str:
    return STEP_WORKLOADS[workload].title if workload in STEP_WORKLOADS else workload


def _table(header: list[str], rows: list[list[str]], left: int = 1) -> list[str]:
    """A Markdown table; the first `left` columns left-aligned, the rest right-aligned (numbers)."""
    align = [":--"] * left + ["--:"] * (len(header) - left)
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def _rate(value: float | None) -> str:
    if value is None:
        return NOT_MEASURED
    return f"{value:,.0f}" if value >= 100 else f"{value:,.3g}"


def render_markdown(summary: Summary, info: RunInfo | None = None) -> str:
    info = info or RunInfo()
    lines = ["# flowc benchmarks", ""]
    lines += _preamble(summary, info)
    for section in (_steps_section, _gflops_section, _sgemm_section, _ratio_section, _first_call_section,
                    _io_section, _overhead_section, _serve_section, _scaling_section, _targets_section):
        body = section(summary, info)
        if body:
            lines += [""] + body
    return "\n".join(lines) + "\n"


def _preamble(summary: Summary, info: RunInfo) -> list[str]:
    threads = f"{info.threads} threads" if info.threads else "the same threads"
    parts = [f"Batch {BATCH} (ResNet block: {RESNET_BATCH}; Wide&Deep: {WDL_BATCH}, 10^6-row tables; "
             + "; ".join(f"{STEP_WORKLOADS[w].title.split()[0]}: {RESNET_ZOO[m].batch_size} at "
                         f"{RESNET_ZOO[m].image_size}x{RESNET_ZOO[m].image_size}"
                         for w, m in (("resnet18_train", "resnet18"), ("resnet50_predict", "resnet50")))
             + "; BERT small: batch "
             + f"{BERT_ZOO['bert_small'].batch_size} x seq {BERT_ZOO['bert_small'].seq_length}, hidden "
             + f"{BERT_ZOO['bert_small'].hidden_size}, {BERT_ZOO['bert_small'].num_hidden_layers} layers"
             + "), float32, "
             f"{threads} for every framework; "
             f"{summary.rounds} round(s), the frameworks alternating A B A B, each in its own process."]
    if info.machine:
        parts.append(f"Run {info.date} on {info.machine}" + (f", code {info.commit}." if info.commit else "."))
    if info.machine_load:
        parts.append(info.machine_load.describe() + ".")
    if info.environment:
        parts.append("Environment: " + ", ".join(f"`{k}={v}`" for k, v in info.environment.items()) + ".")
    parts.append(f"Measured: {', '.join(_label(f) for f in summary.frameworks) or 'nothing'}.")
    parts += [f"Not measured: {_label(f)} ({why})." for f, why in info.missing.items()]
    lines = [" ".join(parts)]
    verdict = not_judged(info.busy)
    if verdict:
        why = info.machine_load.reason if info.machine_load else "the run recorded no machine load"
        lines += ["", f"**Taken on a {'busy machine' if info.busy else 'machine of unknown load'}** ({why}): "
                  "the ratios below are not comparable with an idle machine's and no target is judged."]
    if info.warning:
        lines += ["", f"**Warning:** {info.warning}"]
    return lines


def _steps_section(summary: Summary, info: RunInfo) -> list[str]:
    if not summary.steps:
        return []
    header = ["workload", "GFLOP/step"] + [_label(f) for f in summary.frameworks]
    rows = []
    for workload, per in summary.steps.items():
        gflop = summary.gflop_per_step.get(workload)
        rows.append([_title(workload), f"{gflop:.3f}" if gflop else NOT_MEASURED]
                    + [_rate(per.get(f)) for f in summary.frameworks])
    return ["## Steps per second (median over rounds)", ""] + _table(header, rows)


def _gflops_section(summary: Summary, info: RunInfo) -> list[str]:
    if not summary.gflops:
        return []
    ceiling = summary.ceiling
    title = "## Achieved GFLOP/s"
    if ceiling:
        title += f" (% of the sgemm ceiling, {ceiling[1]:.0f} GFLOP/s)"
    rows = []
    for workload, per in summary.gflops.items():
        cells = [_title(workload)]
        for f in summary.frameworks:
            value = per.get(f)
            if value is None:
                cells.append(NOT_MEASURED)
            elif ceiling:
                cells.append(f"{value:.1f} ({value / ceiling[1]:.0%})")
            else:
                cells.append(f"{value:.1f}")
        rows.append(cells)
    return [title, ""] + _table(["workload"] + [_label(f) for f in summary.frameworks], rows)


def _sgemm_section(summary: Summary, info: RunInfo) -> list[str]:
    if not summary.sgemm:
        return []
    size = f"{info.sgemm_size}³ " if info.sgemm_size else ""
    rows = [[_label(f) + (" (own GEMM)" if f == REFERENCE_FRAMEWORK else ""), f"{v:.1f}"]
            for f, v in summary.sgemm.items()]
    ceiling = summary.ceiling
    assert ceiling is not None
    return ([f"## sgemm ceiling ({size}float32 product, same run)", ""]
            + _table(["framework", "GFLOP/s"], rows)
            + ["", f"Ceiling: {ceiling[1]:.1f} GFLOP/s ({_label(ceiling[0])})."])


def _ratio_section(summary: Summary, info: RunInfo) -> list[str]:
    peers = [f for f in summary.frameworks if f != REFERENCE_FRAMEWORK]
    if not summary.ratios or not peers:
        return []
    rows = []
    for workload, per in summary.ratios.items():
        cells = [_title(workload)]
        for peer in peers:
            ratio = per.get(peer)
            target = ratio_target(workload, peer)
            if ratio is None:
                cells.append(NOT_MEASURED)
            elif target is None:
                cells.append(f"{ratio:.2f}×")
            elif not_judged(info.busy):
                cells.append(f"{ratio:.2f}× (target ≥ {target.minimum:g}, not judged)")
            else:
                cells.append(f"{ratio:.2f}× (target ≥ {target.minimum:g} {MARK[ratio >= target.minimum]})")
        rows.append(cells)
    return (["## flowc / peer, steps/s (median of the per-round ratios; > 1: flowc faster)", ""]
            + _table(["workload"] + [_label(p) for p in peers], rows))


def _first_call_section(summary: Summary, info: RunInfo) -> list[str]:
    if not summary.first_call:
        return []
    frameworks = [f for f in summary.frameworks
                  if any(f in per for caches in summary.first_call.values() for per in caches.values())]
    rows = []
    for workload, caches in summary.first_call.items():
        for cache, per in caches.items():
            cells = [_title(workload), cache]
            for f in frameworks:
                seconds = per.get(f)
                cells.append(NOT_MEASURED if seconds is None else f"{seconds:.2f}")
            rows.append(cells)
    notes = ["", "Seconds from the first call of a step to its result (trace + compile + run) in a fresh "
             "process; cold: empty compile cache, warm: the cache an earlier process filled "
             "(`flowc compile` fills it the same way). Frameworks without an on-disk cache have no warm row."]
    for workload, per in summary.warm_compilations.items():
        counts = ", ".join(f"{_label(f)} {n}" for f, n in per.items())
        notes += ["", f"Compilations in the warm {_title(workload)} process: {counts}."]
    return (["## First call (seconds, median)", ""]
            + _table(["workload", "cache"] + [_label(f) for f in frameworks], rows, left=2) + notes)


def _io_section(summary: Summary, info: RunInfo) -> list[str]:
    if not summary.io:
        return []
    rows = []
    for framework, per in summary.io.items():
        speedup = per.get("speedup")
        rows.append([_label(framework), _rate(per.get("sync")), _rate(per.get("async")),
                     NOT_MEASURED if speedup is None else f"{speedup:.2f}×"])
    return (["## MLP train with I/O-like host work per step (steps/s)", "",
             "Each step first waits as long as the framework's own step takes (a data loader waiting "
             "on I/O); asynchronous calls overlap that wait with the previous step (ideal: 2×).", ""]
            + _table(["framework", "sync", "async", "async / sync"], rows))


def _overhead_section(summary: Summary, info: RunInfo) -> list[str]:
    if not summary.overhead:
        return []
    rows = []
    for workload, per in summary.overhead.items():
        for framework, figures in per.items():
            call = figures["overhead_s"] + figures["kernel_s"]
            rows.append([_title(workload), _label(framework), f"{call * 1e6:,.1f}", f"{figures['kernel_s'] * 1e6:,.1f}",
                         f"{figures['overhead_s'] * 1e6:,.1f}"])
    return (["## Per-call overhead (µs per call, median over rounds)", "",
             "The step built with per-kernel timers (`FLOWC_PROFILE=1`): mean call time as the caller sees it, "
             "mean time inside the kernels, and the difference (argument checks, binding, the foreign call, "
             "copies out, returning to Python).", ""]
            + _table(["workload", "framework", "call", "kernels", "overhead"], rows, left=2))


def _serve_section(summary: Summary, info: RunInfo) -> list[str]:
    if not summary.serve:
        return []
    order = [C_FRAMEWORK, *FRAMEWORKS]
    frameworks = sorted({f for per in summary.serve.values() for f in per},
                        key=lambda f: (order.index(f) if f in order else len(order), f))
    rows = []
    for framework in frameworks:
        one, hundred = summary.serve.get("b1", {}).get(framework), summary.serve.get("b100", {}).get(framework)
        rows.append([_label(framework), NOT_MEASURED if one is None else f"{one * 1e6:,.0f}",
                     NOT_MEASURED if hundred is None else f"{hundred * 1e3:,.2f}",
                     _rate(None if hundred is None else 100 / hundred)])
    return (["## Serving LeNet predict (median over rounds)", "",
             "The predict job exported by `flowc export` and called from a C program, the same job called "
             "from Python, and PyTorch eager: the latency of one call on one image, and calls of 100 images.", ""]
            + _table(["framework", "batch 1 (µs per call)", "batch 100 (ms per call)", "batch 100 (images/s)"], rows))


def _scaling_section(summary: Summary, info: RunInfo) -> list[str]:
    if not info.scaling:
        return []
    from benchmarks.scaling import BERT_TINY_BATCH, TARGET_SPEEDUP, scaling_table
    return (["## Data-parallel scaling (2 MPI ranks x 1 thread against 1 rank x 1 thread)", "",
             f"The same global batch (MLP and LeNet: {BATCH}; BERT-tiny: {BERT_TINY_BATCH}) on one process and split "
             "over two (`mpiexec -n 2`, consistent view: the gradients are summed inside the compiled step); "
             "the best of the rounds; the last column is the master's time per step waiting for its gradient "
             f"sums. Target: {TARGET_SPEEDUP}x (issue 17). The MLP's line with its hidden layer split over the "
             "ranks by unit (model parallelism: `model_distribute=flow.distribute.split(0)`) has no target: it "
             "shows what keeping that layer's 1.6 MB weight in halves, instead of summing its gradient, gives.", ""]
            + scaling_table(info.scaling, judged=info.busy is False))


def targets_table(summary: Summary, info: RunInfo) -> list[str]:
    """The targets as a Markdown table: issue, target, measured, met (✓/✗, or why not judged)."""
    rows = [[str(c.issue), c.target, c.measured, c.mark] for c in evaluate(summary, info.busy)]
    return _table(["issue", "target", "measured", "met"], rows, left=2)


def _targets_section(summary: Summary, info: RunInfo) -> list[str]:
    return ["## Targets", ""] + targets_table(summary, info)


# The sections the README's Speed section shows (benchmarks/readme.py), before the targets.
README_SECTIONS = (_steps_section, _ratio_section, _first_call_section, _io_section, _overhead_section,
                   _serve_section, _scaling_section)
