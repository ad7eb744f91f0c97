"""The model zoo's BERT and Wide & Deep (examples/models/, issue 15) train and agree with the oracle.

For the tiny config of each model:

* the loss falls over a few steps on a fixed synthetic batch;
* one compiled train step (loss and every variable and optimizer state after it) equals the same
  step of the job's graph on the NumPy reference executor;
* a predict job run from a saved OneFlow-format checkpoint, in a fresh session, returns what it
  returned before saving;
* the command line (`--config tiny --steps N`) runs and prints its progress bar with steps/s.

The small and base configs (slow tier) only have to train a couple of steps.
"""
from __future__ import annotations

import io
import os
import subprocess
import sys
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

import bert  # noqa: E402
import progress  # noqa: E402
import wide_and_deep  # noqa: E402

TINY_BERT = bert.CONFIGS["tiny"]
TINY_WDL = wide_and_deep.CONFIGS["tiny"]
BERT_WEIGHTS = ("bert-embeddings-word_embeddings", "bert-encoder-layer_0-attention-self-query-weight",
                "bert-encoder-layer_0-output-LayerNorm-gamma", "cls-seq_relationship-output_weights")


def _session_values(names) -> dict[str, np.ndarray]:
    flow.sync_default_session()
    return {name: default_session().value(name).copy() for name in names}


def _check_one_step_against_reference(train, batch, rtol: float, atol: float, must_move=()) -> None:
    """One compiled step of `train` from the session's current values, against the reference executor."""
    traced = train._trace(default_session())
    graph = traced.graph
    before = _session_values(graph.variables)
    step = default_session().train_steps.get(train.name, 0)      # the job's own step counter
    want, updates = run_reference(graph, batch, before, _runtime_scalars(traced, step))
    got = train(*batch)
    np.testing.assert_allclose(got, want[0], rtol=rtol, atol=atol, err_msg="loss")
    after = _session_values(graph.variables)
    assert updates, "the train job assigns no variable"
    moved = []
    for name, value in updates.items():
        np.testing.assert_allclose(after[name], value, rtol=rtol, atol=atol, err_msg=name)
        moved.append(not np.array_equal(value, before[name]))
    assert sum(moved) >= len(moved) // 2, "the step should move most variables"
    for name in must_move:
        assert not np.array_equal(updates[name], before[name]), f"{name} did not move"


# ----------------------------------------------------------------------------------------------- BERT

@pytest.fixture(scope="module")
def bert_jobs():
    flow.clear_default_session()
    train, predict = bert.make_jobs(TINY_BERT, "adamw", total_steps=20, base_lr=2e-3, warmup_steps=2)
    yield train, predict
    flow.clear_default_session()


def test_bert_variables_have_oneflow_benchmark_names(bert_jobs):
    train, _ = bert_jobs
    names = set(train._trace(default_session()).graph.variables)
    for name in ("bert-embeddings-word_embeddings", "bert-embeddings-token_type_embeddings",
                 "bert-embeddings-position_embeddings", "bert-embeddings-LayerNorm-gamma",
                 "bert-encoder-layer_0-attention-self-query-weight",
                 "bert-encoder-layer_1-attention-output-dense-bias",
                 "bert-encoder-layer_1-attention-output-LayerNorm-beta",
                 "bert-encoder-layer_0-intermediate-dense-weight", "bert-encoder-layer_1-output-LayerNorm-gamma",
                 "cls-predictions-transform-dense-weight", "cls-predictions-output_bias",
                 "bert-pooler-dense-weight", "cls-seq_relationship-output_weights"):
        assert name in names, name


def test_bert_one_step_equals_the_reference_executor(bert_jobs):
    train, _ = bert_jobs
    batch = bert.synthetic_batch(TINY_BERT, seed=1)
    train(*batch)                   # step 0 has a zero learning rate (warmup from 0): compare step 1
    _check_one_step_against_reference(train, batch, rtol=2e-4, atol=2e-5, must_move=BERT_WEIGHTS)


def test_bert_loss_decreases(bert_jobs):
    train, _ = bert_jobs
    batch = bert.synthetic_batch(TINY_BERT, seed=2)
    losses = [float(np.mean(train(*batch))) for _ in range(8)]
    assert np.all(np.isfinite(losses))
    assert losses[-1] < losses[0] - 0.1, losses


def test_bert_predict_from_a_checkpoint_equals_predict_before_saving(bert_jobs, tmp_path):
    train, predict = bert_jobs
    batch = bert.synthetic_batch(TINY_BERT, seed=3)
    for _ in range(3):              # trained values (past the warmup's zero rate), not the initial ones
        train(*batch)               # that a fresh session makes again from the names
    before = predict(*batch)
    flow.checkpoint.save(tmp_path / "bert_tiny")
    assert (tmp_path / "bert_tiny" / "bert-embeddings-word_embeddings" / "out").is_file()
    flow.clear_default_session()
    _, fresh_predict = bert.make_jobs(TINY_BERT, "adamw", total_steps=20)
    flow.load_variables(flow.checkpoint.get(tmp_path / "bert_tiny"))
    after = fresh_predict(*batch)
    for b, a in zip(before, after):
        np.testing.assert_array_equal(a, b)
    assert not np.allclose(after[0], 0.0)


def test_bert_lamb_trains():
    flow.clear_default_session()
    config = bert.replace(TINY_BERT, num_hidden_layers=1)
    train, _ = bert.make_jobs(config, "lamb", total_steps=10, base_lr=2e-3, warmup_steps=1)
    batch = bert.synthetic_batch(config, seed=4)
    train(*batch)
    _check_one_step_against_reference(train, batch, rtol=2e-4, atol=2e-5, must_move=BERT_WEIGHTS)
    losses = [float(np.mean(train(*batch))) for _ in range(5)]
    assert losses[-1] < losses[0], losses
    flow.clear_default_session()


# ------------------------------------------------------------------------------------------ Wide&Deep

@pytest.fixture(scope="module")
def wdl_jobs():
    flow.clear_default_session()
    train, predict = wide_and_deep.make_jobs(TINY_WDL)
    yield train, predict
    flow.clear_default_session()


def test_wide_and_deep_variables_have_oneflow_benchmark_names(wdl_jobs):
    train, _ = wdl_jobs
    names = set(train._trace(default_session()).graph.variables)
    assert {"wide_embedding", "deep_embedding", "fc1-weight", "fc1-bias", "fc3-weight",
            "wide_embedding-m", "deep_embedding-v"} <= names


def test_wide_and_deep_one_step_equals_the_reference_executor(wdl_jobs):
    train, _ = wdl_jobs
    _check_one_step_against_reference(train, wide_and_deep.synthetic_batch(TINY_WDL, seed=1), rtol=1e-4,
                                      atol=1e-6, must_move=("wide_embedding", "deep_embedding", "fc1-weight"))


def test_wide_and_deep_loss_decreases(wdl_jobs):
    train, _ = wdl_jobs
    batch = wide_and_deep.synthetic_batch(TINY_WDL, seed=2)
    losses = [float(np.mean(train(*batch))) for _ in range(10)]
    assert losses[-1] < 0.8 * losses[0], losses


def test_wide_and_deep_predict_from_a_checkpoint_equals_predict_before_saving(wdl_jobs, tmp_path):
    train, predict = wdl_jobs
    batch = wide_and_deep.synthetic_batch(TINY_WDL, seed=3)
    train(*batch)
    before = predict(*batch)
    flow.checkpoint.save(tmp_path / "wdl_tiny")
    flow.clear_default_session()
    _, fresh_predict = wide_and_deep.make_jobs(TINY_WDL)
    flow.load_variables(flow.checkpoint.get(tmp_path / "wdl_tiny"))
    after = fresh_predict(*batch)
    for b, a in zip(before, after):
        np.testing.assert_array_equal(a, b)
    assert np.all((after[1] > 0) & (after[1] < 1))


# ------------------------------------------------------------------------------------ command line

def test_the_progress_bar_reports_steps_per_second():
    out = io.StringIO()
    bar = progress.ProgressBar(4, stream=out, label="m")
    for i in range(4):
        bar.update(i + 1, loss=1.0 / (i + 1))
    bar.finish()
    lines = out.getvalue().splitlines()
    assert "1/4  -- steps/s" in lines[0]          # no rate from the first step alone (it compiles), not "nan"
    assert lines[-1].startswith("m [" + "#" * progress.ProgressBar.WIDTH + "] 4/4")
    assert "steps/s" in lines[-1] and "loss 0.2500" in lines[-1] and "first step" in lines[-1]
    assert bar.steps_per_second > 0


def test_the_command_line_trains_prints_the_bar_and_saves(tmp_path, capsys):
    flow.clear_default_session()
    assert wide_and_deep.main(["--config", "tiny", "--steps", "3", "--save", str(tmp_path / "ckpt")]) == 0
    err = capsys.readouterr().err
    assert "wide_and_deep-tiny [" in err and "3/3" in err and "steps/s" in err
    assert (tmp_path / "ckpt" / "deep_embedding" / "meta").is_file()
    flow.clear_default_session()


# ------------------------------------------------------------------------------------------- slow

@pytest.mark.slow
@pytest.mark.parametrize("name", ["small", "base"])
def test_bigger_bert_configs_train_a_step(name):
    flow.clear_default_session()
    config = bert.replace(bert.CONFIGS[name], batch_size=2)
    train, _ = bert.make_jobs(config, "lamb", total_steps=2)
    batch = bert.synthetic_batch(config)
    losses = [float(np.mean(train(*batch))) for _ in range(2)]
    assert np.all(np.isfinite(losses))
    flow.clear_default_session()


@pytest.mark.slow
def test_the_large_wide_and_deep_trains_a_step():
    flow.clear_default_session()
    config = wide_and_deep.CONFIGS["large"]
    train, _ = wide_and_deep.make_jobs(config)
    batch = wide_and_deep.synthetic_batch(config)
    losses = [float(np.mean(train(*batch))) for _ in range(2)]
    assert np.all(np.isfinite(losses))
    flow.clear_default_session()


@pytest.mark.slow
@pytest.mark.parametrize("script", ["bert.py", "wide_and_deep.py"])
def test_the_scripts_run_as_commands(script):
    done = subprocess.run([sys.executable, str(MODELS / script), "--config", "tiny", "--steps", "2"],
                          capture_output=True, text=True, timeout=300, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "2/2" in done.stderr and "steps/s" in done.stderr
