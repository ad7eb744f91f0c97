"""The GPU export's sources, rendered without building them (fast): the API replays the CUDA step's
launch list in order with each argument taken from the buffer table the Python runtime's host step
uses, every variable and input lands in its table entry, user names reach the C only as escaped
literals, and (where nvcc is installed) the API compiles against cuda.h.  The builds and runs are
tests/test_export_cuda.py's and tests/test_export_cuda_emulated.py's."""
from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from flowc.compiler.codegen.cuda_host import host_buffers
from flowc.compiler.codegen.sanitise import c_string
from flowc.compiler.export.cuda_export import export_gpu_sources
from tests.export_cuda_support import lenet_job


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    folder = tmp_path_factory.mktemp("render")
    spec, step = export_gpu_sources(lenet_job(2), "gpu", "lenet", "sm_90", folder)
    return folder, spec, step


def test_the_api_replays_the_launch_list_in_order_from_the_host_steps_table(rendered):
    folder, spec, step = rendered
    api = (folder / "src" / "lenet_api.cpp").read_text()
    generated = step.generated
    names = list(dict.fromkeys(la.kernel for la in generated.launches))
    table = re.search(r"kernel_names\[\] = \{ (.*?)nullptr \};", api).group(1)
    assert table == "".join(f'"{n}", ' for n in names)
    calls = re.findall(r"void\* args\[\] = \{ (.*?) \};\n.*\n\s+if \(\(r = launch\(m, (\d+), ([\d, ]+), args, (\d+)\)",
                       api)
    assert len(calls) == len(generated.launches)
    buffers = host_buffers(generated.bindings)
    for (args, index, geometry, count), la in zip(calls, generated.launches):
        assert names[int(index)] == la.kernel and int(count) == len(la.args)
        assert geometry == ", ".join(str(v) for v in (*la.grid, *la.block, la.shared_bytes))
        for arg, binding in zip(args.split(", "), la.args):
            slot = {"arena": 0, "scratch": 1, "status": 2}.get(binding[0], None)
            slot = buffers.index(binding) if slot is None else slot
            assert arg.split(" + ")[0] == f"buffers[{slot}]", (arg, binding)
    for v in spec.variables:
        if ("variable", v.name) in buffers:
            assert f"m->table[{buffers.index(('variable', v.name))}] = reinterpret_cast<char*>(m->weights + " \
                   f"{v.offset});" in api, v.name
    assert f"m->table[{buffers.index(('input', 0))}] = reinterpret_cast<char*>(device_inputs[0]);" in api
    assert f"constexpr size_t kScratchBytes = {generated.scratch_bytes};" in api
    for v in spec.variables:
        assert c_string(v.name) in api


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_the_api_compiles_against_cuda_h(rendered):
    folder, *_ = rendered
    src = folder / "src"
    proc = subprocess.run(["nvcc", "-x", "c++", "-std=c++17", "-Xcompiler", "-fsyntax-only,-Wall,-Werror", "-I.",
                           "-c", "lenet_api.cpp", "-o", "/dev/null"], cwd=src, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
