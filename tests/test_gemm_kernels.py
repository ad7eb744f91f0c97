"""The GEMM and direct-convolution kernels (flowc_gemm.h, im2col.h) against double-precision loops,
built for each instruction set this machine can run: the 6x32 AVX-512 kernels, the 6x16 AVX2
kernels and the portable loops.  The job tests only ever build for -march=native, so without this
the paths a machine does not pick would go untested on it (CI may run on either kind of CPU)."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from flowc.compiler.toolchain import find_compiler, include_dir

HARNESS = Path(__file__).parent / "kernels" / "gemm_harness.cpp"

# instruction set -> (extra g++ flags, the B panel width its kernels use)
VARIANTS = {
    "avx512": ([], 32),
    "avx2": (["-mno-avx512f"], 16),
    "portable": (["-mno-avx512f", "-mno-avx2", "-mno-fma"], 16),
}


def _native_macros() -> str:
    cxx = find_compiler()
    return subprocess.run([*cxx, "-march=native", "-dM", "-E", "-x", "c++", "/dev/null"],
                          capture_output=True, text=True, check=True).stdout


@pytest.fixture(scope="module")
def native_macros() -> str:
    return _native_macros()


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_kernels_match_double_loops(variant: str, native_macros: str, tmp_path: Path) -> None:
    flags, panel_width = VARIANTS[variant]
    if variant == "avx512" and "__AVX512F__" not in native_macros:
        pytest.skip("this CPU has no AVX-512F")
    if variant == "avx2" and "__AVX2__" not in native_macros:
        pytest.skip("this CPU has no AVX2")
    binary = tmp_path / "harness"
    subprocess.run([*find_compiler(), "-O2", "-march=native", *flags, "-fopenmp", "-std=c++17",
                    f"-I{include_dir()}", str(HARNESS), "-o", str(binary)], check=True)
    lines = subprocess.run([str(binary)], capture_output=True, text=True, check=True,
                           env={"OMP_NUM_THREADS": "2"}).stdout.splitlines()
    assert lines[-1] == f"kNR {panel_width}"
    cases = dict(line.split() for line in lines[:-1])
    assert len(cases) == 10 * 4 + 6 * 4
    bad = {case: error for case, error in cases.items() if not float(error) <= 1e-4}
    assert not bad, f"{variant}: cases off the double-precision result: {bad}"
