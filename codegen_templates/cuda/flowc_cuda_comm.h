// The collectives a generated GPU step calls, behind a table of function pointers (NCCL).
//
// The GPU twin of codegen_templates/cpu/flowc_comm.h: a data-parallel step starts a bucket of
// gradients once the kernel writing its last gradient has been queued, and waits for it before the
// first kernel that reads a sum.  Every call queues work on the step's `stream` and returns at once:
// a start copies the gradients into the bucket on `stream` and sums them over the ranks on the
// engine's own stream (so the sums overlap the rest of the backward pass); a wait makes `stream`
// wait for them; `settle` is the one call that blocks, until `stream` is done, watching the peers
// (FLOWC_COMM_TIMEOUT).  The runtime fills the table from flowc_comm_nccl.cu (runtime/nccl.py); a
// step never includes nccl.h.  Each call returns 0 or a flowc error code (below).
#pragma once
#include <stdint.h>

#define FLOWC_COMM_ERROR_FAILED 900001      // NCCL or CUDA reported an error in a collective
#define FLOWC_COMM_ERROR_TIMEOUT 900002     // a peer did not take part within the timeout (lost?)
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
struct flowc_cuda_comm {
  void* ctx;
  // Copy `count` gradients (device addresses grads[i], sizes[i] values of type `dtype`,
  // FLOWC_COMM_FLOAT32 ...) into bucket `bucket` on `stream`, then start summing the bucket over
  // every rank.
  int (*start)(void* ctx, int bucket, int count, const void* const* grads, const int64_t* sizes, int dtype,
               void* stream);
  // `stream` waits (on the device) until bucket `bucket` holds the sums.
  int (*wait)(void* ctx, int bucket, void* stream);
  // The device address of bucket `bucket`'s sums, the gradients one after the other.
  void* (*data)(void* ctx, int bucket);
  // One model-parallel exchange (`kind`: FLOWC_COMM_ALL_GATHER ...; `count` values of type `dtype`
  // per rank's block) queued on `stream`; `in` and `out` are device addresses that do not overlap.
  int (*exchange)(void* ctx, int kind, const void* in, void* out, int64_t count, int dtype, void* stream);
  // Block until `stream` has finished, failing with FLOWC_COMM_ERROR_TIMEOUT when a peer stopped
  // taking part: instead of the host step's plain synchronize.
  int (*settle)(void* ctx, void* stream);
};
}
