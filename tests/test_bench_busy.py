"""A benchmark run on a busy machine: measured, reported as busy, and no target judged.

No timing and no peer framework: fake load figures and fake pytest-benchmark files in, the verdicts,
the Markdown and bench.json out.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import machine
from benchmarks.machine import BUSY_SHARE, LoadMonitor, MachineLoad, cpu_busy_seconds, judge
from benchmarks.report import write_report
from benchmarks.report_md import RunInfo, render_markdown, run_info_from_json
from benchmarks.targets import NOT_JUDGED_BUSY, NOT_JUDGED_UNKNOWN, evaluate
from tests.test_bench_report import IDLE, RUNS, summary_of_runs


def busy_load(load_1min: float = 1.8, share: float | None = 0.02) -> MachineLoad:
    busy, reason = judge(2, [load_1min, 1.0, 0.5], share)
    return MachineLoad(cpus=2, measured_cpus=[0, 1], load_before=[load_1min, 1.0, 0.5], load_after=[2.0, 1.2, 0.6],
                       others_share=share, busy=busy, reason=reason)


def test_judge_a_high_load_before_the_run_or_other_work_during_it_makes_the_machine_busy():
    assert judge(2, [1.8, 0.2, 0.1], 0.0)[0] is True          # load 1.8 > 0.5 x 2 CPUs
    assert judge(2, [1.0, 0.2, 0.1], 0.0)[0] is False         # the quiet run: load 1.0 on 2 CPUs
    assert judge(2, [0.2, 0.2, 0.1], BUSY_SHARE + 0.01)[0] is True
    assert judge(2, [0.2, 0.2, 0.1], BUSY_SHARE)[0] is False
    assert judge(2, None, 0.5)[0] is True                     # no load average: /proc/stat alone
    assert judge(2, [0.2, 0.2, 0.1], None)[0] is False        # no /proc/stat: the load average alone
    busy, why = judge(2, None, None)
    assert busy is None and "neither" in why
    assert "1.80 > 1" in judge(2, [1.8, 0.2, 0.1], 0.0)[1]


def test_busy_machine_no_target_is_ticked_in_markdown_or_json(tmp_path, monkeypatch):
    monkeypatch.setattr("benchmarks.report.write_chart", lambda summary, path: "no chart in this test")
    info = RunInfo(threads=2, machine_load=busy_load())
    markdown = render_markdown(summary_of_runs(), info)
    assert "✓" not in markdown and "✗" not in markdown
    assert "**Taken on a busy machine**" in markdown
    assert "| 19 | MLP train ≥ 1.4× PyTorch eager | 2.50× | not judged (busy machine) |" in markdown
    assert "2.50× (target ≥ 1.4, not judged)" in markdown
    assert "| 19 | LeNet train ≥ 1.1× PyTorch eager | n/a (not measured) | – |" in markdown
    assert "Load average 1.80 before the run, 2.00 after it, on 2 CPUs" in markdown

    write_report(RUNS, tmp_path, info)
    merged = json.loads((tmp_path / "bench.json").read_text())
    assert merged["busy_machine"] is True and merged["targets_judged"] is False
    assert merged["run"]["machine_load"]["busy"] is True
    assert not any(t["met"] for t in merged["targets"])
    assert {t["mark"] for t in merged["targets"]} == {NOT_JUDGED_BUSY, "–"}
    assert "✓" not in (tmp_path / "bench.md").read_text()


def test_other_work_during_the_run_alone_marks_it_busy():
    markdown = render_markdown(summary_of_runs(), RunInfo(machine_load=busy_load(load_1min=0.1, share=0.4)))
    assert "✓" not in markdown and NOT_JUDGED_BUSY in markdown
    assert "other work took 40% of CPUs 0,1 during the run (busy machine)" in markdown


def test_unknown_load_judges_nothing_and_an_idle_machine_judges_everything():
    unknown = evaluate(summary_of_runs(), busy=None)
    assert not any(c.met for c in unknown)
    assert NOT_JUDGED_UNKNOWN in {c.mark for c in unknown}
    assert "✓" not in render_markdown(summary_of_runs(), RunInfo())
    idle = evaluate(summary_of_runs(), busy=False)
    assert {c.mark for c in idle} >= {"✓", "✗"}


def test_run_info_survives_the_json_round_trip():
    from dataclasses import asdict
    info = RunInfo(threads=2, machine_load=busy_load(), commit="abc1234-dirty")
    again = run_info_from_json(json.loads(json.dumps(asdict(info))))
    assert again == info and again.busy is True
    assert run_info_from_json({}).busy is None


def test_cpu_busy_seconds_reads_the_busy_fields_of_the_given_cpus(tmp_path):
    stat = tmp_path / "stat"
    #                 user nice system idle iowait irq softirq steal guest guest_nice
    stat.write_text("cpu  900 0 0 9000 0 0 0 0 0 0\n"
                    "cpu0 100 10 20 5000 70 1 2 3 0 0\n"
                    "cpu1 200 0 30 4000 0 0 0 7 0 0\n"
                    "cpu2 999 0 0 0 0 0 0 0 0 0\n"
                    "intr 12345\n")
    hz = machine.os.sysconf("SC_CLK_TCK")
    assert cpu_busy_seconds([0, 1], stat) == pytest.approx((136 + 237) / hz)   # idle and iowait left out
    assert cpu_busy_seconds([3], stat) is None                                # a CPU the file does not list
    assert cpu_busy_seconds([0], tmp_path / "missing") is None


def test_load_monitor_subtracts_the_benchmarks_own_cpu_time(monkeypatch):
    clock = iter([100.0, 110.0, 110.0])             # start, others_share, finish
    busy = iter([50.0, 66.0])                       # CPU seconds of the 2 measured CPUs: 16 s busy in 10 s
    own = iter([3.0, 17.0])                         # the benchmark's processes: 14 s of it
    monkeypatch.setattr(machine.time, "perf_counter", lambda: next(clock))
    monkeypatch.setattr(machine, "cpu_busy_seconds", lambda cpus: next(busy))
    monkeypatch.setattr(machine, "own_cpu_seconds", lambda: next(own))
    monkeypatch.setattr(machine, "load_average", lambda: [0.1, 0.1, 0.1])
    load = LoadMonitor([0, 1]).finish()
    assert load.others_share == pytest.approx(2.0 / 20.0)      # 2 s of others in 2 CPUs x 10 s
    assert load.busy is False and load.measured_cpus == [0, 1]


def test_load_monitor_on_this_machine_gives_a_share_or_none():
    load = LoadMonitor().finish()
    assert load.cpus >= 1
    assert load.others_share is None or 0.0 <= load.others_share <= 1.0
    assert load.busy in (True, False, None) and load.reason


def test_idle_fixture_is_judged():
    assert RunInfo(machine_load=IDLE).busy is False


class FakeMonitor:
    """LoadMonitor with fixed figures: the driver's run without a busy or idle machine to hand."""
    figures = busy_load()

    def __init__(self, cpus=None) -> None:
        self.load_before = self.figures.load_before

    def others_share(self) -> float | None:
        return self.figures.others_share

    def finish(self) -> MachineLoad:
        return MachineLoad(**{k: getattr(self.figures, k) for k in MachineLoad.__dataclass_fields__})


@pytest.mark.parametrize("figures,ticked", [(busy_load(), False), (IDLE, True)])
def test_the_driver_records_the_load_and_judges_only_an_idle_run(tmp_path, monkeypatch, capsys, figures, ticked):
    from benchmarks import run_bench
    from benchmarks.readme import BEGIN, END

    def fake_pytest(command, **_):
        """One framework's process: write the file the report reads (no benchmark runs)."""
        json_path = next(a.split("=", 1)[1] for a in command if a.startswith("--benchmark-json="))
        framework = next(a.split("=", 1)[1] for a in command if a.startswith("--framework="))
        Path(json_path).write_text(json.dumps(RUNS[f"r1-{framework}.json"]))
        return 0

    monkeypatch.setattr(FakeMonitor, "figures", figures)
    monkeypatch.setattr(run_bench, "LoadMonitor", FakeMonitor)
    monkeypatch.setattr(run_bench, "unavailable", lambda framework: None)   # no peer need be installed
    monkeypatch.setattr(run_bench.subprocess, "call", fake_pytest)
    monkeypatch.setattr(run_bench, "REPO", tmp_path)
    monkeypatch.setattr("benchmarks.report.write_chart", lambda summary, path: "no chart in this test")
    (tmp_path / "README.md").write_text(f"## Speed\n\n{BEGIN}\n\nold\n\n{END}\n")
    out = tmp_path / "results"
    assert run_bench.main(["--rounds", "1", "--frameworks", "flowc,torch_eager", "--out", str(out), "--readme",
                           "--no-scaling"]) == 0      # the scaling row would launch real MPI runs
    markdown = (out / "bench.md").read_text()
    readme = (tmp_path / "README.md").read_text()
    run = json.loads((out / "run.json").read_text())
    merged = json.loads((out / "bench.json").read_text())
    assert run["machine_load"]["load_before"] == figures.load_before
    assert set(run["machine_load"]["per_process"]) == {"r1-flowc", "r1-torch_eager"}
    assert merged["targets_judged"] is ticked
    assert ("✓" in markdown) is ticked and ("✓" in readme) is ticked
    assert ("not judged (busy machine)" in markdown) is not ticked
    assert "other work" in capsys.readouterr().out
