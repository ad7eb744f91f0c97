"""Lowering the batch normalisation kernels of train jobs (compiler/ops/batch_norm.py).

`BatchNormGeometry.batch_norm_context` says what each kernel reads and how x is laid out, viewed as
(outer, C, inner); `CudaBatchNorm` lays the GPU kernels out.  Both backends render
codegen_templates/<backend>/<op>.<ext>.j2.  The CPU parallelises over channels (blocks of
`CHANNEL_BLOCK` adjacent channels when inner is 1, NHWC, so each thread reads whole cache lines of a
row); the GPU gives the per-channel sums one block per channel, and y and dx one thread per element.
batch_norm's kernel runs its consumer loop (relu, a residual add) in its write-back, as a reduction's
(compiler/passes/fusion.py).
Attributes reach the source as literals only.
"""
from __future__ import annotations

from flowc.compiler.codegen.common import Lowering, Params, literal
from flowc.compiler.ops.batch_norm import geometry
from flowc.compiler.program import Kernel

BATCH_NORM_OPS = ("batch_norm_stats", "batch_norm", "batch_norm_grad_sums", "batch_norm_grad")
CPU_LOWERINGS = {op: Lowering("_kernel_window_template", f"{op}.cpp.j2", "batch_norm_context")
                 for op in BATCH_NORM_OPS}
CUDA_LOWERINGS = {op: Lowering("_batch_norm", f"{op}.cu.j2", "batch_norm_context") for op in BATCH_NORM_OPS}
# NHWC on the CPU: channels per iteration of the parallel loop (16 float32 are one 64-byte line).
CHANNEL_BLOCK = 16
# The GPU's per-channel sums: threads per channel's block.
SUM_BLOCK = 256
# Inputs of each op after x, by template name ("G?scale": there when the attribute `scale` is true).
_INPUTS = {"batch_norm_stats": [], "batch_norm": ["S", "G?scale", "B?center"],
           "batch_norm_grad_sums": ["S", "DY", "R?relu"], "batch_norm_grad": ["S", "G?scale", "DY", "SUMS", "R?relu"]}


class BatchNormGeometry:
    """Buffer names and the (outer, C, inner) geometry of each batch normalisation kernel."""

    def batch_norm_context(self, k: Kernel, a, params: Params) -> dict:
        x = self.graph.node(a.inputs[0])  # type: ignore[attr-defined]
        outer, channels, inner = geometry(x.type.shape, a.attr("axis"))
        ctx = dict(X=params.use(x.id), outer=outer, C=channels, inner=inner, count=a.attr("count", outer * inner),
                   elements=x.type.size, epsilon=literal(a.attr("epsilon", 0.0)), G=None, B=None, R=None,
                   cblock=1 if inner > 1 else CHANNEL_BLOCK)
        names = [n.split("?")[0] for n in _INPUTS[a.op] if "?" not in n or a.attr(n.split("?")[1])]
        for name, node in zip(names, a.inputs[1:]):
            ctx[name] = params.use(node)
        # y itself is written where it is stored (batch_norm with an epilogue: only if another kernel reads it)
        ctx["OUT"] = params.use(a.id) if self.stored(a.id, k) else None  # type: ignore[attr-defined]
        # batch_norm's consumer loop (relu, a residual add) in its write-back (passes/fusion.py): operands
        # of y's shape read at y's linear index i, scalars at 0
        assert a.op == "batch_norm" or not k.members, f"{a.op} has no epilogue"
        ctx["epilogue"] = self.pointwise_lines(k, k.members, params,  # type: ignore[attr-defined]
                                               lambda s: "i" if any(s) else "0", anchor_value="acc")
        return ctx


class CppBatchNorm(BatchNormGeometry):
    """The CPU generator's side: `_kernel_window_template` renders them with `batch_norm_context`."""


class CudaBatchNorm(BatchNormGeometry):
    """The CUDA generator's lowering of the batch normalisation kernels (a mixin of CudaGenerator)."""

    def _batch_norm(self, k: Kernel, params: Params):
        from flowc.compiler.codegen.cuda import BLOCK, MAX_GRID, Launch, _ceil_div
        a = self.graph.node(k.anchor_id)  # type: ignore[attr-defined]
        ctx = self.window_context(k, a, params)  # type: ignore[attr-defined]
        per_channel = a.op in ("batch_norm_stats", "batch_norm_grad_sums")
        block = SUM_BLOCK if per_channel else BLOCK
        ctx.update(block=block)
        text = self._template(self.lowering(a.op).template, params=params.declarations(), **ctx)  # type: ignore[attr-defined]
        blocks = ctx["C"] if per_channel else _ceil_div(ctx["elements"], block)
        grid = (max(1, min(blocks, MAX_GRID)), 1, 1)
        return text, [Launch(k.name, grid, (block, 1, 1), 0, tuple(params.arguments()))]
