"""A cost model of data-parallel training beyond one machine (issue 17): ring all-reduce of gradient
buckets, overlapped with the backward pass, on p GPUs.  See docs/scaling.md for the model, its
assumptions and its limits.

    python -m benchmarks.scaling_model                      # the table, as text
    python -m benchmarks.scaling_model --markdown           # the table of docs/scaling.md
    python -m benchmarks.scaling_model --plot docs/scaling.png

* Ring all-reduce of S bytes over p ranks (Patarasuk & Yuan 2009; Thakur, Rabenseifner & Gropp
  2005): a reduce-scatter then an all-gather, 2(p-1) steps of S/p bytes each:
  t = 2(p-1) alpha + 2(p-1)/p * S / beta.
* Buckets: the gradients, in the order the backward pass produces them, grouped into buckets of at
  most `bucket_bytes` (a gradient larger than that is a bucket of its own).  A bucket's all-reduce
  may start when its last gradient is produced; the link runs one all-reduce at a time, in order.
* Step time = forward + max(end of the backward pass, end of the last all-reduce) + update.

Only the standard library is needed (no torch, no NumPy); the per-model tables come from flowc's
traced graphs (benchmarks/scaling_extract.py), which imports flowc.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Sequence

from benchmarks.scaling_extract import ModelTable

# ------------------------------------------------------------------------------------------ assumptions

MB = 1_000_000
DEFAULT_BUCKET_BYTES = 25 * MB        # PyTorch DDP's bucket_cap_mb (25 MiB there; 25 MB here)
OTHER_BUCKET_BYTES = 100 * MB         # the one other value the docs show
GPUS = (8, 64, 512)
LINKS_GBIT = (100, 400)               # each GPU's own network link, Gbit/s
DEFAULT_ALPHA = 5e-6                  # s per ring step: an InfiniBand/RoCE hop plus NCCL's per-step overhead

# H100 SXM5 dense BF16 Tensor Core peak, 989.4 TFLOP/s (NVIDIA H100 datasheet; 1979 is with sparsity),
# and its HBM3 bandwidth, 3.35 TB/s.
H100_PEAK_FLOPS = 989.4e12
H100_HBM_BYTES_PER_S = 3.35e12
A100_PEAK_FLOPS = 312e12              # A100 dense BF16/FP16 Tensor Core peak (NVIDIA A100 datasheet)

# The achieved fraction of the peak is taken from NVIDIA's published single-GPU training throughputs
# on an A100 80GB with mixed precision (NVIDIA/DeepLearningExamples):
#   ResNet-50 v1.5: 2470 images/s (PyTorch/Classification/ConvNets/resnet50v1.5/README.md, 1 GPU, AMP);
#   BERT-large pretraining at sequence length 128: 694 sequences/s
#   (PaddlePaddle/LanguageModeling/BERT/README.md, 1 GPU, mixed precision).
# times our traced FLOPs per sample, over the A100 peak (`achieved_fraction`); BERT-base is assumed to
# reach BERT-large's fraction.  The same fraction of an H100's peak is the compute rate modelled.
PUBLISHED_A100 = {"ResNet-50": ("ResNet-50", 2470.0), "BERT-base": ("BERT-large", 694.0)}


def achieved_fraction(samples_per_s: float, flops_per_sample: float, peak_flops: float = A100_PEAK_FLOPS) -> float:
    """The fraction of `peak_flops` a published throughput achieves.

    Example:
        achieved_fraction(2470, 24.3e9)       # ResNet-50 on an A100: about 0.19
    """
    return samples_per_s * flops_per_sample / peak_flops


def ring_allreduce_seconds(nbytes: float, p: int, alpha: float, beta: float) -> float:
    """Time of a ring all-reduce of `nbytes` over `p` ranks, `alpha` s per step, `beta` bytes/s per link.

    Example:
        ring_allreduce_seconds(25e6, 8, 5e-6, 12.5e9)     # 14 * 5 us + 1.75 * 2 ms = 3.57 ms
    """
    if p < 1:
        raise ValueError(f"p: expected at least 1 rank, got {p}")
    if p == 1:
        return 0.0
    return 2 * (p - 1) * alpha + 2 * (p - 1) / p * nbytes / beta


def gbit_to_bytes_per_s(gbit: float) -> float:
    return gbit * 1e9 / 8


# ------------------------------------------------------------------------------------------ buckets

@dataclass(frozen=True)
class Bucket:
    nbytes: int
    last: int          # index (in production order) of its last gradient: it is ready when that one is


def make_buckets(sizes: Sequence[int], bucket_bytes: int) -> list[Bucket]:
    """Gradients (their byte sizes, in production order) grouped in order into buckets of at most
    `bucket_bytes`; a gradient larger than `bucket_bytes` is a bucket of its own.

    Example:
        make_buckets([10, 10, 10, 30, 5], 25)   # [Bucket(20, 1), Bucket(10, 2), Bucket(30, 3), Bucket(5, 4)]
    """
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes: expected a positive size, got {bucket_bytes}")
    buckets: list[Bucket] = []
    current, count = 0, 0
    for i, size in enumerate(sizes):
        if count and current + size > bucket_bytes:
            buckets.append(Bucket(current, i - 1))
            current, count = 0, 0
        current, count = current + size, count + 1
    if count:
        buckets.append(Bucket(current, len(sizes) - 1))
    return buckets


def predict_comm_seconds(bucket_sizes: Sequence[float], p: int, alpha: float, beta: float) -> float:
    """The link time of one step's all-reduces (one after another) of buckets of these sizes on p ranks.

    Example:
        predict_comm_seconds([25e6, 25e6, 2e6], 2, alpha=2e-6, beta=5e9)
    """
    return sum(ring_allreduce_seconds(s, p, alpha, beta) for s in bucket_sizes)


# ------------------------------------------------------------------------------------------ simulation

@dataclass(frozen=True)
class Timeline:
    """When each bucket is ready and when its all-reduce starts and ends, from the backward's start."""
    ready: tuple[float, ...]
    start: tuple[float, ...]
    end: tuple[float, ...]


def simulate_overlap(ready: Sequence[float], durations: Sequence[float], overlap: bool = True,
                     backward_end: float = 0.0) -> Timeline:
    """The FIFO link: bucket k's all-reduce starts at max(its ready time, the end of bucket k-1's);
    without overlap every all-reduce waits for the end of the backward pass.

    Example:
        simulate_overlap([1.0, 2.0], [1.5, 1.0]).end       # (2.5, 3.5)
    """
    if len(ready) != len(durations):
        raise ValueError(f"ready and durations: {len(ready)} and {len(durations)} buckets")
    free, starts, ends = 0.0, [], []
    for r, d in zip(ready, durations):
        s = max(r if overlap else backward_end, free)
        starts.append(s)
        free = s + d
        ends.append(free)
    return Timeline(tuple(ready), tuple(starts), tuple(ends))


@dataclass(frozen=True)
class MeasuredTimes:
    """Measured single-rank times of one step's phases, in seconds (for `predict_step`)."""
    forward: float
    backward: float
    update: float


def split_step(table: ModelTable, step_seconds: float, update_seconds: float = 0.0) -> MeasuredTimes:
    """A measured single-rank step time split into phases: the update's own time (if measured) off
    the top, the rest between forward and backward in proportion to their FLOPs.

    Example:
        table = model_table_of_job(train, samples=100)
        predict_step(table, 2, alpha, beta, split_step(table, step_seconds=0.004)).step
    """
    if update_seconds > step_seconds:
        raise ValueError(f"update_seconds: {update_seconds} is more than the step's {step_seconds}")
    flops = table.forward_flops + table.backward_flops
    if flops == 0:
        raise ValueError(f"{table.name}: the table counts no FLOPs to split the step by")
    rest = step_seconds - update_seconds
    return MeasuredTimes(rest * table.forward_flops / flops, rest * table.backward_flops / flops, update_seconds)


@dataclass(frozen=True)
class StepPrediction:
    p: int
    forward: float
    backward: float
    update: float
    comm: float                # link busy time: the sum of the buckets' all-reduces
    exposed: float             # communication not hidden behind the backward pass
    buckets: int
    timeline: Timeline

    @property
    def step(self) -> float:
        return self.forward + self.backward + self.exposed + self.update

    @property
    def compute(self) -> float:
        return self.forward + self.backward + self.update


def phase_times(table: ModelTable, seconds_per_flop: float,
                update_bytes_per_s: float = H100_HBM_BYTES_PER_S) -> MeasuredTimes:
    """Modelled single-GPU phase times: FLOPs at `seconds_per_flop`, the update at memory bandwidth."""
    return MeasuredTimes(table.forward_flops * seconds_per_flop, table.backward_flops * seconds_per_flop,
                         table.update_bytes / update_bytes_per_s)


def predict_step(table: ModelTable, p: int, alpha: float, beta: float, times: MeasuredTimes | float,
                 bucket_bytes: int = DEFAULT_BUCKET_BYTES, overlap: bool = True) -> StepPrediction:
    """One data-parallel step of `table` on `p` ranks.  `times` is either the compute rate (seconds
    per FLOP) or measured single-rank phase times (`MeasuredTimes`), whose backward time is spread
    over the gradients in proportion to their backward FLOPs (evenly when the table counts none).

    Example:
        pred = predict_step(table, 2, alpha=2e-6, beta=5e9, times=MeasuredTimes(0.010, 0.020, 0.002))
        pred.step, pred.exposed
    """
    if not isinstance(times, MeasuredTimes):
        times = phase_times(table, times)
    total_flops = table.backward_flops
    cumulative, done = [], 0
    for i, g in enumerate(table.gradients):
        done += g.backward_flops
        cumulative.append(done / total_flops if total_flops else (i + 1) / len(table.gradients))
    buckets = make_buckets([g.nbytes for g in table.gradients], bucket_bytes)
    ready = [times.backward * cumulative[b.last] for b in buckets]
    durations = [ring_allreduce_seconds(b.nbytes, p, alpha, beta) for b in buckets]
    line = simulate_overlap(ready, durations, overlap, backward_end=times.backward)
    last_end = line.end[-1] if line.end else 0.0
    exposed = max(0.0, last_end - times.backward)
    return StepPrediction(p, times.forward, times.backward, times.update, sum(durations), exposed, len(buckets),
                          line)


# ------------------------------------------------------------------------------------------ the study

@dataclass(frozen=True)
class Row:
    model: str
    p: int
    gbit: int
    overlapped: StepPrediction
    serial: StepPrediction      # the all-reduces after the backward pass
    other_bucket: StepPrediction
    single: float               # the step on one GPU (no communication)
    samples: int

    @property
    def efficiency(self) -> float:
        return self.single / self.overlapped.step

    @property
    def serial_efficiency(self) -> float:
        return self.single / self.serial.step

    @property
    def other_efficiency(self) -> float:
        return self.single / self.other_bucket.step

    @property
    def throughput(self) -> float:
        return self.p * self.samples / self.overlapped.step


@dataclass(frozen=True)
class Study:
    """The assumptions every row of the table is computed under."""
    peak_flops: float = H100_PEAK_FLOPS
    alpha: float = DEFAULT_ALPHA
    bucket_bytes: int = DEFAULT_BUCKET_BYTES
    other_bucket_bytes: int = OTHER_BUCKET_BYTES


def fractions(tables: dict[str, ModelTable]) -> dict[str, float]:
    """Each studied model's achieved fraction of peak, from PUBLISHED_A100 and the traced FLOPs."""
    out = {}
    for model, (measured, rate) in PUBLISHED_A100.items():
        t = tables[measured]
        out[model] = achieved_fraction(rate, (t.forward_flops + t.backward_flops) / t.samples)
    return out


def study_rows(tables: dict[str, ModelTable], study: Study = Study(), gpus: Sequence[int] = GPUS,
               links: Sequence[int] = LINKS_GBIT) -> list[Row]:
    """The table: every studied model x GPU count x link speed."""
    rows = []
    for model, fraction in fractions(tables).items():
        table = tables[model]
        rate = 1.0 / (fraction * study.peak_flops)
        single = predict_step(table, 1, study.alpha, 1.0, rate, study.bucket_bytes).step
        for p in gpus:
            for gbit in links:
                beta = gbit_to_bytes_per_s(gbit)
                rows.append(Row(model, p, gbit, predict_step(table, p, study.alpha, beta, rate, study.bucket_bytes),
                                predict_step(table, p, study.alpha, beta, rate, study.bucket_bytes, overlap=False),
                                predict_step(table, p, study.alpha, beta, rate, study.other_bucket_bytes),
                                single, table.samples))
    return rows


def studied_tables() -> dict[str, ModelTable]:
    """The traced tables the study needs: the studied models and the ones their fractions come from."""
    from benchmarks.scaling_extract import zoo_table
    names = dict.fromkeys(list(PUBLISHED_A100) + [m for m, _ in PUBLISHED_A100.values()])
    return {name: zoo_table(name) for name in names}


def main(argv: Sequence[str] | None = None) -> int:
    from benchmarks import scaling_report
    parser = argparse.ArgumentParser(description="Predicted data-parallel scaling of ResNet-50 and BERT-base.")
    parser.add_argument("--markdown", action="store_true", help="print the table of docs/scaling.md")
    parser.add_argument("--plot", metavar="PNG", help="write the efficiency-vs-GPUs plot to PNG")
    args = parser.parse_args(argv)
    tables = studied_tables()
    if args.plot:
        scaling_report.plot(tables, Study(), args.plot)
        print(f"wrote {args.plot}")
        return 0
    print(scaling_report.markdown(tables, Study()) if args.markdown else scaling_report.text(tables, Study()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
