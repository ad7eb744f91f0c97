// Runs the CUDA subset flowc generates on the CPU (a test aid), the kernel side: force-included
// into each generated translation unit, which g++ builds with -fsanitize=kernel-address and an
// instrumentation threshold of 0, so that every load and store the kernel makes calls
// __asan_{load,store}N_noabort.  Those hooks, the fibers (one per CUDA thread), the barriers, the
// warp collectives and the checkers live in tests/cuda_emulator_runtime.cpp (libflowc_emu.so),
// built once without instrumentation; see its header comment for what is checked.
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

// cuda_fp16.h's __half, as much of it as generated code uses: conversions to and from float
// (round to nearest even), over the host's IEEE binary16.
#define FLOWC_CUDA_EMULATOR 1
struct __half {
  _Float16 bits;
  __half() = default;
  __half(float f) : bits((_Float16)f) {}
  operator float() const { return (float)bits; }
};
struct uint3 { unsigned x, y, z; };
struct dim3 { unsigned x, y, z; };

extern "C" {
uint3 emu_thread_idx(void);
uint3 emu_block_idx(void);
dim3 emu_block_dim(void);
dim3 emu_grid_dim(void);
void emu_syncthreads(const char* file, int line);
// A warp collective: kind 0 shfl (src lane), 1 shfl_xor, 2 shfl_down, 3 shfl_up, 4 ballot, 5 syncwarp.
void emu_warp(int kind, unsigned mask, const void* in, void* out, int size, int arg, int width,
              const char* file, int line);
void emu_atomic(const void* p, int size);
int emu_run(const char* name, void* fn, int nargs, void** args, unsigned gx, unsigned gy, unsigned gz,
            unsigned bx, unsigned by, unsigned bz, unsigned dynamic_shared);
}

// Built-in variables are calls, not globals: the runtime's state is not instrumented memory.
#define threadIdx (emu_thread_idx())
#define blockIdx (emu_block_idx())
#define blockDim (emu_block_dim())
#define gridDim (emu_grid_dim())
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
// Static shared arrays are the module's only writable data (CUDA allows no other statics in
// device code), so the runtime takes the module's writable segment for its shared memory:
// poisoned at each block's start, race-checked per barrier.  g++'s -fsanitize=kernel-address
// registers each (non-template) one with its size and pads it with a redzone, so an access past
// an array's end is seen; -fno-gnu-unique keeps each module's template statics its own.
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
#define __trap() abort()
#define __syncthreads() emu_syncthreads(__FILE__, __LINE__)

namespace emu {
template <class T>
inline T warp(int kind, unsigned mask, T v, int arg, int width, const char* file, int line) {
  static_assert(sizeof(T) <= 8, "a shuffle moves at most 8 bytes");
  T out;
  emu_warp(kind, mask, &v, &out, (int)sizeof(T), arg, width, file, line);
  return out;
}
}  // namespace emu

#define __shfl_sync(m, v, a, ...) emu::warp(0, m, v, a, (__VA_ARGS__ + 0) ? (__VA_ARGS__ + 0) : 32, __FILE__, __LINE__)
#define __shfl_xor_sync(m, v, a, ...) emu::warp(1, m, v, a, (__VA_ARGS__ + 0) ? (__VA_ARGS__ + 0) : 32, __FILE__, __LINE__)
#define __shfl_down_sync(m, v, a, ...) emu::warp(2, m, v, a, (__VA_ARGS__ + 0) ? (__VA_ARGS__ + 0) : 32, __FILE__, __LINE__)
#define __shfl_up_sync(m, v, a, ...) emu::warp(3, m, v, a, (__VA_ARGS__ + 0) ? (__VA_ARGS__ + 0) : 32, __FILE__, __LINE__)
#define __ballot_sync(m, p) emu::warp<unsigned>(4, m, (unsigned)((p) != 0), 0, 32, __FILE__, __LINE__)
#define __syncwarp(...) ((void)emu::warp<int>(5, (__VA_ARGS__ + 0) ? (unsigned)(__VA_ARGS__ + 0) : 0xffffffffu, 0, 0, 32, __FILE__, __LINE__))

// Atomics: bounds- and initialisation-checked, not race-checked (they are the synchronising kind).
inline int atomicMax(int* p, int v) { emu_atomic(p, 4); int old = *p; if (v > old) *p = v; return old; }
inline int atomicCAS(int* p, int compare, int v) { emu_atomic(p, 4); int old = *p; if (old == compare) *p = v; return old; }
inline int atomicAdd(int* p, int v) { emu_atomic(p, 4); int old = *p; *p = old + v; return old; }
inline float atomicAdd(float* p, float v) { emu_atomic(p, 4); float old = *p; *p = old + v; return old; }

// Returns 0, or 1 with the violation in emu_error().
extern "C" int emu_launch(const char* name, void* fn, int nargs, void** args, unsigned gx, unsigned gy,
                          unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned dynamic_shared) {
  return emu_run(name, fn, nargs, args, gx, gy, gz, bx, by, bz, dynamic_shared);
}

// --- the host step (codegen_templates/cuda/flowc_cuda_host.h's names, on the emulator) ---------------
// A source built with FLOWC_HOST_STEP defined gets its `flowc_step`, which calls these: launches run
// on the fibers above, copies move emulated device memory, and every call is appended to a log kept
// by the runtime (emu_host_log: this module's writable data is the kernels' shared memory, so no
// state of the host step lives here) that tests compare with the step's launch list.
extern "C" {
void emu_write(void*, const void*, size_t);
void emu_copy(void*, const void*, size_t);
const char* emu_error(void);
void emu_host_record(const char* line);
}

namespace flowc_host {
using Stream = void*;
constexpr int kLaunchFailed = 719;     // cudaErrorLaunchFailure: what a kernel fault is on a GPU
inline int launch(const void* fn, const char* name, dim3 grid, dim3 block, unsigned shared, Stream s, void** args,
                  int n) {
  char line[4096];
  int w = snprintf(line, sizeof line, "launch %s %u,%u,%u %u,%u,%u %u %p", name, grid.x, grid.y, grid.z, block.x,
                   block.y, block.z, shared, s);
  for (int i = 0; i < n && w > 0 && w < (int)sizeof line - 24; ++i) w += snprintf(line + w, sizeof line - w, " %p", args[i]);
  emu_host_record(line);
  return emu_run(name, (void*)fn, n, args, grid.x, grid.y, grid.z, block.x, block.y, block.z, shared)
             ? kLaunchFailed : 0;
}
inline void record(const char* what, const void* dst, const void* src, size_t n, Stream s) {
  char line[256];
  snprintf(line, sizeof line, "%s %p %p %zu %p", what, dst, src, n, s);
  emu_host_record(line);
}
inline int clear_status(void* status, Stream s) {
  int zero = 0;
  record("clear_status", status, nullptr, sizeof zero, s);
  emu_write(status, &zero, sizeof zero);
  return 0;
}
inline int copy_device(void* dst, const void* src, size_t n, Stream s) {
  record("copy_device", dst, src, n, s);
  emu_copy(dst, src, n);
  return 0;
}
inline int copy_to_host(void* dst, const void* src, size_t n, Stream s) {
  record("copy_to_host", dst, src, n, s);
  emu_copy(dst, src, n);
  return 0;
}
inline int synchronize(Stream s) {
  record("synchronize", nullptr, nullptr, 0, s);
  return 0;
}
inline const char* error_string(int code) { return code == kLaunchFailed ? emu_error() : "unknown error"; }
// Counts launches instead of timing them (the emulator's time says nothing of a GPU's): enough to
// show that the timer is wired to the right launch.
class Timer {
 public:
  Timer(float* ms, int launches, Stream) : ms_(ms), n_(ms ? launches : 0) {}
  void start(int) {}
  void stop(int i) { if (i < n_) ms_[i] += 1.0f; }
  int finish(int) { return 0; }

 private:
  float* ms_;
  int n_;
};
}  // namespace flowc_host
