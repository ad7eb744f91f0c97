"""The CPU backend's code generator: kernels rendered through codegen_templates/cpu/*.j2.

What each kernel computes comes from `KernelGenerator` (common.py), shared with the CUDA
generator; this module lays kernels out as C++ loop nests and OpenMP regions.  The result is one
translation unit with one exported entry point, `int flowc_step(void* const* ptrs)`, whose pointer
table the runtime builds from `bindings` once per loaded job.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import ClassVar

from flowc.compiler.codegen.batch_norm import CPU_LOWERINGS as BATCH_NORM_LOWERINGS, CppBatchNorm
from flowc.compiler.codegen.collectives import COMM_TYPES, EXCHANGES, Bucket, exchange_count, plan_buckets
from flowc.compiler.codegen.common import (KernelGenerator, LabelCheck, Lowering, Params, coalesce,
                                           describe_binding, gemm_offset, literal, matmul_geometry,
                                           reduction_extents, term)
from flowc.compiler.codegen.dedup import KernelTable
from flowc.compiler.codegen.indexing import CPU_LOWERINGS as INDEXING_LOWERINGS, CppIndexing
from flowc.compiler.codegen.rows import CPU_LOWERINGS as FUSED_ROW_LOWERINGS, CppFusedRows
from flowc.compiler.codegen.sanitise import CodeText, c_identifier, code, code_lines
from flowc.compiler.codegen.templates import environment
from flowc.compiler.ir import Graph, c_type
from flowc.compiler.ops import OPS
from flowc.compiler.program import Kernel, KernelKind, MemoryPlan, view_roots

# Below this many elements a loop runs on one thread: waking the OpenMP team costs more than a
# small loop takes (a few microseconds on an idle machine with the team spinning, 50-150 us on the
# 2-vCPU VM once the worker has parked; the MLP's 51,200-element bias-gradient reduction took
# 85-140 us on 2 threads against 14-28 us on one).
PARALLEL_MIN_ELEMENTS = 1 << 18
REDUCTION_BLOCK = 64
# Long reductions are cut into chunks combined pairwise (see reduction.cpp.j2): a row chunk is summed
# in REDUCTION_LANES accumulators (64 elements each), a column chunk in one accumulator per output.
REDUCTION_LANES = 16
REDUCTION_ROW_CHUNK = 1024
REDUCTION_COLUMN_CHUNK = 64
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
    label_checks: list[LabelCheck]  # labels checked before the first kernel (flowc_step does it)
    profiled_kernels: list[str]    # kernel names, in call order, when built with per-kernel timers
    # The same step as translation units that compile in parallel (the last one holds flowc_step);
    # empty when `source` is compiled whole.  `source` stays the one file users read.
    parts: list[str] = field(default_factory=list)
    # The error codes of check_numerics (a subset of `error_nodes`): code -> the node whose value has a
    # NaN or an infinity.  Empty when the step was built without the option.
    numerics_nodes: dict[int, int] = field(default_factory=dict)
    # The C++ functions behind the kernels (compiler/codegen/dedup.py: equal kernels share one).
    kernel_functions: int = 0
    # A data-parallel step's all-reduce buckets (compiler/codegen/collectives.py); 0 without collectives.
    comm_buckets: int = 0


class CppGenerator(CppIndexing, CppFusedRows, CppBatchNorm, KernelGenerator):
    """Renders a lowered program as one C++ translation unit with one entry point, `flowc_step`."""
    LOWERINGS: ClassVar[dict[str, Lowering]] = {
        "softmax": Lowering("_kernel_row_template", "softmax.cpp.j2"),
        "argmax": Lowering("_kernel_row_template", "argmax.cpp.j2"),
        "sparse_softmax_cross_entropy": Lowering("_kernel_xent_loss", "sparse_xent.cpp.j2"),
        "sparse_softmax_cross_entropy_grad": Lowering("_kernel_xent_grad", "sparse_xent.cpp.j2"),
        "conv2d": Lowering("_kernel_window_template", "conv2d.cpp.j2", "conv_context"),
        "conv2d_grad_input": Lowering("_kernel_window_template", "conv2d_grad_input.cpp.j2", "conv_context"),
        "conv2d_grad_filter": Lowering("_kernel_window_template", "conv2d_grad_filter.cpp.j2", "conv_context"),
        "max_pool2d": Lowering("_kernel_window_template", "pool2d.cpp.j2", "pool_context"),
        "avg_pool2d": Lowering("_kernel_window_template", "pool2d.cpp.j2", "pool_context"),
        "max_pool2d_grad": Lowering("_kernel_window_template", "pool2d_grad.cpp.j2", "pool_context"),
        "avg_pool2d_grad": Lowering("_kernel_window_template", "pool2d_grad.cpp.j2", "pool_context"),
        "concat": Lowering("_kernel_window_template", "concat.cpp.j2", "copy_context"),
        "slice_axis": Lowering("_kernel_window_template", "slice_axis.cpp.j2", "copy_context"),
        **INDEXING_LOWERINGS,   # gather, slices, one_hot, top_k: compiler/codegen/indexing.py
        **FUSED_ROW_LOWERINGS,  # layer_norm, the scaled masked softmax: compiler/codegen/rows.py
        **BATCH_NORM_LOWERINGS,  # batch normalisation of train jobs: compiler/codegen/batch_norm.py
    }
    KIND_METHODS: ClassVar[dict[KernelKind, str]] = {
        "pointwise": "_kernel_pointwise", "reduction": "_kernel_reduction", "matmul": "_kernel_matmul",
        "row": "_kernel_by_op", "window": "_kernel_by_op", "xent_fused": "_kernel_xent_fused",
        "collective": "_kernel_collective",
    }

    def __init__(self, graph: Graph, kernels: list[Kernel], memory: MemoryPlan, version: str = "",
                 profile: bool = False, check_numerics: bool = False) -> None:
        super().__init__(graph, kernels, memory, version, profile, check_numerics)
        self.bindings: list[tuple] = [("arena",)]
        self._table = KernelTable()         # the step's distinct functions (dedup.py)
        # Summed gradients read where the engine left them (CommCalls.direct): node -> its pointer.
        self._in_bucket: dict[int, CodeText] = {}

    # -- buffers ----------------------------------------------------------------------
    def pointer(self, node_id: int) -> CodeText:
        if node_id in self._in_bucket:
            return self._in_bucket[node_id]
        buf = self.memory.storage[node_id]
        t = c_type(self.graph.node(node_id).type.dtype)
        if buf.kind == "arena":
            return code(f"reinterpret_cast<{t}*>(arena + {buf.key})")
        binding = (buf.kind, buf.key)
        if binding not in self.bindings:
            self.bindings.append(binding)
        return code(f"static_cast<{t}*>(ptrs[{self.bindings.index(binding)}])")

    argument = pointer      # a kernel call passes the C pointer expression of each buffer

    # -- kernels ----------------------------------------------------------------------------
    def render(self) -> GeneratedStep:
        table = self._table = KernelTable()
        calls: list[CodeText] = []
        numerics: list[list[CodeText]] = []     # per call: the NaN/Inf checks after it (check_numerics)
        comm = CommCalls(self, plan_buckets(self.graph, self.kernels))
        self._in_bucket = comm.direct
        for index, k in enumerate(self.kernels):
            if k.kind == "collective":
                calls.append(comm.at(index, k))
                numerics.append([])
                continue
            writes = {n for n in k.nodes() if self.stored(n, k)}
            params = Params(self, writes)
            source, returns_error = getattr(self, self.KIND_METHODS[k.kind])(k, params)
            own = c_identifier(k.name)
            name, _ = table.add(source, own)      # a kernel the same as an earlier one calls its function
            args = ", ".join(params.arguments())
            which = f"  // {own}" if name != own else ""
            if returns_error:
                # Stop at the first error: no later kernel (an optimizer update) may run on its data.
                call = code(f"if (int e = {name}({args}, {self.error_code(k)})) return e;")
            else:
                call = code(f"{name}({args});")
            # the comment naming a shared function goes last: the engine calls after it must not be in it
            calls.append(code(comm.before_first() + call + comm.after(index) + which))
            numerics.append([code(f"if (flowc::any_non_finite({self.pointer(n)}, {self.graph.node(n).type.size})) "
                                  f"return {self.numerics_code(n)};") for n in self.numerics_checked(k)])
        checks = [{"labels": self.pointer(c.node), "rows": self.graph.node(c.node).type.size,
                   "classes": c.classes, "code": c.code} for c in self.label_checks]
        copy_backs = [{"dst": self.pointer_for_variable(var, node), "src": self.pointer(node),
                       "nbytes": self.graph.node(node).type.nbytes} for node, var in self.memory.copy_back]
        uses_conv = any(k.kind == "window" and self.graph.node(k.anchor_id).op.startswith("conv2d")
                        for k in self.kernels)
        kernels = table.sources
        common = dict(version=self.version, job=self.graph.name, checks=checks, calls=calls, copy_backs=copy_backs,
                      profile=self.profile, numerics=numerics, check_numerics=self.check_numerics,
                      uses_gemm=uses_conv or any(k.kind == "matmul" for k in self.kernels),  # convs run on the GEMM
                      uses_conv=uses_conv, bindings=[describe_binding(b) for b in self.bindings],
                      comm_slot=comm.slot)
        step = _env.get_template("step.cpp.j2")
        source = step.render(kernels=kernels, split=False, with_step=True, prototypes=[], **common)
        parts = []
        groups = _split_for_compilers(kernels, COMPILE_PARTS)
        if len(groups) > 1:
            # Every part declares the functions it does not define: the step calls kernels, and a
            # multi-loop kernel calls loop functions, that may lie in another part.
            parts = [step.render(kernels=[kernels[i] for i in g], split=True, with_step=g is groups[-1],
                                 prototypes=[_prototype(kernels[i]) for i in range(len(kernels)) if i not in set(g)],
                                 **common)
                     for g in groups]
        return GeneratedStep(source, list(self.bindings), dict(self.error_nodes), list(self.label_checks),
                             [k.name for k in self.kernels] if self.profile else [], parts,
                             dict(self.numerics_nodes), len(kernels), len(comm.plan))

    def _kernel_collective(self, k: Kernel, params: Params):
        raise AssertionError(f"{k.name}: a collective is a call into the engine (CommCalls), not a kernel function")

    def pointer_for_variable(self, var: str, node: int) -> CodeText:
        t = c_type(self.graph.node(node).type.dtype)
        binding = ("variable", var)
        if binding not in self.bindings:
            self.bindings.append(binding)
        return code(f"static_cast<{t}*>(ptrs[{self.bindings.index(binding)}])")

    def _kernel_pointwise(self, k: Kernel, params: Params):
        if len(k.loops) == 1:
            loops = [self._loop_context(k, k.loops[0], params)]
            return _env.get_template("pointwise.cpp.j2").render(
                name=c_identifier(k.name), comment=self.comment(k), params=params.declarations(), loops=loops,
                loop_calls=[], parallel=loops[0]["parallel"]), False
        # Several loops: each its own function (shared by the loops equal to it), called from this kernel.
        loop_params = [Params(self, params.writes) for _ in k.loops]
        loops = [self._loop_context(k, loop, lp) for loop, lp in zip(k.loops, loop_params)]
        parallel = any(lp["parallel"] for lp in loops)
        calls = []
        for i, (lp, lparams) in enumerate(zip(loops, loop_params)):
            own = f"{c_identifier(k.name)}_loop{i}"
            text = _env.get_template("pointwise_loop.cpp.j2").render(
                name=code(own), params=lparams.declarations(), lp=lp, worksharing=parallel)
            fn, _ = self._table.add(text, own)
            calls.append(code(f"{fn}({', '.join(params.use(n) for n in lparams.order)});"))
        return _env.get_template("pointwise.cpp.j2").render(
            name=c_identifier(k.name), comment=self.comment(k), params=params.declarations(), loops=loops,
            loop_calls=calls, parallel=parallel), False

    def _loop_context(self, k: Kernel, members: list[int], params: Params) -> dict:
        shape = self.graph.node(members[-1]).type.shape
        stride_sets = self.loop_strides(members)
        dims, merged = coalesce(shape, stride_sets)
        size = 1
        for d in shape:
            size *= d
        row_setup: list[str] = []
        if len(dims) <= 1:
            def offset(strides: list[int]) -> str:
                s = merged[tuple(strides)]
                return term("j", s[0] if s else 0)
        else:
            rem_lines = ["int64_t rem = r;"]
            for d in range(len(dims) - 2, -1, -1):
                rem_lines.append(f"const int64_t d{d} = rem % {dims[d]}; rem /= {dims[d]};")
            row_setup = rem_lines + ["(void)rem;"]
            row_offsets: dict[tuple, str] = {}

            def offset(strides: list[int]) -> str:
                s = merged[tuple(strides)]
                key = tuple(s)
                if key not in row_offsets:
                    row_offsets[key] = f"o{len(row_offsets)}"
                    expr = " + ".join(term(f"d{d}", s[d]) for d in range(len(dims) - 1)) or "0"
                    row_setup.append(f"const int64_t {row_offsets[key]} = {expr};")
                return f"{row_offsets[key]} + {term('j', s[-1])}"
        body = self.pointwise_lines(k, members, params, offset)
        inner = dims[-1] if dims else 1
        outer = size // inner if inner else 0
        return {"shape": list(shape), "rank": len(dims), "inner": inner, "outer": outer,
                "parallel": size >= PARALLEL_MIN_ELEMENTS, "row_setup": code_lines(row_setup), "body": body,
                "ops": code(", ".join(self.graph.node(m).op for m in members))}

    def _kernel_matmul(self, k: Kernel, params: Params):
        a = self.graph.node(k.anchor_id)
        A, B = a.inputs
        g = matmul_geometry(self.graph, a)
        ta, tb = g.trans_a, g.trans_b
        epilogue = []
        if k.members:
            epilogue = self.pointwise_lines(k, k.members, params, gemm_offset, anchor_value="acc")
        ctx = dict(name=c_identifier(k.name), comment=self.comment(k), T=code(c_type(a.type.dtype)),
                   M=g.M, N=g.N, K=g.K, batch=g.batch, A=params.use(A), B=params.use(B), C=params.use(a.id),
                   lda=g.lda, ldb=g.ldb, ta=code("true" if ta else "false"), tb=code("true" if tb else "false"),
                   epilogue=epilogue)
        return _env.get_template("matmul.cpp.j2").render(params=params.declarations(), **ctx), False

    def _kernel_reduction(self, k: Kernel, params: Params):
        a = self.graph.node(k.anchor_id)
        x = self.graph.node(a.inputs[0])
        outer, reduced, inner = reduction_extents(x.type.shape, a.attr("axes"))
        rule = OPS[a.op]
        assert rule.c_init is not None and rule.c_expr is not None, a.op   # every reduction rule has both
        t = code(c_type(a.type.dtype))
        epilogue = []
        if k.members:
            epilogue = self.pointwise_lines(k, k.members, params,
                                            lambda s: "i" if any(s) else "0", anchor_value="acc")
        chunk = REDUCTION_ROW_CHUNK if inner == 1 else REDUCTION_COLUMN_CHUNK
        chunks = -(-reduced // chunk)
        ctx = dict(name=c_identifier(k.name), comment=self.comment(k), T=t, outer=outer, reduced=reduced,
                   inner=inner, block=REDUCTION_BLOCK, X=params.use(x.id), OUT=params.use(a.id),
                   lanes=REDUCTION_LANES, chunk=chunk, chunks=chunks, levels=max(1, chunks.bit_length()),
                   init=code(rule.c_init.format(T=t)), combine=code(rule.c_expr.format("acc", "x")),
                   parallel=outer * reduced * inner >= PARALLEL_MIN_ELEMENTS, epilogue=epilogue)
        return _env.get_template("reduction.cpp.j2").render(params=params.declarations(), **ctx), False

    def _kernel_by_op(self, k: Kernel, params: Params):
        """Row and window kernels: the op's row in LOWERINGS says which method lays it out."""
        return getattr(self, self.lowering(self.graph.node(k.anchor_id).op).method)(k, params)

    def _kernel_row_template(self, k: Kernel, params: Params):
        a = self.graph.node(k.anchor_id)
        x = self.graph.node(a.inputs[0])
        cols = x.type.shape[-1]
        rows = x.type.size // cols
        text = _env.get_template(self.lowering(a.op).template).render(
            name=c_identifier(k.name), comment=self.comment(k), T=code(c_type(x.type.dtype)), rows=rows, cols=cols,
            parallel=x.type.size >= PARALLEL_MIN_ELEMENTS)
        params.use(x.id)
        params.use(a.id)
        return text, False

    def _kernel_xent_loss(self, k: Kernel, params: Params):
        return self._xent(k, params, loss=self.graph.node(k.anchor_id), grad=None)

    def _kernel_xent_grad(self, k: Kernel, params: Params):
        return self._xent(k, params, loss=None, grad=self.graph.node(k.anchor_id))

    def _kernel_window_template(self, k: Kernel, params: Params):
        a = self.graph.node(k.anchor_id)
        ctx = self.window_context(k, a, params)
        ctx["parallel_min"] = PARALLEL_MIN_ELEMENTS
        return _env.get_template(self.lowering(a.op).template).render(params=params.declarations(), **ctx), False

    def _kernel_xent_fused(self, k: Kernel, params: Params):
        return self._xent(k, params, loss=self.graph.node(k.anchor_id), grad=self.graph.node(k.second_id))

    def _xent(self, k: Kernel, params: Params, loss, grad):
        main = loss or grad
        logits, labels = (self.graph.node(i) for i in main.inputs[:2])
        cols = logits.type.shape[-1]
        rows = logits.type.size // cols
        for n in [logits.id, labels.id] + ([loss.id] if loss else []) + ([grad.inputs[2], grad.id] if grad else []):
            params.use(n)
        text = _env.get_template(self.lowering(main.op).template).render(
            name=c_identifier(k.name), comment=self.comment(k), T=code(c_type(logits.type.dtype)),
            L=code(c_type(labels.type.dtype)),
            rows=rows, cols=cols, loss=loss is not None, grad=grad is not None,
            parallel=logits.type.size >= PARALLEL_MIN_ELEMENTS)
        return text, True   # it reports out-of-range labels


def _split_for_compilers(kernels: list[str], parts: int) -> list[list[int]]:
    """Kernel indices in `parts` groups of about equal code length (the proxy for compile time).

    Comment lines do not count: they cost the compiler nothing, and a user's long file or job name
    in them must not change how the step is split.
    """
    if parts < 2 or len(kernels) < MIN_KERNELS_TO_SPLIT:
        return [list(range(len(kernels)))]
    sizes_of = [sum(len(line) for line in k.splitlines() if not line.lstrip().startswith("//")) for k in kernels]
    groups: list[list[int]] = [[] for _ in range(parts)]
    sizes = [0] * parts
    for i in sorted(range(len(kernels)), key=lambda i: -sizes_of[i]):
        g = sizes.index(min(sizes))
        groups[g].append(i)
        sizes[g] += sizes_of[i]
    return [sorted(g) for g in groups if g]


def _prototype(kernel_source: str) -> CodeText:
    """`void name(params)` of a rendered kernel, whose definition begins `FLOWC_KERNEL void name(...) {`."""
    start = kernel_source.index("FLOWC_KERNEL ") + len("FLOWC_KERNEL ")
    return code(kernel_source[start:kernel_source.index(") {", start) + 1])


class CommCalls:
    """The step's calls into the communication engine (codegen_templates/cpu/flowc_comm.h) for a
    bucket plan (compiler/codegen/collectives.py): starts after the kernel that writes a bucket's
    last gradient, a progress poke after each kernel while buckets are in flight, the wait at the
    bucket's first all_reduce kernel and each gradient's copy out at its own all_reduce kernel; and
    each exchange of a model-parallel layer (all_gather, ...) as one call at its own place."""

    def __init__(self, generator: CppGenerator, plan: list[Bucket]) -> None:
        self.gen, self.plan = generator, plan
        self.bucket_of = {m: b for b in plan for m in b.members}
        self.direct = self._direct()
        self.slot: int | None = None
        if plan or any(n.op in EXCHANGES for n in generator.graph.nodes):
            generator.bindings.append(("comm",))
            self.slot = len(generator.bindings) - 1
        self._started_first = False

    def _direct(self) -> dict[int, CodeText]:
        """The sums (and views of them) their readers take from the bucket, where the engine left them,
        instead of from a copy in the arena: every unscaled sum whose value only this step reads
        (not a result the runtime reads back, not written into a variable in place)."""
        graph, storage = self.gen.graph, self.gen.memory.storage
        roots = view_roots(graph)
        read_back = {roots.get(o, o) for o in graph.outputs}
        direct: dict[int, CodeText] = {}
        for m, b in self.bucket_of.items():
            node = graph.node(m)
            if node.attr("scale") == 1.0 and storage[m].kind == "arena" and m not in read_back:
                direct[m] = code(f"(static_cast<{c_type(b.dtype)}*>(const_cast<void*>(comm->data(comm->ctx, "
                                 f"{b.index}))) + {b.offset(m)})")
        for view, root in roots.items():
            if root in direct:
                direct[view] = direct[root]
        return direct

    def _start(self, b: Bucket) -> str:
        grads = ", ".join(str(self.gen.pointer(self.gen.graph.node(m).inputs[0])) for m in b.members)
        sizes = ", ".join(str(n) for n in b.sizes)
        return (f" {{ const void* g[] = {{{grads}}}; static const int64_t n[] = {{{sizes}}};"
                f" if (int e = comm->start(comm->ctx, {b.index}, {len(b.members)}, g, n, {COMM_TYPES[b.dtype]}))"
                f" return e; }}")

    def before_first(self) -> str:
        """Buckets whose gradients are all sources (start before the first kernel)."""
        if self._started_first:
            return ""
        self._started_first = True
        return "".join(self._start(b) for b in self.plan if b.start_after < 0)

    def after(self, index: int) -> str:
        text = "".join(self._start(b) for b in self.plan if b.start_after == index)
        if any(b.start_after <= index < b.wait_at for b in self.plan):
            text += " if (int e = comm->progress(comm->ctx)) return e;"
        return text

    def at(self, index: int, k: Kernel) -> CodeText:
        node = self.gen.graph.node(k.anchor_id)
        if node.op in EXCHANGES:
            return self._exchange(index, k, node)
        b = self.bucket_of[node.id]
        wait = f"if (int e = comm->wait(comm->ctx, {b.index})) return e; " if b.wait_at == index else ""
        if node.id in self.direct:          # its readers take it from the bucket
            return code(f"{self.before_first()}{wait}// {c_identifier(k.name)}: read in bucket {b.index}")
        out = self.gen.pointer(node.id)
        scale = literal(float(node.attr("scale")))
        return code(f"{self.before_first()}{wait}flowc::comm_unpack<{c_type(b.dtype)}>(comm->data(comm->ctx, "
                    f"{b.index}), {b.offset(node.id)}, {out}, {node.type.size}, {scale});  // {c_identifier(k.name)}")

    def _exchange(self, index: int, k: Kernel, node) -> CodeText:
        kind = EXCHANGES[node.op][0]
        x = self.gen.graph.node(node.inputs[0])
        count, dtype = exchange_count(node, x), COMM_TYPES[x.type.dtype]
        src, dst = self.gen.pointer(x.id), self.gen.pointer(node.id)
        return code(f"{self.before_first()}if (int e = comm->exchange(comm->ctx, {kind}, {src}, {dst}, {count}, "
                    f"{dtype})) return e;{self.after(index)}  // {c_identifier(k.name)}")
