// The collectives a generated step calls, behind a table of function pointers.
//
// A data-parallel step (compiler/passes/data_parallel.py) all-reduces its gradients in buckets:
// it starts a bucket as soon as the kernel that writes the bucket's last gradient has run, pokes
// the engine between the kernels that follow (so a non-blocking collective progresses while the
// backward pass computes), and waits for the bucket before the first kernel that reads a reduced
// gradient.  The step does not know which engine does the work: the runtime hands it this table,
// filled by the MPI library (flowc_comm_mpi.c, runtime/collectives.py); a GPU step gets the same
// calls from NCCL.  Each call returns 0 or a flowc error code (FLOWC_COMM_ERROR_FAILED, FLOWC_COMM_ERROR_TIMEOUT).
#pragma once
#include <stdint.h>

#define FLOWC_COMM_ERROR_FAILED 900001      // the engine reported an error
#define FLOWC_COMM_ERROR_TIMEOUT 900002     // a peer did not take part within the timeout (lost?)
// The exchanges of model parallelism (compiler/passes/model_parallel.py), `kind` of `exchange`.
#define FLOWC_COMM_ALL_GATHER 1        // in: count values; out: every rank's count, in rank order
#define FLOWC_COMM_REDUCE_SCATTER 2    // in: ranks * count values; out: this rank's count of their sums
#define FLOWC_COMM_ALL_TO_ALL 3        // in: ranks blocks of count; out block s: rank s's block for this rank
// The type of the values of a bucket or an exchange, `dtype` of `start` and `exchange`
// (compiler/codegen/collectives.py, COMM_TYPES).
#define FLOWC_COMM_FLOAT32 0
#define FLOWC_COMM_FLOAT64 1
#define FLOWC_COMM_INT32 2
#define FLOWC_COMM_INT64 3

extern "C" {
struct flowc_comm {
  void* ctx;
  // Copy `count` gradients (grads[i] of sizes[i] values of type `dtype`, FLOWC_COMM_FLOAT32 ...) into
  // bucket `bucket` and start summing it over every rank.
  int (*start)(void* ctx, int bucket, int count, const void* const* grads, const int64_t* sizes, int dtype);
  // Let the engine move the buckets in flight along; never blocks.
  int (*progress)(void* ctx);
  // Wait until bucket `bucket` holds the sums (a timeout is FLOWC_COMM_ERROR_TIMEOUT).
  int (*wait)(void* ctx, int bucket);
  // The sums of bucket `bucket`, the gradients one after the other (of its start's type), after its wait.
  const void* (*data)(void* ctx, int bucket);
  // Exchange one value between the ranks (`kind`: FLOWC_COMM_ALL_GATHER ...; `count` values of type
  // `dtype` per rank's block) and wait for it: a model-parallel layer needs the result at once.
  // `in` and `out` do not overlap.
  int (*exchange)(void* ctx, int kind, const void* in, void* out, int64_t count, int dtype);
};
}

namespace flowc {
// A reduced gradient into its own buffer, scaled (1/ranks for a mean; an integer is never scaled): at
// the position of the gradient's all_reduce in the schedule, so the memory plan's lifetimes hold.
template <typename T>
inline void comm_unpack(const void* bucket, int64_t offset, T* out, int64_t n, T scale) {
  const T* sums = static_cast<const T*>(bucket) + offset;
  if (scale == T(1)) {
    for (int64_t i = 0; i < n; ++i) out[i] = sums[i];
  } else {
    for (int64_t i = 0; i < n; ++i) out[i] = sums[i] * scale;
  }
}
}  // namespace flowc
