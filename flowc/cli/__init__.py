"""The `flowc` command (also `python -m flowc`).

    flowc compile MODULE.py [--job NAME ...]     fill the cache ahead of time
    flowc show MODULE.py[:JOB] --ir | --passes | --code | --memory | --kernels
    flowc graph MODULE.py:JOB -o FILE.{dot,svg,png}
    flowc export MODULE.py:JOB --checkpoint DIR -o OUT/   a predict job as a C library
    flowc cache info | list | clear
    flowc launch -n N [--hosts H1,H2] SCRIPT.py [ARGS...]   run a script in N MPI processes
    flowc --version

Each command lives in its own module with `add_parser(subparsers)` and `run(args) -> exit code`.
Errors the user fixes (no such file, no such job, unknown pass, an output path in a missing folder,
an unusable cache folder, a module that calls `os._exit` while flowc imports it) exit with 2 and
one line.
"""
from __future__ import annotations

import argparse
import os
import sys

from flowc.cli import cache_command, compile_command, export_command, graph_command, launch_command, show_command
from flowc.cli.modules import CliError, ProcessExitRefused, refusing_os_exit

COMMANDS = {"compile": compile_command, "show": show_command, "graph": graph_command, "cache": cache_command,
            "launch": launch_command, "export": export_command}


def build_parser() -> argparse.ArgumentParser:
    from flowc.compiler.cache import package_version
    parser = argparse.ArgumentParser(
        prog="flowc", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="flowc: OneFlow-style job functions compiled to C++.",
        epilog="Run `flowc COMMAND --help` for a command's options and examples.")
    parser.add_argument("--version", action="version", version=f"flowc {package_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMANDS.values():
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    from flowc.compiler.cache import CacheError
    try:
        with refusing_os_exit():
            return COMMANDS[args.command].run(args)
    except ProcessExitRefused as e:          # from a job's body, while it was traced
        print(f"\nflowc {args.command}: error: {e.where()}: the job code called {e}, which would end flowc "
              f"before it finished; a job function must not end the process", file=sys.stderr)
        return 2
    except CacheError as e:                  # an unusable cache folder (--cache-dir, FLOWC_CACHE_DIR)
        print(f"flowc {args.command}: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:                  # `flowc show ... | head`: the reader left; not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except CliError as e:
        if e.details:
            print(e.details, file=sys.stderr)
        print(f"flowc {args.command}: error: {e}", file=sys.stderr)
        return e.code


if __name__ == "__main__":
    sys.exit(main())
