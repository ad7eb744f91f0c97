"""`compute_float16_in_float32`: float16 values are stored as halves and computed in float32.

flowc stores a float16 tensor as IEEE binary16 (2 bytes: `flowc::half`, GCC's `_Float16` on the
CPU, `__half` on CUDA) but no kernel computes in it.  This pass rewrites every op that reads or
produces float16 into the same op in float32 between conversions:

    y = op(a, b)            (float16)
 -> y = cast(op(cast(a, float32), cast(b, float32)), float16)

so each op loads halves, converts them to float, computes in float and rounds its result to half
(round to nearest even; past 65504 to infinity; NaN stays NaN).  That is NumPy's float16
arithmetic, op by op: a fused chain still rounds between its ops, because the casts fuse into the
same loop.  Consequences, by kernel kind:

* pointwise: temporaries are float; a float16 result is rounded where the op is.
* reductions accumulate in float32 (the float32 kernel, pairwise/blocked) and round once at the end.
* matmul and convolution run the float32 GEMM on float copies of their float16 operands (a
  conversion kernel before, the rounding in the GEMM's epilogue); the CUDA backend does the same
  (no half-precision tensor cores yet).
* casts: float16 <-> float32 is the conversion itself; float16 to or from any other dtype goes
  through float32 (an integer becomes float first, then half: the same value as NumPy's direct
  conversion except for integers past 2^24, which round twice).

Buffers and views (inputs, variables, scalars, reshapes, device copies) are left alone: they do no
arithmetic.  A graph without float16 is returned unchanged (the same object), so jobs without
float16 compile to exactly the code they compiled to before.
"""
from __future__ import annotations

from flowc.compiler.ir import Graph, GraphBuilder, Node
from flowc.compiler.passes.simplify import rebuild

HALF = "float16"
COMPUTE = "float32"
# Ops that move or name a buffer without arithmetic: they keep their float16 type.
UNTOUCHED = ("input", "variable", "scalar", "reshape", "device_copy")


def compute_float16_in_float32(graph: Graph) -> Graph:
    """Rewrite every float16 op to compute in float32 between conversions (see the module docstring).

    Example:
        lowered = compute_float16_in_float32(graph)   # no float16 op left but casts and buffers
    """
    if not any(n.type.dtype == HALF for n in graph.nodes):
        return graph

    def cast(builder: GraphBuilder, n: Node, x: int, dtype: str) -> int:
        return builder.add("cast", [x], {"dtype": dtype}, loc=n.loc, role=n.role, device=n.type.device)

    def rewrite(builder: GraphBuilder, n: Node, inputs: tuple[int, ...]) -> int | None:
        if n.op in UNTOUCHED:
            return None
        in_dtypes = [builder.types[i].dtype for i in inputs]
        if n.type.dtype != HALF and HALF not in in_dtypes:
            return None
        if n.op == "cast":
            src, dst = in_dtypes[0], n.type.dtype
            if src == dst or COMPUTE in (src, dst):
                return None          # the conversion itself (or a copy)
            return cast(builder, n, cast(builder, n, inputs[0], COMPUTE), dst)
        wide = [cast(builder, n, x, COMPUTE) if d == HALF else x for x, d in zip(inputs, in_dtypes)]
        attrs = {k: (COMPUTE if v == HALF else v) for k, v in n.attr_dict.items()}
        value = builder.add(n.op, wide, attrs, loc=n.loc, name=n.name, role=n.role, device=n.type.device)
        if n.type.dtype == HALF:
            value = cast(builder, n, value, HALF)
        return value
    return rebuild(graph, rewrite)


def float16_nodes(graph: Graph) -> list[int]:
    """Ids of the nodes of `graph` that compute in float16 (none after the pass, but casts and buffers)."""
    return [n.id for n in graph.nodes if n.type.dtype == HALF and n.op not in UNTOUCHED + ("cast",)]
