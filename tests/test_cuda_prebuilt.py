"""A GPU machine without nvcc runs what an ahead-of-time build left in the kernel cache (issue 16:
"the cache copied to a GPU machine without nvcc must run with zero compilations").

The fake driver and the fake nvcc (tests/fake_cuda_driver.py) stand in for the GPU and the toolkit;
nvcc is hidden by pointing $NVCC at a path that does not exist (find_nvcc then looks nowhere else).
"""
from __future__ import annotations

import numpy as np
import pytest

import flow
import flow.typing as tp
import flowc.runtime.job
from flowc.compiler.cache import KernelCache
from flowc.compiler.cached_build import ToolchainError
from flowc.compiler.cuda_prebuilt import ANY_NVCC, prebuilt_build
from flowc.compiler.cuda_toolchain import key_parts
from tests.fake_cuda_driver import FakeDriver, install, uninstall, write_fake_nvcc

X = np.arange(12, dtype=np.float32).reshape(4, 3) / 10


@flow.global_function(type="predict")
def aot_predict(x: tp.Numpy.Placeholder((4, 3))) -> tp.Numpy:
    with flow.scope.placement("gpu", "0:0"):
        w = flow.get_variable("aot_w", shape=(3, 2), initializer=flow.constant_initializer(1.0))
        return flow.matmul(x, w)


def _use(monkeypatch, tmp_path, driver: FakeDriver, nvcc_present: bool) -> None:
    install(driver, monkeypatch, write_fake_nvcc(tmp_path / "bin") if nvcc_present else tmp_path / "no" / "nvcc")
    monkeypatch.setattr(flowc.runtime.job, "_warned_gpu", False)
    monkeypatch.delenv("FLOWC_STRICT_DEVICE", raising=False)
    flow.clear_default_session()


@pytest.fixture
def cache_dir(monkeypatch, tmp_path):
    (tmp_path / "bin").mkdir()
    folder = tmp_path / "cache"
    monkeypatch.setenv("FLOWC_CACHE_DIR", str(folder))
    yield folder
    flow.clear_default_session()
    uninstall()


def test_a_job_built_ahead_of_time_runs_where_nvcc_is_missing_with_zero_compilations(monkeypatch, tmp_path,
                                                                                        cache_dir):
    _use(monkeypatch, tmp_path, FakeDriver(), nvcc_present=True)
    aot_predict(X)                                   # the build machine: the fake nvcc fills the cache
    built = aot_predict.compiled.library
    assert aot_predict.compiled.device == "gpu"

    _use(monkeypatch, tmp_path, FakeDriver(), nvcc_present=False)
    from flowc.runtime.devices import gpu_status
    usable, why = gpu_status()
    assert usable and "nvcc is not installed" in why and "ahead of time" in why, why
    before = flow.compile_cache_stats()["compilations"]
    aot_predict(X)
    assert aot_predict.compiled.device == "gpu"
    assert aot_predict.compiled.library == built
    assert flow.compile_cache_stats()["compilations"] == before


def test_without_nvcc_and_without_an_ahead_of_time_build_the_error_says_what_to_run(monkeypatch, tmp_path,
                                                                                     cache_dir):
    _use(monkeypatch, tmp_path, FakeDriver(), nvcc_present=False)
    with pytest.raises(ToolchainError, match=r"nvcc is not installed.*aot_predict.*flowc compile --device gpu"):
        aot_predict(X)


def test_a_build_by_an_nvcc_newer_than_the_driver_is_not_served(monkeypatch, tmp_path, cache_dir):
    _use(monkeypatch, tmp_path, FakeDriver(), nvcc_present=True)
    aot_predict(X)                                   # built by the fake nvcc of CUDA 13.0
    _use(monkeypatch, tmp_path, FakeDriver(driver_version=12040), nvcc_present=False)
    with pytest.raises(ToolchainError, match=r"nvcc 13\.0, newer than the driver's CUDA 12\.4"):
        aot_predict(X)


def _entry(cache: KernelCache, source: str, version: str, arch: str = "sm_90") -> str:
    parts = key_parts(source, arch, host_step=False, compiler_version=version)

    def build(folder):
        (folder / "kernel.cu").write_text(source)
        (folder / "kernel.cubin").write_bytes(version.encode())
    entry, _ = cache.get_or_build(parts, "k", build, files=("kernel.cu", "kernel.cubin"))
    return entry.key


def test_the_entry_must_match_every_key_part_but_nvcc_and_the_youngest_wins(tmp_path):
    cache = KernelCache(tmp_path / "c")
    src = 'extern "C" __global__ void k(float* x) { x[0] = 1; }'
    _entry(cache, src + " ", "Cuda compilation tools, release 13.0, V13.0.1")     # another source
    _entry(cache, src, "Cuda compilation tools, release 13.0, V13.0.1", arch="sm_80")  # another arch
    older = _entry(cache, src, "Cuda compilation tools, release 12.8, V12.8.9")
    younger = _entry(cache, src, "Cuda compilation tools, release 13.0, V13.0.1")
    wanted = key_parts(src, "sm_90", host_step=False, compiler_version=ANY_NVCC)
    assert prebuilt_build(wanted, "k", cache, 13000).key == younger
    assert prebuilt_build(wanted, "k", cache, 12080).key == older            # 13.0 is too new for 12.8
    with pytest.raises(ToolchainError, match=r"nvcc 12\.8, newer than the driver's CUDA 12\.4"):
        prebuilt_build(wanted, "k", cache, 12040)
    assert prebuilt_build(wanted, "k", cache, None).compiled is False      # no driver to ask: not checked


def test_a_corrupt_entry_is_passed_over_for_an_intact_older_one(tmp_path):
    cache = KernelCache(tmp_path / "c")
    src = 'extern "C" __global__ void k(float* x) { x[0] = 2; }'
    older = _entry(cache, src, "Cuda compilation tools, release 12.8, V12.8.9")
    younger = _entry(cache, src, "Cuda compilation tools, release 13.0, V13.0.1")
    cubin = cache.entry_dir(younger) / "kernel.cubin"
    cubin.chmod(0o644)
    cubin.write_bytes(b"tampered")                          # no longer the bytes its meta.json seals
    wanted = key_parts(src, "sm_90", host_step=False, compiler_version=ANY_NVCC)
    assert prebuilt_build(wanted, "k", cache, 13000).key == older
