"""What every backend's code generator shares: the kernels' geometry and their fused arithmetic.

Python decides *what* each kernel computes (the loops' shapes, the expressions of the fused
pointwise ops, the convolution and pooling geometry, which buffers it reads and writes); each
backend decides how that is laid out (a C++ loop nest, a CUDA grid) through its own templates.
`KernelGenerator` holds the first part; `CppGenerator` (cpu.py) and `CudaGenerator` (cuda.py)
are its siblings and add the second.

A backend says how it lowers each op in one table, `LOWERINGS`: op name -> `Lowering` (the
method that lays the kernel out, its template, the method that computes its geometry).  Ops
of the generic kinds (pointwise, reduction, matmul) need no row: one method per kernel kind
lowers them all from their rule's C expression.  `lowering_of(rule)` answers for any op, and
tests/test_backends.py fails when an op lacks a lowering in a registered backend.

What a generator hands a template is `CodeText` (sanitise.py) when it built it itself: buffer
names, C statements, comments over sanitised pieces.  Anything else a template writes is
sanitised as comment text; user names and file names reach the source only that way.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, ClassVar, Final

import numpy as np

from flowc.compiler.codegen.conv_gemm import conv_gemm_plan
from flowc.compiler.codegen.pooling import pool_plan
from flowc.compiler.codegen.sanitise import CodeText, c_identifier, c_literal, code, code_format, code_lines
from flowc.compiler.ir import FLOAT_DTYPES, Graph, c_type, is_number
from flowc.compiler.ops import OPS, OpRule
from flowc.compiler.ops.pointwise import broadcast_strides
from flowc.compiler.program import Kernel, KernelKind, MemoryPlan

# Op kinds that never become a kernel of their own: sources are buffers the runtime binds,
# views share their input's buffer.
BUFFER_KINDS: Final = ("source", "view")
# Op kinds lowered by one method per kernel kind: from the rule's C expression, or (collective) as calls
# into the communication engine.
GENERIC_KINDS: Final = ("pointwise", "reduction", "matmul", "collective")


@dataclass(frozen=True)
class Lowering:
    """How a backend lowers one op that needs a kernel of its own (row and window ops).

    `method` lays the kernel out (a method of the backend's generator); `template` is the file
    under codegen_templates/<backend>/ it renders; `context` (window ops) is the shared method
    that computes the op's geometry.
    """
    method: str
    template: str
    context: str | None = None


@dataclass(frozen=True)
class LabelCheck:
    """Labels that a kernel checks and the step reads from an input: they are checked before the first
    kernel runs (by the generated step on the CPU, by the runtime on the GPU), so a step that fails on
    a label out of range has changed no variable (atomicity; the kernel's own check stays for labels
    computed inside the step)."""
    input: int          # the placeholder's index
    node: int           # the labels' node
    classes: int        # valid labels are [0, classes)
    code: int           # the error code the step fails with (an entry of `error_nodes`)

    def fails(self, labels: np.ndarray) -> bool:
        """Is a label of `labels` (the fed input) out of range?"""
        return bool(labels.size) and (int(labels.min()) < 0 or int(labels.max()) >= self.classes)


@dataclass(frozen=True)
class GenerateOptions:
    """What a build asks of a backend's generator beyond the program itself."""
    version: str = ""           # flowc's version, named in the generated source
    profile: bool = False       # per-kernel timers
    tf32: bool = False          # float32 GEMMs on TF32 tensor cores, where the backend has them
    arch: str | None = None     # the device architecture, where the backend has them ("sm_90")
    check_numerics: bool = False  # a NaN/Inf check of each stored float output after its kernel


class Params:
    """The buffers one kernel touches: its C parameters, and the step's matching arguments."""

    def __init__(self, gen: KernelGenerator, kernel_writes: set[int]) -> None:
        self.gen = gen
        self.writes = kernel_writes
        self.order: list[int] = []

    def use(self, node_id: int) -> CodeText:
        if node_id not in self.order:
            self.order.append(node_id)
        return code(f"b{node_id}")

    def declarations(self) -> list[CodeText]:
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
        return code_lines(decls)

    def arguments(self) -> list:
        """What the step passes for each parameter, in the backend's terms (`argument`)."""
        return [self.gen.argument(n) for n in self.order]


class KernelGenerator:
    """The shared half of a backend's code generator (see the module docstring).

    Subclasses set `LOWERINGS` (op -> Lowering), `KIND_METHODS` (kernel kind -> method) and
    `argument(node_id)` (what a kernel call passes for a buffer), and implement `render()`.
    """
    LOWERINGS: ClassVar[dict[str, Lowering]] = {}
    KIND_METHODS: ClassVar[dict[KernelKind, str]] = {}

    def __init__(self, graph: Graph, kernels: list[Kernel], memory: MemoryPlan, version: str = "",
                 profile: bool = False, check_numerics: bool = False) -> None:
        self.graph, self.kernels, self.memory, self.version = graph, kernels, memory, version
        self.profile = profile
        self.check_numerics = check_numerics
        self.error_nodes: dict[int, int] = {}
        self.numerics_nodes: dict[int, int] = {}     # the error codes of numerics checks -> node id
        self.label_checks: list[LabelCheck] = []

    @classmethod
    def from_program(cls, program, options: GenerateOptions) -> KernelGenerator:
        """The generator for a lowered `Program` (compiler/program.py)."""
        return cls(program.graph, program.kernels, program.memory, options.version, options.profile,
                   check_numerics=options.check_numerics)

    def render(self):
        raise NotImplementedError

    @classmethod
    def lowering_of(cls, rule: OpRule) -> str | None:
        """How this backend lowers `rule`'s op, in words; None when it cannot."""
        if rule.kind in BUFFER_KINDS:
            return f"no kernel ({rule.kind})"
        if rule.kind in GENERIC_KINDS:
            method = cls.KIND_METHODS.get(rule.kind)
            return f"{method} (generic {rule.kind})" if method and hasattr(cls, method) else None
        lowering = cls.LOWERINGS.get(rule.name)
        if lowering is None or not hasattr(cls, lowering.method):
            return None
        if lowering.context is not None and not hasattr(cls, lowering.context):
            return None
        return f"{lowering.method} with {lowering.template}"

    def argument(self, node_id: int):
        raise NotImplementedError

    def error_code(self, k: Kernel) -> int:
        """A new error code for kernel `k`, which checks the labels of its loss op (input 1; a gather's
        indices).  Labels fed as a step input are also checked before the first kernel (`label_checks`)."""
        code = len(self.error_nodes) + 1
        self.error_nodes[code] = k.anchor_id
        anchor = self.graph.node(k.anchor_id)
        logits, labels = anchor.inputs[:2]
        buf = self.memory.storage.get(labels)
        if buf is not None and buf.kind == "input":
            assert isinstance(buf.key, int), buf      # an input's key is its placeholder index
            # the labels' range: the logits' last axis, or a gather's axis of its params
            classes = self.graph.node(logits).type.shape[anchor.attr("axis") if anchor.op == "gather" else -1]
            self.label_checks.append(LabelCheck(buf.key, labels, classes, code))
        return code

    def numerics_checked(self, k: Kernel) -> list[int]:
        """The outputs of kernel `k` that `check_numerics` scans after it: every float value it stores
        (to the arena or to a variable: updated weights and optimizer state included).  Nothing when
        the option is off, so the generated code is then exactly what it is without the option."""
        if not self.check_numerics:
            return []
        return [n for n in k.nodes() if self.stored(n, k) and self.graph.node(n).type.dtype in FLOAT_DTYPES]

    def numerics_code(self, node_id: int) -> int:
        """A new error code for a NaN/Inf found in `node_id`'s value (the runtime names the node)."""
        code = len(self.error_nodes) + 1
        self.error_nodes[code] = node_id
        self.numerics_nodes[code] = node_id
        return code

    def lowering(self, op: str) -> Lowering:
        return self.LOWERINGS[op]

    def stored(self, node_id: int, kernel: Kernel) -> bool:
        """Does the kernel have to write this node's value to memory?"""
        buf = self.memory.storage.get(node_id)
        return buf is not None and buf.kind in ("arena", "variable") and node_id in kernel.nodes()

    def comment(self, k: Kernel) -> CodeText:
        """`kernel: %id op @file:line, ...`; the user's file name is sanitised (it is the user's text)."""
        nodes = [self.graph.node(n) for n in k.nodes()]
        parts = [code_format("%{} {} @{}", n.id, code(n.op), n.loc) for n in nodes if n.op != "constant"]
        return code(f"{c_identifier(k.name)}: " + ", ".join(parts))

    # -- fused pointwise arithmetic -------------------------------------------------------------
    def pointwise_lines(self, kernel: Kernel, members: list[int], params: Params,
                        offset: Callable[[list[int]], str], anchor_value: str | None = None) -> list[CodeText]:
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
            assert rule.c_expr is not None, node.op       # every pointwise rule has one (OpRule checks it)
            # Only numeric attributes become literals: a c_expr naming any other attribute fails here.
            expr = rule.c_expr.format(*operands, T=t, **{k: literal(v) for k, v in node.attrs if is_number(v)})
            lines.append(f"const {t} v{m} = {expr};")
            names[m] = f"v{m}"
            if self.stored(m, kernel):
                lines.append(f"{params.use(m)}[i] = v{m};")
        return code_lines(lines)

    def loop_strides(self, members: list[int]) -> list[list[int]]:
        """Every stride vector a pointwise loop loads with (plus the contiguous one of its outputs)."""
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

    # -- window geometry: one context per op family, the same for every backend ----------------------
    def conv_context(self, k: Kernel, a, params: Params) -> dict:
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
                                            lambda s: conv_offset(s, out_shape), anchor_value="acc")
        direct = kh == kw == 1 and sh == sw == 1 and not any((pt, pb, pl, pr))
        geo = dict(N=n, C=c, H=h, W=w, F=f, Cg=cg, Fg=f // groups, KH=kh, KW=kw, OH=oh, OW=ow,
                   P=oh * ow, K=cg * kh * kw, sh=sh, sw=sw, pt=pt, pl=pl, dh=dh, dw=dw, groups=groups)
        as_gemm = conv_gemm_plan(dict(geo, padded=any((pt, pb, pl, pr))))
        return dict(names, **geo, direct=direct, as_gemm=as_gemm, epilogue=epilogue)

    def copy_context(self, k: Kernel, a, params: Params) -> dict:
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

    def pool_context(self, k: Kernel, a, params: Params) -> dict:
        if a.op == "avg_pool2d_grad":
            in_shape = a.attr("input_shape")
        else:
            in_shape = self.graph.node(a.inputs[0]).type.shape
        for i in a.inputs:
            params.use(i)
        params.use(a.id)
        out_shape = a.type.shape if not a.op.endswith("_grad") else self.graph.node(a.inputs[-1]).type.shape
        (kh, kw), (sh, sw), (pt, _pb, pl, _pr) = a.attr("ksize"), a.attr("strides"), a.attr("pads")
        n, c, h, w = in_shape
        return dict(planes=n * c, H=h, W=w, OH=out_shape[2], OW=out_shape[3], KH=kh, KW=kw, sh=sh, sw=sw,
                    pt=pt, pl=pl, **pool_plan(h, w, out_shape[2], out_shape[3], (kh, kw), (sh, sw), pt, pl))

    def window_context(self, k: Kernel, a, params: Params) -> dict:
        """The template context every backend's window kernel starts from: names and geometry."""
        ctx = {"name": c_identifier(k.name), "comment": self.comment(k), "T": code(c_type(a.type.dtype)), "op": a.op}
        context = self.lowering(a.op).context
        assert context is not None, f"window op {a.op} has no geometry method"
        ctx.update(getattr(self, context)(k, a, params))
        return ctx


def coalesce(shape: tuple, stride_sets: list[list[int]]) -> tuple[list[int], dict[tuple, list[int]]]:
    """Merge adjacent dims that every stride vector walks contiguously; drop size-1 dims.

    Returns the merged dims and, for each original stride vector, its merged strides.
    """
    keep = [d for d, n in enumerate(shape) if n != 1]
    dims = [shape[d] for d in keep]
    merged = {tuple(s): [s[d] for d in keep] for s in stride_sets}
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


def term(var: str, stride: int) -> str:
    """`var * stride` as C, simplified for strides 0 and 1."""
    if stride == 0:
        return "0"
    return var if stride == 1 else f"{var} * {stride}"


def conv_offset(strides: list[int], shape: tuple) -> str:
    """Offset of an epilogue operand at (image i0, filter i1, pixel p) of an NCHW conv output."""
    ow = shape[3]
    terms = [term("i0", strides[0]), term("i1", strides[1])]
    if strides[2] == strides[3] * ow:          # height and width walk contiguously: index by pixel
        terms.append(term("p", strides[3]))
    else:
        terms += [term(f"(p / {ow})", strides[2]), term(f"(p % {ow})", strides[3])]
    return " + ".join(t for t in terms if t != "0") or "0"


def gemm_offset(strides: list[int]) -> str:
    """Offset of an epilogue operand at row i0, column i1 of a GEMM's output."""
    terms = [t for t in (term("i0", strides[0]), term("i1", strides[1])) if t != "0"]
    return " + ".join(terms) or "0"


def literal(value) -> CodeText:
    """A numeric attribute as a C literal in canonical form (NaN and infinities by their macros);
    a number's own `__repr__` never runs (sanitise.c_literal)."""
    return c_literal(value)


def describe_binding(b: tuple) -> CodeText:
    """A pointer-table entry in words, for the generated source's comments (a variable's name sanitised)."""
    if b[0] == "comm":
        return code("the communication engine's table (flowc_comm.h)")
    return code("the arena") if b[0] == "arena" else code_format("{} {}", code(b[0]), repr(b[1]))


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
    """The GEMM a matmul node asks for (every backend lowers it from this)."""
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
