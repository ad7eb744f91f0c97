"""`flowc cache info | list | clear`: where the compile cache is, what it holds; empty it."""
from __future__ import annotations

import argparse

from flowc.cli.modules import CliError


def add_parser(sub) -> None:
    p = sub.add_parser("cache", help="the compile cache: where it is, what is in it; empty it",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="The content-addressed compile cache ($FLOWC_CACHE_DIR, else ~/.cache/flowc). "
                                   "`clear` removes only what flowc made, only in a folder flowc marked as its "
                                   "cache, and keeps the entries running processes use.",
                       epilog="examples:\n  flowc cache info\n  flowc cache list\n  flowc cache clear\n"
                              "  flowc cache info --core")
    p.add_argument("action", choices=["info", "list", "clear"])
    p.add_argument("--cache-dir", help="the cache folder (default: $FLOWC_CACHE_DIR or ~/.cache/flowc)")
    p.add_argument("--core", action="store_true", help="the core library's cache instead (GEMM kernel and "
                   "precompiled prelude, built once per machine: $FLOWC_CORE_DIR or ~/.cache/flowc-core)")


def run(args: argparse.Namespace) -> int:
    from flowc.compiler.cache import CacheError, KernelCache, default_cache
    from flowc.cli.compile_command import use_cache_dir
    from flowc.compiler.core_library import core_dir
    use_cache_dir(args.cache_dir)
    cache = KernelCache(core_dir(), setting="FLOWC_CORE_DIR") if args.core else default_cache()
    if args.action == "info":
        for key, value in cache.info().items():
            print(f"{key}: {value}")
    elif args.action == "list":
        entries = cache.entries()
        for e in entries:
            print(f"{e.key[:16]}  {e.name:<24} {e.size:>10} B  {e.age / 3600:8.1f} h old  {e.source}")
        print(f"{len(entries)} entries, {sum(e.size for e in entries)} B in {cache.root}")
    else:
        try:
            cleared = cache.clear()
        except CacheError as e:          # not a flowc cache, or not this user's: nothing was removed
            raise CliError(str(e)) from None
        kept = f"; kept {cleared.in_use} in use by running processes" if cleared.in_use else ""
        print(f"removed {cleared.removed} entries from {cache.root}{kept}")
    return 0
