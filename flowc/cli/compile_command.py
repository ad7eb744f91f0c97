"""`flowc compile MODULE.py`: trace and build every job of a module so its first run compiles nothing."""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from flowc.cli.modules import CliError, jobs_of
from flowc.cli.output import check_output_folder
from flowc.compiler import settings
from flowc.compiler.backends import backends, device_names, get_backend

EPILOG = """examples:
  flowc compile examples/mlp_train_demo.py             every job in the module
  flowc compile train.py --job train_job -v            one job, with each pass's time and effect
  flowc compile train.py --cache-dir /srv/flowc-cache  fill another cache (FLOWC_CACHE_DIR at run time)

The module is imported with __name__ == its file name, so its `if __name__ == "__main__":` block
(the training loop) does not run."""


def add_parser(sub) -> None:
    p = sub.add_parser("compile", help="compile a module's jobs ahead of time (fills the cache)",
                       formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG,
                       description="Trace, lower and build every @flow.global_function of MODULE.py.")
    p.add_argument("module", metavar="MODULE.py", help="the Python file defining the jobs")
    p.add_argument("--job", action="append", default=[], metavar="NAME", help="only this job (repeatable)")
    p.add_argument("--device", choices=["auto", *device_names()], default="auto",
                   help="target; auto (default) follows the jobs' placement and what this machine has")
    p.add_argument("--arch", metavar="sm_XX", help="GPU architecture to build for (with --device gpu)")
    p.add_argument("--cache-dir", metavar="DIR", help="the cache to fill (default: $FLOWC_CACHE_DIR or ~/.cache/flowc)")
    loud = p.add_mutually_exclusive_group()
    loud.add_argument("-q", "--quiet", action="store_true", help="print nothing but errors")
    loud.add_argument("-v", "--verbose", action="store_true", help="also print every pass and why the cache missed")


def use_cache_dir(folder: str | None) -> None:
    """Point this process's cache at `folder` (the library reads FLOWC_CACHE_DIR)."""
    if folder:
        check_output_folder(Path(folder), "--cache-dir")
        settings.set_cache_dir(folder)


def run(args: argparse.Namespace) -> int:
    from flowc.compiler.cache import default_cache
    from flowc.compiler.toolchain import ToolchainError
    use_cache_dir(args.cache_dir)
    if args.arch and (args.device == "auto" or get_backend(args.device).is_host):
        accelerators = "|".join(b.name for b in backends() if not b.is_host)
        raise CliError(f"--arch needs --device {accelerators}")
    jobs = jobs_of(args.module, args.job)
    say = (lambda *a, **k: None) if args.quiet else print
    start, built = time.perf_counter(), 0
    for job in jobs:
        say(f"{job.name:<24} {job.job_type:<8}", end="", flush=True)
        try:
            # through the job cache, so that processes started later skip the passes too
            compiled = job.compile(device=None if args.device == "auto" else args.device, arch=args.arch)
        except ToolchainError as e:
            say("")
            print(e, file=sys.stderr)
            return 1
        t = compiled.timings
        built += not compiled.from_cache
        lowering = (f"passes {t['passes'] * 1e3:5.0f} ms  codegen {t['codegen'] * 1e3:4.0f} ms" if "passes" in t
                    else f"passes and codegen: job cache {t.get('job_cache', 0) * 1e3:5.0f} ms")
        say(f" trace {t.get('trace', 0) * 1e3:6.0f} ms  {lowering}  compile {t['compile'] * 1e3:6.0f} ms  "
            f"{'cached' if compiled.from_cache else 'compiled'} ({compiled.device})")
        if args.verbose:
            say(compiled.lowered().passes_text())
            say(f"  {compiled.miss_reason or 'cache hit'}; library {compiled.library}")
    say(f"{len(jobs)} job(s) in {time.perf_counter() - start:.2f} s: {built} compiled, "
        f"{len(jobs) - built} already in the cache at {default_cache().root}")
    return 0
