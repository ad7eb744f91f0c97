"""Mirrored and dynamic inputs on one device (OneFlow's `tp.ListNumpy` / `tp.ListListNumpy`
placeholders), Tuple-annotated parameters, batch_axis and the flow.distribute hints."""
from __future__ import annotations

from typing import Tuple

import numpy as np
import pytest

import flow
import flow.typing as tp
from flowc.compiler.errors import JobCallError, TraceError

rng = np.random.default_rng(7)


def test_a_list_input_smaller_than_declared_runs_on_its_actual_size():
    seen = {}

    @flow.global_function(type="predict")
    def scale(x: tp.ListNumpy.Placeholder((8, 3), dtype=flow.float)) -> tp.ListNumpy:
        seen["dynamic"] = x.is_dynamic
        return flow.math.reduce_sum(x * 2.0, axis=1)

    full = rng.standard_normal((8, 3)).astype(np.float32)
    part = full[:5]
    (out_full,) = scale([full])
    (out_part,) = scale([part])
    np.testing.assert_allclose(out_full, (full * 2).sum(1), rtol=1e-6)
    assert out_part.shape == (5,)
    np.testing.assert_allclose(out_part, (part * 2).sum(1), rtol=1e-6)
    assert seen["dynamic"] is True


def test_a_mean_over_a_smaller_batch_divides_by_the_actual_count():
    @flow.global_function(type="predict")
    def mean(x: tp.ListNumpy.Placeholder((10,), dtype=flow.float)) -> tp.ListNumpy:
        return flow.math.reduce_mean(x)

    x = np.arange(4, dtype=np.float32)
    np.testing.assert_allclose(mean([x])[0], 1.5)


def test_a_train_job_on_smaller_batches_shares_variables_and_step_count():
    @flow.global_function(type="train")
    def train(x: tp.ListNumpy.Placeholder((6, 2), dtype=flow.float)) -> tp.ListNumpy:
        w = flow.get_variable("w_dyn", shape=(2,), initializer=flow.ones_initializer())
        loss = flow.math.reduce_sum(x * w, axis=1)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.5]), momentum=0).minimize(loss)
        return loss

    a = rng.standard_normal((6, 2)).astype(np.float32)
    b = rng.standard_normal((3, 2)).astype(np.float32)
    w = np.ones(2, np.float32)
    for batch in (a, b, a[:4], b):
        (loss,) = train([batch])
        np.testing.assert_allclose(loss, batch @ w, rtol=1e-5)
        w = w - 0.5 * batch.mean(0)        # gradient of the mean loss
        np.testing.assert_allclose(flow.get_all_variables()["w_dyn"].numpy(), w, rtol=1e-5)
    from flowc.runtime.session import default_session
    assert default_session().train_steps["train"] == 4


def test_a_list_input_with_more_elements_than_declared_is_refused():
    @flow.global_function(type="predict")
    def job(x: tp.ListNumpy.Placeholder((4, 2), dtype=flow.float)) -> tp.ListNumpy:
        return x + 1.0

    with pytest.raises(ValueError, match="at most the 8 elements"):
        job([np.zeros((5, 2), np.float32)])
    with pytest.raises(ValueError, match="must have 2 dims"):
        job([np.zeros(4, np.float32)])
    with pytest.raises(JobCallError, match="ListNumpy placeholder.*one device.*a list of 2"):
        job([np.zeros((4, 2), np.float32)] * 2)


def test_a_numpy_input_must_have_its_declared_shape():
    @flow.global_function(type="predict")
    def job(x: tp.Numpy.Placeholder((4, 2), dtype=flow.float)) -> tp.Numpy:
        assert not x.is_dynamic
        return x + 1.0

    with pytest.raises(ValueError, match=r"must have shape \(4, 2\)"):
        job(np.zeros((3, 2), np.float32))


def test_list_list_numpy_joins_a_tensor_list_along_axis_0():
    @flow.global_function(type="predict")
    def job(x: tp.ListListNumpy.Placeholder((8, 2), dtype=flow.float)) -> tp.ListListNumpy:
        return x * 3.0

    a, b = np.ones((3, 2), np.float32), np.full((2, 2), 2.0, np.float32)
    result = job([[a, b]])
    assert isinstance(result, list) and isinstance(result[0], list) and len(result[0]) == 1
    np.testing.assert_array_equal(result[0][0], np.concatenate([a, b]) * 3.0)
    with pytest.raises(ValueError, match="agree past axis 0"):
        job([[a, np.ones((2, 3), np.float32)]])


def test_tuple_annotated_parameters_take_tuples_of_arrays():
    @flow.global_function(type="predict")
    def job(pair: Tuple[tp.Numpy.Placeholder((3,), dtype=flow.float), tp.Numpy.Placeholder((3,), dtype=flow.float)],
            scale: tp.Numpy.Placeholder((1,), dtype=flow.float)) -> tp.Numpy:
        x, y = pair
        return (x - y) * scale

    x, y = np.arange(3, dtype=np.float32), np.ones(3, np.float32)
    np.testing.assert_array_equal(job((x, y), np.array([2], np.float32)), (x - y) * 2)
    np.testing.assert_array_equal(job(pair=[x, y], scale=np.array([1], np.float32)), x - y)
    with pytest.raises(JobCallError, match=r"argument 'pair' is a Tuple of 2 inputs.*a tuple of 3"):
        job((x, y, y), np.array([2], np.float32))


def test_a_tuple_without_members_is_a_clear_error():
    def job(x: Tuple[()]) -> tp.Numpy:
        return x

    with pytest.raises(TypeError, match="Tuple"):
        flow.global_function(type="predict")(job)


def test_batch_axis_is_checked_and_recorded():
    assert tp.Numpy.Placeholder((4, 3), batch_axis=1).batch_axis == 1
    assert tp.Numpy.Placeholder((4, 3), batch_axis=-1).batch_axis == 1
    assert tp.ListNumpy.Placeholder((4, 3), batch_axis=None).batch_axis is None
    with pytest.raises(ValueError, match="batch_axis"):
        tp.Numpy.Placeholder((4, 3), batch_axis=2)


def test_numpy_list_on_old_api_results():
    with pytest.warns(DeprecationWarning):
        placeholder = flow.FixedTensorDef((3,), dtype=flow.float)

    @flow.global_function()
    def job(x=placeholder):
        return x + 1.0

    blob = job(np.zeros(3, np.float32)).get()
    (only,) = blob.numpy_list()
    np.testing.assert_array_equal(only, np.ones(3, np.float32))
    np.testing.assert_array_equal(blob.numpy(0), only)
    assert blob.parallel_num() == 1
    with pytest.raises(IndexError, match=r"1 device\(s\), parallel_id 0 to 0"):
        blob.numpy(1)


def test_a_result_per_rank_joins_along_axis_0_as_one_array():
    """A distributed mirrored job's result (one array per rank, runtime/distributed.py) as each
    annotation gives it: OneFlow's LocalMirroredTensor for the old API; tp.Numpy joins the arrays."""
    from flowc.runtime.futures import LocalBlob, watched_value
    from flowc.runtime.signature import PerDevice, PerRank, rebuild_result
    a, b = np.arange(6, dtype=np.float32).reshape(2, 3), -np.ones((2, 3), np.float32)
    per_rank = PerRank([a, b])
    np.testing.assert_array_equal(rebuild_result(0, [per_rank]), np.concatenate([a, b]))
    listed = rebuild_result((PerDevice(0), PerDevice(0, tensor_list=True)), [per_rank])
    assert [x.tolist() for x in listed[0]] == [a.tolist(), b.tolist()]
    assert [[x.tolist() for x in device] for device in listed[1]] == [[a.tolist()], [b.tolist()]]
    blob = rebuild_result(0, [per_rank], LocalBlob)
    assert blob.parallel_num() == 2 and blob.shape == (4, 3) and len(blob) == 4
    np.testing.assert_array_equal(blob.numpy(1), b)
    np.testing.assert_array_equal(np.asarray(blob), np.concatenate([a, b]))
    with pytest.raises(IndexError, match="2 device"):
        blob.numpy(2)
    np.testing.assert_array_equal(watched_value("numpy", per_rank), np.concatenate([a, b]))
    assert len(watched_value("list_numpy", per_rank)) == 2
    assert watched_value("blob", per_rank).parallel_num() == 2
    scalars = PerRank([np.float32(1.0) * np.ones(()), np.ones(())])
    with pytest.raises(ValueError, match="scalar on each of its 2 ranks.*tp.ListNumpy"):
        rebuild_result(0, [scalars])
    scalar_blob = LocalBlob(scalars)             # its devices' values stay available
    assert [float(v) for v in scalar_blob.numpy_list()] == [1.0, 1.0]
    with pytest.raises(ValueError, match="numpy\\(parallel_id\\)"):
        scalar_blob.numpy()


def test_distribute_hints_are_identities_on_one_device():
    @flow.global_function(type="predict")
    def job(x: tp.Numpy.Placeholder((4, 2), dtype=flow.float)) -> tp.Numpy:
        y = x.with_distribute(flow.distribute.split(0))
        y = y.with_split_distribute(1).with_broadcast_distribute()
        return y.with_distribute(flow.distribute.auto()) * 2.0

    x = rng.standard_normal((4, 2)).astype(np.float32)
    np.testing.assert_array_equal(job(x), x * 2)
    flow.distribute.assert_is_valid_distribute(flow.distribute.partical_sum())
    with pytest.raises(TraceError, match="expected flow.distribute"):
        flow.distribute.assert_is_valid_distribute("split")


def test_a_split_axis_outside_the_blob_is_an_error_naming_the_line():
    @flow.global_function(type="predict")
    def job(x: tp.Numpy.Placeholder((4, 2), dtype=flow.float)) -> tp.Numpy:
        return x.with_distribute(flow.distribute.split(3))

    with pytest.raises(TraceError, match=r"test_mirrored_inputs.py:\d+: Blob.with_distribute: split axis 3"):
        job(np.zeros((4, 2), np.float32))


def test_a_placeholder_may_carry_oneflow_s_name_argument():
    @flow.global_function(type="predict")
    def job(images: tp.Numpy.Placeholder((2,), dtype=flow.float, name="myimages")) -> tp.Numpy:
        return images + 1.0

    np.testing.assert_array_equal(job(np.zeros(2, np.float32)), np.ones(2, np.float32))
    with pytest.raises(TypeError, match="name must be a str"):
        tp.Numpy.Placeholder((2,), name=3)


def test_the_old_api_s_mirrored_tensor_def_takes_a_smaller_list():
    with pytest.warns(DeprecationWarning, match="MirroredTensorDef"):
        placeholder = flow.MirroredTensorDef((4,), dtype=flow.float)

    @flow.global_function()
    def job(x=placeholder):
        return x * 2.0

    (out,) = job([np.ones(3, np.float32)]).get().numpy_list()
    np.testing.assert_array_equal(out, np.full(3, 2.0, np.float32))
