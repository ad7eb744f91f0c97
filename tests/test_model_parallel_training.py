"""Model parallelism on 2 MPI processes (loopback, one thread per rank) against one process.

tests/distributed/train_models.py trains OneFlow's hybrid-parallel MLP (its output layer split by
unit, `model_distribute=flow.distribute.split(0)`) and mixed-parallel LeNet (its hidden layer split,
with dropout) on the same global batches, launched with `python` and with `mpiexec -n 2 python`.
Each rank holds and updates its rows of the split variables; the master gathers them for
`flow.get_all_variables()` and checkpoints, which must equal the one-process run's.
"""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("mpi4py")

from tests.test_distributed_training import MPIEXEC, run, same  # noqa: E402

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec (pip install 'flowc[distributed]')")]


@pytest.mark.parametrize("model", ["hybrid", "mixed"])
def test_a_model_parallel_layer_trains_on_two_ranks_as_in_one_process(model, tmp_path):
    run(1, model, "4", str(tmp_path / "one.npz"))
    two = run(2, model, "4", str(tmp_path / "two.npz"))
    same(tmp_path / "one.npz", tmp_path / "two.npz")      # losses, logits and every variable, gathered
    assert two.stdout.count(f"{model}: losses") == 1
    split = "output-weight" if model == "hybrid" else "dense1-weight"
    values = np.load(tmp_path / "two.npz")
    assert values[f"var:{split}"].shape == ((10, 64) if model == "hybrid" else (64, 1568))
    assert f"var:{split}-momentum" in values.files


@pytest.mark.parametrize("model", ["hybrid", "mixed"])
def test_a_model_parallel_layer_trains_on_a_batch_that_does_not_divide_over_the_ranks(model, tmp_path):
    """31 examples over 2 ranks (16 + 15): the exchanges move padded blocks of one size on both ranks."""
    run(1, model, "3", str(tmp_path / "one.npz"), "--batch", "31")
    run(2, model, "3", str(tmp_path / "two.npz"), "--batch", "31")
    same(tmp_path / "one.npz", tmp_path / "two.npz")


def test_a_job_reading_split_variables_whole_sees_every_ranks_rows(tmp_path):
    """The train job holds the output layer in slices; the predict job declares it without
    model_distribute and reads it whole, on every rank: the master gathers and resends it first."""
    run(1, "hybrid", "3", str(tmp_path / "one.npz"), "--whole-eval")
    run(2, "hybrid", "3", str(tmp_path / "two.npz"), "--whole-eval")
    same(tmp_path / "one.npz", tmp_path / "two.npz")


@pytest.mark.parametrize("saved_by, loaded_by", [(2, 1), (1, 2)])
def test_a_checkpoint_of_split_variables_moves_between_device_counts(saved_by, loaded_by, tmp_path):
    run(1, "hybrid", "5", str(tmp_path / "straight.npz"))
    run(saved_by, "hybrid", "3", str(tmp_path / "first.npz"), "--save", str(tmp_path / "ckpt"))
    # the logical variable is saved once, whole: a checkpoint does not depend on the device count
    saved = np.fromfile(tmp_path / "ckpt" / "output-weight" / "out", dtype=np.float32)
    assert saved.size == 10 * 64
    run(loaded_by, "hybrid", "2", str(tmp_path / "resumed.npz"), "--load", str(tmp_path / "ckpt"), "--skip", "3")
    a, b = np.load(tmp_path / "straight.npz"), np.load(tmp_path / "resumed.npz")
    for key in a.files:
        if key.startswith("var:") or key in ("logits", "mean_loss"):
            np.testing.assert_allclose(b[key], a[key], rtol=1e-5, atol=1e-5, err_msg=key)
    np.testing.assert_allclose(b["losses"], a["losses"][3:], rtol=1e-5, atol=1e-5)
