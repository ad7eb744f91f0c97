"""The serving row of the benchmark report (benchmarks/serve.py, issue 18): fake pytest-benchmark
entries in, the medians over rounds and the Markdown table out.  The exported library's figures are
its C caller's own median call (`call_s`), not pytest-benchmark's time of the whole program."""
from __future__ import annotations

from typing import Any

from benchmarks.report_md import render_markdown
from benchmarks.summary import samples_from_run, summarize


def entry(framework: str, round_no: int, variant: str, median: float, **extra: Any) -> dict[str, Any]:
    info = {"framework": framework, "workload": "lenet_predict", "kind": "serve", "round": round_no,
            "variant": variant, "steps_per_call": int(variant[1:]), **extra}
    return {"name": "test_serve", "stats": {"median": median}, "extra_info": info}


RUN = {"benchmarks": [
    # the C caller: pytest-benchmark saw a 3 s program run; the calls took 300, 320, 340 us
    entry("flowc_c", 0, "b1", 3.0, call_s=300e-6), entry("flowc_c", 1, "b1", 3.0, call_s=340e-6),
    entry("flowc_c", 2, "b1", 3.0, call_s=320e-6), entry("flowc_c", 0, "b100", 3.0, call_s=7e-3),
    entry("flowc", 0, "b1", 360e-6), entry("flowc", 0, "b100", 7.5e-3),
    entry("torch_eager", 0, "b1", 700e-6), entry("torch_eager", 0, "b100", 20e-3),
    {"name": "test_step", "stats": {"median": 0.01},
     "extra_info": {"framework": "flowc", "workload": "lenet_predict", "kind": "steps", "round": 0, "gflop": 1.0}},
]}


def test_serve_medians_come_from_the_callers_own_timing():
    summary = summarize(samples_from_run(RUN))
    assert summary.serve["b1"] == {"flowc_c": 320e-6, "flowc": 360e-6, "torch_eager": 700e-6}
    assert summary.serve["b100"]["flowc_c"] == 7e-3
    assert "flowc_c" not in summary.frameworks          # no empty column in the other tables
    assert summary.to_json()["serve_s_per_call"]["b100"]["torch_eager"] == 20e-3


def test_serve_table_lists_the_library_the_job_and_pytorch():
    text = render_markdown(summarize(samples_from_run(RUN)))
    section = text[text.index("## Serving LeNet predict"):].split("\n## ")[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and "framework" not in line]
    assert rows == ["| flowc library from C | 320 | 7.00 | 14,286 |",
                    "| flowc | 360 | 7.50 | 13,333 |",
                    "| PyTorch eager | 700 | 20.00 | 5,000 |"]
