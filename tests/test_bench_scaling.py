"""benchmarks/scaling.py: the data-parallel scaling row of `make bench` (its table, its place in the
report and the README, and one real measurement on 2 MPI ranks in the slow tier)."""
from __future__ import annotations

import argparse
import json

import pytest

from benchmarks import run_bench
from benchmarks.readme import render_section
from benchmarks.report_md import RunInfo, render_markdown, run_info_from_json
from benchmarks.scaling import TARGET_SPEEDUP, find_mpiexec, scaling_rows, scaling_table
from tests.test_bench_report import IDLE, summary_of_runs

ROWS = [{"workload": "mlp_train", "one_rank_steps_per_s": 500.0, "two_ranks_steps_per_s": 900.0, "speedup": 1.8,
         "wait_ms_per_step": 0.12, "target": TARGET_SPEEDUP},
        {"workload": "lenet_train", "one_rank_steps_per_s": 10.0, "two_ranks_steps_per_s": 15.0, "speedup": 1.5,
         "wait_ms_per_step": 3.5, "target": TARGET_SPEEDUP}]


def test_the_table_marks_each_workload_against_the_target():
    lines = scaling_table(ROWS)
    assert lines[0].startswith("| Workload | 1 rank x 1 thread")
    assert "| MLP train | 500.0 | 900.0 | 1.80x | 0.12 | met |" in lines
    assert "| LeNet train | 10.0 | 15.0 | 1.50x | 3.50 | **missed** |" in lines
    assert all(line.endswith("| not judged |") for line in scaling_table(ROWS, judged=False)[2:])


def test_the_model_parallel_line_is_shown_without_a_target_and_left_out_of_the_cost_model():
    from benchmarks.scaling import validation_table
    row = {"workload": "mlp_split_hidden_train", "one_rank_steps_per_s": 1000.0, "two_ranks_steps_per_s": 1500.0,
           "speedup": 1.5, "wait_ms_per_step": 0.06, "target": None}
    line = scaling_table([row])[2]
    assert line == "| MLP train, hidden layer split(0) | 1000.0 | 1500.0 | 1.50x | 0.06 | no target |"
    assert scaling_table([row], judged=False)[2].endswith("| no target |")
    assert len(validation_table([row])) == 2           # the header and its rule: the data-parallel model skips it


def test_the_report_and_the_readme_show_the_row_judged_on_an_idle_machine_only():
    idle = render_markdown(summary_of_runs(), RunInfo(threads=2, machine_load=IDLE, scaling=ROWS))
    assert "## Data-parallel scaling" in idle and "| 1.80x | 0.12 | met |" in idle
    unknown = render_markdown(summary_of_runs(), RunInfo(threads=2, scaling=ROWS))
    assert "| 1.80x | 0.12 | not judged |" in unknown
    assert "Data-parallel scaling" not in render_markdown(summary_of_runs(), RunInfo(threads=2))
    readme = render_section(summary_of_runs(), RunInfo(threads=2, machine_load=IDLE, scaling=ROWS))
    assert "Data-parallel scaling (2 MPI ranks x 1 thread against 1 rank x 1 thread):" in readme


def test_the_rows_survive_run_json():
    info = RunInfo(threads=2, scaling=ROWS)
    from dataclasses import asdict
    assert run_info_from_json(json.loads(json.dumps(asdict(info)))).scaling == ROWS


def test_make_bench_skips_the_row_without_flowc_or_when_told(capsys):
    args = argparse.Namespace(no_scaling=False, rounds=1, step_seconds=0.1)
    assert run_bench.run_scaling(args, ["torch_eager"]) == []
    args.no_scaling = True
    assert run_bench.run_scaling(args, ["flowc"]) == []


@pytest.mark.slow
def test_a_real_row_on_two_ranks():
    pytest.importorskip("mpi4py")
    if find_mpiexec() is None:
        pytest.skip("no mpiexec")
    (row,) = scaling_rows(("mlp_train",), seconds=0.3, rounds=1, progress=lambda _: None)
    assert row["one_rank_steps_per_s"] > 0 and row["two_ranks_steps_per_s"] > 0
    assert row["speedup"] == pytest.approx(row["two_ranks_steps_per_s"] / row["one_rank_steps_per_s"])
    assert row["wait_ms_per_step"] >= 0


def test_the_cost_model_is_set_against_the_measured_rows():
    from benchmarks.scaling import validation_table
    rows = [{"workload": "mlp_train", "one_rank_steps_per_s": 1000.0, "two_ranks_steps_per_s": 1000.0,
             "speedup": 1.0, "wait_ms_per_step": 0.2, "target": TARGET_SPEEDUP}]
    header, rule, line = validation_table(rows, alpha=2e-6, beta=5e9)
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[0] == "MLP train" and cells[1] == "1.00" and cells[2] == "0.50"     # each rank: half the compute
    # the MLP's 407,050 float32 gradients in one bucket: 2 ranks' ring all-reduce = 2 * alpha + bytes / beta
    assert float(cells[3]) == pytest.approx((2 * 2e-6 + 407_050 * 4 / 5e9) * 1e3, abs=0.01)
    assert float(cells[4]) == pytest.approx(float(cells[2]) + float(cells[3]), abs=0.02)
    assert float(cells[7]) == pytest.approx(1.0 / float(cells[4]), abs=0.02)
