"""The `flowc` command through a subprocess, on the example modules: compile ahead of time, then a
run compiles nothing; every `show` mode prints what it promises; `graph` writes DOT; errors exit 2."""
from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow      # every test runs `flowc` in a new Python process

MLP = "examples/mlp_train_demo.py"
LENET_SEED = "examples/seeds/synchronize_single_job.py"
RUN_BOTH_JOBS = """
import json, sys
sys.path.insert(0, "examples")
import numpy as np, flow
import mlp_train_demo as demo
x = np.zeros((100, 1, 28, 28), np.float32); y = np.zeros(100, np.int32)
demo.train_job(x, y); demo.eval_job(x, y)
print(json.dumps(flow.compile_cache_stats()))
"""


def flowc(*args: str, cache: pathlib.Path, env: dict | None = None) -> subprocess.CompletedProcess:
    full_env = dict(os.environ, FLOWC_CACHE_DIR=str(cache), PYTHONPATH=str(ROOT), **(env or {}))
    return subprocess.run([sys.executable, "-m", "flowc", *args], cwd=ROOT, env=full_env,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> pathlib.Path:
    """One cache filled by `flowc compile` on the MLP module, shared by the show tests."""
    folder = tmp_path_factory.mktemp("flowc-cli-cache")
    done = flowc("compile", MLP, cache=folder)
    assert done.returncode == 0, done.stderr
    return folder


def test_compile_then_run_compiles_nothing(tmp_path):
    done = flowc("compile", MLP, "--cache-dir", str(tmp_path / "c"), cache=tmp_path / "unused")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    for job in ("train_job", "eval_job"):         # one progress line per job with every stage's time
        line = next(text for text in lines if text.startswith(job))
        assert all(stage in line for stage in ("trace", "passes", "codegen", "compile", "compiled"))
    assert "2 compiled, 0 already in the cache" in lines[-1]
    assert not (tmp_path / "unused").exists()      # --cache-dir wins over FLOWC_CACHE_DIR

    env = dict(os.environ, FLOWC_CACHE_DIR=str(tmp_path / "c"), PYTHONPATH=str(ROOT))
    run = subprocess.run([sys.executable, "-c", RUN_BOTH_JOBS], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    stats = json.loads(run.stdout.strip().splitlines()[-1])
    assert stats["compilations"] == 0 and stats["hits"] == 2

    again = flowc("compile", MLP, "-q", cache=tmp_path / "c")
    assert again.returncode == 0 and again.stdout == ""


def test_compile_verbose_shows_passes_and_cache_state(cache):
    done = flowc("compile", MLP, "--job", "eval_job", "-v", cache=cache)
    assert done.returncode == 0, done.stderr
    assert "eval_job" in done.stdout and "train_job" not in done.stdout
    assert "fuse_epilogues" in done.stdout and "cache hit" in done.stdout and "cached" in done.stdout


def test_show_passes_lists_every_pass_with_its_effect(cache):
    from flowc.compiler.stages import pass_names
    done = flowc("show", f"{MLP}:train_job", "--passes", cache=cache)
    assert done.returncode == 0, done.stderr
    for name in pass_names():
        assert re.search(rf"^\s+\d+ {name}\s+\d+\.\d+ ms  ", done.stdout, re.M), name
    assert "fused" in done.stdout and "arena" in done.stdout


def test_show_ir_after_each_pass_and_after_one(cache):
    from flowc.compiler.stages import pass_names
    every = flowc("show", f"{MLP}:eval_job", "--ir", cache=cache)
    assert every.returncode == 0, every.stderr
    assert [m for m in re.findall(r"^== eval_job after (\w+)", every.stdout, re.M)] == pass_names()
    one = flowc("show", f"{MLP}:eval_job", "--ir", "--after", "fuse_epilogues", cache=cache)
    assert one.returncode == 0, one.stderr
    assert "graph eval_job {" in one.stdout and "matmul_4_add_relu" in one.stdout   # a fused kernel
    assert "memory plan" not in one.stdout      # planned only by the last pass


def test_show_kernels_names_fused_groups_and_refusals(cache):
    done = flowc("show", f"{MLP}:train_job", "--kernels", cache=cache)
    assert done.returncode == 0, done.stderr
    assert "softmax_xent_fwd_bwd" in done.stdout and "matmul_4_add_relu" in done.stdout
    assert "epilogue add, relu" in done.stdout
    assert re.search(r"^not fused \(\d+\):\n  %\d+ .* not fused into its consumers: ", done.stdout, re.M)


def test_show_memory_peak_equals_the_plan(cache):
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import mlp_train_demo
        plan = mlp_train_demo.train_job.lower().memory_plan()
    finally:
        sys.path.remove(str(ROOT / "examples"))
    done = flowc("show", f"{MLP}:train_job", "--memory", cache=cache)
    assert done.returncode == 0, done.stderr
    assert f"arena peak {plan.peak_bytes} bytes" in done.stdout
    assert re.search(r"arena\+\d+ +\d+ B  kernels \d+\.\.\d+", done.stdout)      # offsets and lifetimes
    assert "variable hidden-weight" in done.stdout


def test_show_code_is_the_cached_source(cache):
    done = flowc("show", f"{MLP}:eval_job", "--code", cache=cache)
    assert done.returncode == 0, done.stderr
    assert 'extern "C" int flowc_step' in done.stdout and "matmul_4_add_relu" in done.stdout
    sources = [p.read_text() for p in cache.glob("??/*/kernel.cpp")]
    assert done.stdout.rstrip("\n") in [s.rstrip("\n") for s in sources]


def test_show_a_seed_module_with_gpu_placement(tmp_path):
    done = flowc("show", LENET_SEED, "--kernels", cache=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "conv2d" in done.stdout and "pool2d" in done.stdout


def _dot_is_consistent(text: str) -> None:
    assert text.startswith('digraph "train_job" {') and text.rstrip().endswith("}")
    assert text.count("{") == text.count("}")
    defined = set(re.findall(r"^\s+(n\d+) \[label=", text, re.M))
    used = {n for edge in re.findall(r"(n\d+) -> (n\d+);", text) for n in edge}
    assert used and used <= defined


def test_graph_writes_dot_with_roles_and_clusters(tmp_path):
    out = tmp_path / "train.dot"
    done = flowc("graph", f"{MLP}:train_job", "-o", str(out), cache=tmp_path)
    assert done.returncode == 0, done.stderr
    text = out.read_text()
    _dot_is_consistent(text)
    assert "subgraph cluster_" in text and "softmax_xent_fwd_bwd" in text
    for colour in ("#dbe9f6", "#fde0c5", "#d4efd4"):     # forward, backward and update nodes
        assert colour in text


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is not installed")
def test_graph_writes_svg_with_graphviz(tmp_path):
    out = tmp_path / "train.svg"
    done = flowc("graph", f"{MLP}:train_job", "-o", str(out), cache=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "<svg" in out.read_text()


def test_graph_svg_without_graphviz_says_how_to_install(tmp_path):
    out = tmp_path / "train.svg"
    done = flowc("graph", f"{MLP}:train_job", "-o", str(out), cache=tmp_path, env={"PATH": str(tmp_path)})
    assert done.returncode == 1
    assert "apt-get install graphviz" in done.stdout and not out.exists()
    _dot_is_consistent((tmp_path / "train.dot").read_text())


BROKEN_MODULES = {
    "syntax.py": ("def f(:\n    pass\n", r"syntax error in .*syntax\.py:1: "),
    "raises.py": ("import flow\n\ndef helper():\n    raise ValueError('no data here')\n\nhelper()\n",
                  r"importing .*raises\.py raised ValueError: no data here"),
    "nojobs.py": ("import flow\nX = 1\n", r"no @flow\.global_function found in .*nojobs\.py"),
}


@pytest.mark.parametrize("name", sorted(BROKEN_MODULES))
def test_broken_modules_exit_2_with_one_clear_line(tmp_path, name):
    source, message = BROKEN_MODULES[name]
    (tmp_path / name).write_text(source)
    done = flowc("compile", str(tmp_path / name), cache=tmp_path)
    assert done.returncode == 2
    assert re.search(rf"^flowc compile: error: {message}", done.stderr, re.M), done.stderr
    if name == "raises.py":          # the user's traceback, down to their line
        assert 'raises.py", line 4, in helper' in done.stderr and "importlib" not in done.stderr


@pytest.mark.parametrize("args, message", [
    (("compile", "examples/no_such_module.py"), "no such module file: examples/no_such_module.py"),
    (("show", f"{MLP}:no_such_job", "--passes"), "mlp_train_demo.py has no job 'no_such_job'; "
                                                 "its jobs are: train_job, eval_job"),
    (("compile", MLP, "--job", "nope"), "has no job 'nope'"),
    (("show", MLP, "--ir", "--after", "no_such_pass"), "unknown pass 'no_such_pass'; the passes are: simplify, "),
    (("graph", MLP, "-o", "x.dot"), "has 2 jobs (train_job, eval_job); name one"),
    (("graph", f"{MLP}:eval_job", "-o", "x.pdf"), "the file must end in .dot, .svg, .png"),
    (("graph", f"{MLP}:eval_job", "-o", "no_such_dir/x.dot"),
     "-o no_such_dir/x.dot: the folder no_such_dir does not exist; create it first"),
    (("graph", f"{MLP}:eval_job", "-o", "no_such_dir/x.svg"), "the folder no_such_dir does not exist"),
    (("graph", f"{MLP}:eval_job", "-o", "examples/x.dot/"), "-o examples/x.dot/: names a folder; give a file name"),
    (("graph", f"{MLP}:eval_job", "-o", "README.md/x.dot"), "README.md is not a folder"),
    (("compile", MLP, "--cache-dir", "README.md/cache"), "--cache-dir README.md/cache: README.md is not a folder"),
])
def test_usage_errors_exit_2(tmp_path, args, message):
    done = flowc(*args, cache=tmp_path)
    assert done.returncode == 2
    assert message in done.stderr.strip().splitlines()[-1]
    assert "Traceback" not in done.stderr


def test_graph_into_an_unwritable_place_is_one_line(tmp_path):
    out = tmp_path / "x.dot"
    out.mkdir()                                  # a folder where the file should go
    done = flowc("graph", f"{MLP}:eval_job", "-o", str(out), cache=tmp_path / "c")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1] == f"flowc graph: error: -o {out}: is a folder; give a file name"


def test_module_calling_os_exit_at_import_is_an_error_not_a_silent_success(tmp_path):
    (tmp_path / "quits.py").write_text("import os\nimport flow\n\nos._exit(0)\n")
    done = flowc("compile", str(tmp_path / "quits.py"), cache=tmp_path / "c")
    assert done.returncode == 2
    last = done.stderr.strip().splitlines()[-1]
    assert re.match(r"flowc compile: error: importing .*quits\.py called os\._exit\(0\), which would end "
                    r"flowc before it compiled anything", last), done.stderr
    assert 'quits.py", line 4, in <module>' in done.stderr and "refuse" not in done.stderr


def test_job_calling_os_exit_while_traced_is_an_error_naming_the_line(tmp_path):
    (tmp_path / "quits_later.py").write_text(
        "import os\nimport flow\nimport flow.typing as tp\n\n\n"
        "@flow.global_function(type='predict')\n"
        "def quitter(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:\n"
        "    os._exit(0)\n"
        "    return x\n")
    done = flowc("compile", str(tmp_path / "quits_later.py"), cache=tmp_path / "c")
    assert done.returncode == 2
    assert "error: quits_later.py:8: the job code called os._exit(0)" in done.stderr


def test_module_forking_a_child_at_import_still_compiles(tmp_path):
    """multiprocessing ends a forked child with os._exit: only flowc's own process is guarded."""
    (tmp_path / "forks.py").write_text(
        "import multiprocessing\nimport flow\nimport flow.typing as tp\n\n"
        "def work():\n    pass\n\n"
        "child = multiprocessing.get_context('fork').Process(target=work)\n"
        "child.start()\nchild.join(60)\nassert child.exitcode == 0, child.exitcode\n\n\n"
        "@flow.global_function(type='predict')\n"
        "def double(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:\n"
        "    return x + x\n")
    done = flowc("compile", str(tmp_path / "forks.py"), cache=tmp_path / "c")
    assert done.returncode == 0, done.stderr
    assert "1 job(s)" in done.stdout and "1 compiled" in done.stdout


def test_compile_failure_prints_compiler_message_and_source_path(tmp_path):
    broken = tmp_path / "broken.h"
    broken.write_text("#error flowc test: this compiler setup is broken\n")
    done = flowc("compile", MLP, "--job", "eval_job", cache=tmp_path / "c",
                 env={"CXX": f"g++ -include {broken}"})
    assert done.returncode == 1
    assert "this compiler setup is broken" in done.stderr
    kept = re.search(r"generated source kept at: (\S+)", done.stderr).group(1)
    assert pathlib.Path(kept).read_text().startswith("// Generated by flowc")


def test_help_has_examples_for_every_command():
    for command in ("compile", "show", "graph", "cache"):
        done = subprocess.run([sys.executable, "-m", "flowc", command, "--help"], cwd=ROOT,
                              capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
        assert done.returncode == 0 and "examples:" in done.stdout, command
    version = subprocess.run([sys.executable, "-m", "flowc", "--version"], cwd=ROOT, capture_output=True,
                             text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert version.stdout.startswith("flowc ")
