"""Lowering the fused row ops of BERT (compiler/ops/normalization.py): layer_norm and its gradients,
the scaled masked softmax and its gradient.

`FusedRowGeometry.fused_row_context` computes what each kernel reads (the same for every
backend); `CppFusedRows` and `CudaFusedRows`, mixins of the two generators, lay the kernels out
through codegen_templates/cpu/<op>.cpp.j2 and codegen_templates/cuda/<op>.cu.j2.  The CPU runs one
row per iteration of an OpenMP loop; the GPU gives each row one warp, except gamma's gradient (a
sum over rows), where a thread owns a column.  Attributes reach the source as literals only.
"""
from __future__ import annotations

from flowc.compiler.codegen.common import Lowering, Params, literal
from flowc.compiler.codegen.indexing import coordinates
from flowc.compiler.codegen.sanitise import code_lines
from flowc.compiler.ops.pointwise import broadcast_strides
from flowc.compiler.program import Kernel

FUSED_ROW_OPS = ("layer_norm", "layer_norm_grad", "layer_norm_gamma_grad", "fused_scale_mask_softmax",
                 "fused_scale_mask_softmax_grad")
CPU_LOWERINGS = {op: Lowering("_kernel_window_template", f"{op}.cpp.j2", "fused_row_context")
                 for op in FUSED_ROW_OPS}
CUDA_LOWERINGS = {op: Lowering("_fused_row", f"{op}.cu.j2", "fused_row_context") for op in FUSED_ROW_OPS}
# layer_norm_gamma_grad: columns per CPU block (its double accumulators) and rows per statistics chunk
# in the GPU's shared memory.
GAMMA_BLOCK = 64
GAMMA_CHUNK = 256


class FusedRowGeometry:
    """Buffer names and row geometry of each fused row kernel."""

    def fused_row_context(self, k: Kernel, a, params: Params) -> dict:
        graph = self.graph  # type: ignore[attr-defined]
        x = graph.node(a.inputs[0])
        if a.op.startswith("layer_norm"):
            axis = a.attr("begin_norm_axis")
            cols = 1
            for d in x.type.shape[axis:]:
                cols *= d
            ctx = dict(X=params.use(x.id), rows=x.type.size // cols, cols=cols, epsilon=literal(a.attr("epsilon")),
                       G=None, B=None, elements=x.type.size, block=GAMMA_BLOCK)
            names = {"layer_norm": [n for n, on in (("G", a.attr("scale")), ("B", a.attr("center"))) if on],
                     "layer_norm_grad": ["G"] * bool(a.attr("scale")) + ["DY"],
                     "layer_norm_gamma_grad": ["DY"]}[a.op]
            for name, node in zip(names, a.inputs[1:]):
                ctx[name] = params.use(node)
            ctx["OUT"] = params.use(a.id)
            return ctx
        cols = x.type.shape[-1]
        ctx = dict(rows=x.type.size // cols, cols=cols, scale=literal(a.attr("scale")), elements=x.type.size)
        if a.op == "fused_scale_mask_softmax":
            mask = graph.node(a.inputs[1])
            strides = broadcast_strides(mask.type.shape, x.type.shape)[:-1]
            lines, names = coordinates("r", x.type.shape[:-1])
            terms = [f"{c} * {s}" for c, s in zip(names, strides) if c != "0" and s]
            ctx.update(X=params.use(x.id), MASK=params.use(mask.id),
                       mask_row=code_lines(lines + [f"const int64_t mrow = {' + '.join(terms) or '0'};"]))
        else:
            ctx.update(Y=params.use(x.id), DY=params.use(a.inputs[1]))
        ctx["OUT"] = params.use(a.id)
        return ctx


class CppFusedRows(FusedRowGeometry):
    """The CPU generator's side: `_kernel_window_template` renders them with `fused_row_context`."""


class CudaFusedRows(FusedRowGeometry):
    """The CUDA generator's lowering of the fused row kernels (a mixin of CudaGenerator)."""

    def _fused_row(self, k: Kernel, params: Params):
        from flowc.compiler.codegen.cuda import BLOCK, ROWS_PER_BLOCK, Launch, _ceil_div
        a = self.graph.node(k.anchor_id)  # type: ignore[attr-defined]
        ctx = self.window_context(k, a, params)  # type: ignore[attr-defined]
        ctx.update(block=BLOCK, rows_per_block=ROWS_PER_BLOCK, chunk=GAMMA_CHUNK)
        text = self._template(self.lowering(a.op).template, params=params.declarations(), **ctx)  # type: ignore[attr-defined]
        if a.op == "layer_norm_gamma_grad":
            grid = (_ceil_div(ctx["cols"], BLOCK), 1, 1)
        else:
            grid = self._row_grid(ctx["rows"])  # type: ignore[attr-defined]
        return text, [Launch(k.name, grid, (BLOCK, 1, 1), 0, tuple(params.arguments()))]
