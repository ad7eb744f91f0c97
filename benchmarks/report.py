"""Merge a run's pytest-benchmark JSON files into bench.json, bench.md and bench.png.

    python -m benchmarks.report benchmarks/results/raw/*.json     # re-render without re-running

What the raw files do not say (the machine's load, the environment, the code measured) comes from
results/run.json, which run_bench writes; without it the run's load is unknown and no target is
judged.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from benchmarks.chart import write_chart
from benchmarks.report_md import RunInfo, render_markdown, run_info_from_json
from benchmarks.summary import samples_from_run, summarize
from benchmarks.targets import evaluate


def machine_of(run: dict[str, Any]) -> str:
    cpu = run.get("machine_info", {}).get("cpu", {})
    brand = cpu.get("brand_raw") or run.get("machine_info", {}).get("processor", "")
    count = cpu.get("count")
    return f"{brand} ({count} CPUs)" if brand and count else brand


def write_report(runs: dict[str, dict[str, Any]], out_dir: Path, info: RunInfo | None = None) -> tuple[str, list[str]]:
    """Write the three outputs from {file name: pytest-benchmark JSON}; return (Markdown, notes)."""
    info = info or RunInfo()
    first = next(iter(runs.values()), {})
    info.date = info.date or str(first.get("datetime", ""))[:16].replace("T", " ")
    info.machine = info.machine or machine_of(first)
    summary = summarize([s for run in runs.values() for s in samples_from_run(run)])
    markdown = render_markdown(summary, info)

    out_dir.mkdir(parents=True, exist_ok=True)
    merged = {"run": asdict(info), "busy_machine": info.busy, "targets_judged": info.busy is False,
              "summary": summary.to_json(),
              "targets": [{**asdict(c), "mark": c.mark} for c in evaluate(summary, info.busy)], "raw": runs}
    (out_dir / "bench.json").write_text(json.dumps(merged, indent=1, sort_keys=False))
    (out_dir / "bench.md").write_text(markdown)
    notes = [f"wrote {out_dir / 'bench.json'} and {out_dir / 'bench.md'}"]
    why_not = write_chart(summary, out_dir / "bench.png")
    notes.append(why_not or f"wrote {out_dir / 'bench.png'}")
    return markdown, notes


def load_runs(paths: list[Path]) -> dict[str, dict[str, Any]]:
    return {p.name: json.loads(p.read_text()) for p in paths if p.stat().st_size > 0}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", nargs="+", type=Path, help="pytest-benchmark --benchmark-json files")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("--run-info", type=Path, help="the run's run.json (default: OUT/run.json if there)")
    args = parser.parse_args(argv)
    run_info = args.run_info or args.out / "run.json"
    info = run_info_from_json(json.loads(run_info.read_text())) if run_info.exists() else RunInfo()
    markdown, notes = write_report(load_runs(args.json), args.out, info)
    print(markdown)
    print("\n".join(notes))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
