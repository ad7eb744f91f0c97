// Kernels for tests/test_cuda_emulator_checks.py: each broken one commits exactly one class of
// error the CUDA emulator (tests/cuda_emulator_runtime.cpp) must catch; the correct ones must pass.
// Blocks are 64 threads, buffers 64 floats unless a test says otherwise.

// Correct: a block sum by warp shuffles and a shared array between two barriers.
extern "C" __global__ void block_sum(float* out, const float* in) {
  __shared__ float partial[2];
  float v = in[blockIdx.x * blockDim.x + threadIdx.x];
  for (int mask = 16; mask > 0; mask >>= 1) v += __shfl_xor_sync(0xffffffffu, v, mask);
  if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = v;
  __syncthreads();
  if (threadIdx.x == 0) out[blockIdx.x] = partial[0] + partial[1];
}

// Correct: each thread reads its left neighbour's element after a barrier.
extern "C" __global__ void shift_synced(float* out, const float* in) {
  __shared__ float s[64];
  s[threadIdx.x] = in[threadIdx.x];
  __syncthreads();
  out[threadIdx.x] = s[threadIdx.x == 0 ? 0 : threadIdx.x - 1];
}

// Shared-memory race: the same without the barrier.
extern "C" __global__ void shift_racy(float* out, const float* in) {
  __shared__ float s[64];
  s[threadIdx.x] = in[threadIdx.x];
  out[threadIdx.x] = s[threadIdx.x == 0 ? 0 : threadIdx.x - 1];
}

// Shared-memory race, write after read: a thread overwrites what another read in the same phase.
extern "C" __global__ void reuse_racy(float* out, const float* in) {
  __shared__ float s[64];
  s[threadIdx.x] = in[threadIdx.x];
  __syncthreads();
  float left = s[(threadIdx.x + 63) & 63];
  s[threadIdx.x] = 2.0f * left;                // the right neighbour may not have read it yet
  __syncthreads();
  out[threadIdx.x] = s[threadIdx.x];
}

// Global-memory race across blocks: every block writes out[0].
extern "C" __global__ void every_block_writes_one(float* out, const float* in) {
  if (threadIdx.x == 0) out[0] = in[blockIdx.x];
}

// Divergent barrier: two halves of the block wait at different __syncthreads().
extern "C" __global__ void divergent_barrier(float* out, const float* in) {
  if (threadIdx.x < 32) {
    __syncthreads();
  } else {
    __syncthreads();
  }
  out[threadIdx.x] = in[threadIdx.x];
}

// A barrier some threads never reach while others wait at a warp collective: a deadlock.
extern "C" __global__ void barrier_and_syncwarp(float* out, const float* in) {
  if (threadIdx.x == 0) {
    __syncthreads();
  } else {
    __syncwarp();
  }
  out[threadIdx.x] = in[threadIdx.x];
}

// Out-of-bounds write: one thread past the end of a 64-float buffer (launched with 65 threads).
extern "C" __global__ void write_one_past(float* out, const float* in) {
  out[threadIdx.x] = 1.0f;
}

// Uninitialised read: copies a buffer the host never wrote (out[i] = in[i]).
extern "C" __global__ void copy(float* out, const float* in) {
  out[threadIdx.x] = in[threadIdx.x];
}

// Shuffle after lanes exited: the upper half-warp returns, the lower one shuffles over the full mask.
extern "C" __global__ void shuffle_after_exit(float* out, const float* in) {
  if ((threadIdx.x & 31) >= 16) return;
  float v = in[threadIdx.x];
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  out[threadIdx.x] = v;
}

// Uninitialised shared memory: reads a slot no thread wrote.
extern "C" __global__ void shared_never_written(float* out, const float* in) {
  __shared__ float s[64];
  if (threadIdx.x < 32) s[threadIdx.x] = in[threadIdx.x];
  __syncthreads();
  out[threadIdx.x] = s[63 - threadIdx.x];
}

// Out-of-bounds shared write: one thread past the end of a 64-float shared array (65 threads).
extern "C" __global__ void shared_one_past(float* out, const float* in) {
  __shared__ float s[64];
  s[threadIdx.x] = 1.0f;
  __syncthreads();
  if (threadIdx.x < 64) out[threadIdx.x] = s[threadIdx.x];
}

// Uninitialised shared memory in a template (as flowc_cuda.h's block_reduce declares its array):
// warp 0 reads the partial of a warp that does not exist.
template <class T>
__device__ T read_partial(T v) {
  __shared__ T partial[32];
  if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = v;
  __syncthreads();
  return partial[threadIdx.x & 31];
}
extern "C" __global__ void template_partial_unwritten(float* out, const float* in) {
  out[threadIdx.x] = read_partial(in[threadIdx.x]);
}

// Over sm_90's 48 KiB of static shared memory: a 64 KiB array, every byte used.
extern "C" __global__ void shared_64k(float* out, const float* in) {
  __shared__ float big[16384];
  for (int i = threadIdx.x; i < 16384; i += blockDim.x) big[i] = in[threadIdx.x];
  __syncthreads();
  out[threadIdx.x] = big[16383 - threadIdx.x];
}

// Correct: the other warp intrinsics (out holds 256 floats).  out[t]: the warp's sum by
// __shfl_down_sync (lane 0's, broadcast by __shfl_sync); out[64 + t], out[128 + t]: the low and
// high halves of the ballot of "in > 0" over the warp; out[192 + t]: in[t ^ 1] through a shared
// array ordered by __syncwarp.
extern "C" __global__ void warp_intrinsics(float* out, const float* in) {
  __shared__ float s[64];
  const float x = in[threadIdx.x];
  float v = x;
  for (int d = 16; d > 0; d >>= 1) v += __shfl_down_sync(0xffffffffu, v, d);
  v = __shfl_sync(0xffffffffu, v, 0);
  const unsigned ballot = __ballot_sync(0xffffffffu, x > 0.0f);
  s[threadIdx.x] = x;
  __syncwarp();
  out[threadIdx.x] = v;
  out[64 + threadIdx.x] = (float)(ballot & 0xffffu);
  out[128 + threadIdx.x] = (float)(ballot >> 16);
  out[192 + threadIdx.x] = s[threadIdx.x ^ 1];
}

// Divergent warp collective: the two half-warps shuffle at different calls.
extern "C" __global__ void divergent_shuffle(float* out, const float* in) {
  float v = in[threadIdx.x];
  if ((threadIdx.x & 31) < 16) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
  } else {
    v -= __shfl_xor_sync(0xffffffffu, v, 1);
  }
  out[threadIdx.x] = v;
}

// Declared for at most 32 threads per block (a test launches it with 64).
extern "C" __global__ void __launch_bounds__(32) bounded_copy(float* out, const float* in) {
  out[threadIdx.x] = in[threadIdx.x];
}
