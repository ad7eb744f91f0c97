"""`flowc graph MODULE.py:JOB -o FILE.{dot,svg,png}`: a picture of the job graph and its fused kernels."""
from __future__ import annotations

import argparse
import shutil
import subprocess

from flowc.cli.modules import CliError, jobs_of
from flowc.cli.output import check_output_file, write_output_file

FORMATS = (".dot", ".svg", ".png")
INSTALL_DOT = ("Graphviz's `dot` is not installed: `apt-get install graphviz` (Debian/Ubuntu), "
               "`dnf install graphviz` (Fedora) or `brew install graphviz` (macOS)")
EPILOG = """examples:
  flowc graph train.py:train_job -o train_job.dot
  flowc graph train.py:train_job -o train_job.svg     (needs Graphviz's dot)

Forward nodes are blue, backward orange, update green; each fused kernel is a cluster."""


def add_parser(sub) -> None:
    p = sub.add_parser("graph", help="draw a job's graph (DOT, or SVG/PNG through Graphviz)",
                       formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG,
                       description="Write the lowered job graph with its fused kernels as clusters.")
    p.add_argument("target", metavar="MODULE.py:JOB", help="the module and the job (the job may be left out "
                   "when the module has one)")
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="FILE.dot, FILE.svg or FILE.png")


def run(args: argparse.Namespace) -> int:
    out = check_output_file(args.output, "-o")        # before the seconds of tracing and lowering
    if out.suffix not in FORMATS:
        raise CliError(f"-o {args.output}: the file must end in {', '.join(FORMATS)}")
    jobs = jobs_of(args.target)
    if len(jobs) > 1:
        raise CliError(f"{args.target} has {len(jobs)} jobs ({', '.join(j.name for j in jobs)}); "
                       "name one: MODULE.py:JOB")
    dot_text = jobs[0].lower().as_dot()
    if out.suffix == ".dot":
        write_output_file(out, dot_text, "-o")
        print(f"wrote {out}")
        return 0
    dot = shutil.which("dot")
    if dot is None:
        fallback = out.with_suffix(".dot")
        write_output_file(fallback, dot_text, "-o")
        print(f"{INSTALL_DOT}.\nwrote {fallback} instead; render it later with "
              f"`dot -T{out.suffix[1:]} {fallback} -o {out}`")
        return 1
    proc = subprocess.run([dot, f"-T{out.suffix[1:]}", "-o", str(out)], input=dot_text, text=True,
                          capture_output=True)
    if proc.returncode != 0:
        raise CliError(f"dot failed (exit {proc.returncode}): {proc.stderr.strip()}", code=1)
    print(f"wrote {out}")
    return 0
