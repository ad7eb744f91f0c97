"""The model zoo's PyTorch side for issue 15's closing figures: torch_models.py's ResNet (memory.py's
resnet rows) and examples/models/torch_compile_figures.py (torch.compile's compile time)."""
from __future__ import annotations

import dataclasses
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "examples" / "models"


def _import(name: str):
    if str(MODELS) not in sys.path:
        sys.path.insert(0, str(MODELS))
    return __import__(name)


def test_the_command_line_takes_model_config_targets_and_a_positive_timeout():
    figures = _import("torch_compile_figures")
    args = figures.parse_args([])
    assert args.targets == ["bert:base", "resnet:resnet50", "wide_and_deep:large", "dcgan:mnist"]
    assert args.timeout == 900.0
    assert figures.parse_args(["dcgan:tiny", "--timeout", "60"]).targets == ["dcgan:tiny"]
    for bad in (["lenet:tiny"], ["bert"], ["bert:base", "--timeout", "0"]):
        with pytest.raises(SystemExit):
            figures.parse_args(bad)


def test_wrapper_calls_counts_the_kernels_a_compiled_graph_runs():
    figures = _import("torch_compile_figures")
    source = ("cpp_fused_add_0 = async_compile.cpp_pybinding(['float*'], r'''\n"
              "extern \"C\" void kernel(float* x) { cpp_fused_not_a_call(x); }''')\n"
              "def call(args):\n"
              "    buf0 = empty_strided_cpu((4, 4), (4, 1), torch.float32)\n"
              "    cpp_fused_add_0(buf0)\n"
              "    extern_kernels.mm(buf0, buf0, out=buf1)\n"
              "    buf2 = torch.ops.mkldnn._convolution_pointwise.default(buf1, w, None, [0, 0])\n"
              "    aten.randint.low_out(0, 9, [2], out=buf3)\n"
              "    cpp_fused_relu_1(buf2)\n"
              "    return (buf2, )\n")
    assert figures.wrapper_calls(source) == (2, 3)
    assert figures.wrapper_calls("cpp_fused_add_0(buf0)\n") == (0, 0)       # no wrapper: not an output module


def test_a_failed_process_gives_a_row_that_says_why():
    figures = _import("torch_compile_figures")
    assert figures.row("bert:base", "timed out after 900 s", "not run") == \
        "| bert:base | timed out after 900 s | | | | | | |"
    cold = {"graphs": 2, "generated_calls": 10, "library_calls": 4, "first_s": 30.0, "first_cpu_s": 28.0,
            "step_s": 0.5}
    assert figures.row("dcgan:tiny", cold, {"first_s": 2.0, "first_cpu_s": 1.9}) == \
        "| dcgan:tiny | 2 | 10 + 4 | 30.0 | 28.0 | 0.50 | 29.5 | 2.0 (1.9 CPU) |"


def test_the_torch_resnet_has_the_flowc_configs_sizes_and_trains():
    torch = pytest.importorskip("torch", reason="the PyTorch models need the `bench` extra")
    resnet, torch_models = _import("resnet"), _import("torch_models")
    from benchmarks.peers import torch_resnet
    from benchmarks.workloads import ResNetShape
    config = resnet.CONFIGS["tiny"]
    shape = ResNetShape(**{f.name: getattr(config, f.name) for f in dataclasses.fields(ResNetShape)})
    model = torch_resnet.make_model(shape)
    # the flowc model's trainable variables: a weight per convolution, gamma and beta per batch norm, fc1001
    convs = 1 + sum(count * 3 for count in config.block_counts) + len(config.block_counts)
    assert sum(1 for _ in model.parameters()) == 3 * convs + 2
    losses = [torch_models.train_step("resnet", config)() for _ in range(2)]
    assert all(math.isfinite(loss) for loss in losses)
    assert abs(losses[0] - math.log(config.num_classes)) < 1.0        # a fresh network guesses evenly
    with pytest.raises(ValueError, match="data_format"):
        torch_models.train_step("resnet", dataclasses.replace(config, data_format="NHWC"))
    with pytest.raises(ValueError, match="model"):
        torch_models.train_step("lenet", config)
    del torch


@pytest.mark.slow
def test_torch_compile_figures_times_a_cold_and_a_warm_compile(tmp_path):
    pytest.importorskip("torch", reason="torch.compile needs the `bench` extra")
    figures = _import("torch_compile_figures")
    env = dict(figures.child_env(str(tmp_path)), PYTHONPATH=str(ROOT))
    runs = []
    for _ in range(2):
        done = subprocess.run([sys.executable, str(MODELS / "torch_compile_figures.py"), "--child", "dcgan:tiny"],
                              capture_output=True, text=True, timeout=600, env=env)
        assert done.returncode == 0, done.stderr[-2000:]
        runs.append(__import__("json").loads(done.stdout.strip().splitlines()[-1]))
    cold, warm = runs
    assert cold["fxgraph_misses"] > 0 and cold["generated_calls"] > 0 and cold["library_calls"] > 0
    assert warm["fxgraph_hits"] > 0 and warm["first_s"] < cold["first_s"]
    assert cold["step_s"] < cold["first_s"] and math.isfinite(cold["loss"])
    assert os.listdir(tmp_path)


def test_memory_takes_the_frameworks_to_compare():
    memory = _import("memory")
    args = memory.parse_args(["resnet:resnet50"])
    assert args.targets == ["resnet:resnet50"] and args.frameworks == ["flowc", "torch"]
    assert "resnet:resnet50" in memory.parse_args([]).targets
    assert memory.parse_args(["--frameworks", "torch,torch_compile", "bert:base"]).frameworks == \
        ["torch", "torch_compile"]
    for bad in (["--frameworks", "jax", "bert:base"], ["bert"]):
        with pytest.raises(SystemExit):
            memory.parse_args(bad)
