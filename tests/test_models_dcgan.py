"""The model zoo's DCGAN (examples/models/dcgan.py, issue 15): two train jobs sharing one session.

For the tiny config:

* the discriminator's loss falls when only it trains, and the generator's when only it trains (against
  a fixed discriminator);
* one compiled step of each train job (outputs, and every variable and optimizer state after it)
  equals the same step of the job's graph on the NumPy reference executor;
* the jobs share their variables: a discriminator step changes the discriminator the generator job
  sees (its loss is the reference's with the new values, not the old), and neither job moves the
  other's variables;
* the generator's predict job, run from a saved OneFlow-format checkpoint in a fresh session, returns
  what it returned before saving;
* the command line trains, prints its bar and saves.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import flow
from flowc.compiler.reference import run_reference
from flowc.runtime.job import _runtime_scalars
from flowc.runtime.session import default_session

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples" / "models"))

import dcgan  # noqa: E402

TINY = dcgan.CONFIGS["tiny"]
G_WEIGHTS = ("g_fc1-weight", "g_deconv1-weight", "g_deconv2-weight", "g_deconv3-weight", "g_bn1-gamma")
D_WEIGHTS = ("d_conv1-weight", "d_conv2-weight", "d_conv1-bias", "d_fc-weight")


def _values(names) -> dict[str, np.ndarray]:
    flow.sync_default_session()
    return {name: default_session().value(name).copy() for name in names}


def _reference_step(job, inputs):
    """(outputs, updates, values before) of the next step of `job` on the reference executor."""
    traced = job._trace(default_session())
    before = _values(traced.graph.variables)
    step = default_session().train_steps.get(job.name, 0)
    outputs, updates = run_reference(traced.graph, inputs, before, _runtime_scalars(traced, step))
    return outputs, updates, before


@pytest.fixture()
def jobs():
    flow.clear_default_session()
    yield dcgan.make_jobs(TINY)
    flow.clear_default_session()


def test_variables_have_oneflow_benchmark_names(jobs):
    g_vars = set(jobs.train_generator._trace(default_session()).graph.variables)
    d_vars = set(jobs.train_discriminator._trace(default_session()).graph.variables)
    for name in G_WEIGHTS + D_WEIGHTS + ("g_bn2-moving_mean", "g_bn3-beta"):
        assert name in g_vars and name in d_vars, name
    assert "g_deconv1-weight-m" in g_vars and "d_conv1-weight-m" in d_vars      # each job's own Adam state
    assert "d_conv1-weight-m" not in g_vars and "g_deconv1-weight-m" not in d_vars
    z = np.zeros((TINY.eval_size, TINY.z_dim), np.float32)
    assert jobs.eval_generator(z).shape == (TINY.eval_size, TINY.channels, TINY.image_size, TINY.image_size)


@pytest.mark.parametrize("which", ["train_discriminator", "train_generator"])
def test_one_step_of_each_job_equals_the_reference_executor(jobs, which):
    z, images = dcgan.synthetic_batch(TINY, seed=1)
    jobs.train_discriminator(z, images)                 # not the initial values: one step of each first
    jobs.train_generator(z)
    job = getattr(jobs, which)
    inputs = [z, images] if which == "train_discriminator" else [z]
    want, updates, before = _reference_step(job, inputs)
    got = job(*inputs)
    for i, (g, w) in enumerate(zip(got, want)):
        np.testing.assert_allclose(g, w, rtol=2e-4, atol=2e-5, err_msg=f"output {i}")
    after = _values(updates)
    for name, value in updates.items():
        np.testing.assert_allclose(after[name], value, rtol=2e-4, atol=2e-5, err_msg=name)
    trained = D_WEIGHTS if which == "train_discriminator" else G_WEIGHTS
    for name in trained:
        assert not np.array_equal(after[name], before[name]), f"{name} did not move"


def test_the_jobs_share_variables_and_leave_each_others_alone(jobs):
    z, images = dcgan.synthetic_batch(TINY, seed=2)
    jobs.train_generator(z)                             # both jobs traced, compiled and run once
    jobs.train_discriminator(z, images)
    old, _, _ = _reference_step(jobs.train_generator, [z])       # the G job's loss with today's D
    d_before = _values(D_WEIGHTS)
    g_before = _values(G_WEIGHTS + ("g_bn1-moving_mean",))
    jobs.train_discriminator(z, images)
    d_after = _values(D_WEIGHTS)
    assert all(not np.array_equal(d_after[n], d_before[n]) for n in D_WEIGHTS)
    for name, value in _values(g_before).items():                # the D job only reads the generator
        np.testing.assert_array_equal(value, g_before[name], err_msg=name)

    want, _, fresh = _reference_step(jobs.train_generator, [z])
    got_loss, _ = jobs.train_generator(z)
    np.testing.assert_allclose(got_loss, want[0], rtol=2e-4, atol=2e-5)
    assert abs(float(np.mean(want[0])) - float(np.mean(old[0]))) > 1e-4, "the D step should change the G job's loss"
    for name, value in _values(D_WEIGHTS).items():               # the G job only reads the discriminator
        np.testing.assert_array_equal(value, fresh[name], err_msg=name)


def test_the_discriminator_loss_falls_when_only_it_trains(jobs):
    z, images = dcgan.synthetic_batch(TINY, seed=3)
    losses = [float(np.mean(jobs.train_discriminator(z, images)[0])) for _ in range(12)]
    assert np.all(np.isfinite(losses))
    assert np.mean(losses[-3:]) < np.mean(losses[:3]) - 0.1, losses


def test_the_generator_loss_falls_against_a_fixed_discriminator(jobs):
    z, images = dcgan.synthetic_batch(TINY, seed=4)
    for _ in range(5):                      # a discriminator that tells real from fake a little
        jobs.train_discriminator(z, images)
    losses = [float(np.mean(jobs.train_generator(z)[0])) for _ in range(12)]
    assert np.all(np.isfinite(losses))
    assert np.mean(losses[-3:]) < np.mean(losses[:3]) - 0.05, losses


def test_predict_from_a_checkpoint_equals_predict_before_saving(jobs, tmp_path):
    z, images = dcgan.synthetic_batch(TINY, seed=5)
    for _ in range(3):
        jobs.train_discriminator(z, images)
        jobs.train_generator(z)
    eval_z = np.random.default_rng(6).standard_normal((TINY.eval_size, TINY.z_dim)).astype(np.float32)
    before = jobs.eval_generator(eval_z)
    flow.checkpoint.save(tmp_path / "dcgan_tiny")
    assert (tmp_path / "dcgan_tiny" / "g_deconv3-weight" / "out").is_file()
    assert (tmp_path / "dcgan_tiny" / "g_bn2-moving_variance" / "out").is_file()
    flow.clear_default_session()
    fresh = dcgan.make_jobs(TINY)
    flow.load_variables(flow.checkpoint.get(tmp_path / "dcgan_tiny"))
    after = fresh.eval_generator(eval_z)
    np.testing.assert_array_equal(after, before)
    assert np.all(np.abs(after) <= 1.0) and np.std(after) > 0


def test_the_command_line_trains_prints_the_bar_and_saves(tmp_path, capsys):
    flow.clear_default_session()
    assert dcgan.main(["--config", "tiny", "--steps", "3", "--save", str(tmp_path / "ckpt")]) == 0
    err = capsys.readouterr().err
    assert "dcgan-tiny [" in err and "3/3" in err and "steps/s" in err
    assert (tmp_path / "ckpt" / "d_fc-weight" / "meta").is_file()
    flow.clear_default_session()


@pytest.mark.slow
def test_the_mnist_sized_config_trains_a_step():
    flow.clear_default_session()
    config = dcgan.replace(dcgan.CONFIGS["mnist"], batch_size=4)
    jobs = dcgan.make_jobs(config)
    z, images = dcgan.synthetic_batch(config)
    d_loss, _, _ = jobs.train_discriminator(z, images)
    g_loss, fakes = jobs.train_generator(z)
    assert np.isfinite(d_loss).all() and np.isfinite(g_loss).all() and fakes.shape == (4, 1, 28, 28)
    flow.clear_default_session()
