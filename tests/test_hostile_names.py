"""User text never becomes generated code (issue 13, "Code generation must never take user text as code").

A job's name, the user's source file name (`co_filename`, e.g. code `exec`'d under a generated
name), variable and layer names and scalar operands reach the generated C++ and CUDA.  Rendered
with hostile values (newlines, `*/`, a trailing `\\`, `#include`, NUL, U+2028, `??/`, 10,000
characters) every template gives the same code as for benign values, line for line; only
comment lines differ, and those are sanitised.  A payload that would run at load time
(`__attribute__((constructor))`) never runs, and a number's own `__repr__` never reaches a source.
"""
from __future__ import annotations

import dataclasses
import math
import re
import warnings

import jinja2
import numpy as np
import pytest

from flowc.compiler.codegen import cpu as cpu_codegen
from flowc.compiler.codegen.cpu import CppGenerator
from flowc.compiler.codegen.cuda import CudaGenerator
from flowc.compiler.codegen.sanitise import (MAX_COMMENT_CHARS, CodegenEnvironment, CodeText, c_identifier,
                                             c_literal, comment_text, emit)
from flowc.compiler.codegen.templates import environment
from flowc.compiler.ir import Graph, freeze_attrs
from flowc.compiler.pipeline import debug_folder_label, lower
from flowc.compiler.resources import template_folder
from flowc.runtime.checkpoint import variable_name_problem
from flowc.runtime.session import Session
from tests.oracle import compile_case
from tests.test_cuda_codegen import graph_of

HOSTILE = {
    "newline": "n\n__attribute__((constructor)) static void pwn() {}\n",
    "carriage_return": "r\r#include <x>\r",
    "comment_end": "c */ int pwned; /* ",
    "backslash": "b \\",
    "include": "i\n#include <x>\n",
    "nul": "z\x00z",
    "u2028": "u\u2028#include <x>\u2029",
    "trigraph": "t ??/",
    "bidi": "d\u202e#include <x>",
    "long": "L" * 10_000,
}
# A file name's directory part is dropped (flowc shows the base name): no `/`, and no NUL (Python refuses it).
HOSTILE_FILE_NAMES = {k: v.replace("/", "|") + ".py" for k, v in HOSTILE.items() if "\x00" not in v}
# A layer's name prefixes its variables' names, which flow.get_variable checks at declaration: the
# names it refuses (`/`, NUL, too long) reach the generator only through `with_hostile_variables`.
HOSTILE_LAYER_NAMES = {k: v for k, v in HOSTILE.items() if variable_name_problem(v + "conv1-weight") is None}

# The user's module, compiled under a chosen file name: the same text (so the same line numbers)
# for the benign and the hostile run.  Between them the two jobs need every kernel template (the
# embedding `emb`, named in indexed_slices_optimizer_conf, brings the sparse update's).
USER_SOURCE = '''
import flow
import flow.typing as tp


def define(job_name, layer):
    def train(x: tp.Numpy.Placeholder((4, 3, 8, 8)), y: tp.Numpy.Placeholder((4,), dtype=flow.int32)) -> tp.Numpy:
        with flow.scope.placement("gpu", "0:0"):
            h = flow.layers.conv2d(x, 4, 3, padding="SAME", activation=flow.nn.relu, name=layer + "conv1")
            h = flow.layers.conv2d(h, 4, 3, padding="SAME", name=layer + "conv2")
            h = flow.nn.relu(flow.layers.batch_normalization(h, axis=1, name=layer + "bn"))  # fused batch norm
            a = flow.nn.avg_pool2d(h, ksize=2, strides=2, padding="VALID")
            m = flow.nn.max_pool2d(h, ksize=2, strides=2, padding="VALID")
            f = flow.reshape(flow.concat([a, m], axis=1), [4, -1])
            logits = flow.layers.dense(f, 5, name=layer + "dense")
            xent = flow.nn.sparse_softmax_cross_entropy_with_logits(y, logits)
            loss = flow.math.square(xent) + flow.math.reduce_max(flow.nn.softmax(logits), axis=1)
            g = flow.gather(logits, flow.math.top_k(logits, k=2), axis=1, batch_dims=1)
            swapped = flow.slice_v2(g, [(None, None, None), (1, None, -1)])
            g = flow.slice_update(g, swapped, [(None, None, None), (0, 2, 1)])
            loss = loss + flow.math.reduce_sum(g, axis=1) + flow.math.reduce_sum(flow.one_hot(y, 5) * logits, axis=1)
            table = flow.get_variable(layer + "emb", shape=(7, 5), initializer=flow.zeros_initializer())
            loss = loss + flow.math.reduce_sum(flow.gather(table, y) * logits, axis=1)   # a sparse update
            n = flow.layers.layer_norm(logits, begin_norm_axis=-1, name=layer + "ln")     # BERT's fused rows
            loss = loss + flow.math.reduce_sum(flow.nn.softmax(n * 0.5 + logits) * n, axis=1)
        flow.optimizer.Adam(flow.optimizer.PiecewiseConstantScheduler([], [1e-3])).minimize(loss)
        return loss

    def predict(x: tp.Numpy.Placeholder((2, 3, 4)), w: tp.Numpy.Placeholder((2, 4, 5)),
                y: tp.Numpy.Placeholder((6,), dtype=flow.int32)) -> tp.Numpy:
        with flow.scope.placement("gpu", "0:0"):
            logits = flow.reshape(flow.matmul(x, w), [6, 5])
            return flow.math.argmax(logits) + flow.cast(
                flow.nn.sparse_softmax_cross_entropy_with_logits(y, logits), flow.int32)

    train.__name__ = job_name + "train"
    predict.__name__ = job_name + "predict"
    config = flow.function_config()
    config.indexed_slices_optimizer_conf(dict(include_op_names=dict(op_name=[layer + "emb"])))
    return (flow.global_function(type="train", function_config=config)(train),
            flow.global_function(type="predict")(predict))
'''


def user_module(file_name: str, source: str = USER_SOURCE) -> dict:
    """The namespace of `source` run as a module whose `co_filename` is `file_name`."""
    namespace: dict = {}
    exec(compile(source, file_name, "exec"), namespace)
    return namespace


def with_hostile_variables(graph: Graph, suffix: str) -> Graph:
    """`graph` with `suffix` added to every variable's and node's name, as if the user had declared
    them so (at the graph, whatever names the declaring API accepts)."""
    def rename(name: str) -> str:
        return name + suffix if name else name
    nodes = [dataclasses.replace(n, name=rename(n.name),
                                 attrs=freeze_attrs({**n.attr_dict, "name": rename(n.attr("name"))})
                                 if n.op == "variable" else n.attrs) for n in graph.nodes]
    return Graph(graph.name, nodes, graph.outputs, {rename(v): i for v, i in graph.assigns.items()},
                 {rename(v): t for v, t in graph.variables.items()}, graph.scalars, graph.placeholders)


def rendered_sources(file_name: str, job_name: str, layer: str, variable_suffix: str) -> dict[str, str]:
    """backend/job -> generated source (and the CUDA launch list) for the user module's two jobs."""
    train, predict = user_module(file_name)["define"](job_name, layer)
    out: dict[str, str] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for label, job in (("train", train), ("predict", predict)):
            program = lower(with_hostile_variables(graph_of(job, Session()), variable_suffix))
            cpu = CppGenerator(program.graph, program.kernels, program.memory, "test").render()
            out[f"{label}.cpp"] = cpu.source
            for i, part in enumerate(cpu.parts):
                out[f"{label}.part{i}.cpp"] = part
            cuda = CudaGenerator(program.graph, program.kernels, program.memory, "test", arch="sm_90").render()
            out[f"{label}.cu"] = cuda.source
            out[f"{label}.cu.launches"] = "".join(f"{la.kernel} {la.grid} {la.block} {la.shared_bytes}\n"
                                                  for la in cuda.launches)
            # check_numerics puts every stored node's `op @file:line` into more comments
            out[f"{label}.checked.cpp"] = CppGenerator(program.graph, program.kernels, program.memory, "test",
                                                       check_numerics=True).render().source
            out[f"{label}.checked.cu"] = CudaGenerator(program.graph, program.kernels, program.memory, "test",
                                                       arch="sm_90", check_numerics=True).render().source
    return out


def assert_safe_comment_line(line: str) -> None:
    """A line of generated source that holds sanitised user text: one comment, nothing it could end or continue."""
    assert line.lstrip().startswith("//"), line
    body = line.lstrip()[2:]
    assert body.isprintable(), repr(line)            # no NUL, CR, U+2028, bidi override, ...
    assert "\\" not in body and "??" not in body, line
    assert "*/" not in body and "/*" not in body, line
    assert "L" * (MAX_COMMENT_CHARS + 1) not in body, line[:300]


def assert_same_code(benign: str, hostile: str, what: str) -> None:
    """The two sources are the same code: the same lines, apart from sanitised comment lines."""
    benign_lines, hostile_lines = benign.split("\n"), hostile.split("\n")
    assert len(hostile_lines) == len(benign_lines), what
    for b, h in zip(benign_lines, hostile_lines):
        if b != h:
            assert b.lstrip().startswith("//"), f"{what}: a code line changed:\n{b}\n{h}"
            assert_safe_comment_line(h)
    # `#include` may stand inside a sanitised comment line (checked above); these may not appear at all
    for dangerous in ("*/", "/*", "??", "\\", "\r", "\x00", "\u2028", "\u2029", "\u202e"):
        assert hostile.count(dangerous) == benign.count(dangerous), f"{what}: {dangerous!r}"


@pytest.fixture(scope="module")
def benign_sources() -> dict[str, str]:
    return rendered_sources("user_module.py", "job_", "layer_", "")


def test_every_template_is_rendered(benign_sources):
    """The user module reaches every kernel template of both backends (else a hostile name could hide)."""
    used: set[str] = set()
    original = cpu_codegen._env.get_template

    def recording(name, *args, **kwargs):
        used.add(name)
        return original(name, *args, **kwargs)
    cpu_codegen._env.get_template = recording
    try:
        rendered_sources("user_module.py", "job_", "layer_", "")
    finally:
        cpu_codegen._env.get_template = original
    cpu_templates = {p.name for p in template_folder("cpu").glob("*.j2")}
    assert used == cpu_templates
    train, predict = user_module("user_module.py")["define"]("job_", "layer_")
    cuda_used: set[str] = {"step.cu.j2"}
    for job in (train, predict):
        program = lower(graph_of(job, Session()))
        cuda_used |= set(CudaGenerator(program.graph, program.kernels, program.memory, "t", arch="sm_90",
                                       check_numerics=True).render().templates)
    # A data-parallel step's sums out of the NCCL engine's buckets need 2 ranks, which this module's batch
    # normalisation refuses; its kernel takes names through the same c_identifier and comment (test_nccl_engine).
    from tests.test_nccl_engine import COMM_CUDA_TEMPLATES
    assert cuda_used == {p.name for p in template_folder("cuda").glob("*.j2")} - COMM_CUDA_TEMPLATES


@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_hostile_names_change_only_comments(benign_sources, kind):
    text = HOSTILE[kind]
    hostile = rendered_sources(HOSTILE_FILE_NAMES.get(kind, "user_module.py"), text,
                               HOSTILE_LAYER_NAMES.get(kind, "layer_"), text)
    assert sorted(hostile) == sorted(benign_sources)
    for name in benign_sources:
        assert_same_code(benign_sources[name], hostile[name], f"{kind}: {name}")


# -- nothing injected runs ------------------------------------------------------------------------------
MARKER = "flowc_pwned"
# Loaded as part of the step's library, this would create MARKER in the current directory.
CONSTRUCTOR = (f'extern "C" int creat(const char*, unsigned int);\n'
               f'__attribute__((constructor)) static void flowc_pwn() {{ creat("{MARKER}", 384); }}\n')
# In the job's name (the step's first comment line): end the comment, inject, start a new comment.
JOB_NAME_PAYLOAD = "job\n" + CONSTRUCTOR + "//"
# In the file name, repeated in every `@file:line` of a kernel comment (no `/` in a base name): each
# copy defines the constructor once, and swallows the rest of the comment line into a macro's body.
FILE_NAME_PAYLOAD = ("user.py\n#ifndef FLOWC_PWN\n#define FLOWC_PWN\n" + CONSTRUCTOR
                     + "#endif\n#undef FLOWC_JUNK\n#define FLOWC_JUNK ")
SMALL_JOB = '''
import flow
import flow.typing as tp


def define(job_name):
    def job(x: tp.Numpy.Placeholder((2, 3))) -> tp.Numpy:
        return flow.math.reduce_sum(flow.math.exp(x) * 2.0 + x, axis=1)
    job.__name__ = job_name
    return flow.global_function(type="predict")(job)
'''


@pytest.mark.parametrize("file_name, job_name", [("user.py", JOB_NAME_PAYLOAD), (FILE_NAME_PAYLOAD, "job")],
                         ids=["job_name", "file_name"])
def test_an_injected_constructor_never_runs(tmp_path, monkeypatch, file_name, job_name):
    monkeypatch.chdir(tmp_path)
    job = user_module(file_name, SMALL_JOB)["define"](job_name)
    x = np.arange(6, dtype=np.float32).reshape(2, 3) / 6
    result = job(x)
    np.testing.assert_allclose(result, (np.exp(x) * 2 + x).sum(axis=1), rtol=1e-5)
    assert not (tmp_path / MARKER).exists(), "code from a user name ran when the step was loaded"


# -- scalars: the value, never the object's own text ----------------------------------------------------
EVIL_TEXT = "0); } __attribute__((constructor)) static void evil() { (0"


class EvilFloat(float):
    def __repr__(self) -> str:
        return EVIL_TEXT

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        return EVIL_TEXT

    def __float__(self) -> float:       # a subclass instance back, as float() would take it
        return self


class EvilInt(int):
    def __repr__(self) -> str:
        return EVIL_TEXT

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        return EVIL_TEXT


SCALAR_JOB = '''
import flow
import flow.typing as tp


def define(Float, Int):
    def scalars(x: tp.Numpy.Placeholder((2, 3))) -> tp.Numpy:
        y = flow.math.add(x * Float(2.0), Int(3)) - Float(0.25)
        return flow.nn.leaky_relu(y, alpha=Float(0.5)) + flow.math.maximum(x, Float(-1.0))
    return flow.global_function(type="predict")(scalars)
'''


def scalar_sources(float_type: type, int_type: type) -> tuple[str, str]:
    job = user_module("scalars.py", SCALAR_JOB)["define"](float_type, int_type)
    program = lower(graph_of(job, Session()))
    return (CppGenerator(program.graph, program.kernels, program.memory, "t").render().source,
            CudaGenerator(program.graph, program.kernels, program.memory, "t", arch="sm_90").render().source)


@pytest.mark.filterwarnings("ignore:EvilFloat.__float__ returned non-float:DeprecationWarning")
def test_a_number_subclass_repr_never_reaches_the_source():
    evil = scalar_sources(EvilFloat, EvilInt)
    plain = scalar_sources(float, int)
    for e, p in zip(evil, plain):
        assert "evil" not in e
        assert e == p


@pytest.mark.filterwarnings("ignore:EvilFloat.__float__ returned non-float:DeprecationWarning")
def test_a_number_subclass_computes_its_value():
    job = user_module("scalars.py", SCALAR_JOB)["define"](EvilFloat, EvilInt)
    x = np.array([[-4, -1, 0], [0.5, 1, 2]], np.float32)
    y = x * 2 + 3 - 0.25
    np.testing.assert_allclose(job(x), np.where(y > 0, y, y * 0.5) + np.maximum(x, -1), rtol=1e-6)


# (-0.0 is left out: the simplify pass folds `x + 0.0` and `x - -0.0` to `x`, wrong for x = -0.0 -- a
# finding for the "numbers never lie" part of issue 13, not about how a scalar is spelled.)
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, 1e-45, np.float32(math.nan),
                                   np.float64(-math.inf), EvilFloat(math.nan), EvilFloat(math.inf)],
                         ids=["nan", "inf", "-inf", "denormal", "np.float32 nan", "np.float64 -inf",
                              "EvilFloat nan", "EvilFloat inf"])
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
def test_special_scalars_agree_with_the_reference(value):
    x = np.array([[-2, -0.0, 0], [1.5, np.inf, -np.inf]], np.float32)
    case = compile_case(lambda b: [b * value, b + value, b - value], [x], grads=False)
    assert "evil" not in str(case.graph)
    for compiled, reference in zip(case.compiled, case.reference):
        np.testing.assert_array_equal(compiled, reference)          # NaN where NaN, signs of zeros aside
        np.testing.assert_array_equal(np.signbit(compiled[~np.isnan(compiled)]),
                                      np.signbit(reference[~np.isnan(reference)]))


# -- the sanitiser itself -----------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_comment_text_is_one_safe_line(kind):
    text = comment_text(HOSTILE[kind])
    assert_safe_comment_line("// " + text)
    assert comment_text(text) == text                   # idempotent
    assert len(text) <= MAX_COMMENT_CHARS


@pytest.mark.parametrize("text", ["train_job", "mlp_train_demo.py:27", "variable 'hidden-bias'", "a * b / c",
                                  "名前 ünïcode", "x?y", ""])
def test_comment_text_keeps_ordinary_text(text):
    assert comment_text(text) == text


def test_comment_text_splits_every_delimiter():
    assert "*/" not in comment_text("*/*/") and "/*" not in comment_text("/*/*")
    assert not comment_text("x \\").rstrip().endswith("\\")
    assert "??" not in comment_text("a ??/ ???")


def test_emit_lets_only_code_and_numbers_through_unchanged():
    assert emit(CodeText("a */ b")) == "a */ b"          # the generator's own text, trusted
    assert emit("a */ b") == "a * / b"                   # anything else is untrusted: sanitised
    assert emit(3) == "3" and emit(np.int64(-2)) == "-2" and emit(EvilInt(7)) == "7"
    assert emit((1, 2, 3)) == "(1, 2, 3)" and emit([4]) == "[4]" and emit((5,)) == "(5,)"
    assert emit(("variable", "w\n#include <x>")) == "('variable', 'w/n#include <x>')"
    assert isinstance(emit(12), CodeText)


@pytest.mark.parametrize("value, text", [(2.0, "2.0"), (1e-05, "1e-05"), (-0.0, "-0.0"), (math.nan, "NAN"),
                                         (math.inf, "INFINITY"), (-math.inf, "-INFINITY"), (True, "1"),
                                         (np.float32(0.5), "0.5"), (np.int64(9), "9"), (EvilFloat(1.5), "1.5"),
                                         (EvilInt(4), "4"), (EvilFloat(math.nan), "NAN")])
def test_c_literal_is_canonical(value, text):
    assert c_literal(value) == text


def test_c_literal_refuses_what_is_not_a_number():
    with pytest.raises(TypeError):
        c_literal("1); system(\"x\"")


def test_identifiers_are_generated():
    assert c_identifier("matmul_4_add_relu") == "matmul_4_add_relu"
    for bad in ["a b", "x\n", "1x", "f();", ""]:
        with pytest.raises(ValueError):
            c_identifier(bad)


def test_a_template_cannot_opt_out():
    """Every `{{ }}` is sanitised, in any template of the environment; its finalize cannot be replaced."""
    env = CodegenEnvironment(loader=jinja2.DictLoader({"new.j2": "// {{ name }}\nint {{ ident }} = {{ n }};"}))
    out = env.get_template("new.j2").render(name="x\n#include <y>", ident=CodeText("v0"), n=EvilInt(1))
    assert out == "// x #include <y>\nint v0 = 1;" and isinstance(out, CodeText)
    with pytest.raises(TypeError):
        CodegenEnvironment(finalize=lambda v: v)


def test_a_stale_bytecode_cache_cannot_skip_the_sanitiser(tmp_path, monkeypatch):
    """Templates compiled without the sanitiser (an older flowc, the same core folder) are not reused:
    the environment reads no compiled templates from disk."""
    monkeypatch.setenv("FLOWC_CORE_DIR", str(tmp_path))
    (tmp_path / "templates").mkdir()
    old = jinja2.Environment(loader=jinja2.FileSystemLoader(str(template_folder("cpu"))),
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                             bytecode_cache=jinja2.FileSystemBytecodeCache(str(tmp_path / "templates")))
    old.get_template("step.cpp.j2")
    assert list((tmp_path / "templates").iterdir()), "the old environment stored its bytecode"
    source = environment("cpu").get_template("step.cpp.j2").render(
        version="v", job=JOB_NAME_PAYLOAD, calls=[], copy_backs=[], profile=False, uses_gemm=False, uses_conv=False,
        bindings=[], kernels=[], split=False, with_step=True, prototypes=[], checks=[],
        check_numerics=False, numerics=[])
    assert "constructor" in source.splitlines()[0] and source.splitlines()[1] == "//"


def test_debug_folder_names_are_generated():
    assert debug_folder_label("a/b") == "a_b"
    for name in ["..", "/", "a\x00b", "x" * 10_000, "../../etc/passwd", "\u2028"]:
        label = debug_folder_label(name)
        assert label and len(label) <= 40 and re.fullmatch(r"[A-Za-z0-9_]+", label), name


@pytest.mark.parametrize("job_name", ["a/b", "..", "a\x00b", "../../x"])
def test_debug_dump_with_a_path_like_job_name(tmp_path, monkeypatch, capsys, job_name):
    """FLOWC_DEBUG=1 writes its dump into a folder of a generated name inside the temp directory."""
    monkeypatch.setenv("FLOWC_DEBUG", "1")
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    job = user_module("user.py", SMALL_JOB)["define"](job_name)
    job(np.zeros((2, 3), np.float32))
    dumps = [p for p in tmp_path.iterdir() if p.name.startswith("flowc-")]
    assert len(dumps) == 1 and (dumps[0] / "step.cpp").is_file()
    assert repr(job_name) in capsys.readouterr().err
