"""The seed programs of OneFlow's "Get results from job function" pages, both API generations,
run as scripts from examples/ the way a user runs them: train, save a checkpoint, then evaluate
from it in a new process."""
from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow      # two training runs in subprocesses, about a minute or more


def run(script: pathlib.Path, cwd: pathlib.Path) -> str:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, str(script)], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, f"{script.name} failed:\n{proc.stderr[-3000:]}"
    return proc.stdout


def accuracy(output: str) -> float:
    match = re.search(r"accuracy: ([0-9.]+)%", output)
    assert match, output
    return float(match.group(1))


@pytest.mark.parametrize("folder, lenet_min, mlp_min", [("seeds", 95.0, 88.0), ("seeds_old_api", 80.0, 88.0)])
def test_seed_programs_train_save_and_evaluate(tmp_path, folder, lenet_min, mlp_min):
    examples = ROOT / "examples" / folder
    lenet_train = run(examples / "synchronize_single_job.py", tmp_path)
    assert (tmp_path / "lenet_models_1" / "snapshot_done").exists()
    losses = [float(line) for line in lenet_train.splitlines() if re.fullmatch(r"[0-9.e+-]+", line.strip())]
    assert losses and losses[-1] < losses[0]
    assert accuracy(run(examples / "synchronize_batch_job.py", tmp_path)) >= lenet_min

    run(examples / "async_single_job.py", tmp_path)
    assert (tmp_path / "mlp_models_1" / "snapshot_done").exists()
    assert accuracy(run(examples / "async_batch_job.py", tmp_path)) >= mlp_min
