"""A progress line for long compiles, on a terminal.

A model's step takes seconds to compile; a program that stays silent that long looks hung.  When a
build in parallel parts (compiler/toolchain.py) is still running after `SHOW_AFTER_S`, and stderr is a
terminal, one line shows how many parts are done and the time so far, rewritten in place, and ends
with the total:

    flowc: compiling 'bert_train': 1/2 parts done, 3.1 s
    flowc: compiled 'bert_train' in 2 parts, 5.4 s

Nothing is printed when stderr is not a terminal (logs and tests), nor for builds faster than that.

    progress = CompileProgress("bert_train", parts=2)
    progress.update(done=1)
    progress.finish()
"""
from __future__ import annotations

import contextvars
import sys
import time
from typing import TextIO

SHOW_AFTER_S = 2.0

# What the build under way in this thread compiles (set by cached_build.build_cached): the job's name.
building: contextvars.ContextVar[str] = contextvars.ContextVar("flowc_building", default="a step")


class CompileProgress:
    """The progress line of one build of `parts` translation units (see the module docstring)."""

    def __init__(self, label: str, parts: int, stream: TextIO | None = None) -> None:
        self.label, self.parts = label, parts
        self.stream = stream if stream is not None else sys.stderr
        self.start = time.perf_counter()
        self.shown = False
        self._last: tuple[int, int] | None = None

    def _live(self) -> bool:
        isatty = getattr(self.stream, "isatty", None)
        return bool(isatty and isatty())

    def update(self, done: int) -> None:
        """`done` of the parts have finished; show the line once the build has taken long enough."""
        elapsed = time.perf_counter() - self.start
        if elapsed < SHOW_AFTER_S or not self._live():
            return
        if (done, int(elapsed * 2)) == self._last:      # redrawn when a part ends, else twice a second
            return
        self._last = (done, int(elapsed * 2))
        self.stream.write(f"\rflowc: compiling {self.label}: {done}/{self.parts} parts done, {elapsed:.1f} s")
        self.stream.flush()
        self.shown = True

    def finish(self, ok: bool = True) -> None:
        """End the line (if one was shown) with the total time."""
        if not self.shown:
            return
        elapsed = time.perf_counter() - self.start
        verb = "compiled" if ok else "failed to compile"
        self.stream.write(f"\rflowc: {verb} {self.label} in {self.parts} parts, {elapsed:.1f} s\x1b[K\n")
        self.stream.flush()
