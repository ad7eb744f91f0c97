"""A session over several MPI ranks: the master runs the script, the others compute.

OneFlow's model: the same script runs on every machine; machine 0 (the master) builds the jobs,
takes the calls, prints, returns results, fires callbacks and saves checkpoints, and the others
only compute.  flowc keeps it literally.  Every rank traces and compiles the same jobs (each its
share of the batch: compiler/passes/data_parallel.py).  At its first job call a worker stops
running the script and serves the master instead: for each call the master sends every worker its
share of the inputs and the step's runtime scalars, all ranks run the compiled step (whose
gradient all-reduces meet inside it, runtime/collectives.py), and the workers send their results
back; the master puts each result together as its layout says (a split result is concatenated in
rank order, a partial sum added up) and returns the logical value.  When the master's script ends
it tells the workers to exit.

Messages travel on a duplicate of MPI's world communicator (pickled, small), the sums inside the
steps on another, so the two never match each other's messages.

Example (run as `mpiexec -n 2 python train.py`; nothing in the script changes)::

    loss = train_job(images, labels)     # rank 0: the loss of the global batch; rank 1 never returns
"""
from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import shlex
import socket
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Sequence

import numpy as np

from flowc.compiler import settings
from flowc.compiler.comm_library import mpi_tool
from flowc.compiler.errors import DistributedError
from flowc.compiler.fingerprint import first_difference, locations, signature
from flowc.compiler.ir import numpy_dtype
from flowc.compiler.ops.random_shards import RANK_SCALAR
from flowc.compiler.passes.batch_split import BatchSplit
from flowc.compiler.passes.layouts import BROADCAST
from flowc.runtime.arrival_watch import alive, check_arrivals
from flowc.runtime.collectives import CommEngine
from flowc.runtime.loaded_step import LoadedStep
from flowc.runtime.pipeline import call_after_exit_drain
from flowc.runtime.signature import PerRank
from flowc.runtime import environment
from flowc.runtime.world import World, check_configuration, configured_devices, detect_world

# How often a rank looks whether the other ranks on its host are still alive.
WATCH_SECONDS = 0.2
# How long a rank spins on MPI's probe for the next message before it sleeps between probes: longer
# than the master's Python work between two steps of a small job, short next to a pause.
SPIN_SECONDS = 0.01
# The tags of the pickled control messages and of the raw arrays that follow them (shares, results).
CONTROL_TAG = 0
DATA_TAG = 7

if TYPE_CHECKING:
    from flowc.compiler.build import TracedJob
    from flowc.runtime.session import Session


class Cluster:
    """The ranks of a distributed session: the control channel and the steps' engines."""

    def __init__(self, world: World) -> None:
        from mpi4py import MPI
        self.world = world
        self.control = MPI.COMM_WORLD.Dup()        # master <-> worker messages
        self.collective = MPI.COMM_WORLD.Dup()     # the compiled steps' all-reduces
        self.engines: list[Any] = []        # CommEngine (CPU steps), NcclEngine (GPU steps)
        self.variables_sent = False
        # Variables split over the ranks (model parallelism) whose other ranks' slices changed since the
        # master last gathered them: its own copy holds only its rows up to date.
        self.dirty: set[str] = set()
        self._closed = False
        # Why the ranks can no longer work together (a timeout): the master's exit then ends every rank
        # (MPI_Abort) instead of waiting, in MPI_Finalize, for a rank that no longer answers.
        self.broken: str | None = None
        # (host, pid) of every rank, for the watchdog (a collective: every rank makes its cluster at once)
        self.peers: list[tuple[str, int]] = self.control.allgather((socket.gethostname(), os.getpid()))
        self.job = "the script"          # what this rank runs, for the watchdog's message
        self.pid = os.getpid()           # a forked child inherits this cluster but is none of its ranks
        self.serving = False             # a worker runs the master's steps (it reached its first job call)
        threading.Thread(target=self._watch, name="flowc-rank-watchdog", daemon=True).start()

    def _watch(self) -> None:
        """Stop this rank, naming the rank that was lost, when another rank on this host has died.

        A rank that dies leaves the others waiting inside MPI for it.  `mpiexec` (MPICH's Hydra) kills
        them at once, unless told not to (`-disable-auto-cleanup`, which `flowc launch` passes): then
        this watchdog reports which rank is gone and ends this one within WATCH_SECONDS.  Ranks on
        other hosts are found by the collectives' timeout (FLOWC_COMM_TIMEOUT) instead."""
        host = socket.gethostname()
        local = [(rank, pid) for rank, (h, pid) in enumerate(self.peers) if h == host and rank != self.world.rank]
        while local and not self._closed:
            time.sleep(WATCH_SECONDS)
            lost = [(rank, pid) for rank, pid in local if not alive(pid)]
            if lost and not self._closed:
                names = ", ".join(f"rank {rank} (pid {pid} on {host})" for rank, pid in lost)
                role = "the master" if any(rank == 0 for rank, _ in lost) else "a worker"
                sys.stderr.write(f"flowc: {names} was lost while running {self.job}: {role} stopped; rank "
                                 f"{self.world.rank} stops too\n")
                sys.stderr.flush()
                time.sleep(WATCH_SECONDS)       # the launcher forwards the message before it sees this rank end
                os._exit(1)

    @property
    def ranks(self) -> int:
        return self.world.size

    def engine(self, buckets: int) -> CommEngine:
        """A new engine for a loaded step with `buckets` buckets."""
        engine = CommEngine(self.collective, max(buckets, 1))
        self.engines.append(engine)
        return engine

    def gpu_engine(self, buckets: int, context=None, device: str | None = None):
        """A new NCCL engine (runtime/nccl.py) for a loaded GPU step with `buckets` buckets, made by
        every rank at once; `context`: a context manager making the step's device current, for its
        close; `device`: which GPU this rank uses (its PCI bus id: two ranks on one GPU are refused)."""
        from flowc.runtime.nccl import NcclEngine
        engine = NcclEngine(self.collective, max(buckets, 1), context=context, device=device)
        self.engines.append(engine)
        return engine

    def receive(self, source: int, what: str) -> Any:
        """The next control message from rank `source`, waited for at most FLOWC_COMM_TIMEOUT seconds:
        a rank that stopped answering (stopped, hung, or on a host the watchdog cannot see) is an error
        naming it, not a hang."""
        control = self.control
        timeout = settings.comm_timeout()
        if not wait_for_message(control, source, CONTROL_TAG, timeout):
            self.broken = (f"rank {source} did not answer within FLOWC_COMM_TIMEOUT={timeout:g} s while "
                           f"{what} (lost, stopped or hung)")
            raise DistributedError(self.broken)
        message = control.recv(source=source, tag=CONTROL_TAG)
        if message[0] == "ended":            # the worker is gone (end_if_no_job_call): no rank may wait for it
            self.broken = message[1]
            raise DistributedError(message[1])
        return message

    def waited_seconds(self) -> float:
        """Seconds this rank's steps spent waiting for gradient sums, over every step so far."""
        return sum(e.waited_seconds() for e in self.engines)

    def end_if_no_job_call(self) -> None:
        """At a worker's exit: one whose script raised before its first job call, after this cluster
        was made (an early get_all_variables() or checkpoint call traces the jobs), tells the master
        why and ends at once.  Left to MPI's end it would wait there for the master, and the master
        for its answer, until FLOWC_COMM_TIMEOUT.  One whose script simply ended waits for the
        master's next word: "exit" when the master's script made no job call either (a clean end),
        else a step it cannot run, which it answers the same way."""
        if self.serving or self.world.is_master:
            return
        error = getattr(sys, "last_value", None)         # the uncaught exception Python just printed
        while error is None and not self.broken:
            wait_for_message(self.control, 0, CONTROL_TAG, None)
            kind = self.control.recv(source=0, tag=CONTROL_TAG)[0]
            if kind == "exit":
                self.end_worker()
            if kind not in ("clear", "variables"):     # a step, or the rows of split variables: it must answer
                break
        why = f"{type(error).__name__}: {error}" if error is not None else "its script ended"
        text = (f"rank {self.world.rank} stopped before its first job call ({why}); every rank must make the "
                "same job calls")
        sys.stderr.write(f"flowc: {text}\n")
        sys.stderr.flush()
        try:
            self.control.send(("ended", text), dest=0)     # a small message: sent without the master's receive
        finally:
            os._exit(1)

    # -- the master's side ------------------------------------------------------------------
    def send_variables(self, session: Session) -> None:
        """Every variable's value to every worker (before the first step: the master may have loaded
        a checkpoint or set values the workers' initializers did not make)."""
        self.gather_shards(session)          # the whole of each split variable, not its stale rows
        values = {name: session.value(name) for name in session.variables}
        for rank in range(1, self.ranks):
            self.control.send(("variables", values), dest=rank)
        self.variables_sent = True

    def gather_shards(self, session: Session) -> None:
        """The workers' rows of the split variables that changed into the master's whole copies (a
        checkpoint save, `flow.get_all_variables()`, a job reading them whole)."""
        if not self.world.is_master or not self.dirty:
            return
        if self.broken is not None:
            raise DistributedError(f"the other ranks' slices of the split variables {sorted(self.dirty)} cannot be "
                                   f"gathered: the ranks of this run no longer work together ({self.broken})")
        names = sorted(name for name in self.dirty if name in session.variables)
        for rank in range(1, self.ranks):
            self.control.send(("shards", names), dest=rank)
        failed = []
        for rank in range(1, self.ranks):
            status, text = self.receive(rank, "sending its slices of the split variables")
            if status == "error":
                failed.append(f"rank {rank}: {text}")
                continue
            for name in names:
                self.control.Recv(shard_rows(session.value(name), self, rank), source=rank, tag=DATA_TAG)
        if failed:
            self.broken = "; ".join(failed)
            raise DistributedError(self.broken)
        self.dirty.clear()

    def session_cleared(self) -> None:
        """The master's script cleared its session: the workers clear theirs (same jobs, new variables)."""
        self.dirty.clear()
        if self.world.is_master:
            for rank in range(1, self.ranks):
                self.control.send(("clear",), dest=rank)
        self.variables_sent = False

    def shutdown(self) -> None:
        """Tell the workers to exit (the master's script has ended), once the calls in flight are done."""
        if self._closed or not self.world.is_master or os.getpid() != self.pid:
            return           # (a forked child's exit must not end the parent's workers)
        self._closed = True
        interrupted = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
        if isinstance(interrupted, KeyboardInterrupt) and self.broken is None:
            # Ctrl-C: the calls in flight were abandoned (runtime/pipeline.py keeps their lock), and a
            # worker may be inside a step's exchange the master left: end every rank now, as one
            # process would end, rather than wait for them
            self.broken = "interrupted"
        if self.broken is not None:
            from mpi4py import MPI
            why = "the master's script was interrupted" if self.broken == "interrupted" else \
                f"the ranks of this job no longer work together ({self.broken})"
            sys.stderr.write(f"flowc: {why}: ending every rank\n")
            sys.stderr.flush()
            time.sleep(WATCH_SECONDS)       # the launcher forwards the output before it sees the abort
            MPI.COMM_WORLD.Abort(1)
        from flowc.runtime.session import default_session
        session = default_session()
        if session.cluster is self:
            try:
                session.sync("the end of the master's script")
            except Exception as err:      # a failed call was the script's to report; the workers still exit
                print(f"flowc: {err}", file=sys.stderr)
        for rank in range(1, self.ranks):
            self.control.send(("exit",), dest=rank)

    # -- a worker's side ---------------------------------------------------------------------
    def serve(self, session: Session) -> None:
        """Run the master's steps until it says exit; then end this process (a worker never goes back
        to the script: only the master prints, saves and fires callbacks).  A second thread's job
        call waits here for good: the first one serves, and ends the process."""
        with _serve_lock:
            first = not self.serving
            self.serving = True
        if not first:
            threading.Event().wait()
        # (job, ordinal) -> its step, the buffers of its inputs, the job's graph before the data-parallel pass
        served: dict[tuple[str, int], tuple[LoadedStep, list[np.ndarray], Any]] = {}
        # The master's values of variables no job has declared here yet (a worker traces a job only at
        # its first step): written as soon as a traced job declares them.
        pending: dict[str, np.ndarray] = {}

        def write_values() -> None:
            written = []
            for name in [n for n in pending if n in session.variables]:
                value, mine = pending.pop(name), session.value(name)
                if value.shape == mine.shape:      # else the graphs differ: the fingerprint check says where
                    np.copyto(mine, value)
                    written.append(name)
            if written:                            # a GPU step's device copies are now behind
                from flowc.runtime.devices import sync_to_device
                sync_to_device(session, written)
        while True:
            # Probed, not a blocking receive: MPI's busy-polls a core for as long as the master's
            # script runs between two calls (its data loading, an evaluation, a pause).
            wait_for_message(self.control, 0, CONTROL_TAG, None)
            message = self.control.recv(source=0, tag=CONTROL_TAG)
            kind = message[0]
            if kind == "exit":
                break
            if kind == "clear":               # the master cleared its session: a new one, on this cluster
                from flowc.runtime.session import clear_default_session, default_session
                clear_default_session()
                session = default_session()
                served.clear()
                pending.clear()
                continue
            if kind == "variables":
                pending.update(message[1])
                write_values()
                continue
            if kind == "shards":           # the master gathers the split variables: this rank's rows
                missing = [name for name in message[1] if name not in session.variables]
                if missing:
                    self.control.send(("error", f"no variables {missing} here"), dest=0)
                    continue
                from flowc.runtime.devices import sync_to_host
                sync_to_host(session, message[1])     # a GPU step's updates are on the device
                self.control.send(("ok", None), dest=0)
                for name in message[1]:
                    self.control.Send(shard_rows(session.value(name), self), dest=0, tag=DATA_TAG)
                continue
            _, job_name, ordinal, scalars, expected = message
            self.job = f"job {job_name!r}"
            try:
                loaded, inputs, logical = served.get((job_name, ordinal)) or self._loaded(session, job_name, ordinal)
            except Exception as err:        # the master raises it, naming this rank
                self.control.send(("error", f"{type(err).__name__}: {err}"), dest=0)
                continue
            if expected is not None:     # the job's first step: do all ranks run the same graph?
                mismatch = _compare(expected, logical, self.world.rank)
                self.control.send(("mismatch", mismatch) if mismatch else ("ready", None), dest=0)
                if mismatch or self.control.recv(source=0, tag=CONTROL_TAG)[0] != "go":
                    continue             # another rank disagreed: no shares come
                served[job_name, ordinal] = (loaded, inputs, logical)
            if pending:
                write_values()
            for buffer in inputs:           # the shares arrive as raw buffers, in the inputs' dtypes
                self.control.Recv(buffer, source=0, tag=DATA_TAG)
            if RANK_SCALAR in loaded.graph.scalars:      # this rank's share of the job's random draws
                scalars = {**scalars, RANK_SCALAR: self.world.rank}
            try:
                # shares received straight into the slot's own inputs need no copy there
                received_in_slot = inputs is getattr(loaded.slots[0], "inputs", None)
                loaded.feed(loaded.slots[0], [] if received_in_slot else inputs, scalars)
                outputs = loaded.compute(loaded.slots[0])
            except Exception as err:
                self.control.send(("error", f"{type(err).__name__}: {err}"), dest=0)
                continue
            self.control.send(("ok", None), dest=0)
            for value in outputs:
                self.control.Send(np.ascontiguousarray(value), dest=0, tag=DATA_TAG)
        for engine in self.engines:
            engine.close()
        self.end_worker()

    def end_worker(self) -> None:
        """End this worker once the master's script has ended: MPI, then the process.  Not through
        SystemExit: the script's own exit handlers are the master's to run (they may call jobs), and
        when the first job call came from another thread, SystemExit would end that thread only.

        Through the C library's exit, not os._exit: the MPI library's own exit handlers must run.
        Without them MPICH's launcher takes this rank's end for the job's and reports 0 (or kills
        the master) instead of the master's exit status, and the master's MPI end may wait for this
        process until it has gone."""
        from flowc.compiler.cache_trust import remove_private_folders
        self._closed = True              # the watchdog must not take the master's end for a loss
        remove_private_folders()
        sys.stdout.flush()
        sys.stderr.flush()
        from mpi4py import MPI
        MPI.Finalize()
        # PyDLL holds the interpreter lock: no Python thread runs while the libraries are torn down
        ctypes.PyDLL(None).exit(0)
        os._exit(0)                      # (not reached)

    def _loaded(self, session: Session, job_name: str, ordinal: int) -> tuple[LoadedStep, list[np.ndarray], Any]:
        """The step of job `job_name` (the `ordinal`-th job function of that name) on this worker (built
        at its first step), buffers for its inputs, and the job's graph as traced (before the
        data-parallel pass: the ranks' own graphs differ where the batch does not divide)."""
        from flowc.runtime.job import job_function_named
        job = session.job_named(job_name, ordinal) or job_function_named(job_name, ordinal)
        if job is None:
            which = f"job {job_name!r}" if not ordinal else f"job function number {ordinal + 1} called {job_name!r}"
            raise DistributedError(f"{which} is not defined on rank {self.world.rank}: define every job "
                                   "function before the first job call, the same on every rank")
        with _quiet():       # the master prints and warns what the job functions do while traced, once
            ready = job._ensure_ready()
        distribution = ready.traced.distribution
        loaded = ready.loaded
        loaded = loaded.inner if isinstance(loaded, DistributedStep) else loaded
        logical = distribution.logical if distribution is not None and distribution.logical else loaded.graph
        return loaded, _slot_inputs(loaded) or _buffers(loaded.graph, loaded.graph.placeholders), logical


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """A worker's trace, without the prints and warnings of the script's job functions: the master's
    trace of the same functions shows them (a worker's errors reach the master as messages)."""
    with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _compare(expected: tuple[list[str], list[str]], graph, rank: int) -> str | None:
    """None when `graph` has the master's signature, else what differs, naming the first op."""
    theirs, their_locations = expected
    mine, my_locations = signature(graph), locations(graph)
    at = first_difference(theirs, mine)
    if at is None:
        return None

    def show(lines: list[str], where: list[str]) -> str:
        return f"{lines[at]} @ {where[at]}" if at < len(where) else (lines[at] if at < len(lines) else "nothing")
    return (f"job {graph.name!r} differs between rank 0 and rank {rank} at op {at}: rank 0 has "
            f"{show(theirs, their_locations)}, rank {rank} has {show(mine, my_locations)} (every rank must run the "
            "same script; a worker knows only the job functions defined before its first job call, so a job "
            "defined again after that, after flow.clear_default_session() too, keeps its first definition there)")


class DistributedStep(LoadedStep):
    """The master's view of a job over every rank: it feeds and computes like one step, taking the
    logical (global) inputs and returning the logical results."""

    def __init__(self, inner: LoadedStep, traced: TracedJob, cluster: Cluster, job_name: str,
                 ordinal: int = 0) -> None:
        assert traced.distribution is not None
        # the job's name and which job function of that name it is (0: the first defined)
        self.inner, self.cluster, self.job_name, self.ordinal = inner, cluster, job_name, ordinal
        self.compiled, self.graph, self.session, self.slots = inner.compiled, inner.graph, inner.session, inner.slots
        self.layouts = traced.distribution.outputs
        self.mirrored = traced.distribution.mirrored
        # what every rank must have traced alike (the ranks' graphs differ where the batch does not divide)
        self.logical = traced.distribution.logical or self.graph
        self.split = traced.distribution.split or BatchSplit(cluster.ranks)
        # each rank's results: their shapes and dtypes (an uneven batch's shares differ from this rank's)
        self.result_types = [[(self.graph.node(o).type.shape if self.split.even else
                               traced.distribution.output_shape(i, rank), numpy_dtype(self.graph.node(o).type.dtype))
                              for i, o in enumerate(self.graph.outputs)] for rank in range(cluster.ranks)]
        # the split variables this job updates, and the variables it reads whole
        self.sharded_writes = set(traced.distribution.sharded) & set(self.graph.assigns)
        self.whole_reads = set(self.graph.variables) - set(traced.distribution.sharded)
        # the placeholders every rank gets whole (batch_axis=None); the others are split along axis 0
        self.whole_inputs = {i for i, kind in enumerate(traced.distribution.inputs) if kind == BROADCAST}
        # slot -> (every rank's shares, the scalars, the error code of labels out of range or None)
        self._pending: dict[int, tuple[list[list[np.ndarray]], dict, int | None]] = {}
        self._agreed = False         # the workers confirmed they run the same graph (the first step)

    def feed(self, slot: Any, arrays: Sequence[np.ndarray], scalars: dict[str, float] | None = None,
             borrowed: bool = False) -> None:
        """Keep the workers' shares of `arrays` (copies, in the inputs' dtypes, unless `borrowed`: a
        synchronous call, whose caller cannot touch its arrays before the step is done) and feed this
        rank's share to its own step."""
        shards, kept, bad_labels = self._pending.get(id(slot), ([], {}, None))
        if arrays:
            ranks = self.cluster.ranks
            graph = self.graph
            typed = [np.asarray(a, dtype=numpy_dtype(graph.node(p).type.dtype))
                     for a, p in zip(arrays, graph.placeholders)]
            bad_labels = self._labels_out_of_range(typed)
            split = self.split
            for i, (a, p) in enumerate(zip(typed, graph.placeholders)):
                if i not in self.whole_inputs and (not a.ndim or not split.divides(a.shape[0])):
                    # never drop the rows a slice would leave out
                    raise DistributedError(f"job {self.job_name!r}: input {graph.node(p).name or p!r} of shape "
                                           f"{list(a.shape)} does not split along axis 0 {split.describe()}")
            # rank r's rows (the pass checked how the batch axis splits), or the whole input; plain
            # slices, as np.split's per-call overhead is a tenth of a small job's step
            bounds = [[(0, 0) if i in self.whole_inputs else
                       (split.first_row(a.shape[0], r), split.first_row(a.shape[0], r) + split.rows(a.shape[0], r))
                       for i, a in enumerate(typed)] for r in range(ranks)]
            # each share a C-ordered copy unless borrowed as one: the workers receive raw bytes into
            # row-major buffers (a Fortran-ordered share would arrive transposed)
            shards = [[part if borrowed and part.flags.c_contiguous else np.array(part, order="C")
                       for part in (a if i in self.whole_inputs else a[start:end]
                                    for i, (a, (start, end)) in enumerate(zip(typed, bounds[r])))]
                      for r in range(ranks)]
            self.inner.feed(slot, shards[0], scalars)
        elif scalars:
            self.inner.feed(slot, (), scalars)
        if scalars:
            kept = {**kept, **scalars}
        self._pending[id(slot)] = (shards, kept, bad_labels)

    def _labels_out_of_range(self, inputs: list[np.ndarray]) -> int | None:
        """The step's error code when labels are out of range, checked here for every rank's share at
        once: a rank that stopped at its own check would leave the others waiting in the step's
        collectives (until FLOWC_COMM_TIMEOUT).  `compute` raises it, before any rank starts the step,
        so an asynchronous call fails at the next sync point, as in one process."""
        for check in self.compiled.generated.label_checks:
            labels = inputs[check.input]
            if labels.size and (labels.min() < 0 or labels.max() >= check.classes):
                return check.code
        return None

    def compute(self, slot: Any) -> list[np.ndarray]:
        cluster = self.cluster
        if os.getpid() != cluster.pid:
            raise DistributedError(f"job {self.job_name!r}: this process was forked from rank 0 of a run on "
                                   f"{cluster.ranks} ranks, whose other ranks serve the parent only; call jobs "
                                   "in the parent, or start the child with multiprocessing's 'spawn' method (it "
                                   "then runs its jobs alone)")
        if cluster.broken is not None:
            raise DistributedError(f"job {self.job_name!r}: the ranks of this run no longer work together "
                                   f"({cluster.broken}); restart the job")
        cluster.job = f"job {self.job_name!r}"
        shards, scalars, bad_labels = self._pending.pop(id(slot), ([], {}, None))
        if bad_labels is not None:
            self.inner.raise_step_error(bad_labels)
        if cluster.dirty & self.whole_reads:    # split in another job: every rank needs the whole again
            cluster.variables_sent = False
        if not cluster.variables_sent:
            cluster.send_variables(self.session)
        first = not self._agreed
        expected = (signature(self.logical), locations(self.logical)) if first else None
        for rank in range(1, cluster.ranks):
            cluster.control.send(("step", self.job_name, self.ordinal, scalars, expected), dest=rank)
        if first:       # no rank may start the step's collectives before all agree on its graph
            answers = [cluster.receive(rank, f"job {self.job_name!r} compared its graph")
                       for rank in range(1, cluster.ranks)]
            mismatches = [text for status, text in answers if status == "mismatch"]
            failed = [f"rank {rank}: {text}" for rank, (status, text) in enumerate(answers, start=1)
                      if status == "error"]
            verdict = "abort" if mismatches or failed else "go"
            for rank, (status, _) in enumerate(answers, start=1):
                if status == "ready":        # it waits for the verdict before the shares
                    cluster.control.send((verdict,), dest=rank)
            if mismatches or failed:
                raise DistributedError("; ".join(mismatches + failed))
            self._agreed = True
        # Non-blocking: the master starts its own share at once instead of waiting, in a large message's
        # rendezvous, for each worker to be ready to receive.
        sends = [cluster.control.Isend(share, dest=rank, tag=DATA_TAG)
                 for rank in range(1, len(shards)) for share in shards[rank]]      # none: a job without inputs
        try:
            local = self.inner.compute(slot)
        except DistributedError as err:
            cluster.broken = str(err)      # the sums timed out: the workers do not answer (shares may never go)
            raise
        except BaseException as err:
            # This rank stopped inside its step (it left the others' sums): the ranks' variables and
            # collectives may no longer agree, so no later step runs.
            cluster.broken = f"rank 0 failed in job {self.job_name!r}: {err}"
            raise
        cluster.dirty |= self.sharded_writes
        _wait_all(sends)
        per_rank, failed = self._results()
        if failed:       # a worker stopped inside its step: the ranks may no longer agree
            cluster.broken = "; ".join(failed)
            raise DistributedError(cluster.broken)
        return self._combine([local] + per_rank)

    def _results(self) -> tuple[list[list[np.ndarray]], list[str]]:
        """Every worker's results of the step (or its error)."""
        cluster = self.cluster
        per_rank, failed = [], []
        for rank in range(1, cluster.ranks):
            status, text = cluster.receive(rank, f"running job {self.job_name!r}")
            if status == "error":
                failed.append(f"rank {rank}: {text}")
                continue
            outputs = [np.empty(shape, dtype=dtype) for shape, dtype in self.result_types[rank]]
            for buffer in outputs:
                cluster.control.Recv(buffer, source=rank, tag=DATA_TAG)
            per_rank.append(outputs)
        return per_rank, failed

    def _combine(self, per_rank: list[list[np.ndarray]]) -> list[Any]:
        results: list[Any] = []
        for i, layout in enumerate(self.layouts):
            values = [outputs[i] for outputs in per_rank]
            if self.mirrored:            # each rank's own result (a tp.ListNumpy gives the list)
                results.append(PerRank(values))
            elif layout in ("split", "model_split"):
                results.append(np.concatenate(values, axis=0))
            elif layout == "column_split":
                results.append(np.concatenate(values, axis=-1))
            elif layout == "partial_sum":
                total = values[0].copy()
                for v in values[1:]:          # rank order: the same sum in every run
                    total += v
                results.append(total)
            else:
                results.append(values[0])
        return results

    def compute_borrowed(self, slot: Any, arrays: Sequence[np.ndarray],
                         scalars: dict[str, float] | None = None) -> list[np.ndarray]:
        self.feed(slot, arrays, scalars, borrowed=True)
        return self.compute(slot)

    def profile(self) -> list[tuple[str, float]]:
        return self.inner.profile()

    def failed_value(self, node_id: int, slot: Any) -> np.ndarray:
        return self.inner.failed_value(node_id, slot)

    def release(self) -> None:
        self.inner.release()


def relaunch_alone(world: World, job_module: str | None) -> None:
    """A script run alone (`python train.py`) that configures several devices on one machine
    (`flow.config.gpu_device_num(2)`) starts them, as OneFlow's single-machine scripts gain data
    parallelism from that call alone: at its first job call it runs again under mpiexec, one process
    per device (this process becomes mpiexec).  Only for a script run by path whose own module
    defines the job: a test runner, a notebook or `flowc show` get check_configuration's error instead,
    which names the `flowc launch` command.  What the script did before its first job call runs
    again on every rank (its output too)."""
    if world.is_distributed or job_module != "__main__":
        return
    devices, machines, call = configured_devices(environment.config_values, environment.env_values)
    if devices is None or devices < 2 or (machines or 1) > 1:
        return
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if path is None or getattr(main, "__spec__", None) is not None or not sys.argv[0] or \
            Path(sys.argv[0]).resolve() != Path(path).resolve():
        return
    mpiexec = mpi_tool("mpiexec")
    if mpiexec is None:
        return
    argv = [mpiexec, "-n", str(devices), sys.executable, *sys.argv]
    sys.stdout.flush()
    sys.stderr.write(f"flowc: {call}: this script runs again on {devices} processes, one per device: "
                     f"{shlex.join(argv)}\n")
    sys.stderr.flush()
    os.execv(mpiexec, argv)


def trace_as_ranks(session: Session, ranks: int) -> None:
    """Trace `session`'s jobs as one of `ranks` ranks without MPI (`flowc show --ranks N`): the graphs,
    kernels and code a distributed run would build; such a session cannot run them."""
    if session.cluster is not None:
        raise DistributedError("this session already runs on MPI ranks")
    session.joined, session.ranks = True, ranks
    _configure_buckets(session)


def _configure_buckets(session: Session) -> None:
    """The bucket size of the gradient all-reduces: flow.config.collective_boxing.nccl_fusion_threshold_mb."""
    threshold = environment.config_values.get("collective_boxing.nccl_fusion_threshold_mb")
    if threshold is not None:
        session.bucket_bytes = threshold << 20


def join(session: Session, job_module: str | None = None) -> Cluster | None:
    """The session's cluster when this process was launched as one of several MPI ranks (made at
    the first job call, before any job is traced: their graphs depend on the number of ranks).
    `job_module` is the module of the job being called or traced (see `relaunch_alone`).  Threads
    making their first calls at once make one cluster."""
    if session.joined:
        return session.cluster
    with _join_lock:
        return _join(session, job_module)


def _join(session: Session, job_module: str | None) -> Cluster | None:
    if session.joined:                   # another thread joined while this one waited for the lock
        return session.cluster
    world = detect_world()
    relaunch_alone(world, job_module)
    check_configuration(world, environment.config_values, environment.env_values)    # a mismatch: every call
    if not world.is_distributed:
        session.joined = True
        return None
    # MPI's start waits for every rank: one that already ended is an error now (the next call asks
    # again), one that ends while this rank waits ends it (runtime/arrival_watch.py), not a wait without end
    arrivals = check_arrivals(world)
    try:
        cluster = Cluster(world)
    except BaseException:
        session.joined = True
        raise
    finally:
        arrivals.stop()
    session.cluster = cluster
    session.ranks = world.size
    _configure_buckets(session)
    session.joined = True           # last: another thread's first call reads it without the lock
    if world.is_master:
        call_after_exit_drain(cluster.shutdown)     # after the callbacks in flight, and the calls they make
    else:
        atexit.register(cluster.end_if_no_job_call)
    return cluster


_join_lock = threading.Lock()
_serve_lock = threading.Lock()


def wait_for_message(control, source: int, tag: int, timeout: float | None) -> bool:
    """Whether a message from `source` with `tag` waits on `control` within `timeout` seconds (None:
    no limit).  It probes in a spin for SPIN_SECONDS first, since the next message (a step's answer,
    the next step) is usually just behind, and then yields the core between probes, 0.5 ms apart."""
    if control.Iprobe(source=source, tag=tag):
        return True
    start = time.monotonic()
    while not control.Iprobe(source=source, tag=tag):
        waited = time.monotonic() - start
        if timeout is not None and waited > timeout:
            return False
        if waited > SPIN_SECONDS:
            time.sleep(0.0005)
    return True


def _wait_all(requests: list) -> None:
    """Wait for mpi4py requests (the shares' sends: their buffers must live until then)."""
    if requests:
        from mpi4py import MPI
        MPI.Request.Waitall(requests)


def shard_rows(value: np.ndarray, cluster: Cluster, rank: int | None = None) -> np.ndarray:
    """Rank `rank`'s (default: this rank's) rows of a variable split along axis 0 over the cluster's
    ranks: a contiguous view into the whole variable, which a model-parallel step reads and updates."""
    ranks = cluster.ranks
    rank = cluster.world.rank if rank is None else rank
    return value.reshape(ranks, -1)[rank]


def _slot_inputs(loaded: LoadedStep) -> list[np.ndarray] | None:
    """The input arrays of `loaded`'s first slot where its slots keep them on the host (the CPU step's),
    else None."""
    inputs = getattr(loaded.slots[0], "inputs", None)
    return inputs if isinstance(inputs, list) and all(isinstance(a, np.ndarray) for a in inputs) else None


def _buffers(graph, node_ids) -> list[np.ndarray]:
    """Empty arrays of the types of `node_ids` in `graph` (one rank's inputs or results)."""
    return [np.empty(graph.node(i).type.shape, dtype=numpy_dtype(graph.node(i).type.dtype)) for i in node_ids]
