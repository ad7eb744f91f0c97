"""The model zoo's ResNets (examples/models/resnet.py, issue 15) train and agree with the oracle.

On the tiny configs (a bottleneck ResNet and a basic-block one, few channels, 32x32 images):

* the loss falls over a few steps on a fixed synthetic batch;
* one compiled train step (loss, every variable, momentum buffer and batch-norm moving statistic
  after it) equals the same step of the job's graph on the NumPy reference executor;
* a predict job run from a saved OneFlow-format checkpoint, in a fresh session, returns what it
  returned before saving;
* NHWC jobs given the NCHW jobs' weights (conv weights transposed to (out, kh, kw, in)) and the
  transposed images compute the same predictions, loss and updates;
* the command line (`--config tiny --steps N --save DIR`) trains, prints its bar and saves.

The full-size ResNet-50 (224x224) and ResNet-18 (32x32, batch 32) are in the slow tier.
"""
# (no `from __future__ import annotations`: the job functions' placeholder annotations are local names)

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import flow
from flowc.compiler.reference import run_reference
from flowc.runtime.job import _runtime_scalars
from flowc.runtime.session import default_session

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "examples" / "models"
sys.path.insert(0, str(MODELS))

import resnet  # noqa: E402

TINY = resnet.CONFIGS["tiny"]
TINY18 = resnet.CONFIGS["tiny18"]
MUST_MOVE = ("Resnet-conv1-weight", "Resnet-res2_0_branch2a-weight", "Resnet-res3_0_branch2b-weight",
             "Resnet-res2_0_branch2c_bn-gamma", "Resnet-res3_0_branch1-weight", "Resnet-fc1001-weight",
             "Resnet-conv1_bn-moving_mean", "Resnet-res5_0_branch2c_bn-moving_variance")


def _values(names) -> dict[str, np.ndarray]:
    flow.sync_default_session()
    return {name: default_session().value(name).copy() for name in names}


def _step_against_reference(train, batch, rtol: float, atol: float) -> tuple[float, dict[str, np.ndarray]]:
    """One compiled step of `train` against the reference executor from the same values; returns the
    loss and the variables after the step."""
    traced = train._trace(default_session())
    graph = traced.graph
    before = _values(graph.variables)
    step = default_session().train_steps.get(train.name, 0)
    want, updates = run_reference(graph, batch, before, _runtime_scalars(traced, step))
    got = train(*batch)
    np.testing.assert_allclose(got, want[0], rtol=rtol, atol=atol, err_msg="loss")
    after = _values(graph.variables)
    assert updates, "the train job assigns no variable"
    for name, value in updates.items():
        np.testing.assert_allclose(after[name], value, rtol=rtol, atol=atol, err_msg=name)
    return got.item(), after


def _nhwc(name: str, value: np.ndarray) -> np.ndarray:
    """A variable of the NCHW model as the NHWC model holds it: conv weights (out, kh, kw, in)."""
    return np.ascontiguousarray(value.transpose(0, 2, 3, 1)) if value.ndim == 4 else value


# ------------------------------------------------------------------------------------------- model

def test_variables_have_oneflow_benchmark_names():
    train, _ = resnet.make_jobs(TINY)
    names = set(train._trace(default_session()).graph.variables)
    for name in ("Resnet-conv1-weight", "Resnet-conv1_bn-gamma", "Resnet-conv1_bn-beta",
                 "Resnet-conv1_bn-moving_mean", "Resnet-conv1_bn-moving_variance",
                 "Resnet-res2_0_branch1-weight", "Resnet-res2_0_branch2a-weight", "Resnet-res2_0_branch2b_bn-gamma",
                 "Resnet-res2_1_branch2c-weight", "Resnet-res5_0_branch1_bn-beta", "Resnet-fc1001-weight",
                 "Resnet-fc1001-bias", "Resnet-conv1-weight-momentum"):
        assert name in names, name
    assert "Resnet-res2_1_branch1-weight" not in names       # identity shortcut: same width, stride 1
    shapes = {n: t.shape for n, t in train._trace(default_session()).graph.variables.items()}
    assert shapes["Resnet-conv1-weight"] == (TINY.stem_filters, 3, 7, 7)
    assert shapes["Resnet-res3_0_branch2b-weight"] == (8, 8, 3, 3)          # v1.5: the stride on the 3x3
    assert shapes["Resnet-fc1001-weight"] == (TINY.num_classes, TINY.block_filters[-1])


def test_batch_norm_in_a_namespace_updates_its_moving_statistics():
    """flow.layers.batch_normalization under flow.scope.namespace assigns the namespaced variables."""
    x_t = flow.typing.Numpy.Placeholder((6, 3, 2, 2))

    @flow.global_function(type="train")
    def bn_train(x: x_t) -> flow.typing.Numpy:
        with flow.scope.namespace("block"):
            y = flow.layers.batch_normalization(x, axis=1, momentum=0.75, name="bn")
        loss = flow.math.reduce_mean(y * y)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1])).minimize(loss)
        return loss

    x = np.random.default_rng(0).standard_normal((6, 3, 2, 2)).astype(np.float32) * 2 + 1
    bn_train(x)
    got = _values(["block-bn-moving_mean", "block-bn-moving_variance"])
    np.testing.assert_allclose(got["block-bn-moving_mean"], 0.25 * x.mean(axis=(0, 2, 3)), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["block-bn-moving_variance"], 0.75 + 0.25 * x.var(axis=(0, 2, 3), ddof=1),  # unbiased
                               rtol=1e-5)


def test_smoothed_labels_are_oneflow_benchmarks():
    @flow.global_function(type="predict")
    def smooth(labels: flow.typing.Numpy.Placeholder((3,), dtype=flow.int32)) -> flow.typing.Numpy:
        return resnet.smoothed_labels(labels, replace(TINY, num_classes=4))

    got = smooth(np.array([0, 3, 1], np.int32))
    want = np.full((3, 4), 0.1 / 4, np.float32)
    want[[0, 1, 2], [0, 3, 1]] = 0.9 + 0.1 / 4
    np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("config", [TINY, TINY18], ids=["bottleneck", "basic"])
def test_one_step_equals_the_reference_executor(config):
    train, _ = resnet.make_jobs(config, total_steps=20, warmup_steps=1)
    batch = resnet.synthetic_batch(config, seed=1)
    train(*batch)                   # step 0: a zero learning rate (warmup from 0)
    train(*batch)                   # step 1: the zero-initialised last gammas of each block move
    before = _values(train._trace(default_session()).graph.variables)
    _, after = _step_against_reference(train, batch, rtol=5e-4, atol=5e-5)
    names = MUST_MOVE if config.block == "bottleneck" else [n.replace("2c", "2b") for n in MUST_MOVE]
    for name in names:
        assert not np.array_equal(after[name], before[name]), f"{name} did not move"


def test_loss_decreases():
    train, _ = resnet.make_jobs(TINY, total_steps=20, warmup_steps=2)
    batch = resnet.synthetic_batch(TINY, seed=2)
    losses = [train(*batch).item() for _ in range(12)]
    assert np.all(np.isfinite(losses))
    assert losses[-1] < 0.7 * losses[0], losses


def test_predict_from_a_checkpoint_equals_predict_before_saving(tmp_path):
    train, predict = resnet.make_jobs(TINY, total_steps=20, warmup_steps=1)
    batch = resnet.synthetic_batch(TINY, seed=3)
    for _ in range(3):              # trained values and moving statistics, not the initial ones
        train(*batch)
    before = predict(*batch)
    flow.checkpoint.save(tmp_path / "resnet_tiny")
    assert (tmp_path / "resnet_tiny" / "Resnet-res2_0_branch2a_bn-moving_variance" / "out").is_file()
    flow.clear_default_session()
    _, fresh_predict = resnet.make_jobs(TINY)
    flow.load_variables(flow.checkpoint.get(tmp_path / "resnet_tiny"))
    after = fresh_predict(*batch)
    np.testing.assert_array_equal(after, before)
    np.testing.assert_allclose(after.sum(axis=1), 1.0, rtol=1e-5)


def test_nhwc_equals_nchw_on_the_same_weights():
    train, predict = resnet.make_jobs(TINY, total_steps=20, warmup_steps=1)
    images, labels = resnet.synthetic_batch(TINY, seed=4)
    for _ in range(2):
        train(images, labels)
    weights = {name: v.numpy() for name, v in flow.get_all_variables().items()}
    want_predict = predict(images, labels)
    want_loss = train(images, labels).item()
    want_after = {name: v.numpy() for name, v in flow.get_all_variables().items()}
    flow.clear_default_session()

    nhwc = replace(TINY, data_format="NHWC")
    train_nhwc, predict_nhwc = resnet.make_jobs(nhwc, total_steps=20, warmup_steps=1)
    flow.load_variables({name: _nhwc(name, value) for name, value in weights.items()}, ignore_mismatch=False)
    images_nhwc = np.ascontiguousarray(images.transpose(0, 2, 3, 1))
    np.testing.assert_allclose(predict_nhwc(images_nhwc, labels), want_predict, rtol=1e-4, atol=1e-6)
    default_session().train_steps[train_nhwc.name] = 2         # the NCHW job's step 2, same learning rate
    assert train_nhwc(images_nhwc, labels).item() == pytest.approx(want_loss, rel=1e-4)
    got_after = {name: v.numpy() for name, v in flow.get_all_variables().items()}
    for name, value in want_after.items():
        np.testing.assert_allclose(got_after[name], _nhwc(name, value), rtol=1e-3, atol=1e-5, err_msg=name)


# ------------------------------------------------------------------------------------ command line

def test_the_command_line_trains_prints_the_bar_and_saves(tmp_path, capsys):
    assert resnet.main(["--config", "tiny", "--steps", "3", "--save", str(tmp_path / "ckpt")]) == 0
    err = capsys.readouterr().err
    assert "resnet-tiny [" in err and "3/3" in err and "steps/s" in err
    assert (tmp_path / "ckpt" / "Resnet-fc1001-weight" / "meta").is_file()


def test_the_command_line_refuses_a_bad_image_size():
    with pytest.raises(SystemExit):
        resnet.main(["--config", "tiny", "--image-size", "-3"])


# ------------------------------------------------------------------------------------------- slow

@pytest.mark.slow
def test_resnet50_predicts_at_full_size_like_the_reference_and_nhwc():
    config = replace(resnet.CONFIGS["resnet50"], batch_size=1)
    _, predict = resnet.make_jobs(config)
    images, labels = resnet.synthetic_batch(config, seed=5)
    got = predict(images, labels)
    assert got.shape == (1, 1000) and np.all(np.isfinite(got))
    traced = predict._trace(default_session())
    values = _values(traced.graph.variables)
    want, _ = run_reference(traced.graph, [images, labels], values, _runtime_scalars(traced, 0))
    np.testing.assert_allclose(got, want[0], rtol=1e-3, atol=1e-6)
    flow.clear_default_session()
    _, predict_nhwc = resnet.make_jobs(replace(config, data_format="NHWC"))
    flow.load_variables({name: _nhwc(name, value) for name, value in values.items()}, ignore_mismatch=False)
    np.testing.assert_allclose(predict_nhwc(np.ascontiguousarray(images.transpose(0, 2, 3, 1)), labels), got,
                               rtol=1e-3, atol=1e-6)


@pytest.mark.slow
def test_resnet18_trains_at_its_benchmark_size():
    config = resnet.CONFIGS["resnet18"]
    train, _ = resnet.make_jobs(config, total_steps=10, warmup_steps=1)
    batch = resnet.synthetic_batch(config, seed=6)
    losses = [train(*batch).item() for _ in range(6)]
    assert np.all(np.isfinite(losses))
    assert losses[-1] < losses[1], losses


@pytest.mark.slow
def test_the_script_runs_as_a_command():
    done = subprocess.run([sys.executable, str(MODELS / "resnet.py"), "--config", "tiny", "--steps", "2",
                           "--data-format", "NHWC"], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "2/2" in done.stderr and "steps/s" in done.stderr
