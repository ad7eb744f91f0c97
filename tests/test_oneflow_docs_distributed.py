"""OneFlow 0.3's distributed documentation programs (examples/oneflow_docs/distributed/) on 2 MPI ranks.

Each program is launched as its page says, `mpiexec -n 2 python PROGRAM`, for a few steps, and as the
same program on one process (`--devices 1`) fed the same global batches: the master alone prints,
and the losses agree with the one-process run (consistent view: the same logical job; mirrored view:
one process given both ranks' batches in its one entry).  Each launch runs once per test session
(`launched`) and is shared by the tests that read it.
"""
from __future__ import annotations

import importlib.util
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from flowc.compiler.comm_library import mpi_tool

ROOT = Path(__file__).resolve().parent.parent
PROGRAMS = ROOT / "examples" / "oneflow_docs" / "distributed"
STEPS = 3
MPIEXEC = mpi_tool("mpiexec")
INSTALL = "pip install 'flowc[distributed]'"
MPI_MARKS = (pytest.mark.slow,
             pytest.mark.skipif(importlib.util.find_spec("mpi4py") is None, reason=f"no mpi4py ({INSTALL})"),
             pytest.mark.skipif(MPIEXEC is None, reason=f"no mpiexec ({INSTALL})"))


def needs_mpi(test):
    """Slow, and skipped where mpi4py or mpiexec is missing (the README check below needs neither)."""
    for mark in MPI_MARKS:
        test = mark(test)
    return test


DATA_PARALLEL = ["distributed_train", "mirrored_strategy", "consistent_strategy"]
# Placed by layer on devices "0:0" and "0:1": flowc runs every op on every rank's share instead (data
# parallelism, the same logical job) and says so with a warning.
PLACED = ["hybrid_parallelism_lenet"]
# Their models split a layer's weight over the devices: model parallelism (each rank holds its units).
MODEL_PARALLEL = ["hybrid_parallelism_mlp", "mixed_parallel_mlp", "mixed_parallel_lenet"]
ALL = DATA_PARALLEL + PLACED + MODEL_PARALLEL
# Programs whose 2-rank run must equal the one-process run: the data- and model-parallel ones
# (consistent_strategy and mixed_parallel_lenet with their dropout: each rank draws its share of the
# one-process mask).
EXACT = DATA_PARALLEL + MODEL_PARALLEL

_launched: dict[tuple[str, int], subprocess.CompletedProcess] = {}


def launched(program: str, ranks: int, refused: bool = False) -> subprocess.CompletedProcess:
    """`program` run for STEPS steps on `ranks` MPI ranks (1: plain python, --devices 1), once a session;
    it must succeed, or with `refused` fail."""
    if (program, ranks) not in _launched:
        python = [sys.executable, str(PROGRAMS / f"{program}.py"), "--steps", str(STEPS), "--print-every", "1"]
        argv = [*python, "--devices", "1"] if ranks == 1 else [str(MPIEXEC), "-n", str(ranks), *python]
        # one thread per rank on a 2-core machine; no GPU: the "gpu" placements run on the CPU here, as
        # the jobs' collectives do not run on GPUs yet
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), FLOWC_COMM_TIMEOUT="60",
                   CUDA_VISIBLE_DEVICES="")
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env, cwd=PROGRAMS)
        assert (proc.returncode != 0) == refused, \
            f"{program} on {ranks} rank(s): exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-3000:]}"
        _launched[program, ranks] = proc
    return _launched[program, ranks]


def losses(stdout: str) -> list[tuple[int, float]]:
    return [(int(step), float(loss)) for step, loss in re.findall(r"^step (\d+) loss ([0-9.]+)", stdout, re.MULTILINE)]


@needs_mpi
@pytest.mark.parametrize("program", ALL)
def test_the_program_trains_on_two_ranks_and_only_the_master_prints(program):
    seen = losses(launched(program, 2).stdout)
    assert [step for step, _ in seen] == list(range(STEPS)), "one loss line per step, from the master only"
    values = [loss for _, loss in seen]
    assert all(math.isfinite(v) for v in values)
    assert values[-1] < values[0], f"{program} did not learn: {values}"


@needs_mpi
@pytest.mark.parametrize("program", EXACT)
def test_two_ranks_compute_what_one_process_computes_on_the_same_global_batch(program):
    one, two = losses(launched(program, 1).stdout), losses(launched(program, 2).stdout)
    assert len(one) == len(two) == STEPS
    for (step, a), (_, b) in zip(one, two):
        assert b == pytest.approx(a, abs=1e-5), f"{program} step {step}: 1 process {a}, 2 ranks {b}"


@needs_mpi
def test_the_mirrored_job_returns_one_array_per_rank():
    # the program concatenates the per-device list it gets back: 2 entries on 2 ranks, 1 on one process
    assert re.search(r"\(devices: 2\)$", launched("mirrored_strategy", 2).stdout, re.MULTILINE)
    assert re.search(r"\(devices: 1\)$", launched("mirrored_strategy", 1).stdout, re.MULTILINE)


@needs_mpi
def test_the_configuration_before_the_first_job_call_runs_on_every_rank():
    # OneFlow's model: every machine runs the script; only the master goes on past its first job call
    assert launched("distributed_train", 2).stdout.count("distributed config") == 2
    assert launched("distributed_train", 1).stdout.count("distributed config") == 1


@needs_mpi
def test_a_placement_on_device_1_is_said_to_run_as_data_parallelism():
    err = launched("hybrid_parallelism_lenet", 2).stderr
    assert "flow.scope.placement(..., '0:1')" in err and "every rank runs them on its share of the batch" in err


def test_every_distributed_program_is_listed_in_the_readme():
    readme = (ROOT / "examples" / "oneflow_docs" / "README.md").read_text()
    section = readme[readme.index("## Several devices"):]
    listed = set(re.findall(r"^\| `distributed/([a-z_]+)\.py` \|", section, re.MULTILINE))
    assert listed == set(ALL) == {p.stem for p in PROGRAMS.glob("*.py") if p.stem != "run_options"}
