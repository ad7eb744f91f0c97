"""The command line shared by the programs of this folder (not a documentation program itself).

OneFlow's programs hard-code `gpu_device_num(2)` and train for whole epochs.  flowc runs one process
per device, so the device count a program configures must match the launch: `--devices` says it
(2 by default, what the documentation's programs configure; `--devices 1` for a one-process run of
the same program), `--steps` cuts the epoch short and `--print-every` says how often the loss shows.

Example:
    mpiexec -n 2 python consistent_strategy.py --steps 5 --print-every 1
    python consistent_strategy.py --devices 1 --steps 5 --print-every 1     # the same logical job
"""
from __future__ import annotations

import argparse
from typing import NamedTuple

MNIST_BATCHES = 45          # the embedded MNIST sample holds 45 training batches of 100


class RunOptions(NamedTuple):
    devices: int
    steps: int
    print_every: int


def parse(description: str) -> RunOptions:
    """The options of one program: `description` is its docstring's first line, for --help."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--devices", type=int, default=2, help="devices configured (one process each); default 2")
    parser.add_argument("--steps", type=int, default=MNIST_BATCHES,
                        help=f"training steps, at most {MNIST_BATCHES} (one epoch of the sample, the default)")
    parser.add_argument("--print-every", type=int, default=20, help="print the loss every N steps; default 20")
    args = parser.parse_args()
    if args.devices < 1:
        parser.error(f"--devices must be at least 1, got {args.devices}")
    if not 1 <= args.steps <= MNIST_BATCHES:
        parser.error(f"--steps must be in 1..{MNIST_BATCHES}, got {args.steps}")
    if args.print_every < 1:
        parser.error(f"--print-every must be at least 1, got {args.print_every}")
    return RunOptions(args.devices, args.steps, args.print_every)
