"""API that OneFlow 0.3's documentation programs (examples/oneflow_docs/) call and flowc lacked.

`flow.checkpoint.save(path, var_dict)` (basics_topics/model_load_save): given a dict, OneFlow saves exactly
its entries - values from `flow.get_all_variables()`, `flow.checkpoint.get()` or NumPy arrays - and
nothing else (no train step counter), in the same folder format, refusing a non-empty folder.
"""
import os

import numpy as np
import pytest

import flow
import flow.typing as tp
from flowc.runtime.checkpoint import CheckpointError


@pytest.fixture(autouse=True)
def fresh_session():
    flow.clear_default_session()
    yield
    flow.clear_default_session()


def make_train_job():
    @flow.global_function(type="train")
    def train_job(x: tp.Numpy.Placeholder((2, 3))) -> tp.Numpy:
        w = flow.get_variable("w", shape=(3, 4), initializer=flow.random_uniform_initializer(-1, 1))
        b = flow.get_variable("b", shape=(4,), initializer=flow.zeros_initializer())
        loss = flow.math.reduce_mean(flow.math.square(flow.matmul(x, w) + b))
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0).minimize(loss)
        return loss
    return train_job


def test_save_with_var_dict_writes_exactly_its_entries(tmp_path):
    train_job = make_train_job()
    train_job(np.ones((2, 3), np.float32))
    current = flow.get_all_variables()
    extra = np.arange(6, dtype=np.int32).reshape(2, 3)
    flow.checkpoint.save(str(tmp_path / "part"), {"w": current["w"], "extra": extra})
    assert sorted(os.listdir(tmp_path / "part")) == ["extra", "snapshot_done", "w"]
    saved = flow.checkpoint.get(str(tmp_path / "part"))
    assert sorted(saved) == ["extra", "w"]
    assert saved["w"].numpy().tobytes() == current["w"].numpy().tobytes()
    assert saved["extra"].numpy().dtype == np.int32 and np.array_equal(saved["extra"].numpy(), extra)


def test_save_with_var_dict_round_trips_through_load_variables(tmp_path):
    train_job = make_train_job()
    train_job(np.ones((2, 3), np.float32))
    w_before = flow.get_all_variables()["w"].numpy()
    flow.checkpoint.save(str(tmp_path / "w_only"), {"w": flow.get_all_variables()["w"]})
    train_job(np.ones((2, 3), np.float32))
    assert not np.array_equal(flow.get_all_variables()["w"].numpy(), w_before)
    flow.load_variables(flow.checkpoint.get(str(tmp_path / "w_only")))
    assert np.array_equal(flow.get_all_variables()["w"].numpy(), w_before)


def test_save_with_var_dict_accepts_values_read_by_checkpoint_get(tmp_path):
    make_train_job()
    flow.checkpoint.save(str(tmp_path / "all"))
    everything = flow.checkpoint.get(str(tmp_path / "all"))
    flow.checkpoint.save(str(tmp_path / "copy"), {"b": everything["b"]})
    assert np.array_equal(flow.checkpoint.get(str(tmp_path / "copy"))["b"].numpy(), np.zeros(4, np.float32))


def test_save_with_var_dict_refuses_a_non_empty_folder_and_bad_values(tmp_path):
    make_train_job()
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "file").write_text("x")
    with pytest.raises(CheckpointError, match="not empty"):
        flow.checkpoint.save(str(tmp_path / "taken"), {"w": np.zeros((3, 4), np.float32)})
    with pytest.raises(CheckpointError, match="complex64"):
        flow.checkpoint.save(str(tmp_path / "bad"), {"w": np.zeros(2, np.complex64)})
    with pytest.raises(CheckpointError, match="must be a dict"):
        flow.checkpoint.save(str(tmp_path / "bad"), [("w", np.zeros(2, np.float32))])
    assert not (tmp_path / "bad").exists()            # nothing written when a value is refused
