// The NCCL engine behind flowc_cuda_comm.h: gradient buckets summed over the ranks' GPUs on a
// stream of their own, and the exchanges of model-parallel layers, all queued without blocking
// the host; only `settle` blocks, polling so that a lost peer is an error, not a hang.
//
// Built once per installation with nvcc (compiler/nccl_library.py: host code only, no kernels),
// loaded by runtime/nccl.py, which bootstraps the communicator over MPI (rank 0's unique id,
// broadcast) and hands the generated step the table `flowc_nccl_fill` writes.  NCCL itself is
// opened with dlopen from the path the runtime found (the nvidia-nccl-cu12 wheel, $FLOWC_NCCL or
// the system's libnccl.so.2), so neither this file nor a step needs nccl.h; the few declarations
// below are NCCL's stable ABI (2.14 and later).
//
// The communicator is nonblocking: its start and any call that must still connect the ranks return
// at once (ncclInProgress), and the engine polls them with FLOWC_COMM_TIMEOUT, so a rank that never
// joins is an error on the others, not a wait without end inside NCCL.
//
// Under the CUDA emulator (tests: FLOWC_CUDA_EMULATOR, with the CUDA runtime subset of
// tests/fake_cudart.h) the same code runs on the CPU against a fake NCCL over MPI.
#include <dlfcn.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <new>
#include <vector>
#ifndef FLOWC_CUDA_EMULATOR
#include <cuda_runtime.h>
#endif
#include "flowc_cuda_comm.h"

namespace {

// --- NCCL's ABI ----------------------------------------------------------------------------
typedef struct ncclComm* ncclComm_t;
struct ncclUniqueId { char internal[128]; };
typedef int ncclResult_t;            // an enum in nccl.h: int-sized
constexpr ncclResult_t kNcclSuccess = 0;
constexpr ncclResult_t kNcclInProgress = 7;
constexpr int kNcclInt32 = 2;        // ncclDataType_t
constexpr int kNcclInt64 = 4;
constexpr int kNcclFloat32 = 7;
constexpr int kNcclFloat64 = 8;
constexpr int kNcclSum = 0;          // ncclRedOp_t

// NCCL 2.14's ncclConfig_t (ncclConfig_v21400). NCCL reads the fields of the version a caller
// declares, so this layout stays valid in later releases, whose struct only grew at its end.
struct NcclConfig {
  size_t size = sizeof(NcclConfig);
  unsigned int magic = 0xcafebeef;   // NCCL_API_MAGIC
  unsigned int version = 21400;      // NCCL_VERSION(2, 14, 0)
  int blocking = 0;                  // calls return ncclInProgress instead of waiting
  int unset = INT_MIN;               // 2.14's tail padding: NCCL_CONFIG_UNDEF_INT where later releases read it
};
static_assert(sizeof(NcclConfig) == 24, "ncclConfig_v21400 is 24 bytes");

struct Nccl {
  void* handle = nullptr;
  ncclResult_t (*GetUniqueId)(ncclUniqueId*) = nullptr;
  ncclResult_t (*CommInitRankConfig)(ncclComm_t*, int, ncclUniqueId, int, NcclConfig*) = nullptr;
  ncclResult_t (*AllReduce)(const void*, void*, size_t, int, int, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*AllGather)(const void*, void*, size_t, int, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*ReduceScatter)(const void*, void*, size_t, int, int, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*Send)(const void*, size_t, int, int, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*Recv)(void*, size_t, int, int, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*GroupStart)() = nullptr;
  ncclResult_t (*GroupEnd)() = nullptr;
  ncclResult_t (*CommGetAsyncError)(ncclComm_t, ncclResult_t*) = nullptr;
  ncclResult_t (*CommAbort)(ncclComm_t) = nullptr;
  ncclResult_t (*CommDestroy)(ncclComm_t) = nullptr;
  const char* (*GetErrorString)(ncclResult_t) = nullptr;
};

void say(char* error, int error_len, const char* what, const char* detail) {
  if (error && error_len > 0) snprintf(error, (size_t)error_len, "%s%s%s", what, detail ? ": " : "", detail ? detail : "");
}

template <class F>
bool symbol(void* handle, const char* name, F* out, char* error, int error_len) {
  *out = reinterpret_cast<F>(dlsym(handle, name));
  if (*out == nullptr) say(error, error_len, "the NCCL library has no symbol", name);
  return *out != nullptr;
}

// dlopen the NCCL at `path` once per process (NCCL starts threads: it is never closed).
bool load(const char* path, Nccl* nccl, char* error, int error_len) {
  void* handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    say(error, error_len, "could not open the NCCL library", dlerror());
    return false;
  }
  nccl->handle = handle;
  return symbol(handle, "ncclGetUniqueId", &nccl->GetUniqueId, error, error_len) &&
         symbol(handle, "ncclCommInitRankConfig", &nccl->CommInitRankConfig, error, error_len) &&
         symbol(handle, "ncclAllReduce", &nccl->AllReduce, error, error_len) &&
         symbol(handle, "ncclAllGather", &nccl->AllGather, error, error_len) &&
         symbol(handle, "ncclReduceScatter", &nccl->ReduceScatter, error, error_len) &&
         symbol(handle, "ncclSend", &nccl->Send, error, error_len) &&
         symbol(handle, "ncclRecv", &nccl->Recv, error, error_len) &&
         symbol(handle, "ncclGroupStart", &nccl->GroupStart, error, error_len) &&
         symbol(handle, "ncclGroupEnd", &nccl->GroupEnd, error, error_len) &&
         symbol(handle, "ncclCommGetAsyncError", &nccl->CommGetAsyncError, error, error_len) &&
         symbol(handle, "ncclCommAbort", &nccl->CommAbort, error, error_len) &&
         symbol(handle, "ncclCommDestroy", &nccl->CommDestroy, error, error_len) &&
         symbol(handle, "ncclGetErrorString", &nccl->GetErrorString, error, error_len);
}

double now_seconds() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

// A poll loop's pause: past a short spin (the awaited work is usually nearly done), yield the core.
void pause_after(int spins) {
  if (spins > 1000) {
    timespec pause = {0, 50000};
    nanosleep(&pause, nullptr);
  }
}

// A bucket's or an exchange's type (FLOWC_COMM_FLOAT32 ...) as NCCL's datatype and its size; size 0: not
// one of them.
struct SumType { int nccl; size_t size; };
SumType sum_type(int dtype) {
  switch (dtype) {
    case FLOWC_COMM_FLOAT32: return {kNcclFloat32, 4};
    case FLOWC_COMM_FLOAT64: return {kNcclFloat64, 8};
    case FLOWC_COMM_INT32: return {kNcclInt32, 4};
    case FLOWC_COMM_INT64: return {kNcclInt64, 8};
    default: return {0, 0};
  }
}

struct Bucket {
  char* data = nullptr;              // device memory, grown to the largest bucket seen
  size_t capacity = 0;               // bytes
  cudaEvent_t ready = nullptr;       // on the step's stream: the gradients are in `data`
  cudaEvent_t done = nullptr;        // on the engine's stream: `data` holds the sums
  cudaEvent_t wait_begin = nullptr;  // the step's stream around its wait for `done` (timed):
  cudaEvent_t wait_end = nullptr;    //   the communication the backward pass did not hide
  bool started = false;              // started and not yet awaited
  bool timed = false;                // awaited since the last settle: its wait is still to be added
};

struct Engine {
  Nccl nccl;
  ncclComm_t comm = nullptr;
  int ranks = 0;
  int rank = 0;
  cudaStream_t stream = nullptr;     // the all-reduces: overlapping the step's own stream
  std::vector<Bucket> buckets;
  double timeout_seconds = 0.0;      // 0: settle waits without a limit
  double waited_seconds = 0.0;
  // A call failed: the ranks' collectives may no longer match, so the communicator is aborted at
  // close instead of destroyed (ncclCommDestroy, and a wait for the stream, could then wait for ever).
  bool broken = false;
  char error[512] = {0};
};

int failed(Engine* e, const char* what, const char* detail = nullptr) {
  say(e->error, (int)sizeof e->error, what, detail);
  e->broken = true;
  return FLOWC_COMM_ERROR_FAILED;
}

int nccl_failed(Engine* e, const char* what, ncclResult_t r) {
  return failed(e, what, e->nccl.GetErrorString ? e->nccl.GetErrorString(r) : "unknown NCCL error");
}

int cuda_failed(Engine* e, const char* what, cudaError_t r) { return failed(e, what, cudaGetErrorString(r)); }

// Abort the communicator: NCCL's kernels still waiting for a lost peer return, and every later
// call of this engine fails (the runtime stops the job).
void abort_comm(Engine* e) {
  if (e->comm) e->nccl.CommAbort(e->comm);
  e->comm = nullptr;
}

int timed_out(Engine* e, const char* what, const char* why) {
  abort_comm(e);
  e->broken = true;
  char detail[256];
  snprintf(detail, sizeof detail, "did not complete within FLOWC_COMM_TIMEOUT (%g s)%s", e->timeout_seconds, why);
  say(e->error, (int)sizeof e->error, what, detail);
  return FLOWC_COMM_ERROR_TIMEOUT;
}

// The end of a call that returned `n`. On the nonblocking communicator a call returns ncclInProgress
// while NCCL still works on it (its start; a first collective that connects the ranks), and nothing
// may be queued on the communicator or its streams before it is done: poll its state, up to the
// timeout (then abort: a rank never came). 0, or the error code with the reason in e->error.
int finish(Engine* e, const char* what, ncclResult_t n, const char* why_late = "") {
  const double start = now_seconds();
  for (int spins = 0; n == kNcclInProgress; ++spins) {
    ncclResult_t state = kNcclInProgress;
    ncclResult_t r = e->nccl.CommGetAsyncError(e->comm, &state);
    n = r != kNcclSuccess ? r : state;
    if (n != kNcclInProgress) break;
    if (e->timeout_seconds > 0 && now_seconds() - start > e->timeout_seconds) return timed_out(e, what, why_late);
    pause_after(spins);
  }
  return n == kNcclSuccess ? 0 : nccl_failed(e, what, n);
}

int comm_start(void* ctx, int b, int count, const void* const* grads, const int64_t* sizes, int dtype,
               void* stream_) {
  Engine* e = static_cast<Engine*>(ctx);
  cudaStream_t stream = static_cast<cudaStream_t>(stream_);
  if (e->comm == nullptr) return failed(e, "the NCCL communicator was aborted by an earlier failure");
  if (b < 0 || b >= (int)e->buckets.size()) return failed(e, "a step started a bucket the engine does not have");
  Bucket& k = e->buckets[b];
  // A bucket still in flight (a step that stopped before its wait) would have its sums overwritten.
  if (k.started) return failed(e, "a step started a bucket whose last sums it never awaited");
  const SumType type = sum_type(dtype);
  if (type.size == 0) return failed(e, "a step started a bucket of a type the engine does not sum");
  size_t total = 0;
  for (int i = 0; i < count; ++i) total += (size_t)sizes[i];
  if (total * type.size > k.capacity) {
    if (k.data) {
      cudaError_t r = cudaStreamSynchronize(e->stream);   // the last sums in it are done with
      if (r != cudaSuccess) return cuda_failed(e, "waiting for the engine's stream", r);
      cudaFree(k.data);
      k.data = nullptr;
      k.capacity = 0;
    }
    cudaError_t r = cudaMalloc((void**)&k.data, total * type.size);
    if (r != cudaSuccess) return cuda_failed(e, "allocating a gradient bucket", r);
    k.capacity = total * type.size;
  }
  size_t offset = 0;
  for (int i = 0; i < count; ++i) {
    cudaError_t r = cudaMemcpyAsync(k.data + offset, grads[i], (size_t)sizes[i] * type.size,
                                    cudaMemcpyDeviceToDevice, stream);
    if (r != cudaSuccess) return cuda_failed(e, "copying a gradient into its bucket", r);
    offset += (size_t)sizes[i] * type.size;
  }
  cudaError_t r = cudaEventRecord(k.ready, stream);
  if (r == cudaSuccess) r = cudaStreamWaitEvent(e->stream, k.ready, 0);
  if (r != cudaSuccess) return cuda_failed(e, "ordering a bucket's sum after its gradients", r);
  ncclResult_t n = e->nccl.AllReduce(k.data, k.data, total, type.nccl, kNcclSum, e->comm, e->stream);
  if (int f = finish(e, "ncclAllReduce", n)) return f;
  r = cudaEventRecord(k.done, e->stream);
  if (r != cudaSuccess) return cuda_failed(e, "marking a bucket's sum", r);
  k.started = true;
  return 0;
}

int comm_wait(void* ctx, int b, void* stream_) {
  Engine* e = static_cast<Engine*>(ctx);
  cudaStream_t stream = static_cast<cudaStream_t>(stream_);
  if (b < 0 || b >= (int)e->buckets.size() || !e->buckets[b].started)
    return failed(e, "a step awaited a bucket it had not started");
  Bucket& k = e->buckets[b];
  cudaError_t r = cudaEventRecord(k.wait_begin, stream);
  if (r == cudaSuccess) r = cudaStreamWaitEvent(stream, k.done, 0);
  if (r == cudaSuccess) r = cudaEventRecord(k.wait_end, stream);
  if (r != cudaSuccess) return cuda_failed(e, "ordering the step after a bucket's sum", r);
  k.started = false;
  k.timed = true;
  return 0;
}

void* comm_data(void* ctx, int b) {
  Engine* e = static_cast<Engine*>(ctx);
  return b >= 0 && b < (int)e->buckets.size() ? e->buckets[b].data : nullptr;
}

int comm_exchange(void* ctx, int kind, const void* in, void* out, int64_t count, int dtype, void* stream_) {
  Engine* e = static_cast<Engine*>(ctx);
  cudaStream_t stream = static_cast<cudaStream_t>(stream_);
  if (e->comm == nullptr) return failed(e, "the NCCL communicator was aborted by an earlier failure");
  const SumType type = sum_type(dtype);
  if (type.size == 0) return failed(e, "a step asked for an exchange of a type the engine does not move");
  const Nccl& c = e->nccl;
  const size_t block = (size_t)count * type.size;     // bytes of one rank's block
  ncclResult_t n = kNcclSuccess;
  switch (kind) {
    case FLOWC_COMM_ALL_GATHER:
      n = c.AllGather(in, out, (size_t)count, type.nccl, e->comm, stream);
      break;
    case FLOWC_COMM_REDUCE_SCATTER:
      n = c.ReduceScatter(in, out, (size_t)count, type.nccl, kNcclSum, e->comm, stream);
      break;
    case FLOWC_COMM_ALL_TO_ALL:
      // Block s of `in` goes to rank s; block s of `out` comes from rank s (one group: no deadlock).
      n = c.GroupStart();
      for (int peer = 0; peer < e->ranks && (n == kNcclSuccess || n == kNcclInProgress); ++peer) {
        n = c.Send(static_cast<const char*>(in) + (size_t)peer * block, (size_t)count, type.nccl, peer, e->comm,
                   stream);
        if (n == kNcclSuccess || n == kNcclInProgress)
          n = c.Recv(static_cast<char*>(out) + (size_t)peer * block, (size_t)count, type.nccl, peer, e->comm,
                     stream);
      }
      {
        ncclResult_t end = c.GroupEnd();       // always closes the group it opened
        if (n == kNcclSuccess || n == kNcclInProgress) n = end;
      }
      break;
    default:
      return failed(e, "a step asked for an exchange the engine does not know");
  }
  return finish(e, "a model-parallel exchange", n);
}

// NCCL's asynchronous error on the communicator (aborting it), or 0.
int async_error(Engine* e) {
  if (e->comm == nullptr) return 0;
  ncclResult_t async = kNcclSuccess;
  ncclResult_t r = e->nccl.CommGetAsyncError(e->comm, &async);
  if (r != kNcclSuccess) async = r;
  if (async == kNcclSuccess || async == kNcclInProgress) return 0;
  abort_comm(e);
  return nccl_failed(e, "NCCL reported an error in the step's collectives", async);
}

int comm_settle(void* ctx, void* stream_) {
  Engine* e = static_cast<Engine*>(ctx);
  cudaStream_t stream = static_cast<cudaStream_t>(stream_);
  const double start = now_seconds();
  for (int spins = 0;; ++spins) {
    cudaError_t q = cudaStreamQuery(stream);
    // NCCL may record an error while its kernels still complete: asked once more after the stream is done
    int async_failure = async_error(e);
    if (async_failure) return async_failure;
    if (q == cudaSuccess) break;
    if (q != cudaErrorNotReady) {                     // a CUDA error: the host step names it
      e->broken = true;
      return (int)q;
    }
    if (e->timeout_seconds > 0 && now_seconds() - start > e->timeout_seconds)
      return timed_out(e, "a collective", "");
    pause_after(spins);
  }
  for (Bucket& k : e->buckets) {
    if (!k.timed) continue;
    float ms = 0.0f;
    if (cudaEventElapsedTime(&ms, k.wait_begin, k.wait_end) == cudaSuccess) e->waited_seconds += 1e-3 * ms;
    k.timed = false;
  }
  return 0;
}

void destroy(Engine* e) {
  // A failed call, or a step that stopped between a bucket's start and its wait (a failure of its
  // own): the ranks' collectives may no longer match, so abort. Its kernels return, and the wait for
  // the stream below ends.
  bool in_flight = false;
  for (const Bucket& k : e->buckets) in_flight = in_flight || k.started;
  if (e->broken || in_flight) abort_comm(e);
  if (e->stream) cudaStreamSynchronize(e->stream);
  for (Bucket& k : e->buckets) {
    for (cudaEvent_t ev : {k.ready, k.done, k.wait_begin, k.wait_end})
      if (ev) cudaEventDestroy(ev);
    if (k.data) cudaFree(k.data);
  }
  if (e->comm) e->nccl.CommDestroy(e->comm);
  if (e->stream) cudaStreamDestroy(e->stream);
  delete e;
}

}  // namespace

extern "C" {

// Can this process open NCCL at `library` and find every entry point the engine calls?  0, or the
// reason in `error`.  Every rank asks before any starts NCCL: a rank that could not would leave the
// others in NCCL's start until FLOWC_COMM_TIMEOUT.
int flowc_nccl_check(const char* library, char* error, int error_len) {
  Nccl nccl;
  return load(library, &nccl, error, error_len) ? 0 : FLOWC_COMM_ERROR_FAILED;
}

// Rank 0's half of the bootstrap: the id every rank's flowc_nccl_open takes (128 bytes into `id`).
int flowc_nccl_unique_id(const char* library, void* id, char* error, int error_len) {
  Nccl nccl;
  if (!load(library, &nccl, error, error_len)) return FLOWC_COMM_ERROR_FAILED;
  ncclUniqueId unique;
  ncclResult_t r = nccl.GetUniqueId(&unique);
  if (r != kNcclSuccess) {
    say(error, error_len, "ncclGetUniqueId", nccl.GetErrorString(r));
    return FLOWC_COMM_ERROR_FAILED;
  }
  memcpy(id, unique.internal, sizeof unique.internal);
  return 0;
}

// An engine with `buckets` buckets on the communicator of `ranks` ranks that share `id`, on the
// device current on this thread (every rank calls it together: NCCL's own bootstrap).  NULL, with
// the reason in `error`, when it could not be made.
void* flowc_nccl_open(const char* library, const void* id, int ranks, int rank, int buckets, double timeout_seconds,
                      char* error, int error_len) {
  Engine* e = new (std::nothrow) Engine();
  if (e == nullptr) {
    say(error, error_len, "out of host memory", nullptr);
    return nullptr;
  }
  e->ranks = ranks;
  e->rank = rank;
  e->timeout_seconds = timeout_seconds;
  e->buckets.resize((size_t)(buckets > 0 ? buckets : 1));
  if (!load(library, &e->nccl, error, error_len)) {
    destroy(e);
    return nullptr;
  }
  cudaError_t r = cudaStreamCreateWithFlags(&e->stream, cudaStreamNonBlocking);
  for (Bucket& k : e->buckets) {
    if (r == cudaSuccess) r = cudaEventCreateWithFlags(&k.ready, cudaEventDisableTiming);
    if (r == cudaSuccess) r = cudaEventCreateWithFlags(&k.done, cudaEventDisableTiming);
    if (r == cudaSuccess) r = cudaEventCreate(&k.wait_begin);
    if (r == cudaSuccess) r = cudaEventCreate(&k.wait_end);
  }
  if (r != cudaSuccess) {
    say(error, error_len, "creating the engine's stream and events", cudaGetErrorString(r));
    destroy(e);
    return nullptr;
  }
  ncclUniqueId unique;
  memcpy(unique.internal, id, sizeof unique.internal);
  NcclConfig config;
  ncclResult_t n = e->nccl.CommInitRankConfig(&e->comm, ranks, unique, rank, &config);
  // e->comm stays null unless NCCL made a communicator: a failed start's is aborted by destroy
  if (finish(e, "ncclCommInitRankConfig", n,
             ": a rank did not join the communicator (it stopped, or NCCL cannot connect the hosts: "
             "NCCL_DEBUG=INFO shows why)")) {
    say(error, error_len, e->error, nullptr);
    destroy(e);
    return nullptr;
  }
  return e;
}

void flowc_nccl_fill(void* ctx, void* table) {
  flowc_cuda_comm* t = static_cast<flowc_cuda_comm*>(table);
  t->ctx = ctx;
  t->start = comm_start;
  t->wait = comm_wait;
  t->data = comm_data;
  t->exchange = comm_exchange;
  t->settle = comm_settle;
}

double flowc_nccl_waited_seconds(void* ctx) { return static_cast<Engine*>(ctx)->waited_seconds; }

// Why the last call that returned an error failed ("" when none has).
const char* flowc_nccl_error(void* ctx) { return static_cast<Engine*>(ctx)->error; }

void flowc_nccl_close(void* ctx) {
  if (ctx) destroy(static_cast<Engine*>(ctx));
}

}  // extern "C"
