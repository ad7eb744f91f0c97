"""`flowc show MODULE.py[:JOB] --ir | --passes | --code | --memory | --kernels`: what the compiler did."""
from __future__ import annotations

import argparse

from flowc.cli.modules import CliError, jobs_of
from flowc.compiler.backends import device_names

EPILOG = """examples:
  flowc show train.py:train_job --passes                the passes, their time and what each changed
  flowc show train.py:train_job --ir --after fuse_epilogues
  flowc show train.py:train_job --kernels              fused groups, and why candidates were not fused
  flowc show train.py:train_job --memory               buffers, offsets, lifetimes, peak bytes
  flowc show train.py --code                           the generated source of every job
  flowc show train.py:train_job --kernels --ranks 2    one rank's share of the job on 2 MPI ranks: its
                                                       all_reduce nodes and where each bucket starts and waits"""


def _ir(lowered, args) -> str:
    if args.after:
        return f"== {lowered.name} after {args.after} ==\n{lowered.as_text(after=args.after)}"
    return "\n\n".join(f"== {lowered.name} after {r.name} ({r.seconds * 1e3:.2f} ms: {r.summary}) ==\n{r.dump}"
                       for r in lowered.passes)


# mode -> what it prints for one lowered job
MODES = {
    "ir": _ir,
    "passes": lambda lowered, args: lowered.passes_text(),
    "kernels": lambda lowered, args: lowered.kernels_text(),
    "memory": lambda lowered, args: str(lowered.memory_plan()),
    "code": lambda lowered, args: lowered.compile(arch=args.arch).source(),
}


def add_parser(sub) -> None:
    p = sub.add_parser("show", help="print the IR per pass, the passes, the code, the memory plan or the kernels",
                       formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG,
                       description="Print one stage of the compilation of a module's jobs.")
    p.add_argument("target", metavar="MODULE.py[:JOB]", help="the module, and optionally one job in it")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--ir", action="store_true", help="the IR after every pass (or only --after PASS)")
    what.add_argument("--passes", action="store_true", help="the passes with their time and what each changed")
    what.add_argument("--code", action="store_true", help="the generated C++ (CUDA with --device gpu)")
    what.add_argument("--memory", action="store_true", help="the memory plan: buffers, offsets, lifetimes, peak")
    what.add_argument("--kernels", action="store_true", help="the kernels, their fused ops, fusion refusals")
    p.add_argument("--after", metavar="PASS", help="with --ir: only the program after this pass")
    p.add_argument("--device", choices=["auto", *device_names()], default="auto", help="target (default: auto)")
    p.add_argument("--arch", metavar="sm_XX", help="GPU architecture for --code with --device gpu")
    p.add_argument("--ranks", type=int, default=1, metavar="N",
                   help="show rank 0's share of the jobs when run on N MPI ranks (default 1: one process; a "
                        "batch that does not divide over N gives rank 0 one example more than the last ranks)")


def run(args: argparse.Namespace) -> int:
    from flowc.compiler.stages import UnknownPassError, pass_names
    mode = next(m for m in MODES if getattr(args, m))
    if args.after and mode != "ir":
        raise CliError("--after goes with --ir")
    if args.after and args.after not in pass_names():
        raise CliError(f"unknown pass {args.after!r}; the passes are: {', '.join(pass_names())}")
    if args.ranks < 1:
        raise CliError(f"--ranks must be 1 or more, got {args.ranks}")
    outputs = []
    jobs = jobs_of(args.target)
    if args.ranks > 1:
        from flowc.runtime.distributed import trace_as_ranks
        from flowc.runtime.session import default_session
        trace_as_ranks(default_session(), args.ranks)
    for job in jobs:
        lowered = job.lower(device=None if args.device == "auto" else args.device)
        try:
            outputs.append(MODES[mode](lowered, args))
        except UnknownPassError as e:
            raise CliError(str(e)) from None
    print("\n\n".join(outputs))
    return 0
