"""The README's Speed section is generated from a run between two markers; the rest stays as written."""
from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.readme import BEGIN, END, render_section, replace_between_markers, update_readme
from benchmarks.report import write_report
from benchmarks.report_md import RunInfo
from tests.test_bench_busy import busy_load
from tests.test_bench_report import IDLE, RUNS, summary_of_runs

REPO = Path(__file__).resolve().parents[1]
README = f"# flowc\n\nintro\n\n## Speed\n\nhand-written text\n\n{BEGIN}\n\nold run\n\n{END}\n\nafter the run\n"


def test_the_section_between_the_markers_is_replaced_and_the_rest_kept():
    text = replace_between_markers(README, "new run")
    assert "old run" not in text and "new run" in text
    assert text.startswith("# flowc\n\nintro\n\n## Speed\n\nhand-written text\n\n" + BEGIN)
    assert text.endswith(f"new run\n\n{END}\n\nafter the run\n")
    assert replace_between_markers(text, "new run") == text        # idempotent
    with pytest.raises(ValueError, match="markers"):
        replace_between_markers("# no markers\n", "x")
    with pytest.raises(ValueError, match="markers"):
        replace_between_markers(f"{END}\n{BEGIN}\n", "x")


def test_the_repository_readme_has_the_markers_in_order():
    text = (REPO / "README.md").read_text()
    assert text.count(BEGIN) == 1 and text.count(END) == 1
    assert text.index(BEGIN) < text.index(END)
    assert text.index("## Speed") < text.index(BEGIN)


def test_the_section_shows_machine_date_load_and_tables():
    info = RunInfo(date="2026-11-23 15:00", machine="Test CPU (2 CPUs)", threads=2, commit="abc1234", machine_load=IDLE)
    section = render_section(summary_of_runs(), info)
    assert section.startswith("Current run: 2026-11-23 15:00, Test CPU (2 CPUs), code abc1234, 2 threads")
    assert "Load average 0.20 before the run, 1.90 after it, on 2 CPUs" in section
    assert "(idle machine)" in section
    assert "Steps per second (median over rounds):" in section and "## " not in section
    assert "| MLP train | 0.164 | 800 | 250 |" in section
    assert "| 19 | MLP train ≥ 1.4× PyTorch eager | 2.50× | ✓ |" in section
    assert "sgemm ceiling measured in the same run: 172 GFLOP/s" in section


def test_a_busy_run_goes_into_the_readme_without_ticks(tmp_path, monkeypatch):
    monkeypatch.setattr("benchmarks.report.write_chart", lambda summary, path: "no chart in this test")
    write_report(RUNS, tmp_path, RunInfo(threads=2, machine_load=busy_load()))
    readme = tmp_path / "README.md"
    readme.write_text(README)
    update_readme(tmp_path / "bench.json", readme)
    text = readme.read_text()
    assert "**Not an idle machine**" in text and "not judged (busy machine)" in text
    assert "✓" not in text and "old run" not in text
    assert "hand-written text" in text and text.endswith("after the run\n")
    assert "Test CPU (2 CPUs)" in text and "2026-11-21 10:00" in text
