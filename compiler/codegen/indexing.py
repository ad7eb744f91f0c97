"""Lowering the indexing ops (compiler/ops/indexing.py): gather, gather_grad, strided_slice,
slice_update, one_hot and top_k; and the indexed-slices ops of a sparse embedding update
(compiler/ops/indexed_slices.py): unique_indices, indexed_slices_reduce_sum, gather_rows, scatter_rows.

`IndexingGeometry` computes what each kernel indexes (the same for every backend);
`CppIndexing` and `CudaIndexing`, mixins of the two generators, lay the kernels out through
codegen_templates/cpu/<op>.cpp.j2 and codegen_templates/cuda/<op>.cu.j2.  Index arithmetic is
64-bit throughout and every number in it is computed here from shapes and attributes, so only
literals reach the source.

The CPU kernels run one loop each; on the GPU one thread handles one output element (gather,
slices, one-hot), one column of the scattered gradient (gather_grad: its index loop stays in order,
so the sum is deterministic), or one row (top_k).
"""
from __future__ import annotations

from flowc.compiler.codegen.common import Lowering, Params, literal
from flowc.compiler.codegen.sanitise import CodeText, code, code_lines
from flowc.compiler.ir import Graph, c_type
from flowc.compiler.ops.indexing import gather_dims
from flowc.compiler.ops.pointwise import broadcast_strides
from flowc.compiler.program import Kernel

ROWS_PARALLEL_MIN = 1 << 15   # gather_rows, scatter_rows: fewer elements than this stay on one CPU thread

OPS = ("gather", "gather_grad", "strided_slice", "slice_update", "one_hot", "top_k",
       "unique_indices", "indexed_slices_reduce_sum", "gather_rows", "scatter_rows")
CPU_LOWERINGS = {op: Lowering("_kernel_indexing", f"{op}.cpp.j2", f"{op}_context") for op in OPS}
CUDA_LOWERINGS = {op: Lowering("_indexing", f"{op}.cu.j2", f"{op}_context") for op in OPS}
# Kernels that check their indices and fail the step with an error code (the CPU kernel returns it,
# the CUDA kernel raises the step's status).
CHECKING = ("gather",)


def coordinates(var: str, shape: tuple) -> tuple[list[str], list[str]]:
    """C lines splitting the linear index `var` of a C-contiguous `shape` into coordinates; returns
    (lines, one coordinate expression per dim: a variable, or "0" for a dim of size 1)."""
    lines = [f"int64_t rem = {var};"]
    names = ["0"] * len(shape)
    for d in range(len(shape) - 1, -1, -1):
        if shape[d] != 1:
            names[d] = f"c{d}"
            lines.append(f"const int64_t c{d} = rem % {shape[d]}; rem /= {shape[d]};")
    lines.append("(void)rem;")
    return lines, names


class IndexingGeometry:
    """The geometry of each indexing kernel: buffer names, extents and index statements."""
    graph: Graph

    def gather_context(self, k: Kernel, a, params: Params) -> dict:
        p, ix = (self.graph.node(i) for i in a.inputs)
        b, o, n, i, kk = gather_dims(p.type.shape, ix.type.shape, a.attr("axis"), a.attr("batch_dims"))
        return dict(P=params.use(p.id), IX=params.use(ix.id), OUT=params.use(a.id), B=b, O=o, A=n, I=i, K=kk,
                    threads=a.type.size)

    def gather_grad_context(self, k: Kernel, a, params: Params) -> dict:
        ix, dy = (self.graph.node(i) for i in a.inputs)
        b, o, n, i, kk = gather_dims(a.attr("params_shape"), ix.type.shape, a.attr("axis"), a.attr("batch_dims"))
        return dict(IX=params.use(ix.id), DY=params.use(dy.id), OUT=params.use(a.id), B=b, O=o, A=n, I=i, K=kk,
                    threads=b * o * i)

    # -- indexed slices: n positions, rows of W elements, tables of A rows --------------------------
    def unique_indices_context(self, k: Kernel, a, params: Params) -> dict:
        ix = self.graph.node(a.inputs[0])
        return dict(IX=params.use(ix.id), OUT=params.use(a.id), N=ix.type.size, A=a.attr("vocab"),
                    threads=ix.type.size)

    def indexed_slices_reduce_sum_context(self, k: Kernel, a, params: Params) -> dict:
        ix, dy = (self.graph.node(i) for i in a.inputs)
        n, w = a.type.shape
        return dict(IX=params.use(ix.id), DY=params.use(dy.id), OUT=params.use(a.id), N=n, W=w,
                    A=a.attr("vocab"), threads=n)

    def gather_rows_context(self, k: Kernel, a, params: Params) -> dict:
        table, rows = (self.graph.node(i) for i in a.inputs)
        n, w = a.type.shape
        return dict(TABLE=params.use(table.id), R=params.use(rows.id), OUT=params.use(a.id), N=n, W=w,
                    A=table.type.shape[0], threads=n * w, parallel_min=ROWS_PARALLEL_MIN)

    def scatter_rows_context(self, k: Kernel, a, params: Params) -> dict:
        table, rows, values = (self.graph.node(i) for i in a.inputs)
        n, w = values.type.shape
        storage = self.memory.storage  # type: ignore[attr-defined]
        # In place when the memory plan put the result in the table's own buffer (the variable):
        # then the rows not written keep their value with no copy.
        inplace = (storage[a.id].kind, storage[a.id].key) == (storage[table.id].kind, storage[table.id].key)
        return dict(TABLE=params.use(table.id), R=params.use(rows.id), VALUES=params.use(values.id),
                    OUT=params.use(a.id), N=n, W=w, A=table.type.shape[0], inplace=inplace, threads=n * w,
                    parallel_min=ROWS_PARALLEL_MIN)

    def strided_slice_context(self, k: Kernel, a, params: Params) -> dict:
        x = self.graph.node(a.inputs[0])
        strides = broadcast_strides(x.type.shape, x.type.shape)
        lines, names = coordinates("e", a.type.shape)
        base = sum(s * st for s, st in zip(a.attr("start"), strides))
        terms = [f"{c} * {step * st}" for c, step, st in zip(names, a.attr("step"), strides) if c != "0"]
        lines.append(f"const int64_t at = {' + '.join([str(base)] + terms)};")
        return dict(X=params.use(x.id), OUT=params.use(a.id), index=code_lines(lines), threads=a.type.size)

    def slice_update_context(self, k: Kernel, a, params: Params) -> dict:
        x, update = (self.graph.node(i) for i in a.inputs)
        lines, names = coordinates("e", x.type.shape)
        ustrides = broadcast_strides(update.type.shape, update.type.shape)
        lines += ["bool inside = true;", "int64_t at = 0;"]
        for d, (c, start, step, n) in enumerate(zip(names, a.attr("start"), a.attr("step"), a.attr("shape"))):
            if n == 0:
                lines.append("inside = false;")
                continue
            sign = "" if step > 0 else "-"
            lines.append(f"const int64_t t{d} = {sign}({c} - {start});")
            lines.append(f"inside = inside && t{d} >= 0 && t{d} % {abs(step)} == 0 && t{d} <= {(n - 1) * abs(step)};")
            if ustrides[d]:
                lines.append(f"at += (t{d} / {abs(step)}) * {ustrides[d]};")
        return dict(X=params.use(x.id), UPD=params.use(update.id), OUT=params.use(a.id), index=code_lines(lines),
                    threads=a.type.size)

    def one_hot_context(self, k: Kernel, a, params: Params) -> dict:
        ix = self.graph.node(a.inputs[0])
        axis, depth = a.attr("axis"), a.attr("depth")
        inner = 1
        for d in ix.type.shape[axis:]:
            inner *= d
        return dict(IX=params.use(ix.id), OUT=params.use(a.id), depth=depth, inner=inner,
                    on=literal(a.attr("on_value")), off=literal(a.attr("off_value")), threads=a.type.size)

    def top_k_context(self, k: Kernel, a, params: Params) -> dict:
        x = self.graph.node(a.inputs[0])
        cols = x.type.shape[-1]
        return dict(X=params.use(x.id), OUT=params.use(a.id), TX=code(c_type(x.type.dtype)), rows=x.type.size // cols,
                    cols=cols, k=a.attr("k"), threads=x.type.size // cols)


class CppIndexing(IndexingGeometry):
    """The CPU generator's lowering of the indexing kernels (a mixin of CppGenerator)."""

    def _kernel_indexing(self, k: Kernel, params: Params) -> tuple[str, bool]:
        from flowc.compiler.codegen.cpu import _env     # the CPU generator's templates (imported late: it imports us)
        a = self.graph.node(k.anchor_id)
        ctx = self.window_context(k, a, params)  # type: ignore[attr-defined]
        text = _env.get_template(self.lowering(a.op).template).render(  # type: ignore[attr-defined]
            params=params.declarations(), **ctx)
        return text, a.op in CHECKING


class CudaIndexing(IndexingGeometry):
    """The CUDA generator's lowering of the indexing kernels (a mixin of CudaGenerator)."""

    def _indexing(self, k: Kernel, a, params: Params, ctx: dict):
        from flowc.compiler.codegen.cuda import BLOCK, Launch, _grid_1d
        args = tuple(params.arguments())
        status: CodeText | None = None
        if a.op in CHECKING:
            status = code(str(self.error_code(k)))  # type: ignore[attr-defined]
            args += (("status",),)
        text = self._template(self.lowering(a.op).template, params=params.declarations(),  # type: ignore[attr-defined]
                              block=BLOCK, code=status, **ctx)
        launches = [Launch(k.name, _grid_1d(ctx["threads"]), (BLOCK, 1, 1), 0, args)]
        if a.op == "scatter_rows" and not ctx["inplace"]:   # the table's copy runs first
            copy = Launch(f"{k.name}_copy", _grid_1d(a.type.size), (BLOCK, 1, 1), 0, args)
            launches.insert(0, copy)
        return text, launches
