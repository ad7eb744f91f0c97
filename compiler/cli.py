"""The `flowc` command.  This first version manages the compile cache; ahead-of-time
compilation and `flowc show` come with the CLI issue.

    flowc --version
    flowc cache info | list | clear
"""
from __future__ import annotations

import argparse
import sys


def _cache_command(args: argparse.Namespace) -> int:
    from compiler.cache import default_cache
    cache = default_cache()
    if args.action == "info":
        for key, value in cache.info().items():
            print(f"{key}: {value}")
    elif args.action == "list":
        for e in cache.entries():
            print(f"{e.key[:16]}  {e.name:<24} {e.size:>10} B  {e.age / 3600:8.1f} h old  {e.source}")
    else:
        print(f"removed {cache.clear()} entries")
    return 0


def main(argv: list[str] | None = None) -> int:
    from compiler.cache import package_version
    parser = argparse.ArgumentParser(prog="flowc", description="flowc: OneFlow-style job functions compiled to C++.")
    parser.add_argument("--version", action="version", version=f"flowc {package_version()}")
    sub = parser.add_subparsers(dest="command")
    cache = sub.add_parser("cache", help="the compile cache: where it is, what is in it; empty it",
                           description="Examples: flowc cache info; flowc cache list; flowc cache clear")
    cache.add_argument("action", choices=["info", "list", "clear"])
    args = parser.parse_args(argv)
    if args.command == "cache":
        return _cache_command(args)
    parser.print_help()
    return 2


if __name__ == "__main__":
    sys.exit(main())
