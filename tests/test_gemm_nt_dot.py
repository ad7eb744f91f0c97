"""C = A * B^T through flowc_gemm.h (the dot-product kernels of flowc_gemm_nt.h where use_dot_path
picks them, the packed kernels elsewhere) against double-precision loops, for each instruction set
this machine can run: built as shipped, and with FLOWC_GEMM_NT_DOT=1 so that every case, short K
and wide N included, goes through the dot path (tests/kernels/gemm_nt_harness.cpp)."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from flowc.compiler.toolchain import find_compiler, include_dir
from tests.test_gemm_kernels import VARIANTS, _native_macros

HARNESS = Path(__file__).parent / "kernels" / "gemm_nt_harness.cpp"
CASES = 14 + 4 * 4 + 6
# Shapes the shipped rule must send through the dot path on AVX2/AVX-512 (the MLP's two layers,
# LeNet's dense1) and ones it must leave on the packed path (short K, large M).
SHIPPED_DOT = ("nt_100x512x784_off0_pad0", "nt_100x10x512_off0_pad0", "nt_100x512x3136_off0_pad0")
SHIPPED_PACKED = ("nt_64x64x64_off0_pad0", "nt_257x70x256_off0_pad0")


@pytest.fixture(scope="module")
def native_macros() -> str:
    return _native_macros()


def _run_harness(variant: str, defines: list[str], macros: str, tmp_path: Path) -> dict[str, tuple[str, float]]:
    flags, _ = VARIANTS[variant]
    if variant == "avx512" and "__AVX512F__" not in macros:
        pytest.skip("this CPU has no AVX-512F")
    if variant == "avx2" and "__AVX2__" not in macros:
        pytest.skip("this CPU has no AVX2")
    binary = tmp_path / "nt_harness"
    subprocess.run([*find_compiler(), "-O2", "-march=native", *flags, *defines, "-fopenmp", "-std=c++17",
                    f"-I{include_dir()}", str(HARNESS), "-o", str(binary)], check=True)
    lines = subprocess.run([str(binary)], capture_output=True, text=True, check=True,
                           env={"OMP_NUM_THREADS": "2"}).stdout.splitlines()
    cases = {}
    for line in lines:
        case, path, error = line.split()
        cases[case] = (path, float(error))
    assert len(cases) == CASES
    return cases


@pytest.mark.parametrize("forced", [False, True], ids=["shipped", "dot_forced"])
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_nt_gemm_matches_double_loops(variant: str, forced: bool, native_macros: str, tmp_path: Path) -> None:
    cases = _run_harness(variant, ["-DFLOWC_GEMM_NT_DOT=1"] if forced else [], native_macros, tmp_path)
    bad = {case: error for case, (_, error) in cases.items() if not error <= 1e-4}
    assert not bad, f"{variant}: cases off the double-precision result: {bad}"
    paths = {case: path for case, (path, _) in cases.items()}
    if variant == "portable":
        assert set(paths.values()) == {"portable"}
    elif forced:
        assert set(paths.values()) == {"dot"}
    else:
        assert all(paths[c] == "dot" for c in SHIPPED_DOT), paths
        assert all(paths[c] == "packed" for c in SHIPPED_PACKED), paths
