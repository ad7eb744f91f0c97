"""`flowc show --memory`'s peak summary (compiler/memory_report.py), and `flowc show` on a module that
builds its jobs inside `make_jobs()` (examples/models, issue 15)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

import pytest

import flow
import flow.typing as tp
from flowc.cli import main as flowc_main
from flowc.compiler.memory_report import summarize

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def fresh_session():
    flow.clear_default_session()
    yield
    flow.clear_default_session()


def _mlp_train_job():
    @flow.global_function(type="train")
    def mem_mlp(x: tp.Numpy.Placeholder((8, 16)), y: tp.Numpy.Placeholder((8, 4))) -> tp.Numpy:
        h = flow.layers.dense(x, 32, activation=flow.math.relu, name="h",
                              kernel_initializer=flow.random_normal_initializer(stddev=0.1))
        out = flow.layers.dense(h, 4, name="out", kernel_initializer=flow.random_normal_initializer(stddev=0.1))
        loss = flow.math.reduce_mean(flow.math.square(out - y))
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0.9).minimize(loss)
        return loss
    return mem_mlp


def test_the_summary_counts_live_values_variables_and_inputs():
    lowered = _mlp_train_job().lower()
    plan = lowered.memory_plan()
    summary = plan.summary
    assert summary is not None and summary == summarize(lowered.program.memory, lowered.program.kernels)
    assert summary.arena_bytes == plan.peak_bytes
    assert 0 < summary.live_peak_bytes <= summary.arena_bytes
    # variables: h-weight (32x16), h-bias (32), out-weight (4x32), out-bias (4), each with its momentum
    assert summary.variable_bytes == 2 * 4 * (32 * 16 + 32 + 4 * 32 + 4)
    assert summary.input_bytes == 4 * (8 * 16 + 8 * 4)
    assert summary.total_bytes == summary.arena_bytes + summary.variable_bytes + summary.input_bytes
    kernel_names = {k.name for k in lowered.program.kernels}
    assert summary.peak_kernel_name in kernel_names
    # the printout: the header, then the summary as its second line
    lines = str(plan).splitlines()
    assert lines[0].startswith(f"memory plan for mem_mlp: arena peak {plan.peak_bytes} bytes")
    assert lines[1].startswith(f"  peak: arena {plan.peak_bytes / 2**20:.2f} MiB (live values at most")
    assert f"at kernel {summary.peak_kernel} {summary.peak_kernel_name}" in lines[1]


def test_the_live_peak_is_the_largest_sum_of_buffers_alive_together():
    lowered = _mlp_train_job().lower()
    memory, kernels = lowered.program.memory, lowered.program.kernels
    buffers = {b for b in memory.storage.values() if b.kind == "arena"}
    by_kernel = [sum(b.nbytes for b in buffers if b.first <= k <= b.last) for k in range(len(kernels) + 1)]
    summary = summarize(memory, kernels)
    assert summary.live_peak_bytes == max(by_kernel)
    assert by_kernel[summary.peak_kernel] == max(by_kernel)


def test_show_memory_finds_the_jobs_a_module_builds_in_make_jobs(capsys):
    code = flowc_main(["show", str(ROOT / "examples" / "models" / "dcgan.py") + ":train_discriminator",
                       "--memory"])
    out = capsys.readouterr().out
    assert code == 0
    assert out.startswith("memory plan for train_discriminator: arena peak ")
    assert re.search(r"^  peak: arena \d+\.\d\d MiB \(live values at most \d+\.\d\d MiB, at kernel \d+ ", out, re.M)
    assert "variable d_conv1-weight" in out


def test_a_make_jobs_that_needs_arguments_is_a_clear_error(tmp_path, capsys):
    module = tmp_path / "needs_args.py"
    module.write_text("def make_jobs(config):\n    raise AssertionError('not called')\n")
    assert flowc_main(["show", str(module), "--memory"]) == 2
    err = capsys.readouterr().err
    assert "needs_args.py has no job at module level and its make_jobs() needs arguments (config)" in err


def test_a_module_with_neither_jobs_nor_make_jobs_names_both(tmp_path, capsys):
    module = tmp_path / "empty_module.py"
    module.write_text("x = 1\n")
    assert flowc_main(["show", str(module), "--memory"]) == 2
    err = capsys.readouterr().err
    assert "no @flow.global_function found" in err and "make_jobs()" in err


# ------------------------------------------------------------- examples/models/memory.py (peak RSS)

def _memory_module():
    sys.path.insert(0, str(ROOT / "examples" / "models"))
    import memory
    return memory


def test_the_high_water_mark_resets_to_the_current_resident_set():
    memory = _memory_module()
    block = np.ones(64 << 20, np.uint8)           # 64 MiB touched, then freed
    high = memory.status_kib("VmHWM")
    del block
    memory.reset_peak()
    after = memory.status_kib("VmHWM")
    assert after <= memory.status_kib("VmRSS") + 1024 and after < high - 32 * 1024


@pytest.mark.slow
def test_the_memory_script_measures_both_frameworks():
    pytest.importorskip("torch", reason="memory.py compares with PyTorch, which the `bench` extra installs")
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "models" / "memory.py"), "dcgan:tiny"],
                          capture_output=True, text=True, timeout=600, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line.split() for line in done.stdout.splitlines()[1:]]
    assert [r[:2] for r in rows] == [["dcgan:tiny", "flowc"], ["dcgan:tiny", "torch"]]
    for row in rows:
        base, peak = float(row[2]), float(row[3])
        assert 0 < base < peak
