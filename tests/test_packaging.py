"""flowc as a user gets it: a wheel, installed into a fresh virtualenv, run from somewhere else.

Every other test runs from the source tree, where a file the wheel forgot (a header, a template)
is still found.  Here the wheel is built from the checkout, installed with pip into a new venv
and a job is compiled and run from a folder that also holds a user's own `runtime.py` and
`compiler/` package -- names flowc must not claim.
"""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# What the wheel needs at run time, borrowed from the test environment so no download happens.
RUNTIME_DEPENDENCIES = ("numpy", "jinja2", "markupsafe", "cffi", "pycparser")

pytestmark = pytest.mark.slow

USER_JOB = textwrap.dedent('''
    import sys
    import numpy as np
    import flow
    import flow.typing as tp
    import flowc.compiler

    @flow.global_function(type="predict")
    def affine(x: tp.Numpy.Placeholder((2, 3), dtype=flow.float)) -> tp.Numpy:
        w = flow.get_variable("w", shape=(3, 4), initializer=flow.ones_initializer())
        return flow.nn.relu(flow.matmul(x, w) - 1.0)

    out = affine(np.arange(6, dtype=np.float32).reshape(2, 3))
    print(out.tolist())
    print(flowc.compiler.__file__)
''')
# The user's own modules that happen to share names with flowc's folders.
USER_RUNTIME = 'raise SystemExit("the user\'s runtime.py was imported by flowc")\n'
USER_COMPILER = 'raise SystemExit("the user\'s compiler/ package was imported by flowc")\n'


def _build_wheel(out: Path) -> Path:
    """`pip wheel .`: in an isolated build environment made from pyproject.toml's [build-system], as
    a user's pip does, unless this environment already has the build tools (faster, no download)."""
    isolation = ["--no-build-isolation"] if importlib.util.find_spec("wheel") else []
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", *isolation, "-q",
                           str(ROOT), "-w", str(out)], capture_output=True, text=True, cwd=out, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (wheel,) = out.glob("flowc-*.whl")
    return wheel


def _site_packages(env_dir: Path) -> Path:
    (site,) = env_dir.glob("lib/python*/site-packages")
    return site


def _borrow_dependencies(site: Path, store: Path) -> None:
    """Make the test environment's copies of the dependencies importable in the new venv, and nothing
    else of it (in particular not the editable flowc install)."""
    store.mkdir()
    for name in RUNTIME_DEPENDENCIES:
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.origin is not None, f"{name} is not installed"
        origin = Path(spec.origin)
        target = origin.parent if origin.name == "__init__.py" else origin
        (store / target.name).symlink_to(target)
    for backend in Path(importlib.util.find_spec("_cffi_backend").origin).parent.glob("_cffi_backend*"):
        (store / backend.name).symlink_to(backend)
    (site / "flowc_test_dependencies.pth").write_text(f"{store}\n")


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict:
    base = tmp_path_factory.mktemp("packaging")
    wheel = _build_wheel(base)
    env_dir = base / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    proc = subprocess.run([str(python), "-m", "pip", "install", "--no-deps", "--no-index", "-q", str(wheel)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    _borrow_dependencies(_site_packages(env_dir), base / "dependencies")
    return {"wheel": wheel, "env": env_dir, "python": python}


def test_the_wheel_installs_exactly_flow_and_flowc(installed):
    names = zipfile.ZipFile(installed["wheel"]).namelist()
    assert {n.split("/")[0] for n in names if ".dist-info/" not in n} == {"flow", "flowc"}
    # the files the compiler reads at run time, not only Python modules
    for shipped in ("flowc/codegen_templates/cpu/flowc_core.cpp", "flowc/codegen_templates/cpu/step.cpp.j2",
                    "flowc/codegen_templates/cpu/flowc_gemm.h", "flowc/codegen_templates/cuda/step.cu.j2",
                    "flowc/runtime/datasets/mnist_5k.npz", "flowc/py.typed", "flow/py.typed"):
        assert shipped in names, shipped


def test_a_job_compiles_and_runs_from_the_wheel_beside_a_users_runtime_and_compiler(installed, tmp_path):
    work = tmp_path / "user_project"
    (work / "compiler").mkdir(parents=True)
    (work / "compiler" / "__init__.py").write_text(USER_COMPILER)
    (work / "runtime.py").write_text(USER_RUNTIME)
    (work / "job.py").write_text(USER_JOB)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env.update(FLOWC_CACHE_DIR=str(tmp_path / "cache"))
    proc = subprocess.run([str(installed["python"]), "job.py"], cwd=work, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "[[2.0, 2.0, 2.0, 2.0], [11.0, 11.0, 11.0, 11.0]]"
    assert Path(lines[1]).is_relative_to(_site_packages(installed["env"]))


def test_the_flowc_command_and_python_m_flowc_run_from_the_wheel(installed, tmp_path):
    (tmp_path / "runtime.py").write_text(USER_RUNTIME)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    for argv in ([str(installed["env"] / "bin" / "flowc"), "--version"],
                 [str(installed["python"]), "-m", "flowc", "--version"]):
        proc = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0 and proc.stdout.startswith("flowc 0."), (argv, proc.stdout, proc.stderr)


def test_importing_a_folder_under_its_old_top_level_name_is_refused():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for old in ("compiler", "runtime", "codegen_templates"):
        proc = subprocess.run([sys.executable, "-c", f"import {old}"], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=60)
        assert proc.returncode != 0
        assert f"imported as `flowc.{old}`, not as `{old}`" in proc.stderr
