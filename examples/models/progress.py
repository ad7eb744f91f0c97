"""The command line the model examples share: `--config NAME --steps N`, and a one-line progress bar.

    bar = ProgressBar(total=100)
    for step in range(100):
        loss = train_job(*batch)
        bar.update(step + 1, loss=float(loss.mean()))
    bar.finish()

The bar rewrites one line of stderr (at most ten times a second): steps done / total, steps/s over the
steps after the first (the first call traces and compiles, so it is reported on its own), the last
loss.  On a stream that is not a terminal it prints one line per tenth of the run instead.
"""
from __future__ import annotations

import argparse
import sys
import time
from typing import IO, Callable, Sequence


class ProgressBar:
    """`[#####.....] 50/100  12.3 steps/s  loss 4.2100  (first step 3.1 s)` on one rewritten line.

    Example:
        bar = ProgressBar(10)
        for i in range(10):
            bar.update(i + 1, loss=0.5)
        bar.finish()
    """

    WIDTH = 30

    def __init__(self, total: int, stream: IO[str] | None = None, label: str = "train") -> None:
        self.total, self.label = max(int(total), 1), label
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.start = time.perf_counter()
        self.first_done: float | None = None       # when step 1 ended (trace + compile + one step)
        self.done, self.loss = 0, float("nan")
        self._last_draw, self._last_tenth = 0.0, -1

    @property
    def steps_per_second(self) -> float:
        """Steps/s over the steps after the first (nan until two steps are done)."""
        if self.first_done is None or self.done < 2:
            return float("nan")
        return (self.done - 1) / max(time.perf_counter() - self.first_done, 1e-9)

    def update(self, done: int, loss: float | None = None) -> None:
        """Record that `done` steps are finished (and the last loss), redrawing when due."""
        self.done = int(done)
        if loss is not None:
            self.loss = float(loss)
        if self.first_done is None and self.done >= 1:
            self.first_done = time.perf_counter()
        self._draw(force=self.done >= self.total)

    def line(self) -> str:
        """The bar as text."""
        filled = self.WIDTH * min(self.done, self.total) // self.total
        first = "" if self.first_done is None else f"  (first step {self.first_done - self.start:.2f} s)"
        rate = self.steps_per_second
        shown = "--" if rate != rate else f"{rate:.2f}"      # no rate before the second step
        return (f"{self.label} [{'#' * filled}{'.' * (self.WIDTH - filled)}] {self.done}/{self.total}  "
                f"{shown} steps/s  loss {self.loss:.4f}{first}")

    def _draw(self, force: bool = False) -> None:
        now = time.perf_counter()
        if self.tty:
            if force or now - self._last_draw >= 0.1:
                self._last_draw = now
                self.stream.write("\r" + self.line())
                self.stream.flush()
            return
        tenth = 10 * self.done // self.total
        if tenth != self._last_tenth or force:
            self._last_tenth = tenth
            self.stream.write(self.line() + "\n")
            self.stream.flush()

    def finish(self) -> None:
        """Draw the final state and end the line."""
        if self.tty:
            self._draw(force=True)
            self.stream.write("\n")
            self.stream.flush()


def parse_args(description: str, configs: Sequence[str], default_config: str, default_steps: int = 20,
               argv: Sequence[str] | None = None,
               more: Callable[[argparse.ArgumentParser], None] | None = None) -> argparse.Namespace:
    """`--config` (one of `configs`), `--steps`, `--batch-size` (0: the config's), `--seed`, `--save DIR`,
    and what `more` adds to the parser.

    Example:
        args = parse_args("Train BERT", ["tiny", "small", "base"], "tiny", argv=["--steps", "5"])
    """
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--config", choices=list(configs), default=default_config,
                   help=f"model size (default: {default_config})")
    p.add_argument("--steps", type=int, default=default_steps, help=f"train steps (default: {default_steps})")
    p.add_argument("--batch-size", type=int, default=0, help="batch size (default: the config's)")
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic data (default: 0)")
    p.add_argument("--save", metavar="DIR", help="save a OneFlow-format checkpoint to DIR after training")
    if more is not None:
        more(p)
    args = p.parse_args(argv)
    if args.steps < 1:
        p.error("--steps must be at least 1")
    if args.batch_size < 0:
        p.error("--batch-size must be positive (or 0 for the config's)")
    return args


def train_loop(train: Callable[..., object], batches: Sequence[Sequence[object]], args: argparse.Namespace,
               label: str) -> int:
    """Run `args.steps` train steps cycling through `batches` under a progress bar, then save a
    checkpoint to `args.save` when given: the end of every model script's `main`.

    Example:
        return train_loop(train, batches, parse_args("Train BERT", ["tiny"], "tiny"), "bert-tiny")
    """
    import flow
    import numpy as np

    bar = ProgressBar(args.steps, label=label)
    for step in range(args.steps):
        loss = train(*batches[step % len(batches)])
        bar.update(step + 1, loss=float(np.mean(loss)))
    bar.finish()
    if args.save:
        flow.checkpoint.save(args.save)
        print(f"saved to {args.save}")
    return 0
