"""benchmarks/gpu_check.sh, the GPU run book, where there is no GPU: on the fake driver it runs to one
verdict per check, says UNVERIFIED (never PASS) on every line that needs a GPU, and exits non-zero
on a FAIL; without any driver every GPU line is a SKIP naming gpu_status()'s reason."""
from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import gpu_check, gpu_steps
from tests.fake_cuda_driver import write_fake_nvcc

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"
LINE = re.compile(r"^(PASS|FAIL|SKIP|UNVERIFIED) +([a-z0-9-]+) +(.+)$")


def run_script(*args: str, env: dict[str, str] | None = None) -> tuple[int, list[tuple[str, str, str]], str]:
    full = dict(os.environ, PYTHON=sys.executable, **(env or {}))
    full.pop("FLOWC_REQUIRE_GPU", None)
    proc = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, env=full, cwd=ROOT,
                          timeout=600)
    lines = [m.groups() for m in map(LINE.match, proc.stdout.splitlines()) if m]
    assert len(lines) == len(proc.stdout.splitlines()), proc.stdout       # nothing but verdicts on stdout
    return proc.returncode, lines, proc.stderr


def _failing_nvcc(folder: Path) -> Path:
    """An nvcc that answers --version and fails every compile."""
    path = folder / "nvcc"
    path.write_text("#!/bin/sh\nfor a in \"$@\"; do if [ \"$a\" = --version ]; then "
                    "echo 'Cuda compilation tools, release 13.0, V13.0.0'; echo 'Build failing_fake'; "
                    "exit 0; fi; done\n"
                    "echo 'error: this nvcc compiles nothing' >&2; exit 1\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_the_run_book_covers_the_issues_list():
    names = [c.name for c in gpu_check.CHECKS]
    assert names[0] == "environment" and len(set(names)) == len(names)
    assert {"device-tests", "lenet-vs-reference", "bitwise-repeat", "large-sizes", "mixed-and-leaks", "seeds",
            "aot-build", "aot-run", "bench-fp32", "bench-tf32"} <= set(names)
    assert {f"sanitizer-{t}" for t in ("memcheck", "racecheck", "synccheck", "initcheck")} <= set(names)
    assert os.access(SCRIPT, os.X_OK)


def test_a_failing_check_makes_the_script_exit_non_zero_and_gpu_lines_stay_unverified(tmp_path):
    rc, lines, _ = run_script("--fake-driver", "--only", "environment,aot-build,device-tests,seeds",
                              "--work", str(tmp_path / "work"),       # kept after a failure: not in /tmp
                              env={"NVCC": str(_failing_nvcc(tmp_path)), "FLOWC_CACHE_DIR": str(tmp_path / "c")})
    assert rc == 1
    verdicts = {name: (verdict, detail) for verdict, name, detail in lines}
    assert list(verdicts) == ["environment", "aot-build", "device-tests", "seeds"]
    assert verdicts["aot-build"][0] == "FAIL" and "compiles nothing" in verdicts["aot-build"][1]
    assert verdicts["environment"][0] == "UNVERIFIED" and "Fake H200" in verdicts["environment"][1]
    for name in ("device-tests", "seeds"):
        assert verdicts[name][0] == "UNVERIFIED" and "fake driver" in verdicts[name][1], verdicts[name]


def test_without_a_usable_gpu_every_gpu_line_is_a_skip_with_the_reason(tmp_path):
    from flowc.runtime.devices import gpu_status
    usable, why = gpu_status()
    if usable:
        pytest.skip("a GPU is usable here: the run book runs for real (benchmarks/gpu_check.sh)")
    rc, lines, _ = run_script("--only", "device-tests,large-sizes,bench-fp32",
                              env={"FLOWC_CACHE_DIR": str(tmp_path / "c")})
    assert rc == 0 and [name for _, name, _ in lines] == ["device-tests", "large-sizes", "bench-fp32"]
    for verdict, name, detail in lines:
        assert verdict == "SKIP" and why in detail, (name, detail)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="the AOT line builds with nvcc")
def test_the_whole_run_book_runs_to_its_verdicts_on_the_fake_driver(tmp_path):
    rc, lines, stderr = run_script("--fake-driver", env={"FLOWC_CACHE_DIR": str(tmp_path / "c")})
    assert rc == 0, (lines, stderr[-2000:])
    assert [name for _, name, _ in lines] == [c.name for c in gpu_check.CHECKS]
    gpu = {c.name for c in gpu_check.CHECKS if c.needs_gpu}
    for verdict, name, detail in lines:
        if name in gpu or name == "environment":
            assert verdict == "UNVERIFIED", (name, verdict, detail)       # never PASS without a GPU
        else:
            assert verdict == "PASS", (name, detail)
    aot = next(detail for _, name, detail in lines if name == "aot-build")
    assert "step libraries for sm_90" in aot


def test_the_gpu_bench_table_shows_every_row_and_the_ratio():
    rows = [{"model": "mlp", "framework": "flowc", "steps_per_s": 900.0},
            {"model": "mlp", "framework": "flowc-per-launch", "steps_per_s": 600.0},
            {"model": "mlp", "framework": "torch", "steps_per_s": 450.0},
            {"model": "lenet", "framework": "flowc", "steps_per_s": 300.0},
            {"model": "lenet", "framework": "flowc-per-launch", "steps_per_s": 250.0},
            {"model": "lenet", "framework": "torch", "error": "PyTorch sees no CUDA device"}]
    text = gpu_steps.table(rows, tf32=True)
    assert "TF32" in text and "2.00x" in text
    lenet = next(ln for ln in text.splitlines() if ln.startswith("lenet"))
    assert "300.0" in lenet and "n/a" in lenet
    assert "lenet torch: PyTorch sees no CUDA device" in text


def test_the_aot_line_fills_a_cache_with_step_libraries_and_checks_their_keys(tmp_path):
    """The AOT line's plumbing with a fake nvcc (placeholder libraries): `flowc compile` of the seeds
    into a fresh cache, step.so entries found, keys without paths (the slow test above uses nvcc)."""
    rc, lines, _ = run_script("--fake-driver", "--only", "aot-build",
                              env={"NVCC": str(write_fake_nvcc(tmp_path)), "FLOWC_CACHE_DIR": str(tmp_path / "c")})
    (verdict, name, detail), = lines
    assert (rc, verdict, name) == (0, "PASS", "aot-build") and "step libraries" in detail
