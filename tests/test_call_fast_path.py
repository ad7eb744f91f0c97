"""A job call whose arguments are ndarrays of exactly the declared shapes and dtypes skips the
argument binder (JobFunction._exact_arrays) and passes the arrays' memory to the step in place
(CpuLoadedStep.compute_borrowed).  Every other kind of argument takes the full path; both must
give the same results and leave the caller's arrays alone."""
from __future__ import annotations

import numpy as np
import pytest

import flow
import flow.typing as tp


@pytest.fixture()
def affine_job():
    flow.clear_default_session()

    @flow.global_function(type="predict")
    def affine(x: tp.Numpy.Placeholder((4, 3), dtype=flow.float),
               k: tp.Numpy.Placeholder((4,), dtype=flow.int32)) -> tp.Numpy:
        w = flow.get_variable("fast_path_w", shape=(3, 2), dtype=flow.float,
                              initializer=flow.random_uniform_initializer(seed=3))
        return flow.matmul(x, w) + flow.expand_dims(flow.cast(k, flow.float), axis=1)

    yield affine
    flow.clear_default_session()


def _inputs(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((4, 3)).astype(np.float32), rng.integers(-5, 5, size=4).astype(np.int32)


def test_exact_and_converted_arguments_give_the_same_result(affine_job) -> None:
    x, k = _inputs()
    exact = affine_job(x, k)
    readonly_x, readonly_k = x.copy(), k.copy()
    readonly_x.flags.writeable = False
    readonly_k.flags.writeable = False
    strided = np.asfortranarray(x)                         # not C-contiguous: copied into the slot
    assert np.array_equal(affine_job(readonly_x, readonly_k), exact)
    assert np.array_equal(affine_job(strided, k), exact)
    assert np.array_equal(affine_job(x, k.astype(np.int64)), exact)     # converted by the binder
    assert np.array_equal(affine_job(x=x, k=k), exact)                  # keywords: the binder
    assert np.array_equal(affine_job(x.view(np.recarray).view(np.ndarray), k), exact)


def test_exact_arguments_are_not_written(affine_job) -> None:
    x, k = _inputs(1)
    before = (x.copy(), k.copy())
    for _ in range(3):
        affine_job(x, k)
    assert np.array_equal(x, before[0]) and np.array_equal(k, before[1])


def test_a_subclass_or_a_wrong_shape_still_gets_the_binders_checks(affine_job) -> None:
    x, k = _inputs(2)

    class Tagged(np.ndarray):
        pass

    assert np.array_equal(affine_job(x.view(Tagged), k), affine_job(x, k))
    with pytest.raises(ValueError, match="'x' must have shape"):
        affine_job(x[:3], k)
    with pytest.raises(flow.JobCallError, match="dtype"):
        affine_job(x.astype(np.complex64), k)
