"""Checkpoints: OneFlow's folder format, atomic saves, checked loads, and loads before the first call.

Model: one dense layer (8 -> 4) trained with softmax cross-entropy and SGD with momentum 0.9, with a
learning rate that changes at step 4, so a restored train step counter matters; a predict job reads
the same variables.
"""
import os

import numpy as np
import pytest

import flow
import flow.typing as tp
import flowc.runtime.checkpoint as ckpt
from flowc.runtime.session import default_session

N, IN, OUT = 6, 8, 4
_rng = np.random.RandomState(7)
X = _rng.uniform(-1, 1, (N, IN)).astype(np.float32)
LABELS = _rng.randint(0, OUT, (N,)).astype(np.int32)


def logits_of(x):
    return flow.layers.dense(x, OUT, kernel_initializer=flow.truncated_normal(0.1),
                             bias_initializer=flow.random_uniform_initializer(-0.1, 0.1), name="dense")


def make_jobs():
    @flow.global_function(type="train")
    def train_job(x: tp.Numpy.Placeholder((N, IN)), labels: tp.Numpy.Placeholder((N,), dtype=flow.int32)
                  ) -> tp.Numpy:
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(labels, logits_of(x))
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([4], [0.1, 0.03]), momentum=0.9).minimize(loss)
        return loss

    @flow.global_function(type="predict")
    def predict_job(x: tp.Numpy.Placeholder((N, IN))) -> tp.Numpy:
        return logits_of(x)

    return train_job, predict_job


def make_small_job(shape=(3, 4)):
    @flow.global_function(type="predict")
    def small_job(x: tp.Numpy.Placeholder((shape[1],))) -> tp.Numpy:
        w = flow.get_variable("w", shape=shape, initializer=flow.random_uniform_initializer(-1, 1))
        return flow.matmul(flow.reshape(x, [1, shape[1]]), w, transpose_b=True)
    return small_job


def values():
    return {name: v.numpy() for name, v in flow.get_all_variables().items()}


def assert_same_bits(a: dict, b: dict):
    assert sorted(a) == sorted(b)
    for name in a:
        assert a[name].dtype == b[name].dtype and a[name].shape == b[name].shape, name
        assert a[name].tobytes() == b[name].tobytes(), name


# ---------------------------------------------------------------------------------------------
# Round trip
# ---------------------------------------------------------------------------------------------
def test_round_trip_before_first_call_restores_weights_momentum_and_steps(tmp_path):
    path = tmp_path / "model"
    train_job, predict_job = make_jobs()
    for _ in range(3):
        train_job(X, LABELS)
    logits_before = predict_job(X)
    saved = values()
    assert {"dense-weight", "dense-bias", "dense-weight-momentum", "dense-bias-momentum"} <= set(saved)
    assert np.any(saved["dense-weight-momentum"] != 0)
    flow.train.CheckPoint().save(str(path))
    for _ in range(3):                   # the run that never stopped: steps 3, 4, 5 (lr changes at 4)
        train_job(X, LABELS)
    uninterrupted = values()

    flow.clear_default_session()
    train_job, predict_job = make_jobs()
    check_point = flow.train.CheckPoint()
    check_point.load(str(path))          # before any job call, as OneFlow programs do
    # as in OneFlow, the load first traced every job: all variables (the momentum too) are declared
    assert {"dense-weight", "dense-bias", "dense-weight-momentum", "dense-bias-momentum"} <= \
        set(default_session().variables)
    assert not default_session().pending_values
    logits_after = predict_job(X)
    assert logits_after.tobytes() == logits_before.tobytes()
    assert default_session().train_steps == {"train_job": 3}
    for _ in range(3):
        train_job(X, LABELS)
    assert default_session().train_steps == {"train_job": 6}
    assert_same_bits(values(), uninterrupted)


def test_load_after_the_first_call_writes_in_place(tmp_path):
    train_job, predict_job = make_jobs()
    train_job(X, LABELS)
    trained_logits = predict_job(X)
    flow.checkpoint.save(tmp_path / "m")
    train_job(X, LABELS)
    train_job(X, LABELS)
    weight_array = default_session().variables["dense-weight"].value
    loaded = predict_job.loaded
    flow.train.CheckPoint().load(tmp_path / "m")
    assert default_session().variables["dense-weight"].value is weight_array     # same storage
    assert predict_job(X).tobytes() == trained_logits.tobytes()                 # no retrace, new values
    assert predict_job.loaded is loaded
    assert default_session().train_steps == {"train_job": 1}


# ---------------------------------------------------------------------------------------------
# The files on disk
# ---------------------------------------------------------------------------------------------
def test_files_on_disk_follow_oneflow_format(tmp_path):
    train_job, _ = make_jobs()
    train_job(X, LABELS)
    train_job(X, LABELS)
    path = tmp_path / "model"
    flow.checkpoint.save(str(path))
    assert (path / "snapshot_done").is_file() and (path / "snapshot_done").stat().st_size == 0
    assert sorted(p.name for p in path.iterdir()) == sorted([
        "dense-weight", "dense-bias", "dense-weight-momentum", "dense-bias-momentum",
        "System-Train-TrainStep-train_job", "snapshot_done"])
    assert (path / "dense-weight" / "meta").read_text() == \
        "VariableMetaInfo { shape { dim: 4 dim: 8 } data_type: kFloat }"
    assert (path / "dense-bias" / "meta").read_text() == "VariableMetaInfo { shape { dim: 4 } data_type: kFloat }"
    assert (path / "dense-weight" / "out").stat().st_size == OUT * IN * 4
    raw = (path / "dense-weight" / "out").read_bytes()
    np.testing.assert_array_equal(np.frombuffer(raw, dtype="<f4").reshape(OUT, IN), values()["dense-weight"])
    step = path / "System-Train-TrainStep-train_job"
    assert (step / "meta").read_text() == "VariableMetaInfo { shape { } data_type: kInt64 }"
    assert np.frombuffer((step / "out").read_bytes(), dtype="<i8").tolist() == [2]
    assert [p.name for p in tmp_path.iterdir()] == ["model"]           # no temporary folder left


def test_meta_text_for_other_dtypes():
    assert ckpt.format_meta((2, 3), "float64") == "VariableMetaInfo { shape { dim: 2 dim: 3 } data_type: kDouble }"
    for dtype, name in [("int8", "kInt8"), ("int32", "kInt32"), ("int64", "kInt64"), ("uint8", "kUInt8")]:
        assert ckpt.format_meta((5,), dtype).endswith(f"data_type: {name} }}")
        assert ckpt.parse_meta(ckpt.format_meta((5,), dtype), "v", "here").dtype == dtype
    # protobuf's multi-line text format (what OneFlow's text_format writes) reads the same
    multi = "shape {\n  dim: 512\n  dim: 784\n}\ndata_type: kFloat\n"
    parsed = ckpt.parse_meta(multi, "v", "here")
    assert parsed.shape == (512, 784) and parsed.dtype == "float32"


def test_legacy_folder_without_meta_loads_before_and_after_declaration(tmp_path):
    job = make_small_job()
    x = np.arange(4, dtype=np.float32)
    expected = job(x)
    flow.checkpoint.save(tmp_path / "m")
    os.remove(tmp_path / "m" / "w" / "meta")
    saved_w = values()["w"]

    flow.clear_default_session()
    job = make_small_job()
    flow.train.CheckPoint().load(tmp_path / "m")          # shape unknown until the job declares `w`
    assert job(x).tobytes() == expected.tobytes()

    flow.clear_default_session()
    job = make_small_job()
    flow.train.CheckPoint().init()
    job(x)
    default_session().variables["w"].value[...] = 0
    flow.train.CheckPoint().load(tmp_path / "m")          # declared: shape from the session
    assert values()["w"].tobytes() == saved_w.tobytes()
    assert flow.checkpoint.get(tmp_path / "m")["w"].numpy().tobytes() == saved_w.tobytes()


def test_legacy_value_with_wrong_size_fails_at_declaration(tmp_path):
    make_small_job((3, 4))(np.zeros(4, np.float32))
    flow.checkpoint.save(tmp_path / "m")
    os.remove(tmp_path / "m" / "w" / "meta")
    flow.clear_default_session()
    flow.train.CheckPoint().load(tmp_path / "m")
    with pytest.raises(flow.FlowError, match=r"'w'.*\[2, 4\].*32 bytes.*48 bytes"):
        make_small_job((2, 4))(np.zeros(4, np.float32))


# ---------------------------------------------------------------------------------------------
# Saving safely
# ---------------------------------------------------------------------------------------------
def test_interrupted_save_leaves_nothing(tmp_path, monkeypatch):
    train_job, _ = make_jobs()
    train_job(X, LABELS)
    real_write = ckpt._write_variable
    written = []

    def fail_after_first(folder, name, value, dtype):
        if written:
            raise OSError("disk full (simulated)")
        real_write(folder, name, value, dtype)
        written.append(name)

    monkeypatch.setattr(ckpt, "_write_variable", fail_after_first)
    path = tmp_path / "model"
    with pytest.raises(OSError, match="simulated"):
        flow.checkpoint.save(path)
    assert written                                   # it did start writing
    assert not path.exists()
    assert list(tmp_path.iterdir()) == []            # the temporary folder is gone too
    monkeypatch.undo()
    flow.checkpoint.save(path)                       # and a later save works
    assert (path / "snapshot_done").exists()


def test_save_into_non_empty_folder_is_an_error(tmp_path):
    make_small_job()(np.zeros(4, np.float32))
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "something").write_text("keep me")
    with pytest.raises(flow.FlowError, match="not empty"):
        flow.checkpoint.save(tmp_path / "taken")
    assert (tmp_path / "taken" / "something").read_text() == "keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]
    (tmp_path / "empty").mkdir()                     # an existing empty folder is fine
    flow.checkpoint.save(tmp_path / "empty")
    assert (tmp_path / "empty" / "w" / "out").exists()


# ---------------------------------------------------------------------------------------------
# Loading checks everything and names the variable
# ---------------------------------------------------------------------------------------------
def test_corrupted_out_size_names_the_variable(tmp_path):
    job = make_small_job()
    x = np.ones(4, np.float32)
    job(x)
    flow.checkpoint.save(tmp_path / "m")
    with open(tmp_path / "m" / "w" / "out", "r+b") as f:
        f.truncate(40)
    before = values()["w"]
    with pytest.raises(flow.FlowError, match=r"'w'.*40 bytes, expected 48"):
        flow.train.CheckPoint().load(tmp_path / "m")
    assert values()["w"].tobytes() == before.tobytes()          # a failed load changes nothing
    flow.clear_default_session()
    with pytest.raises(flow.FlowError, match=r"'w'.*40 bytes, expected 48"):   # checked even before declaration
        flow.train.CheckPoint().load(tmp_path / "m")


def test_shape_mismatch_names_the_variable(tmp_path):
    make_small_job((3, 4))(np.ones(4, np.float32))
    flow.checkpoint.save(tmp_path / "m")
    flow.clear_default_session()
    make_small_job((5, 4))(np.ones(4, np.float32))
    with pytest.raises(flow.FlowError, match=r"'w' has shape \[3, 4\] but is declared with shape \[5, 4\]"):
        flow.train.CheckPoint().load(tmp_path / "m")
    flow.clear_default_session()
    flow.train.CheckPoint().load(tmp_path / "m")               # pending: checked at declaration
    with pytest.raises(flow.FlowError, match=r"'w' is declared with shape \[5, 4\].*has shape \[3, 4\]"):
        make_small_job((5, 4))(np.ones(4, np.float32))


def test_checkpoint_without_snapshot_done_is_incomplete(tmp_path):
    make_small_job()(np.ones(4, np.float32))
    flow.checkpoint.save(tmp_path / "m")
    os.remove(tmp_path / "m" / "snapshot_done")
    with pytest.raises(flow.FlowError, match="incomplete"):
        flow.train.CheckPoint().load(tmp_path / "m")
    with pytest.raises(flow.FlowError, match="no such folder"):
        flow.train.CheckPoint().load(tmp_path / "missing")


# ---------------------------------------------------------------------------------------------
# flow.checkpoint.get, flow.load_variables, flow.get_all_variables, CheckPoint.init
# ---------------------------------------------------------------------------------------------
def test_get_and_load_variables_round_trip(tmp_path):
    train_job, predict_job = make_jobs()
    for _ in range(2):
        train_job(X, LABELS)
    expected_logits = predict_job(X)
    saved = values()
    flow.checkpoint.save(tmp_path / "m")

    got = flow.checkpoint.get(tmp_path / "m")
    assert set(got) == set(saved) | {"System-Train-TrainStep-train_job"}
    assert got["dense-weight"].shape == (OUT, IN) and got["dense-weight"].dtype == "float32"
    os.remove(tmp_path / "m" / "dense-bias" / "out")            # read lazily: only .numpy() reads
    with pytest.raises(OSError):
        got["dense-bias"].numpy()

    flow.clear_default_session()
    train_job, predict_job = make_jobs()
    predict_job(X)
    flow.load_variables({"dense-weight": got["dense-weight"], "dense-bias": saved["dense-bias"]})
    assert predict_job(X).tobytes() == expected_logits.tobytes()
    with pytest.raises(flow.FlowError, match="'nonexistent' is not declared"):
        flow.load_variables({"nonexistent": np.zeros(3, np.float32)}, ignore_mismatch=False)
    with pytest.raises(flow.FlowError, match=r"'dense-bias' has shape \[3\].*\[4\]"):
        flow.load_variables({"dense-bias": np.zeros(3, np.float32)})
    flow.load_variables({"nonexistent": np.zeros(3, np.float32)})   # ignored until something declares it


def test_get_all_variables_returns_copies_of_current_values():
    train_job, predict_job = make_jobs()
    predict_job(X)                   # the session's first call traces both jobs, as OneFlow's does
    initial = values()
    assert sorted(initial) == ["dense-bias", "dense-bias-momentum", "dense-weight", "dense-weight-momentum"]
    train_job(X, LABELS)
    now = flow.get_all_variables()
    session = default_session()
    for name, v in now.items():
        np.testing.assert_array_equal(v.numpy(), session.variables[name].value)
    assert np.any(now["dense-weight"].numpy() != initial["dense-weight"])
    copy = now["dense-weight"].numpy()
    copy[...] = 123
    assert not np.any(session.variables["dense-weight"].value == 123)
    train_job(X, LABELS)                                        # a snapshot: later steps do not change it
    assert now["dense-weight"].numpy().tobytes() != session.variables["dense-weight"].value.tobytes()


def test_init_resets_in_place_and_compiled_jobs_see_it():
    train_job, predict_job = make_jobs()
    flow.train.CheckPoint().init()                  # before any call: traces the jobs, initializes their variables
    initial_logits = predict_job(X)
    initial = values()
    for _ in range(3):
        train_job(X, LABELS)
    assert predict_job(X).tobytes() != initial_logits.tobytes()
    loaded = (train_job.loaded, predict_job.loaded)
    compilations = flow.compile_cache_stats()["compilations"]
    arrays = {name: slot.value for name, slot in default_session().variables.items()}
    flow.train.CheckPoint().init()
    assert all(default_session().variables[n].value is a for n, a in arrays.items())
    assert predict_job(X).tobytes() == initial_logits.tobytes()
    now = values()
    for name in initial:
        assert now[name].tobytes() == initial[name].tobytes(), name
    assert not np.any(now["dense-weight-momentum"])
    assert default_session().train_steps == {}
    assert (train_job.loaded, predict_job.loaded) == loaded
    assert flow.compile_cache_stats()["compilations"] == compilations


def test_init_forgets_values_loaded_for_undeclared_variables(tmp_path):
    job = make_small_job()
    x = np.ones(4, np.float32)
    first = job(x)
    default_session().variables["w"].value[...] = 2
    flow.checkpoint.save(tmp_path / "m")
    flow.clear_default_session()
    job = make_small_job()
    check_point = flow.train.CheckPoint()
    check_point.load(tmp_path / "m")
    check_point.init()
    assert job(x).tobytes() == first.tobytes()


def test_save_before_first_call_keeps_loaded_values(tmp_path):
    job = make_small_job()
    x = np.ones(4, np.float32)
    expected = job(x)
    flow.checkpoint.save(tmp_path / "a")
    flow.clear_default_session()
    flow.train.CheckPoint().load(tmp_path / "a")
    flow.checkpoint.save(tmp_path / "b")            # nothing declared yet: the loaded values are saved
    flow.clear_default_session()
    flow.train.CheckPoint().load(tmp_path / "b")
    assert make_small_job()(x).tobytes() == expected.tobytes()


def test_a_checkpoint_folder_name_too_long_for_the_save_is_a_clear_error(tmp_path):
    # the save writes `.<name>.saving-<host>-<pid>-<hex>` first: a 250-byte name fits the limit, that does not
    too_long = tmp_path / ("m" * 250)
    with pytest.raises(ckpt.CheckpointError, match="its folder name is 250 bytes long; a save first writes a "
                                                   "temporary folder"):
        flow.checkpoint.save(str(too_long), {"w": np.ones(3, np.float32)})
    assert not too_long.exists() and not os.listdir(tmp_path)
    fits = tmp_path / ("m" * 100)
    flow.checkpoint.save(str(fits), {"w": np.ones(3, np.float32)})
    assert (fits / "w" / "out").exists()
