// The CUDA runtime calls of codegen_templates/cuda/flowc_comm_nccl.cu (the NCCL engine), on the
// CUDA emulator: force-included when the engine is built with g++ for a test
// (tests/nccl_emulated.py), so the engine's own code runs on the CPU.
//
// Device memory is the emulator's (emu_alloc: bounds- and initialisation-checked); a stream runs
// everything at once, in call order, so "asynchronous" copies are done when the call returns and
// events are always complete.  Every call that orders work (event records, stream waits, copies)
// is appended to the host step's log (emu_host_record), so a test reads one sequence: the host
// step's launches and the engine's calls interleaved.  FLOWC_FAKE_STREAM_BUSY=N makes
// cudaStreamQuery answer "not ready" N times per step first (the engine's polling loop runs).
#pragma once
#define FLOWC_CUDA_EMULATOR 1
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

extern "C" {
void* emu_alloc(size_t);
void emu_free(void*);
void emu_copy(void*, const void*, size_t);
void emu_host_record(const char* line);
}

typedef void* cudaStream_t;
struct FakeEvent { int id; };
typedef FakeEvent* cudaEvent_t;
enum cudaError_t { cudaSuccess = 0, cudaErrorMemoryAllocation = 2, cudaErrorNotReady = 600 };
enum cudaMemcpyKind { cudaMemcpyDeviceToDevice = 3 };
#define cudaStreamNonBlocking 0x01
#define cudaEventDisableTiming 0x02

namespace fake_cudart {
inline int& next_id() { static int id = 0; return ++id, id; }
inline void log(const char* what, const void* a, const void* b, size_t n) {
  char line[256];
  snprintf(line, sizeof line, "%s %p %p %zu", what, a, b, n);
  emu_host_record(line);
}
// The engine's own stream, created by it: named in the log so a test tells it from the step's.
constexpr uintptr_t kEngineStream = 0xE0E0;
}  // namespace fake_cudart

inline const char* cudaGetErrorString(cudaError_t e) {
  return e == cudaSuccess ? "no error" : e == cudaErrorNotReady ? "device not ready" : "out of memory";
}
inline cudaError_t cudaMalloc(void** p, size_t n) {
  *p = emu_alloc(n);
  return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
inline cudaError_t cudaFree(void* p) { emu_free(p); return cudaSuccess; }
inline cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t n, cudaMemcpyKind, cudaStream_t s) {
  fake_cudart::log("engine_copy", dst, src, n);
  (void)s;
  emu_copy(dst, src, n);
  return cudaSuccess;
}
inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned) {
  *s = (cudaStream_t)fake_cudart::kEngineStream;
  return cudaSuccess;
}
inline cudaError_t cudaStreamDestroy(cudaStream_t) { return cudaSuccess; }
inline cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
inline cudaError_t cudaStreamQuery(cudaStream_t s) {
  static int busy = -1;
  static int left = 0;
  if (busy < 0) {
    const char* text = getenv("FLOWC_FAKE_STREAM_BUSY");
    busy = text ? atoi(text) : 0;
    left = busy;
  }
  if (left > 0) {
    --left;
    return cudaErrorNotReady;
  }
  left = busy;               // the next step polls as long
  fake_cudart::log("stream_query", s, nullptr, 0);
  return cudaSuccess;
}
inline cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned) {
  *e = new FakeEvent{fake_cudart::next_id()};
  return cudaSuccess;
}
inline cudaError_t cudaEventCreate(cudaEvent_t* e) { return cudaEventCreateWithFlags(e, 0); }
inline cudaError_t cudaEventDestroy(cudaEvent_t e) { delete e; return cudaSuccess; }
inline cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  fake_cudart::log("event_record", (const void*)(uintptr_t)e->id, s, 0);
  return cudaSuccess;
}
inline cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned) {
  fake_cudart::log("stream_wait", s, (const void*)(uintptr_t)e->id, 0);
  return cudaSuccess;
}
inline cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t, cudaEvent_t) { *ms = 0.0f; return cudaSuccess; }
