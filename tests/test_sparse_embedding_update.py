"""Sparse embedding updates (issue 15): a variable read only by a gather is updated at the batch's rows.

The backward pass keeps the embedding's gradient as indexed slices (unique indices and summed rows,
compiler/ops/indexed_slices.py) and the optimizer's rule runs on those rows only
(compiler/indexed_slices.py).  Checked here, on a small table whose batches repeat indices:

* each sparse optimizer (SGD, momentum, Adam with OneFlow's indexed_slices_optimizer_conf, LazyAdam
  always): three compiled steps equal the reference executor, and equal an independent NumPy
  transcription of OneFlow's indexed-slices kernels; rows never gathered keep value and state bit
  for bit;
* the sparse gradient equals central differences of the loss, and sparse SGD equals dense SGD;
* when OneFlow keeps the update dense (not named in the conf, regularizer, loss scale, clipping,
  weight decay, another optimizer) the graph has no sparse update;
* the four ops, generated C++ and CUDA (in tests/test_cuda_codegen.py's emulator) against the reference,
  the copy path (scatter_rows not in place) and the in-place path (a train step) both.
"""
from __future__ import annotations

import numpy as np
import pytest

import flow
import flow.typing as tp
from flowc.compiler.build import build_job_graph
from flowc.compiler.pipeline import lower
from flowc.compiler.reference import run_reference
from flowc.compiler.trace import emit
from flowc.runtime.job import _runtime_scalars
from flowc.runtime.session import Session, default_session
from tests.oracle import compile_case, trace_case

VOCAB, DIM, LR = 10, 3, 0.1
# Three batches of (2, 3) ids with repeats; rows 2, 3, 5, 6, 8 and 9 are never gathered.
IDS = [np.array([[1, 4, 1], [7, 4, 4]], np.int32), np.array([[4, 0, 0], [7, 1, 0]], np.int32),
       np.array([[0, 0, 0], [0, 7, 1]], np.int32)]
NEVER = [2, 3, 5, 6, 8, 9]
rng = np.random.default_rng(15)
POS = [rng.uniform(0.5, 1.5, (2, 3, 1)).astype(np.float32) for _ in IDS]   # per-occurrence weights
TARGET = np.array([[0.5], [-1.0]], np.float32)
W = np.array([[0.7], [-0.4], [1.1]], np.float32)       # a fixed projection, fed


def _optimizer(kind: str):
    lr = flow.optimizer.PiecewiseConstantScheduler([], [LR])
    return {"sgd": lambda: flow.optimizer.SGD(lr, momentum=0.0),
            "momentum": lambda: flow.optimizer.SGD(lr, momentum=0.9),
            "adam": lambda: flow.optimizer.Adam(lr, do_bias_correction=True),
            "lazy_adam": lambda: flow.optimizer.LazyAdam(lr),
            "rmsprop": lambda: flow.optimizer.RMSProp(lr),
            "adamw": lambda: flow.optimizer.AdamW(lr, weight_decay=0.01)}[kind]()


def make_job(name: str, kind: str, named: bool = True, regularizer=None, loss_scale=None, clipping=None):
    """A train job: loss = ((sum_k pos[b, k] * table[ids[b, k]]) @ proj - target) ** 2."""
    table_name = f"{name}_table"
    config = flow.function_config()
    if named:
        config.indexed_slices_optimizer_conf(dict(include_op_names=dict(op_name=[table_name])))

    def job(ids: tp.Numpy.Placeholder((2, 3), dtype=flow.int32), pos: tp.Numpy.Placeholder((2, 3, 1)),
            target: tp.Numpy.Placeholder((2, 1)), proj: tp.Numpy.Placeholder((DIM, 1))) -> tp.Numpy:
        table = flow.get_variable(table_name, shape=(VOCAB, DIM), regularizer=regularizer,
                                  initializer=flow.random_uniform_initializer(minval=-1.0, maxval=1.0))
        h = flow.math.reduce_sum(flow.gather(table, ids) * pos, axis=[1])         # (2, DIM)
        loss = flow.math.square(flow.matmul(h, proj) - target)
        opt = _optimizer(kind)
        if loss_scale is not None:
            opt.loss_scale_policy = loss_scale
        if clipping is not None:
            opt.grad_clipping = clipping
        opt.minimize(loss)
        return loss
    job.__name__ = name
    train = flow.global_function(type="train", function_config=config)(job)
    return train, table_name


def _batch(step: int) -> list:
    return [IDS[step], POS[step], TARGET, W]


def _values(names) -> dict[str, np.ndarray]:
    flow.sync_default_session()
    return {n: default_session().value(n).copy() for n in names}


# --- an independent transcription of OneFlow's indexed-slices kernels ----------------------------

def _dense_gradient(table: np.ndarray, step: int) -> np.ndarray:
    """d(mean over the 2 instances of the loss)/d(table), by hand."""
    ids, pos = IDS[step], POS[step]
    h = (table[ids] * pos).sum(1)                                   # (2, DIM)
    r = h @ W - TARGET                                              # (2, 1)
    d_emb = (2 * r / 2)[:, None, :] * pos * W[:, 0][None, None, :]  # (2, 3, DIM)
    g = np.zeros_like(table, dtype=np.float64)
    np.add.at(g, ids.reshape(-1), d_emb.reshape(-1, DIM))
    return g


def oneflow_steps(kind: str, table: np.ndarray, steps: int) -> dict[str, np.ndarray]:
    w = table.astype(np.float64)
    m, v = np.zeros_like(w), np.zeros_like(w)
    b1, b2, eps = 0.9, 0.999, 1e-8
    for t in range(steps):
        rows = np.unique(IDS[t])
        g = _dense_gradient(w, t)[rows]
        if kind == "sgd":
            w[rows] -= LR * g
        elif kind == "momentum":
            m[rows] = 0.9 * m[rows] - LR * g
            w[rows] += m[rows]
        else:                  # adam with bias correction, lazy_adam: both corrected by beta ** (t + 1)
            lr = LR * np.sqrt(1 - b2 ** (t + 1)) / (1 - b1 ** (t + 1))
            m[rows] = b1 * m[rows] + (1 - b1) * g
            v[rows] = b2 * v[rows] + (1 - b2) * g * g
            w[rows] -= lr * m[rows] / (np.sqrt(v[rows]) + eps)
    return {"value": w, "m": m, "v": v}


# --- the sparse optimizers -----------------------------------------------------------------------

SPARSE = ["sgd", "momentum", "adam", "lazy_adam"]


@pytest.mark.parametrize("kind", SPARSE)
def test_sparse_steps_equal_the_reference_and_oneflow_and_leave_other_rows_alone(kind):
    name = f"h15sp_{kind}"
    train, table_name = make_job(name, kind)
    traced = train._trace(default_session())
    ops = [n.op for n in lower(traced.graph).graph.nodes]
    assert "scatter_rows" in ops and "gather_grad" not in ops      # no dense (vocab, dim) gradient
    names = list(traced.graph.variables)
    first = _values(names)
    for step in range(3):
        before = _values(names)
        want, updates = run_reference(traced.graph, _batch(step), before, _runtime_scalars(traced, step))
        got = train(*_batch(step))
        np.testing.assert_allclose(got, want[0], rtol=1e-6, atol=1e-7)
        after = _values(names)
        for var, value in updates.items():
            np.testing.assert_allclose(after[var], value, rtol=1e-6, atol=1e-7, err_msg=f"step {step}: {var}")
    last = _values(names)
    for var in names:
        if var.startswith(table_name) and last[var].shape == (VOCAB, DIM):
            assert last[var][NEVER].tobytes() == first[var][NEVER].tobytes(), f"{var} changed a row never gathered"
    want = oneflow_steps(kind, first[table_name], 3)
    np.testing.assert_allclose(last[table_name], want["value"], rtol=2e-5, atol=2e-6)
    for suffix in ("m", "v"):
        if f"{table_name}-{suffix}" in last:
            np.testing.assert_allclose(last[f"{table_name}-{suffix}"], want[suffix], rtol=2e-5, atol=1e-7)
    if kind == "momentum":
        np.testing.assert_allclose(last[f"{table_name}-momentum"], want["m"], rtol=2e-5, atol=1e-7)


def test_the_sparse_gradient_equals_central_differences_and_sparse_sgd_equals_dense_sgd():
    sparse, table_name = make_job("h15sp_fd_sparse", "sgd")
    dense, dense_table = make_job("h15sp_fd_dense", "sgd", named=False)
    assert "scatter_rows" not in [n.op for n in dense._trace(default_session()).graph.nodes]
    traced = sparse._trace(default_session())
    start = _values([table_name])[table_name]
    flow.sync_default_session()
    default_session().value(dense_table)[...] = start
    sparse(*_batch(0))
    dense(*_batch(0))
    stepped = _values([table_name, dense_table])
    np.testing.assert_allclose(stepped[table_name], stepped[dense_table], rtol=1e-6, atol=1e-7)
    gradient = (start.astype(np.float64) - stepped[table_name]) / LR

    def loss_at(table: np.ndarray) -> float:       # the job's loss on the reference executor, mean over instances
        values = {v: (table if v == table_name else _values([v])[v]) for v in traced.graph.variables}
        out, _ = run_reference(traced.graph, _batch(0), values, _runtime_scalars(traced, 0))
        return float(np.asarray(out[0], np.float64).mean())
    eps = 0.05          # the loss is quadratic in the table: central differences are exact but for rounding
    for row in [0, 1, 4, 7, 2]:
        for col in range(DIM):
            up, down = start.copy(), start.copy()
            up[row, col] += eps
            down[row, col] -= eps
            numeric = (loss_at(up) - loss_at(down)) / (2 * eps)
            np.testing.assert_allclose(gradient[row, col], numeric, rtol=2e-3, atol=2e-4,
                                       err_msg=f"row {row}, col {col}")


def test_lazy_adams_dense_update_is_lazy_too_and_equals_the_sparse_one():
    """OneFlow's lazy_adam kernel skips elements whose gradient is below 1e-12: the dense update (here
    forced by a loss scale of 1) leaves the rows without a gradient alone, and equals the sparse one."""
    sparse, sparse_table = make_job("h15sp_lazy_sparse", "lazy_adam")
    dense, dense_table = make_job("h15sp_lazy_dense", "lazy_adam", named=False,
                                  loss_scale=flow.optimizer.loss_scale.static_loss_scale(1.0))
    assert "scatter_rows" not in [n.op for n in lower(dense._trace(default_session()).graph).graph.nodes]
    sparse._trace(default_session())
    start = _values([sparse_table])[sparse_table]
    default_session().value(dense_table)[...] = start
    for step in range(3):
        sparse(*_batch(step))
        dense(*_batch(step))
    for suffix in ("", "-m", "-v"):
        got = _values([sparse_table + suffix, dense_table + suffix])
        np.testing.assert_allclose(got[dense_table + suffix], got[sparse_table + suffix], rtol=1e-6, atol=1e-9,
                                   err_msg=suffix)
        assert got[dense_table + suffix][NEVER].tobytes() == got[sparse_table + suffix][NEVER].tobytes()
    assert _values([dense_table])[dense_table][NEVER].tobytes() == start[NEVER].tobytes()


@pytest.mark.parametrize("case,reason", [
    (dict(kind="adam", named=False), "not named in function_config().indexed_slices_optimizer_conf"),
    (dict(kind="rmsprop"), "RMSProp has no indexed-slices update"),
    (dict(kind="adamw"), "weight decay"),
    (dict(kind="lazy_adam", regularizer=flow.regularizers.l2(0.01)), "regularizer"),
    (dict(kind="lazy_adam", loss_scale=flow.optimizer.loss_scale.static_loss_scale(8.0)), "loss scale"),
    (dict(kind="lazy_adam", clipping=flow.optimizer.grad_clipping.by_global_norm(1.0)), "clips gradients"),
])
def test_oneflow_keeps_these_updates_dense(case, reason, recwarn):
    from flowc.compiler import indexed_slices
    plans = []
    real = indexed_slices.sparse_update_plan

    def spy(*args, **kwargs):
        plans.append(real(*args, **kwargs))
        return plans[-1]
    train, table_name = make_job(f"h15sp_dense_{len(reason)}_{case['kind']}", **case)
    import flowc.compiler.build as build
    build.sparse_update_plan, saved = spy, build.sparse_update_plan
    try:
        graph = build_job_graph(train.name, "train", train.fn, train.placeholders, train.result_spec,
                                default_session(), train.config).graph
    finally:
        build.sparse_update_plan = saved
    ops = [n.op for n in graph.nodes]
    assert "scatter_rows" not in ops and "gather_grad" in ops
    assert any(reason in p.reason for p in plans), [p.reason for p in plans]
    # a variable the conf names but that stays dense is said so, with the reason and its line
    said = [str(w.message) for w in recwarn if "indexed_slices_optimizer_conf names" in str(w.message)]
    named = case.get("named", True)
    assert (len(said) == 1 and reason in said[0] and "test_sparse_embedding_update.py:" in said[0]) == named, said


# --- the ops, C++ and CUDA ------------------------------------------------------------------------

OP_IDS = np.array([[3, 9, 3], [-1, 0, 3], [9, 12, 0]], np.int64)      # repeats, and two out of [0, 8)
OP_TABLE = rng.standard_normal((8, 2, 2)).astype(np.float32)
OP_DY = rng.standard_normal((3, 3, 4)).astype(np.float32)
OP_VALUES = rng.standard_normal((9, 4)).astype(np.float32)


def indexed_ops(ids, table, dy, values):
    rows = emit("unique_indices", [ids], {"vocab": 8})
    summed = emit("indexed_slices_reduce_sum", [ids, dy], {"vocab": 8})
    picked = emit("gather_rows", [table, rows], {})
    written = emit("scatter_rows", [table, rows, values], {})
    return rows, summed, picked, written


OP_INPUTS = [OP_IDS, OP_TABLE, OP_DY, OP_VALUES]
# The CUDA templates the emulator tests below render (test_cuda_codegen's coverage check leaves them to us).
INDEXED_SLICES_CUDA_TEMPLATES = {f"{op}.cu.j2" for op in ("unique_indices", "indexed_slices_reduce_sum",
                                                          "gather_rows", "scatter_rows")}


def covered_ops() -> set[str]:
    """The ops of the cases here (tests/test_ops.py checks every op has a case)."""
    graph, _, _ = trace_case(indexed_ops, OP_INPUTS, grads=False)
    return {n.op for n in graph.nodes}


def test_the_ops_compiled_equal_the_reference_and_numpy():
    case = compile_case(indexed_ops, OP_INPUTS, grads=False)
    for got, want in zip(case.compiled, case.reference):
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
    rows, summed, picked, written = case.reference
    flat = OP_IDS.reshape(-1)
    np.testing.assert_array_equal(rows, [3, -1, -1, -1, 0, -1, -1, -1, -1])   # 9 and 12 are out of [0, 8)
    dy = OP_DY.reshape(9, 4)
    np.testing.assert_allclose(summed[0], dy[0] + dy[2] + dy[5], rtol=1e-6)
    np.testing.assert_allclose(summed[4], dy[4] + dy[8], rtol=1e-6)
    assert not summed[[1, 2, 3, 5, 6, 7, 8]].any()
    np.testing.assert_array_equal(picked[0], OP_TABLE[3].reshape(-1))
    assert not picked[1].any()
    want = OP_TABLE.reshape(8, 4).copy()
    want[3], want[0] = OP_VALUES[0], OP_VALUES[4]
    np.testing.assert_array_equal(written, want.reshape(8, 2, 2))
    assert flat.size == rows.size


@pytest.fixture(scope="module")
def emulator(tmp_path_factory):
    from tests.test_cuda_codegen import Emulator
    return Emulator(tmp_path_factory.mktemp("cuda-emulator-sparse"))


def _emulate(emulator, program, feeds, variables):
    from tests.test_cuda_codegen import render, replay
    step = render(program, prefix="sparse_")
    lib = emulator.build(step.source, [la.kernel for la in step.launches])
    return step, replay(emulator, lib, program, step, feeds, variables, {})


def test_the_cuda_kernels_equal_the_reference_in_the_emulator(emulator):
    import shutil
    if shutil.which("g++") is None:
        pytest.skip("g++ runs the CUDA emulator")
    graph, _, _ = trace_case(indexed_ops, OP_INPUTS, grads=False)
    program = lower(graph)
    step, (got, status) = _emulate(emulator, program, OP_INPUTS, {})
    assert status == 0
    assert any(la.kernel.endswith("_copy") for la in step.launches), "scatter_rows here is not in place"
    want, _ = run_reference(graph, OP_INPUTS, {})
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_an_in_place_sparse_train_step_in_the_cuda_emulator(emulator):
    import shutil
    if shutil.which("g++") is None:
        pytest.skip("g++ runs the CUDA emulator")
    train, table_name = make_job("h15sp_cuda", "lazy_adam")
    session = Session()
    graph = build_job_graph(train.name, "train", train.fn, train.placeholders, train.result_spec, session,
                            train.config).graph
    program = lower(graph)
    assert table_name in program.memory.inplace.values(), program.memory.notes
    variables = {name: np.ascontiguousarray(session.value(name)) for name in graph.variables}
    before = {k: v.copy() for k, v in variables.items()}
    scalars = {name: LR for name in graph.scalars}
    want_out, want = run_reference(graph, _batch(0), before, scalars)
    from tests.test_cuda_codegen import render, replay
    step = render(program, prefix="sparse_train_")
    lib = emulator.build(step.source, [la.kernel for la in step.launches])
    got, status = replay(emulator, lib, program, step, _batch(0), variables, scalars)
    assert status == 0
    np.testing.assert_allclose(got[0], want_out[0], rtol=1e-6)
    for var, value in want.items():
        np.testing.assert_allclose(variables[var], value, rtol=1e-6, atol=1e-7, err_msg=var)
    assert variables[table_name][NEVER].tobytes() == before[table_name][NEVER].tobytes()
