"""The compile cache seen from whole jobs, across processes: warm runs compile nothing,
concurrent runs both succeed, a corrupt entry is rebuilt."""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow      # every test compiles the MLP in new Python processes

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCRIPT = """
import json, sys
sys.path.insert(0, "examples")
import numpy as np, flow
import mlp_train_demo as demo
x = np.zeros((100, 1, 28, 28), np.float32); y = np.zeros(100, np.int32)
demo.train_job(x, y); demo.eval_job(x, y)
print(json.dumps(flow.compile_cache_stats()))
"""


def start(cache_dir: pathlib.Path) -> subprocess.Popen:
    env = dict(os.environ, FLOWC_CACHE_DIR=str(cache_dir), PYTHONPATH=str(ROOT))
    return subprocess.Popen([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


def test_second_process_compiles_nothing(tmp_path):
    first = finish(start(tmp_path))
    assert first["compilations"] == 2          # the train job and the eval job
    second = finish(start(tmp_path))
    assert second["compilations"] == 0 and second["hits"] == 2


def test_two_processes_compiling_at_once_both_succeed(tmp_path):
    a, b = start(tmp_path), start(tmp_path)
    stats_a, stats_b = finish(a), finish(b)
    assert stats_a["compilations"] + stats_b["compilations"] == 2


def test_corrupt_library_is_rebuilt(tmp_path):
    finish(start(tmp_path))
    library = next(tmp_path.glob("??/*/kernel.so"))
    library.write_bytes(library.read_bytes()[:100])      # a truncated write
    again = finish(start(tmp_path))
    assert again["compilations"] == 1
    assert library.stat().st_size > 100
