"""C++ for the CPU: kernel contexts rendered through codegen_templates/cpu/*.j2.

Python decides *what* each kernel computes (the loops' shapes, the expressions of
the fused pointwise ops, which buffers it reads and writes); the templates decide
how the C++ reads.  The result is one translation unit with one exported entry
point, `int flowc_step(void* const* ptrs)`, whose pointer table the runtime builds
from `bindings` once per loaded job.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from flowc.compiler.codegen.templates import environment
from flowc.compiler.ir import Graph, c_type
from flowc.compiler.ops import OPS
from flowc.compiler.ops.pointwise import broadcast_strides
from flowc.compiler.passes.fusion import Kernel
from flowc.compiler.passes.memory import MemoryPlan

# Below this many elements a loop runs on one thread: waking the OpenMP team costs more than a
# small loop takes (a few microseconds on an idle machine with the team spinning, 50-150 us on the
# 2-vCPU VM once the worker has parked; the MLP's 51,200-element bias-gradient reduction took
# 85-140 us on 2 threads against 14-28 us on one).
PARALLEL_MIN_ELEMENTS = 1 << 18
REDUCTION_BLOCK = 64
# A step with this many kernels or more compiles as that many translation units at once (one per
# core; g++ spends most of a step's build optimising kernel bodies, which parallelises perfectly).
COMPILE_PARTS = max(1, min(4, os.cpu_count() or 1))
MIN_KERNELS_TO_SPLIT = 4

_env = environment("cpu")


@dataclass
class GeneratedStep:
    source: str
    bindings: list[tuple]          # ptr slot -> ("arena",) | ("input", i) | ("variable", name) | ("scalar", name)
    error_nodes: dict[int, int]    # error code -> node id
    profiled_kernels: list[str]    # kernel names, in call order, when built with per-kernel timers
    # The same step as translation units that compile in parallel (the last one holds flowc_step);
    # empty when `source` is compiled whole.  `source` stays the one file users read.
    parts: list[str] = field(default_factory=list)


class _Params:
    """The buffers one kernel touches, as C parameters and the step's matching arguments."""

    def __init__(self, gen: "CppGenerator", kernel_writes: set[int]) -> None:
        self.gen = gen
        self.writes = kernel_writes
        self.order: list[int] = []

    def use(self, node_id: int) -> str:
        if node_id not in self.order:
            self.order.append(node_id)
        return f"b{node_id}"

    def declarations(self) -> list[str]:
        storage = self.gen.memory.storage
        where = [(storage[n].kind, storage[n].key) for n in self.order]
        decls = []
        for n, w in zip(self.order, where):
            t = c_type(self.gen.graph.node(n).type.dtype)
            const = "" if n in self.writes else "const "
            # __restrict only where no other parameter of this kernel shares the memory
            # (an in-place update reads and writes one variable).
            restrict = " FLOWC_RESTRICT" if where.count(w) == 1 else ""
            decls.append(f"{const}{t}*{restrict} b{n}")
        return decls

    def arguments(self) -> list[str]:
        return [self.gen.pointer(n) for n in self.order]


class CppGenerator:
    def __init__(self, graph: Graph, kernels: list[Kernel], memory: MemoryPlan, version: str = "",
                 profile: bool = False) -> None:
        self.graph, self.kernels, self.memory, self.version = graph, kernels, memory, version
        self.profile = profile
        self.bindings: list[tuple] = [("arena",)]
        self.error_nodes: dict[int, int] = {}
        self.materialized = {n for n, b in memory.storage.items()}

    # -- buffers ----------------------------------------------------------------------
    def pointer(self, node_id: int) -> str:
        buf = self.memory.storage[node_id]
        t = c_type(self.graph.node(node_id).type.dtype)
        if buf.kind == "arena":
            return f"reinterpret_cast<{t}*>(arena + {buf.key})"
        binding = (buf.kind, buf.key)
        if binding not in self.bindings:
            self.bindings.append(binding)
        return f"static_cast<{t}*>(ptrs[{self.bindings.index(binding)}])"

    def stored(self, node_id: int, kernel: Kernel) -> bool:
        """Does the kernel have to write this node's value to memory?"""
        buf = self.memory.storage.get(node_id)
        return buf is not None and buf.kind in ("arena", "variable") and node_id in kernel.nodes()

    # -- pointwise bodies -----------------------------------------------------------------
    def pointwise_lines(self, kernel: Kernel, members: list[int], params: _Params,
                        offset: Callable[[list[int]], str], anchor_value: str | None = None) -> list[str]:
        """C statements computing `members` at linear index `i` (plus loads and stores)."""
        lines: list[str] = []
        loads: dict[tuple, str] = {}
        inside = set(members)
        names = {kernel.anchor: anchor_value} if anchor_value else {}
        for m in members:
            node = self.graph.node(m)
            rule = OPS[node.op]
            operands = []
            for x in node.inputs:
                if x in inside or x in names:
                    operands.append(names.get(x, f"v{x}"))
                    continue
                xt = self.graph.node(x).type
                if rule.input_strides is not None:
                    strides = rule.input_strides(node.attr_dict, xt.shape, node.type.shape)
                else:
                    strides = broadcast_strides(xt.shape, node.type.shape)
                key = (x, tuple(strides))
                if key not in loads:
                    loads[key] = f"l{len(loads)}"
                    lines.append(f"const {c_type(xt.dtype)} {loads[key]} = {params.use(x)}[{offset(strides)}];")
                operands.append(loads[key])
            t = c_type(node.type.dtype)
            expr = rule.c_expr.format(*operands, T=t, **{k: _literal(v) for k, v in node.attrs})
            lines.append(f"const {t} v{m} = {expr};")
            names[m] = f"v{m}"
            if self.stored(m, kernel):
                lines.append(f"{params.use(m)}[i] = v{m};")
        return lines

    # -- kernels ----------------------------------------------------------------------------
    def render(self) -> GeneratedStep:
        kernels, calls = [], []
        for k in self.kernels:
            writes = {n for n in k.nodes() if self.stored(n, k)}
            params = _Params(self, writes)
            source, returns_error = getattr(self, f"_kernel_{k.kind}")(k, params)
            kernels.append(source)
            args = ", ".join(params.arguments())
            if returns_error:
                code = len(self.error_nodes) + 1
                self.error_nodes[code] = k.anchor
                calls.append(f"if (int e = {k.name}({args}, {code})) err = e;")
            else:
                calls.append(f"{k.name}({args});")
        copy_backs = [{"dst": self.pointer_for_variable(var, node), "src": self.pointer(node),
                       "nbytes": self.graph.node(node).type.nbytes} for node, var in self.memory.copy_back]
        uses_conv = any(k.kind == "window" and self.graph.node(k.anchor).op.startswith("conv2d")
                        for k in self.kernels)
        common = dict(version=self.version, job=self.graph.name, calls=calls, copy_backs=copy_backs,
                      profile=self.profile,
                      uses_gemm=uses_conv or any(k.kind == "matmul" for k in self.kernels),  # convs run on the GEMM
                      uses_conv=uses_conv, bindings=[_describe_binding(b) for b in self.bindings])
        step = _env.get_template("step.cpp.j2")
        source = step.render(kernels=kernels, split=False, with_step=True, prototypes=[], **common)
        parts = []
        groups = _split_for_compilers(kernels, COMPILE_PARTS)
        if len(groups) > 1:
            last = set(groups[-1])
            parts = [step.render(kernels=[kernels[i] for i in g], split=True, with_step=g is groups[-1],
                                 prototypes=[_prototype(kernels[i]) for i in range(len(kernels)) if i not in last]
                                 if g is groups[-1] else [], **common)
                     for g in groups]
        return GeneratedStep(source, list(self.bindings), dict(self.error_nodes),
                             [k.name for k in self.kernels] if self.profile else [], parts)

    def pointer_for_variable(self, var: str, node: int) -> str:
        t = c_type(self.graph.node(node).type.dtype)
        binding = ("variable", var)
        if binding not in self.bindings:
            self.bindings.append(binding)
        return f"static_cast<{t}*>(ptrs[{self.bindings.index(binding)}])"

    def _comment(self, k: Kernel) -> str:
        nodes = [self.graph.node(n) for n in k.nodes()]
        return f"{k.name}: " + ", ".join(f"%{n.id} {n.op} @{n.loc}" for n in nodes if n.op != "constant")

    def _kernel_pointwise(self, k: Kernel, params: _Params):
        loops = [self._loop_context(k, loop, params) for loop in k.loops]
        parallel = any(lp["parallel"] for lp in loops)
        return _env.get_template("pointwise.cpp.j2").render(
            name=k.name, comment=self._comment(k), params=params.declarations(), loops=loops,
            parallel=parallel), False

    def _loop_context(self, k: Kernel, members: list[int], params: _Params) -> dict:
        shape = self.graph.node(members[-1]).type.shape
        stride_sets = self._loop_strides(members)
        dims, merged = _coalesce(shape, stride_sets)
        size = 1
        for d in shape:
            size *= d
        row_setup: list[str] = []
        if len(dims) <= 1:
            def offset(strides: list[int]) -> str:
                s = merged[_key(strides)]
                return _term("j", s[0] if s else 0)
        else:
            rem_lines = ["int64_t rem = r;"]
            for d in range(len(dims) - 2, -1, -1):
                rem_lines.append(f"const int64_t d{d} = rem % {dims[d]}; rem /= {dims[d]};")
            row_setup = rem_lines + ["(void)rem;"]
            row_offsets: dict[tuple, str] = {}

            def offset(strides: list[int]) -> str:
                s = merged[_key(strides)]
                key = tuple(s)
                if key not in row_offsets:
                    row_offsets[key] = f"o{len(row_offsets)}"
                    expr = " + ".join(_term(f"d{d}", s[d]) for d in range(len(dims) - 1)) or "0"
                    row_setup.append(f"const int64_t {row_offsets[key]} = {expr};")
                return f"{row_offsets[key]} + {_term('j', s[-1])}"
        body = self.pointwise_lines(k, members, params, offset)
        inner = dims[-1] if dims else 1
        outer = size // inner if inner else 0
        return {"shape": list(shape), "rank": len(dims), "inner": inner, "outer": outer,
                "parallel": size >= PARALLEL_MIN_ELEMENTS, "row_setup": row_setup, "body": body,
                "ops": ", ".join(self.graph.node(m).op for m in members)}

    def _loop_strides(self, members: list[int]) -> list[list[int]]:
        """Every stride vector the loop will load with (plus the contiguous one of its outputs)."""
        inside = set(members)
        shape = self.graph.node(members[-1]).type.shape
        sets = [broadcast_strides(shape, shape)]
        for m in members:
            node = self.graph.node(m)
            rule = OPS[node.op]
            for x in node.inputs:
                if x in inside:
                    continue
                xt = self.graph.node(x).type
                sets.append(rule.input_strides(node.attr_dict, xt.shape, node.type.shape)
                            if rule.input_strides else broadcast_strides(xt.shape, node.type.shape))
        return sets

    def _kernel_matmul(self, k: Kernel, params: _Params):
        a = self.graph.node(k.anchor)
        A, B = a.inputs
        g = matmul_geometry(self.graph, a)
        ta, tb = g.trans_a, g.trans_b
        epilogue = []
        if k.members:
            epilogue = self.pointwise_lines(k, k.members, params, lambda s: _gemm_offset(s), anchor_value="acc")
        ctx = dict(name=k.name, comment=self._comment(k), T=c_type(a.type.dtype),
                   M=g.M, N=g.N, K=g.K, batch=g.batch, A=params.use(A), B=params.use(B), C=params.use(a.id),
                   lda=g.lda, ldb=g.ldb, ta="true" if ta else "false", tb="true" if tb else "false",
                   epilogue=epilogue)
        return _env.get_template("matmul.cpp.j2").render(params=params.declarations(), **ctx), False

    def _kernel_reduction(self, k: Kernel, params: _Params):
        a = self.graph.node(k.anchor)
        x = self.graph.node(a.inputs[0])
        outer, reduced, inner = reduction_extents(x.type.shape, a.attr("axes"))
        rule = OPS[a.op]
        t = c_type(a.type.dtype)
        epilogue = []
        if k.members:
            epilogue = self.pointwise_lines(k, k.members, params,
                                            lambda s: "i" if any(s) else "0", anchor_value="acc")
        ctx = dict(name=k.name, comment=self._comment(k), T=t, outer=outer, reduced=reduced,
                   inner=inner, block=REDUCTION_BLOCK, X=params.use(x.id), OUT=params.use(a.id),
                   init=rule.c_init.format(T=t), combine=rule.c_expr.format("acc", "x"),
                   parallel=outer * reduced * inner >= PARALLEL_MIN_ELEMENTS, epilogue=epilogue)
        return _env.get_template("reduction.cpp.j2").render(params=params.declarations(), **ctx), False

    def _kernel_row(self, k: Kernel, params: _Params):
        a = self.graph.node(k.anchor)
        if a.op == "sparse_softmax_cross_entropy":
            return self._xent(k, params, loss=a, grad=None)
        if a.op == "sparse_softmax_cross_entropy_grad":
            return self._xent(k, params, loss=None, grad=a)
        x = self.graph.node(a.inputs[0])
        cols = x.type.shape[-1]
        rows = x.type.size // cols
        text = _env.get_template(OPS[a.op].template).render(
            name=k.name, comment=self._comment(k), T=c_type(x.type.dtype), rows=rows, cols=cols,
            parallel=x.type.size >= PARALLEL_MIN_ELEMENTS)
        params.use(x.id)
        params.use(a.id)
        return text, False

    def _kernel_window(self, k: Kernel, params: _Params):
        a = self.graph.node(k.anchor)
        ctx = {"name": k.name, "comment": self._comment(k), "T": c_type(a.type.dtype), "op": a.op,
               "parallel_min": PARALLEL_MIN_ELEMENTS}
        ctx.update(getattr(self, WINDOW_CONTEXTS[a.op])(k, a, params))
        return _env.get_template(OPS[a.op].template).render(params=params.declarations(), **ctx), False

    def _conv_context(self, k: Kernel, a, params: _Params) -> dict:
        # Every conv op's geometry, from the forward shapes: x (N, C, H, W), weight (F, Cg, KH, KW).
        if a.op == "conv2d":
            x_shape, w_shape = (self.graph.node(i).type.shape for i in a.inputs)
            names = {"X": params.use(a.inputs[0]), "Wt": params.use(a.inputs[1]), "OUT": params.use(a.id)}
        elif a.op == "conv2d_grad_input":
            x_shape, w_shape = a.attr("input_shape"), self.graph.node(a.inputs[1]).type.shape
            names = {"Wt": params.use(a.inputs[1]), "DY": params.use(a.inputs[0]), "DX": params.use(a.id)}
        else:
            x_shape, w_shape = self.graph.node(a.inputs[0]).type.shape, a.attr("filter_shape")
            names = {"X": params.use(a.inputs[0]), "DY": params.use(a.inputs[1]), "DW": params.use(a.id)}
        n, c, h, w = x_shape
        f, cg, kh, kw = w_shape
        (sh, sw), (pt, pb, pl, pr), (dh, dw) = a.attr("strides"), a.attr("pads"), a.attr("dilation")
        from flowc.compiler.ops.conv import out_size
        oh, ow = out_size(h, kh, sh, pt, pb, dh), out_size(w, kw, sw, pl, pr, dw)
        groups = a.attr("groups")
        epilogue = []
        if k.members:
            out_shape = a.type.shape
            epilogue = self.pointwise_lines(k, k.members, params,
                                            lambda s: _conv_offset(s, out_shape), anchor_value="acc")
        direct = kh == kw == 1 and sh == sw == 1 and not any((pt, pb, pl, pr))
        return dict(names, N=n, C=c, H=h, W=w, F=f, Cg=cg, Fg=f // groups, KH=kh, KW=kw, OH=oh, OW=ow,
                    P=oh * ow, K=cg * kh * kw, sh=sh, sw=sw, pt=pt, pl=pl, dh=dh, dw=dw, groups=groups,
                    direct=direct, epilogue=epilogue)

    def _copy_context(self, k: Kernel, a, params: _Params) -> dict:
        axis = a.attr("axis")
        shape = a.type.shape
        outer = int(np.prod(shape[:axis], dtype=np.int64))
        inner = int(np.prod(shape[axis + 1:], dtype=np.int64))
        if a.op == "slice_axis":
            x = self.graph.node(a.inputs[0]).type
            params.use(a.inputs[0])
            params.use(a.id)
            return dict(outer=outer, in_block=x.shape[axis] * inner, out_block=shape[axis] * inner,
                        offset=a.attr("begin") * inner)
        parts, offset = [], 0
        for x in a.inputs:
            block = self.graph.node(x).type.shape[axis] * inner
            parts.append({"name": params.use(x), "block": block, "offset": offset})
            offset += block
        return dict(outer=outer, out_block=shape[axis] * inner, out=params.use(a.id), parts=parts)

    def _pool_context(self, k: Kernel, a, params: _Params) -> dict:
        if a.op == "avg_pool2d_grad":
            in_shape = a.attr("input_shape")
        else:
            in_shape = self.graph.node(a.inputs[0]).type.shape
        for i in a.inputs:
            params.use(i)
        params.use(a.id)
        out_shape = a.type.shape if not a.op.endswith("_grad") else self.graph.node(a.inputs[-1]).type.shape
        (kh, kw), (sh, sw), (pt, pb, pl, pr) = a.attr("ksize"), a.attr("strides"), a.attr("pads")
        n, c, h, w = in_shape
        return dict(planes=n * c, H=h, W=w, OH=out_shape[2], OW=out_shape[3], KH=kh, KW=kw, sh=sh, sw=sw,
                    pt=pt, pl=pl)

    def _kernel_xent_fused(self, k: Kernel, params: _Params):
        return self._xent(k, params, loss=self.graph.node(k.anchor), grad=self.graph.node(k.second))

    def _xent(self, k: Kernel, params: _Params, loss, grad):
        main = loss or grad
        logits, labels = (self.graph.node(i) for i in main.inputs[:2])
        cols = logits.type.shape[-1]
        rows = logits.type.size // cols
        for n in [logits.id, labels.id] + ([loss.id] if loss else []) + ([grad.inputs[2], grad.id] if grad else []):
            params.use(n)
        text = _env.get_template("sparse_xent.cpp.j2").render(
            name=k.name, comment=self._comment(k), T=c_type(logits.type.dtype), L=c_type(labels.type.dtype),
            rows=rows, cols=cols, loss=loss is not None, grad=grad is not None,
            parallel=logits.type.size >= PARALLEL_MIN_ELEMENTS)
        return text, True   # it reports out-of-range labels


# Window ops: which method builds the template context (the template itself is the op row's).
WINDOW_CONTEXTS = {
    "conv2d": "_conv_context", "conv2d_grad_input": "_conv_context", "conv2d_grad_filter": "_conv_context",
    "max_pool2d": "_pool_context", "avg_pool2d": "_pool_context",
    "max_pool2d_grad": "_pool_context", "avg_pool2d_grad": "_pool_context",
    "concat": "_copy_context", "slice_axis": "_copy_context",
}


def _key(strides: list[int]) -> tuple:
    return tuple(strides)


def _coalesce(shape: tuple, stride_sets: list[list[int]]) -> tuple[list[int], dict[tuple, list[int]]]:
    """Merge adjacent dims that every stride vector walks contiguously; drop size-1 dims.

    Returns the merged dims and, for each original stride vector, its merged strides.
    """
    keep = [d for d, n in enumerate(shape) if n != 1]
    dims = [shape[d] for d in keep]
    merged = {_key(s): [s[d] for d in keep] for s in stride_sets}
    out_dims: list[int] = []
    out: dict[tuple, list[int]] = {k: [] for k in merged}
    for d in range(len(dims)):
        if out_dims and all(out[k][-1] == v[d] * dims[d] for k, v in merged.items()):
            out_dims[-1] *= dims[d]
            for k, v in merged.items():
                out[k][-1] = v[d]
        else:
            out_dims.append(dims[d])
            for k, v in merged.items():
                out[k].append(v[d])
    return out_dims, out


def _term(var: str, stride: int) -> str:
    if stride == 0:
        return "0"
    return var if stride == 1 else f"{var} * {stride}"


def _conv_offset(strides: list[int], shape: tuple) -> str:
    """Offset of an epilogue operand at (image i0, filter i1, pixel p) of an NCHW conv output."""
    ow = shape[3]
    terms = [_term("i0", strides[0]), _term("i1", strides[1])]
    if strides[2] == strides[3] * ow:          # height and width walk contiguously: index by pixel
        terms.append(_term("p", strides[3]))
    else:
        terms += [_term(f"(p / {ow})", strides[2]), _term(f"(p % {ow})", strides[3])]
    return " + ".join(t for t in terms if t != "0") or "0"


def _gemm_offset(strides: list[int]) -> str:
    terms = [t for t in (_term("i0", strides[0]), _term("i1", strides[1])) if t != "0"]
    return " + ".join(terms) or "0"


def _literal(value) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float):
        if value != value:
            return "NAN"
        if value in (float("inf"), float("-inf")):
            return "INFINITY" if value > 0 else "-INFINITY"
        return repr(value)
    return str(value)


def _describe_binding(b: tuple) -> str:
    return "the arena" if b[0] == "arena" else f"{b[0]} {b[1]!r}"


@dataclass(frozen=True)
class MatmulGeometry:
    """A (batched) matmul node's GEMM: C[M, N] = op(A)[M, K] op(B)[K, N], `batch` times."""
    M: int
    N: int
    K: int
    batch: int
    lda: int
    ldb: int
    trans_a: bool
    trans_b: bool


def matmul_geometry(graph: Graph, node) -> MatmulGeometry:
    """The GEMM a matmul node asks for (both code generators lower it from this)."""
    ta, tb = node.attr("transpose_a"), node.attr("transpose_b")
    ashape, bshape = (graph.node(i).type.shape for i in node.inputs)
    return MatmulGeometry(M=node.type.shape[-2], N=node.type.shape[-1], K=ashape[-2] if ta else ashape[-1],
                          batch=int(np.prod(node.type.shape[:-2], dtype=np.int64)),
                          lda=ashape[-1], ldb=bshape[-1], trans_a=bool(ta), trans_b=bool(tb))


def reduction_extents(shape: tuple, axes) -> tuple[int, int, int]:
    """(outer, reduced, inner) sizes of a reduction over the contiguous `axes` of `shape`."""
    outer = reduced = inner = 1
    for d, n in enumerate(shape):
        if d < axes[0]:
            outer *= n
        elif d <= axes[-1]:
            reduced *= n
        else:
            inner *= n
    return outer, reduced, inner


def _split_for_compilers(kernels: list[str], parts: int) -> list[list[int]]:
    """Kernel indices in `parts` groups of about equal source length (the proxy for compile time)."""
    if parts < 2 or len(kernels) < MIN_KERNELS_TO_SPLIT:
        return [list(range(len(kernels)))]
    groups: list[list[int]] = [[] for _ in range(parts)]
    sizes = [0] * parts
    for i in sorted(range(len(kernels)), key=lambda i: -len(kernels[i])):
        g = sizes.index(min(sizes))
        groups[g].append(i)
        sizes[g] += len(kernels[i])
    return [sorted(g) for g in groups if g]


def _prototype(kernel_source: str) -> str:
    """`void name(params)` of a rendered kernel, whose definition begins `FLOWC_KERNEL void name(...) {`."""
    start = kernel_source.index("FLOWC_KERNEL ") + len("FLOWC_KERNEL ")
    return kernel_source[start:kernel_source.index(") {", start) + 1]
