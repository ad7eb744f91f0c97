"""The programs of examples/oneflow_docs/ (OneFlow 0.3's documentation programs written for flowc) run
as scripts, the way a user runs them, and do what their page says."""
from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = ROOT / "examples" / "oneflow_docs"

pytestmark = pytest.mark.slow      # each program is a subprocess; the training ones take seconds


def run(script: str, cwd: pathlib.Path, *args: str) -> str:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, str(DOCS / script), *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, f"{script} failed:\n{proc.stderr[-3000:]}"
    return proc.stdout


def losses(output: str) -> list[float]:
    return [float(v) for v in re.findall(r"loss ([0-9.]+)", output)]


def test_every_program_is_listed_in_the_readme():
    readme = (DOCS / "README.md").read_text()
    programs = {p.name for p in DOCS.glob("*.py") if p.name != "lenet_model.py"}
    assert programs == set(re.findall(r"^\| `([a-z0-9_]+\.py)` \|", readme, re.MULTILINE))
    checked = readme[readme.index("## Pages and snippets checked"):]
    for program in programs:                 # the page-by-page table says which page each one serves
        assert f"`{program}`" in checked, program


def test_feed_numpy_returns_the_arrays_it_was_fed(tmp_path):
    assert "(32, 1, 28, 28) (32,)" in run("feed_numpy.py", tmp_path)


def test_the_old_training_style_learns(tmp_path):
    seen = losses(run("mlp_mnist.py", tmp_path))
    assert seen[-1] < seen[0] and seen[-1] < 1.0


def test_lenet_trains_saves_evaluates_and_predicts(tmp_path):
    model = str(tmp_path / "lenet_models_1")
    seen = losses(run("lenet_train.py", tmp_path, model))
    assert seen[-1] < seen[0]
    assert (tmp_path / "lenet_models_1" / "snapshot_done").exists()
    accuracy = float(re.search(r"accuracy: ([0-9.]+)%", run("lenet_eval.py", tmp_path, model)).group(1))
    assert accuracy > 70.0
    right = int(re.search(r"(\d+) of 20 right", run("lenet_test.py", tmp_path, model)).group(1))
    assert right >= 12


def test_a_saved_model_is_fine_tuned_with_one_more_layer(tmp_path):
    origin, extended = str(tmp_path / "mlp_models_1"), str(tmp_path / "mlp_ext_models_1")
    run("mlp_mnist_origin.py", tmp_path, origin)
    tuned = losses(run("mlp_mnist_finetune.py", tmp_path, origin, extended))
    assert tuned[-1] < 1.0
    assert (tmp_path / "mlp_ext_models_1" / "dense3-weight").is_dir()
    assert (tmp_path / "mlp_ext_models_1" / "dense1-weight").is_dir()


def test_watch_prints_the_relu_of_its_input(tmp_path):
    out = run("test_watch.py", tmp_path)
    numbers = [re.findall(r"-?[0-9.]+", line.split(":", 1)[1]) for line in out.splitlines()]
    given, relu = ([float(v) for v in row] for row in numbers)
    assert relu == [max(v, 0.0) for v in given]


def test_watch_diff_sees_one_gradient_per_step(tmp_path):
    out = run("test_watch_diff.py", tmp_path)
    assert re.search(r"^45 gradients watched$", out, re.MULTILINE)


def test_the_three_minute_quickstart_learns_with_adam(tmp_path):
    seen = losses(run("quickstart_in_3_min.py", tmp_path, "2"))
    assert seen[-1] < 0.5 * seen[0]


def test_lenet_of_0_3_trains_saves_with_checkpoint_save_and_loads_with_load_variables(tmp_path):
    model = str(tmp_path / "lenet_models_1")
    seen = losses(run("lenet_mnist_train.py", tmp_path, model))
    assert seen[-1] < seen[0]
    assert sorted(os.listdir(model)) == sorted(
        ["System-Train-TrainStep-train_job", "snapshot_done"]
        + [f"{layer}-{part}" for layer in ("conv1", "conv2", "dense1", "dense2") for part in ("bias", "weight")])
    accuracy = float(re.search(r"accuracy: ([0-9.]+)%", run("lenet_mnist_eval.py", tmp_path, model)).group(1))
    assert accuracy > 70.0
    right = int(re.search(r"(\d+) of 20 right", run("lenet_mnist_predict.py", tmp_path, model)).group(1))
    assert right >= 12


def test_build_nn_prints_placeholder_shapes_and_overloads_plus(tmp_path):
    out = run("build_nn.py", tmp_path)
    assert "conv1: (100, 32, 28, 28) flow.float32" in out
    assert "output + fc2_biases == flow.math.add(output, fc2_biases)" in out


def test_concepts_both_logical_views_compute_the_same(tmp_path):
    out = run("concepts.py", tmp_path)
    assert "mirrored: images (32, 1, 28, 28) flow.float32, labels (32,) flow.int32, logits (32, 10)" in out
    assert re.search(r"loss [0-9.]+ in both views", out)


def test_every_optimizer_and_schedule_of_the_optimizer_page_trains(tmp_path):
    out = run("optimizer_config.py", tmp_path)
    trained = re.findall(r"^(.+): loss ([0-9.]+) -> ([0-9.]+)$", out, re.MULTILINE)
    assert len(trained) == 7
    for title, first, last in trained:
        assert float(last) < float(first), title
    assert "eval after training" in out


def test_model_load_save_snippets(tmp_path):
    out = run("model_load_save.py", tmp_path, str(tmp_path))
    assert "after load_variables: [[1.0, 1.0, 1.0], [1.0, 1.0, 1.0], [1.0, 1.0, 1.0]]" in out
    assert "saved with var_dict: conv1-weight snapshot_done" in out
    assert "saving again fails: CheckpointError" in out
    everything = set(os.listdir(tmp_path / "models_all"))
    assert {"myblob", "conv1-weight", "snapshot_done", "System-Train-TrainStep-train_job"} <= everything
    assert (tmp_path / "models_all" / "myblob" / "meta").is_file()
    assert (tmp_path / "models_all" / "myblob" / "out").stat().st_size == 9 * 4


def test_a_job_function_is_defined_once_and_called_like_a_function(tmp_path):
    out = run("job_function_define_call.py", tmp_path)
    assert "defined: loss (100,) flow.float32" in out
    assert out.count("defined:") == 1                # traced once, called many times
    seen = losses(out)
    assert len(seen) == 6 and seen[-1] < seen[0]
