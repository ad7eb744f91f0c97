"""`flowc cache info | list | clear`: where the compile cache is, what it holds; empty it."""
from __future__ import annotations

import argparse


def add_parser(sub) -> None:
    p = sub.add_parser("cache", help="the compile cache: where it is, what is in it; empty it",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="The content-addressed compile cache ($FLOWC_CACHE_DIR, else ~/.cache/flowc).",
                       epilog="examples:\n  flowc cache info\n  flowc cache list\n  flowc cache clear\n"
                              "  flowc cache info --core")
    p.add_argument("action", choices=["info", "list", "clear"])
    p.add_argument("--cache-dir", help="the cache folder (default: $FLOWC_CACHE_DIR or ~/.cache/flowc)")
    p.add_argument("--core", action="store_true", help="the core library's cache instead (GEMM kernel and "
                   "precompiled prelude, built once per machine: $FLOWC_CORE_DIR or ~/.cache/flowc-core)")


def run(args: argparse.Namespace) -> int:
    from flowc.compiler.cache import KernelCache, default_cache
    from flowc.cli.compile_command import use_cache_dir
    from flowc.compiler.core_library import core_dir
    use_cache_dir(args.cache_dir)
    cache = KernelCache(core_dir()) if args.core else default_cache()
    if args.action == "info":
        for key, value in cache.info().items():
            print(f"{key}: {value}")
    elif args.action == "list":
        entries = cache.entries()
        for e in entries:
            print(f"{e.key[:16]}  {e.name:<24} {e.size:>10} B  {e.age / 3600:8.1f} h old  {e.source}")
        print(f"{len(entries)} entries, {sum(e.size for e in entries)} B in {cache.root}")
    else:
        print(f"removed {cache.clear()} entries from {cache.root}")
    return 0
