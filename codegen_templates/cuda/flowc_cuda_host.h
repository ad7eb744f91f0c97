// flowc_cuda_host.h -- what a generated host step (`flowc_step`, the end of step.cu.j2) calls.
//
// The host step launches a job's kernels on the stream the runtime passes in, in one foreign
// call per step (runtime/cuda_executor.py), instead of one PyCUDA call per launch.  It uses the
// CUDA runtime API, linked statically into the step's shared library: the runtime API takes the
// context current on the calling thread, which is the primary context PyCUDA retained and pushed,
// so the kernels, the device memory PyCUDA allocated and PyCUDA's stream all live in one context.
// Every function returns a cudaError_t as an int (0: success); the step returns the first one.
//
// Under the CUDA emulator (tests/cuda_emulator.h defines FLOWC_CUDA_EMULATOR) the same names are
// defined by the emulator, which runs each launch on its fibers and records the sequence.
#pragma once
#ifndef FLOWC_CUDA_EMULATOR
#include <cuda_runtime.h>

namespace flowc_host {

using Stream = cudaStream_t;
constexpr int kMaxArgs = 64;      // every kernel parameter is a pointer; no kernel has more

// A kernel launch: `args` holds the argument values (device pointers); cudaLaunchKernel wants
// the address of each.  `name` is for the emulator's messages only.
inline int launch(const void* fn, const char* /*name*/, dim3 grid, dim3 block, unsigned shared, Stream s,
                  void** args, int n) {
  void* params[kMaxArgs];
  for (int i = 0; i < n && i < kMaxArgs; ++i) params[i] = &args[i];
  if (n > kMaxArgs) return (int)cudaErrorInvalidValue;
  return (int)cudaLaunchKernel(fn, grid, block, params, shared, s);
}

inline int clear_status(void* status, Stream s) { return (int)cudaMemsetAsync(status, 0, sizeof(int), s); }

inline int copy_device(void* dst, const void* src, size_t n, Stream s) {
  return (int)cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, s);
}

// Into page-locked host memory (the runtime's staging buffers), so the copy is asynchronous.
inline int copy_to_host(void* dst, const void* src, size_t n, Stream s) {
  return (int)cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, s);
}

inline int synchronize(Stream s) { return (int)cudaStreamSynchronize(s); }

inline const char* error_string(int code) { return cudaGetErrorString((cudaError_t)code); }

// FLOWC_PROFILE=1: an event pair around every launch, milliseconds added to `ms[i]` once the
// stream has finished (the step then synchronises: profiling measures, it does not overlap).
class Timer {
 public:
  Timer(float* ms, int launches, Stream s) : ms_(ms), n_(ms ? launches : 0), s_(s) {
    if (n_) events_ = new cudaEvent_t[2 * n_]();
    for (int i = 0; i < 2 * n_; ++i) cudaEventCreate(&events_[i]);
  }
  ~Timer() {
    for (int i = 0; i < 2 * n_; ++i) cudaEventDestroy(events_[i]);
    delete[] events_;
  }
  Timer(const Timer&) = delete;
  Timer& operator=(const Timer&) = delete;
  void start(int i) { if (i < n_) cudaEventRecord(events_[2 * i], s_); }
  void stop(int i) { if (i < n_) cudaEventRecord(events_[2 * i + 1], s_); }
  // `done` launches ran (a check_numerics stop ends the step early).
  int finish(int done) {
    if (!n_) return 0;
    if (int err = synchronize(s_)) return err;
    for (int i = 0; i < done && i < n_; ++i) {
      float t = 0.0f;
      if (cudaEventElapsedTime(&t, events_[2 * i], events_[2 * i + 1]) == cudaSuccess) ms_[i] += t;
    }
    return 0;
  }

 private:
  float* ms_;
  int n_;
  Stream s_;
  cudaEvent_t* events_ = nullptr;
};

}  // namespace flowc_host
#endif  // FLOWC_CUDA_EMULATOR
