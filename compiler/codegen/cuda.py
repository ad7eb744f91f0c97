"""CUDA for NVIDIA GPUs: the CPU backend's kernels, rendered through codegen_templates/cuda/*.cu.j2.

`CudaGenerator` consumes the same `Program` as `CppGenerator` (the graph, the kernels of the
fusion passes, the memory plan) and is its sibling over `KernelGenerator` (common.py): what a
kernel computes (the fused pointwise statements, the epilogues, the convolution and pooling
geometry) is shared, so both backends implement one semantics.  What differs is how a kernel is
laid out on the GPU (one method per kernel kind, and `LOWERINGS` for the row and window ops), and
that a step is a translation unit of `extern "C" __global__` kernels plus a launch list, which the
host step at its end (`flowc_step`, cuda_host.py) runs in order on the job's stream in one call
(the per-launch fallback replays the list from Python instead):

    gen = CudaGenerator(program.graph, program.kernels, program.memory, version)
    step = gen.render()
    step.source      # one .cu file
    step.launches    # [Launch(kernel, grid, block, shared_bytes, args)], args as bindings

Every kernel parameter is a pointer; sizes and strides are literals in the source.  A launch
argument names the buffer: ("arena", byte offset), ("input", i), ("variable", name),
("scalar", name), ("scratch", byte offset) or ("status",), the int the kernels that check
their data (labels out of range) raise with atomicMax, and check_numerics' checks set (the first
one wins) when a value holds a NaN or an infinity.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import ClassVar

import numpy as np

from flowc.compiler.codegen.batch_norm import CUDA_LOWERINGS as BATCH_NORM_LOWERINGS, CudaBatchNorm
from flowc.compiler.codegen.common import (GenerateOptions, KernelGenerator, LabelCheck, Lowering, Params,
                                           coalesce, describe_binding, gemm_offset, literal, matmul_geometry,
                                           reduction_extents, term)
from flowc.compiler.codegen.collectives import EXCHANGES, Bucket, exchange_count, plan_buckets
from flowc.compiler.codegen.cuda_host import CommCall, Fetch, host_step
from flowc.compiler.codegen.dedup import KernelTable
from flowc.compiler.codegen.indexing import CUDA_LOWERINGS as INDEXING_LOWERINGS, CudaIndexing
from flowc.compiler.codegen.rows import CUDA_LOWERINGS as FUSED_ROW_LOWERINGS, CudaFusedRows
from flowc.compiler.codegen.sanitise import c_identifier, code, code_format, code_lines
from flowc.compiler.codegen.templates import environment
from flowc.compiler.cuda_toolchain import arch_number
from flowc.compiler.ir import Graph, c_type
from flowc.compiler.ops import OPS
from flowc.compiler.program import Kernel, KernelKind, MemoryPlan

BLOCK = 256                # threads of the elementwise and row kernels
ROWS_PER_BLOCK = BLOCK // 32   # row kernels give each row one warp
REDUCTION_CHUNK = 64       # elements a thread combines in order before pairing partial results
MAX_GRID = 65535           # grid-stride loops cover the rest; also the y/z limit
GEMM_TILE = 64             # flowc::kGemmBM == kGemmBN in flowc_cuda_gemm.h
GEMM_THREADS, TF32_THREADS = 256, 128
SPLIT_CHUNK = 2048         # filter gradient: reduction elements per split (see _conv2d_grad_filter)
MAX_SPLITS = 64
INT32_SAFE = 1 << 30       # index ranges below this use 32-bit arithmetic (with room for grid-stride overshoot)

_env = environment("cuda")


class CudaCodegenError(ValueError):
    """A kernel cannot be laid out on the GPU (e.g. a dimension beyond CUDA's grid limits)."""


@dataclass(frozen=True)
class Launch:
    """One kernel launch of a step: grid and block in CUDA's (x, y, z) order, one binding per parameter."""
    kernel: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_bytes: int
    args: tuple[tuple, ...]
    # A check_numerics launch: the runtime reads the status after it and stops the step when it is set.
    # Out of the repr, which tests/golden records: a step built without the option reads as before.
    checks_status: bool = field(default=False, repr=False)


@dataclass(frozen=True)
class DeviceCopy:
    """A device-to-device copy after the last launch (a variable updated by copy, not in place)."""
    dst: tuple
    src: tuple
    nbytes: int


@dataclass
class GeneratedCudaStep:
    source: str
    launches: list[Launch]
    copies: list[DeviceCopy]
    bindings: list[tuple]            # ("arena",) then every other buffer the launches use, first use first
    error_nodes: dict[int, int]      # status code -> node id
    label_checks: list[LabelCheck]   # input labels the runtime checks before the first launch
    profiled_kernels: list[str]      # launch names, in order, when built to be profiled
    scratch_bytes: int = 0           # one scratch buffer per job, shared by the kernels (they run in order)
    templates: list[str] = field(default_factory=list)   # the template of each kernel, in kernel order
    tensor_cores: bool = False       # GEMMs on TF32 tensor cores
    numerics_nodes: dict[int, int] = field(default_factory=dict)   # check_numerics codes -> node id
    kernel_functions: int = 0        # the __global__ functions behind the launches (equal kernels share one)
    fetches: list[Fetch] = field(default_factory=list)   # the outputs the host step downloads, in order
    host_sync: bool = True           # the host step waits for the stream (the host reads something of the step)
    comm_calls: list[CommCall] = field(default_factory=list)   # the engine's calls between the launches
    comm_buckets: int = 0            # a data-parallel step's all-reduce buckets

    @property
    def uses_comm(self) -> bool:
        """The step calls a communication engine (NCCL): it runs only as a host step, on several ranks."""
        return bool(self.comm_calls)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _grid_1d(total: int, block: int = BLOCK) -> tuple[int, int, int]:
    return (max(1, min(_ceil_div(total, block), MAX_GRID)), 1, 1)


def _gemm_grid(column_tiles: int, row_tiles: int, planes: int) -> tuple[int, int, int]:
    """A GEMM template's grid: y and z stop at CUDA's 65,535, the kernels stride over the rest."""
    return (max(1, column_tiles), max(1, min(row_tiles, MAX_GRID)), max(1, min(planes, MAX_GRID)))


def _pow2_block(n: int) -> int:
    b = 32
    while b < n and b < BLOCK:
        b *= 2
    return b


class CudaGenerator(CudaIndexing, CudaFusedRows, CudaBatchNorm, KernelGenerator):
    """Renders a lowered program as one CUDA translation unit and its launch list.

    `tf32=True` runs float32 GEMMs and convolutions on tensor cores (TF32 inputs, FP32
    accumulation) where `arch` has them (sm_80 and newer); the default is exact FP32.
    """
    LOWERINGS: ClassVar[dict[str, Lowering]] = {
        "softmax": Lowering("_row_template", "softmax.cu.j2"),
        "argmax": Lowering("_row_template", "argmax.cu.j2"),
        "sparse_softmax_cross_entropy": Lowering("_xent_loss", "sparse_xent.cu.j2"),
        "sparse_softmax_cross_entropy_grad": Lowering("_xent_grad", "sparse_xent.cu.j2"),
        "conv2d": Lowering("_conv2d", "conv2d.cu.j2", "conv_context"),
        "conv2d_grad_input": Lowering("_conv2d_grad_input", "conv2d_grad_input.cu.j2", "conv_context"),
        "conv2d_grad_filter": Lowering("_conv2d_grad_filter", "conv2d_grad_filter.cu.j2", "conv_context"),
        "max_pool2d": Lowering("_pool2d", "pool2d.cu.j2", "pool_context"),
        "avg_pool2d": Lowering("_pool2d", "pool2d.cu.j2", "pool_context"),
        "max_pool2d_grad": Lowering("_pool2d_grad", "pool2d_grad.cu.j2", "pool_context"),
        "avg_pool2d_grad": Lowering("_pool2d_grad", "pool2d_grad.cu.j2", "pool_context"),
        "concat": Lowering("_concat", "concat.cu.j2", "copy_context"),
        "slice_axis": Lowering("_slice_axis", "slice_axis.cu.j2", "copy_context"),
        **INDEXING_LOWERINGS,   # gather, slices, one_hot, top_k: compiler/codegen/indexing.py
        **FUSED_ROW_LOWERINGS,  # layer_norm, the scaled masked softmax: compiler/codegen/rows.py
        **BATCH_NORM_LOWERINGS,  # batch normalisation of train jobs: compiler/codegen/batch_norm.py
    }
    KIND_METHODS: ClassVar[dict[KernelKind, str]] = {
        "pointwise": "_pointwise", "reduction": "_reduction", "matmul": "_matmul",
        "row": "_row", "window": "_window", "xent_fused": "_xent_fused",
        "collective": "_collective",
    }

    def __init__(self, graph: Graph, kernels: list[Kernel], memory: MemoryPlan, version: str = "",
                 profile: bool = False, tf32: bool = False, arch: str = "sm_80", check_numerics: bool = False) -> None:
        super().__init__(graph, kernels, memory, version, profile, check_numerics)
        self.arch = arch
        self.tensor_cores = tf32 and arch_number(arch) >= 80
        self.notes: list[str] = []
        if tf32 and not self.tensor_cores:
            self.notes.append(f"TF32 asked for, but {arch} has no TF32 tensor cores: GEMMs stay FP32")
        largest = max((n.type.size for n in graph.nodes), default=1)
        # 32-bit index arithmetic is much cheaper on the GPU; keep headroom for grid-stride overshoot.
        self.I = "int" if largest < INT32_SAFE else "int64_t"
        self.scratch_bytes = 0
        self.templates: list[str] = []
        self._bucket_of: dict[int, Bucket] = {}     # all_reduce node -> its bucket (render)
        self._comm_calls: list[CommCall] = []       # the engine's calls so far (render)

    @classmethod
    def from_program(cls, program, options: GenerateOptions) -> CudaGenerator:
        assert options.arch is not None, "the CUDA generator needs the arch it generates for"
        return cls(program.graph, program.kernels, program.memory, options.version, options.profile,
                   tf32=options.tf32, arch=options.arch, check_numerics=options.check_numerics)

    # -- buffers --------------------------------------------------------------------------
    def binding(self, node_id: int) -> tuple:
        buf = self.memory.storage[node_id]
        return ("arena", buf.key) if buf.kind == "arena" else (buf.kind, buf.key)

    argument = binding      # a launch passes each buffer as its binding; the runtime resolves it

    def _template(self, template: str, /, **ctx) -> str:
        self.templates.append(template)
        ctx.setdefault("I", code(self.I))
        return _env.get_template(template).render(**ctx)

    def _index_type(self, largest: int) -> str:
        """The graph's index type, widened where one kernel's range outgrows every single tensor."""
        return self.I if largest < INT32_SAFE else "int64_t"

    # -- the step ---------------------------------------------------------------------------
    def render(self) -> GeneratedCudaStep:
        table = KernelTable()           # equal kernels are one __global__ function (dedup.py)
        launches: list[Launch] = []
        profiled: list[str] = []        # each launch by its own kernel's name, for the profile
        plan = plan_buckets(self.graph, self.kernels)
        self._bucket_of = {m: b for b in plan for m in b.members}
        self._comm_calls = [self._start(b, 0) for b in plan if b.start_after < 0]
        for index, k in enumerate(self.kernels):
            writes = {n for n in k.nodes() if self.stored(n, k)}
            params = Params(self, writes)
            self._comm_calls += [CommCall(len(launches), "wait", b.index) for b in plan if b.wait_at == index]
            text, kernel_launches = getattr(self, self.KIND_METHODS[k.kind])(k, params)
            self._comm_calls = [replace(c, at=len(launches)) if c.at < 0 else c for c in self._comm_calls]
            checks = [self._numerics_check(k, n) for n in self.numerics_checked(k)]
            for launch in kernel_launches:
                profiled.append(launch.kernel)
            for text_, launch in [(text, None)] + checks:
                if text_ is None:       # an exchange: a call of the engine, no kernel of its own
                    continue
                own = c_identifier(k.name) if launch is None else c_identifier(launch.kernel)
                fn, _ = table.add(text_, own)
                if launch is None:      # the kernel's launches (a companion `<name>_sum` too) call `fn`
                    launches.extend(_calling(la, own, fn) for la in kernel_launches)
                else:
                    profiled.append(launch.kernel)
                    launches.append(_calling(launch, own, fn))
            self._comm_calls += [self._start(b, len(launches)) for b in plan if b.start_after == index]
        comm_calls = self._comm_calls
        sources = table.sources
        copies = [DeviceCopy(("variable", var), self.binding(node), self.graph.node(node).type.nbytes)
                  for node, var in self.memory.copy_back]
        fetches = [Fetch(i, self.binding(o), self.graph.node(o).type.nbytes) for i, o in enumerate(self.graph.outputs)]
        bindings: list[tuple] = [("arena",)]
        for b in ([a for launch in launches for a in launch.args] + [c.dst for c in copies] + [c.src for c in copies]
                  + [f.src for f in fetches] + [a for call in comm_calls for a in call.args]):
            if b[0] not in ("arena", "scratch", "status", "bucket") and b not in bindings:
                bindings.append(b)
        if comm_calls:
            bindings.append(("comm",))
        reads = [what for what, present in (("the outputs", any(f.nbytes for f in fetches)),
                                            ("the status of the kernels that check their data", self.error_nodes),
                                            ("the status of check_numerics", self.numerics_nodes),
                                            # a wait on the peers is where a lost rank is noticed
                                            ("the collectives' completion", comm_calls)) if present]
        host = host_step(launches, copies, fetches, bindings, sync=bool(reads), reads=", ".join(reads),
                         comm_calls=comm_calls)
        source = _env.get_template("step.cu.j2").render(
            version=self.version, job=self.graph.name, kernels=sources, notes=self.notes,
            launches=launches, copies=copies, bindings=[describe_binding(b) for b in bindings],
            uses_gemm=any(t in GEMM_TEMPLATES for t in self.templates), tensor_cores=self.tensor_cores, host=host)
        return GeneratedCudaStep(source, launches, copies, bindings, dict(self.error_nodes), list(self.label_checks),
                                 profiled if self.profile else [],
                                 self.scratch_bytes, list(self.templates), self.tensor_cores,
                                 dict(self.numerics_nodes), len(sources), fetches, bool(reads),
                                 comm_calls, len(plan))

    def _start(self, b: Bucket, at: int) -> CommCall:
        """Start bucket `b` before launch `at`: its gradients are the all_reduce nodes' inputs."""
        return CommCall(at, "start", b.index, tuple(self.binding(self.graph.node(m).inputs[0]) for m in b.members),
                        b.sizes, b.dtype)

    def _numerics_check(self, k: Kernel, node_id: int) -> tuple[str, Launch]:
        """check_numerics after kernel `k`: a kernel scanning the value of `node_id` it stored."""
        node = self.graph.node(node_id)
        name = f"{k.name}_check_{node_id}"
        text = self._template("check_numerics.cu.j2", name=c_identifier(name),
                              comment=code_format("{}: check_numerics of %{} {} @{}", c_identifier(name), node_id,
                                                  code(node.op), node.loc),
                              T=code(c_type(node.type.dtype)), X=code(f"b{node_id}"), size=node.type.size,
                              I=code(self._index_type(node.type.size)), code=self.numerics_code(node_id), block=BLOCK)
        return text, Launch(name, _grid_1d(node.type.size), (BLOCK, 1, 1), 0, (self.binding(node_id), ("status",)),
                            checks_status=True)

    # -- pointwise ----------------------------------------------------------------------------
    def _pointwise(self, k: Kernel, params: Params):
        loops, begin = [], 0
        for members in k.loops:
            lp = self._loop(k, members, params, begin)
            loops.append(lp)
            begin = lp["end"]
        text = self._template("pointwise.cu.j2", name=c_identifier(k.name), comment=self.comment(k),
                              I=code(self._index_type(begin)),
                              params=params.declarations(), loops=loops, total=begin, block=BLOCK)
        return text, [Launch(k.name, _grid_1d(begin), (BLOCK, 1, 1), 0, tuple(params.arguments()))]

    def _loop(self, k: Kernel, members: list[int], params: Params, begin: int) -> dict:
        """One loop of a pointwise kernel: index `i` in [0, size) of its output, offset by `begin`
        in the kernel's flattened range; operands read at their (broadcast) strides."""
        shape = self.graph.node(members[-1]).type.shape
        dims, merged = coalesce(shape, self.loop_strides(members))
        size = int(np.prod(shape, dtype=np.int64))
        index: list[str] = []
        if len(dims) <= 1:
            def offset(strides: list[int]) -> str:
                s = merged[tuple(strides)]
                return term("i", s[0] if s else 0)
        else:
            index.append(f"{self.I} rem = i;")
            for d in range(len(dims) - 1, 0, -1):
                index.append(f"const {self.I} d{d} = rem % {dims[d]}; rem /= {dims[d]};")
            index.append(f"const {self.I} d0 = rem;")

            def offset(strides: list[int]) -> str:
                s = merged[tuple(strides)]
                return " + ".join(t for t in (term(f"d{d}", s[d]) for d in range(len(dims))) if t != "0") or "0"
        body = self.pointwise_lines(k, members, params, offset)
        return {"begin": begin, "end": begin + size, "shape": list(shape), "index": code_lines(index), "body": body,
                "ops": code(", ".join(self.graph.node(m).op for m in members))}

    # -- reductions ---------------------------------------------------------------------------
    def _reduction(self, k: Kernel, params: Params):
        a = self.graph.node(k.anchor_id)
        x = self.graph.node(a.inputs[0])
        outer, reduced, inner = reduction_extents(x.type.shape, a.attr("axes"))
        rule, t = OPS[a.op], code(c_type(a.type.dtype))
        assert rule.c_init is not None and rule.c_expr is not None, a.op   # every reduction rule has both
        epilogue = self.pointwise_lines(k, k.members, params, lambda s: "i" if any(s) else "0",
                                        anchor_value="acc") if k.members else []
        # inner == 1: one block per output, its threads along the row; else one thread per output.
        block = _pow2_block(reduced) if inner == 1 else BLOCK
        grid = (max(1, min(outer, MAX_GRID)), 1, 1) if inner == 1 else _grid_1d(outer * inner)
        # Long reductions: chunks of REDUCTION_CHUNK per thread, combined pairwise (reduction.cu.j2).
        per_thread = -(-reduced // block) if inner == 1 else reduced
        chunks = -(-per_thread // REDUCTION_CHUNK)
        text = self._template("reduction.cu.j2", name=c_identifier(k.name), comment=self.comment(k), T=t,
                              outer=outer, reduced=reduced, inner=inner, X=params.use(x.id), OUT=params.use(a.id),
                              per_thread=per_thread, chunk=REDUCTION_CHUNK, chunks=chunks,
                              levels=max(1, chunks.bit_length()),
                              init=code(rule.c_init.format(T=t)), combine=code(rule.c_expr.format("acc", "x")),
                              epilogue=epilogue, block=block, params=params.declarations())
        return text, [Launch(k.name, grid, (block, 1, 1), 0, tuple(params.arguments()))]

    # -- GEMM -----------------------------------------------------------------------------------
    def _tile(self, dtype: str, a_k_fast: bool, b_n_fast: bool) -> tuple[str, int]:
        """The tile function (flowc_cuda_gemm.h) and its block size for this dtype."""
        flags = f"{str(a_k_fast).lower()}, {str(b_n_fast).lower()}"
        if self.tensor_cores and dtype == "float32":
            return code(f"flowc::gemm_tile_tf32<{flags}>"), TF32_THREADS
        return code(f"flowc::gemm_tile<{c_type(dtype)}, {flags}>"), GEMM_THREADS

    def _matmul(self, k: Kernel, params: Params):
        a = self.graph.node(k.anchor_id)
        A, B = a.inputs
        g = matmul_geometry(self.graph, a)
        ta, tb, M, N, K, batch = g.trans_a, g.trans_b, g.M, g.N, g.K, g.batch
        if batch > 1 and k.members:
            raise CudaCodegenError(f"{a.loc}: {k.name}: a batched matmul has no epilogue (fusion refuses it)")
        lda, ldb = g.lda, g.ldb
        tile, threads = self._tile(a.type.dtype, not ta, not tb)
        epilogue = self.pointwise_lines(k, k.members, params, gemm_offset, anchor_value="acc") if k.members else []
        text = self._template("matmul.cu.j2", name=c_identifier(k.name), comment=self.comment(k),
                              T=code(c_type(a.type.dtype)),
                              M=M, N=N, K=K, batch=batch, A=params.use(A), B=params.use(B), C=params.use(a.id),
                              a_index=code(f"({self.I})k * {lda} + m" if ta else f"({self.I})m * {lda} + k"),
                              b_index=code(f"({self.I})n * {ldb} + k" if tb else f"({self.I})k * {ldb} + n"),
                              tile=tile, threads=threads, epilogue=epilogue, params=params.declarations(),
                              row_tiles=_ceil_div(M, GEMM_TILE))
        grid = _gemm_grid(_ceil_div(N, GEMM_TILE), _ceil_div(M, GEMM_TILE), batch)
        return text, [Launch(k.name, grid, (threads, 1, 1), 0, tuple(params.arguments()))]

    # -- row kernels -------------------------------------------------------------------------------
    def _collective(self, k: Kernel, params: Params):
        """An exchange is one engine call (no kernel); an all_reduce's sum is copied out of its
        bucket by a kernel, after the bucket's wait (render)."""
        node = self.graph.node(k.anchor_id)
        if node.op in EXCHANGES:
            number = EXCHANGES[node.op][1]
            x = self.graph.node(node.inputs[0])
            self._comm_calls.append(CommCall(-1, "exchange", args=(self.binding(x.id), self.binding(node.id)),
                                             sizes=(number, exchange_count(node, x)), dtype=x.type.dtype))
            return None, []
        b = self._bucket_of[node.id]
        scale = float(node.attr("scale"))
        text = self._template("comm_unpack.cu.j2", name=c_identifier(k.name), comment=self.comment(k),
                              T=code(c_type(b.dtype)), size=node.type.size,
                              scale=None if scale == 1.0 else literal(scale), block=BLOCK)
        return text, [Launch(k.name, _grid_1d(node.type.size), (BLOCK, 1, 1), 0,
                             (("bucket", b.index, b.itemsize * b.offset(node.id)), self.binding(node.id)))]

    def _row(self, k: Kernel, params: Params):
        return getattr(self, self.lowering(self.graph.node(k.anchor_id).op).method)(k, params)

    def _row_template(self, k: Kernel, params: Params):
        a = self.graph.node(k.anchor_id)
        x = self.graph.node(a.inputs[0])
        cols = x.type.shape[-1]
        rows = x.type.size // cols
        text = self._template(self.lowering(a.op).template, name=c_identifier(k.name), comment=self.comment(k),
                              T=code(c_type(x.type.dtype)), rows=rows, cols=cols, X=params.use(x.id),
                              OUT=params.use(a.id), params=params.declarations(), block=BLOCK,
                              rows_per_block=ROWS_PER_BLOCK)
        return text, [Launch(k.name, self._row_grid(rows), (BLOCK, 1, 1), 0, tuple(params.arguments()))]

    def _row_grid(self, rows: int) -> tuple[int, int, int]:
        return (max(1, min(_ceil_div(rows, ROWS_PER_BLOCK), MAX_GRID)), 1, 1)

    def _xent_loss(self, k: Kernel, params: Params):
        return self._xent(k, params, loss=self.graph.node(k.anchor_id), grad=None)

    def _xent_grad(self, k: Kernel, params: Params):
        return self._xent(k, params, loss=None, grad=self.graph.node(k.anchor_id))

    def _xent_fused(self, k: Kernel, params: Params):
        return self._xent(k, params, loss=self.graph.node(k.anchor_id), grad=self.graph.node(k.second_id))

    def _xent(self, k: Kernel, params: Params, loss, grad):
        main = loss or grad
        logits, labels = (self.graph.node(i) for i in main.inputs[:2])
        cols = logits.type.shape[-1]
        rows = logits.type.size // cols
        names = {"X": params.use(logits.id), "LABELS": params.use(labels.id),
                 "LOSS": params.use(loss.id) if loss else code(""),
                 "DY": params.use(grad.inputs[2]) if grad else code(""),
                 "DX": params.use(grad.id) if grad else code("")}
        status_code = self.error_code(k)
        text = self._template(self.lowering(main.op).template, name=c_identifier(k.name), comment=self.comment(k),
                              T=code(c_type(logits.type.dtype)), rows=rows, cols=cols, loss=loss is not None,
                              grad=grad is not None, code=status_code, params=params.declarations(), block=BLOCK,
                              rows_per_block=ROWS_PER_BLOCK, **names)
        args = tuple(params.arguments()) + (("status",),)
        return text, [Launch(k.name, self._row_grid(rows), (BLOCK, 1, 1), 0, args)]

    # -- window kernels: the CPU generator's geometry, a GPU layout per op ---------------------------
    def _window(self, k: Kernel, params: Params):
        a = self.graph.node(k.anchor_id)
        ctx = self.window_context(k, a, params)
        return getattr(self, self.lowering(a.op).method)(k, a, params, ctx)

    def _conv2d(self, k: Kernel, a, params: Params, ctx: dict):
        tile, threads = self._tile(a.type.dtype, True, True)
        text = self._template(self.lowering(a.op).template, tile=tile, threads=threads, params=params.declarations(),
                              row_tiles=_ceil_div(ctx["Fg"], GEMM_TILE), **ctx)
        grid = _gemm_grid(_ceil_div(ctx["P"], GEMM_TILE), _ceil_div(ctx["Fg"], GEMM_TILE), ctx["N"] * ctx["groups"])
        return text, [Launch(k.name, grid, (threads, 1, 1), 0, tuple(params.arguments()))]

    def _conv2d_grad_input(self, k: Kernel, a, params: Params, ctx: dict):
        total = ctx["N"] * ctx["C"] * ctx["H"] * ctx["W"]
        text = self._template(self.lowering(a.op).template, total=total, block=BLOCK,
                              params=params.declarations(), **ctx)
        return text, [Launch(k.name, _grid_1d(total), (BLOCK, 1, 1), 0, tuple(params.arguments()))]

    def _conv2d_grad_filter(self, k: Kernel, a, params: Params, ctx: dict):
        # dW[f, k] sums over every image and pixel (N * P terms, 57,600 for the seed LeNet's first
        # layer) but has few outputs: split that sum over blocks, each writing its partial to
        # scratch, and add the partials in split order in a second kernel (deterministic).
        reduce_len = ctx["N"] * ctx["P"]
        splits = max(1, min(MAX_SPLITS, _ceil_div(reduce_len, SPLIT_CHUNK)))
        chunk = _ceil_div(reduce_len, splits)
        splits = _ceil_div(reduce_len, chunk)          # no empty split
        if chunk >= 1 << 31:     # the GEMM tile counts the terms of one split in an int
            raise CudaCodegenError(f"{a.loc}: {a.op}: {reduce_len} terms per filter gradient element do not fit "
                                   f"{MAX_SPLITS} splits of fewer than 2**31")
        itemsize = np.dtype(a.type.dtype).itemsize
        if splits > 1:
            self.scratch_bytes = max(self.scratch_bytes, splits * ctx["F"] * ctx["K"] * itemsize)
        tile, threads = self._tile(a.type.dtype, True, False)
        text = self._template(self.lowering(a.op).template, tile=tile, threads=threads, splits=splits, chunk=chunk,
                              R=reduce_len, block=BLOCK, params=params.declarations(),
                              row_tiles=_ceil_div(ctx["Fg"], GEMM_TILE),
                              I=code(self._index_type(max(splits * ctx["F"] * ctx["K"], reduce_len))), **ctx)
        grid = _gemm_grid(_ceil_div(ctx["K"], GEMM_TILE), _ceil_div(ctx["Fg"], GEMM_TILE), ctx["groups"] * splits)
        args = tuple(params.arguments())
        if splits == 1:
            return text, [Launch(k.name, grid, (threads, 1, 1), 0, args)]
        scratch = ("scratch", 0)
        return text, [Launch(k.name, grid, (threads, 1, 1), 0, args + (scratch,)),
                      Launch(f"{k.name}_sum", _grid_1d(ctx["F"] * ctx["K"]), (BLOCK, 1, 1), 0,
                             (self.binding(a.id), scratch))]

    def _pool2d(self, k: Kernel, a, params: Params, ctx: dict):
        names = {"X": code(f"b{a.inputs[0]}"), "OUT": code(f"b{a.id}")}
        total = ctx["planes"] * ctx["OH"] * ctx["OW"]
        text = self._template(self.lowering(a.op).template, total=total, block=BLOCK, params=params.declarations(),
                              **names, **ctx)
        return text, [Launch(k.name, _grid_1d(total), (BLOCK, 1, 1), 0, tuple(params.arguments()))]

    def _pool2d_grad(self, k: Kernel, a, params: Params, ctx: dict):
        names = {"X": code(f"b{a.inputs[0]}" if a.op == "max_pool2d_grad" else ""),
                 "DY": code(f"b{a.inputs[-1]}"), "DX": code(f"b{a.id}")}
        total = ctx["planes"] * ctx["H"] * ctx["W"]
        text = self._template(self.lowering(a.op).template, total=total, block=BLOCK, params=params.declarations(),
                              **names, **ctx)
        return text, [Launch(k.name, _grid_1d(total), (BLOCK, 1, 1), 0, tuple(params.arguments()))]

    def _concat(self, k: Kernel, a, params: Params, ctx: dict):
        begin = 0
        for part in ctx["parts"]:
            part["begin"], begin = begin, begin + ctx["outer"] * part["block"]
            part["end"] = begin
        text = self._template(self.lowering(a.op).template, total=begin, block=BLOCK, params=params.declarations(),
                              **ctx)
        return text, [Launch(k.name, _grid_1d(begin), (BLOCK, 1, 1), 0, tuple(params.arguments()))]

    def _slice_axis(self, k: Kernel, a, params: Params, ctx: dict):
        total = ctx["outer"] * ctx["out_block"]
        text = self._template(self.lowering(a.op).template, total=total, block=BLOCK, X=code(f"b{a.inputs[0]}"),
                              OUT=code(f"b{a.id}"), params=params.declarations(), **ctx)
        return text, [Launch(k.name, _grid_1d(total), (BLOCK, 1, 1), 0, tuple(params.arguments()))]


def _calling(launch: Launch, own: str, fn: str) -> Launch:
    """`launch` of kernel `own` (or of its companion `own_sum`) as a launch of the equal function `fn`."""
    if fn == own:
        return launch
    assert launch.kernel.startswith(own), (launch.kernel, own)
    return replace(launch, kernel=fn + launch.kernel[len(own):])


# Templates whose kernels call the tile GEMM of flowc_cuda_gemm.h (the step then includes it).
GEMM_TEMPLATES = {"matmul.cu.j2", "conv2d.cu.j2", "conv2d_grad_filter.cu.j2"}
