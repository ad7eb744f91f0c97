"""The benchmark report: fake pytest-benchmark JSON files in, medians, paired ratios and Markdown out.

No timing and no peer framework is involved: this checks the arithmetic and the tables that
`make bench` prints.
"""
from __future__ import annotations

import json
from typing import Any

from benchmarks.machine import MachineLoad
from benchmarks.report import write_report
from benchmarks.report_md import RunInfo, render_markdown
from benchmarks.summary import samples_from_run, summarize
from benchmarks.workloads import STEP_WORKLOADS, mlp_flops, sgemm_gflop

MLP_GFLOP = STEP_WORKLOADS["mlp_train"].gflop
PREDICT_GFLOP = STEP_WORKLOADS["mlp_predict"].gflop
IDLE = MachineLoad(cpus=2, measured_cpus=[0, 1], load_before=[0.2, 0.3, 0.4], load_after=[1.9, 0.9, 0.5],
                   others_share=0.01, busy=False, reason="quiet")


def entry(framework: str, workload: str, kind: str, round_no: int, median: float, **extra: Any) -> dict[str, Any]:
    """One benchmark as pytest-benchmark writes it, tagged the way benchmarks/conftest.py tags it."""
    info = {"framework": framework, "workload": workload, "kind": kind, "round": round_no, **extra}
    return {"name": f"test_{workload}", "stats": {"median": median, "mean": median * 1.1}, "extra_info": info}


def run(*benchmarks: dict[str, Any]) -> dict[str, Any]:
    return {"machine_info": {"cpu": {"brand_raw": "Test CPU", "count": 2}}, "datetime": "2026-11-21T10:00:00",
            "benchmarks": list(benchmarks)}


# Three rounds, A B A B: flowc and PyTorch eager run one after the other in each round.
#   flowc:       1000, 500, 800 steps/s  -> median 800
#   torch_eager:  500, 200, 250 steps/s  -> median 250
#   per-round ratios 2.0, 2.5, 3.2 -> median 2.5 (the ratio of the medians would be 3.2)
RUNS = {
    "r1-flowc.json": run(entry("flowc", "mlp_train", "steps", 0, 1 / 1000, gflop=MLP_GFLOP),
                         entry("flowc", "mlp_predict", "steps", 0, 1 / 1900, gflop=PREDICT_GFLOP),
                         entry("flowc", "mlp_predict", "overhead", 0, 1 / 1900, overhead_s=12e-6, kernel_s=500e-6),
                         entry("flowc", "sgemm", "sgemm", 0, 0.1, gflop=sgemm_gflop()),
                         entry("flowc", "mlp_train", "first_call", 0, 2.0, variant="cold",
                               first_call_s=[0.4], compilations=[1]),
                         entry("flowc", "mlp_train", "first_call", 0, 1.0, variant="warm",
                               first_call_s=[0.1], compilations=[0]),
                         {"name": "test_legacy", "stats": {"median": 1.0}, "extra_info": {}}),
    "r1-torch_eager.json": run(entry("torch_eager", "mlp_train", "steps", 0, 1 / 500, gflop=MLP_GFLOP),
                               entry("torch_eager", "sgemm", "sgemm", 0, 0.2, gflop=sgemm_gflop())),
    "r2-flowc.json": run(entry("flowc", "mlp_train", "steps", 1, 1 / 500, gflop=MLP_GFLOP)),
    "r2-torch_eager.json": run(entry("torch_eager", "mlp_train", "steps", 1, 1 / 200, gflop=MLP_GFLOP)),
    "r3-flowc.json": run(entry("flowc", "mlp_train", "steps", 2, 1 / 800, gflop=MLP_GFLOP)),
    "r3-torch_eager.json": run(entry("torch_eager", "mlp_train", "steps", 2, 1 / 250, gflop=MLP_GFLOP)),
}


def summary_of_runs():
    return summarize([s for r in RUNS.values() for s in samples_from_run(r)])


def test_mlp_train_flop_count_is_the_issues_0164_gflop():
    assert mlp_flops("train") == 2 * 100 * 784 * 512 * 2 + 2 * 100 * 512 * 10 * 3
    assert round(MLP_GFLOP, 3) == 0.164


def test_medians_over_rounds_and_paired_ratios():
    summary = summary_of_runs()
    assert summary.frameworks == ["flowc", "torch_eager"]
    assert summary.rounds == 3
    assert summary.steps["mlp_train"] == {"flowc": 800.0, "torch_eager": 250.0}
    assert abs(summary.ratios["mlp_train"]["torch_eager"] - 2.5) < 1e-9
    assert abs(summary.gflops["mlp_train"]["flowc"] - 800 * MLP_GFLOP) < 1e-9
    ceiling = summary.ceiling
    assert ceiling is not None and ceiling[0] == "flowc"
    assert abs(ceiling[1] - sgemm_gflop() / 0.1) < 1e-9
    assert summary.first_call["mlp_train"]["cold"]["flowc"] == 0.4
    assert summary.warm_compilations["mlp_train"]["flowc"] == 0


def test_markdown_tables_show_medians_ratios_and_targets():
    markdown = render_markdown(summary_of_runs(), RunInfo(threads=2, missing={"jax_jit": "jax is not installed"},
                                                          machine_load=IDLE))
    assert "| MLP train | 0.164 | 800 | 250 |" in markdown
    assert "2.50× (target ≥ 1.4 ✓)" in markdown
    assert "| 19 | MLP train ≥ 1.4× PyTorch eager | 2.50× | ✓ |" in markdown
    # 1900 steps/s x 0.0813 GFLOP = 154 GFLOP/s of a 172 GFLOP/s ceiling: 90% < 95%
    assert ("| 19 | MLP predict ≥ 95% of the sgemm ceiling (0.081 GFLOP per step) | 90% (154 of 172 GFLOP/s) | ✗ |"
            in markdown)
    assert "| 19 | MLP predict per-call overhead (call time − kernel time) < 20 µs | 12.0 µs | ✓ |" in markdown
    assert "| MLP predict | flowc | 512.0 | 500.0 | 12.0 |" in markdown
    assert "| 7 | first call of the MLP train job, cold cache ≤ 0.5 s | 0.40 s | ✓ |" in markdown
    assert "| 7 | compilations in a process started after the cache was filled = 0 | 0 | ✓ |" in markdown
    assert "| 19 | LeNet predict ≥ 1.1× torch.compile | n/a (not measured) | – |" in markdown
    assert "| 19 | ResNet block train ≥ 1.1× PyTorch eager | n/a (not measured) | – |" in markdown
    assert "Not measured: JAX jit (jax is not installed)." in markdown
    assert "Load average 0.20 before the run, 1.90 after it, on 2 CPUs" in markdown
    assert "busy machine" not in markdown


def test_write_report_merges_the_files(tmp_path):
    markdown, notes = write_report(RUNS, tmp_path, RunInfo(threads=2, machine_load=IDLE))
    assert (tmp_path / "bench.md").read_text() == markdown
    merged = json.loads((tmp_path / "bench.json").read_text())
    assert set(merged["raw"]) == set(RUNS)
    assert merged["summary"]["steps_per_s"]["mlp_train"]["flowc"] == 800.0
    assert merged["run"]["machine"] == "Test CPU (2 CPUs)"
    assert merged["busy_machine"] is False and merged["targets_judged"] is True
    assert merged["run"]["machine_load"]["load_before"] == [0.2, 0.3, 0.4]
    assert merged["summary"]["per_call_overhead_s"]["mlp_predict"]["flowc"]["overhead_s"] == 12e-6
    # the chart is optional (matplotlib is in the bench extra): either it was written or the notes say why not
    assert (tmp_path / "bench.png").exists() or any("matplotlib" in n for n in notes)
