// Runs the CUDA subset flowc generates on the CPU (a test aid): one block at a time, each CUDA
// thread a ucontext fiber, __syncthreads and warp shuffles as cooperative barriers.
#pragma once
#include <ucontext.h>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <cstdio>
#include <utility>
#include <vector>

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
namespace emu {
inline uint3 thread_idx, block_idx;
inline dim3 block_dim, grid_dim;
}
#define threadIdx emu::thread_idx
#define blockIdx emu::block_idx
#define blockDim emu::block_dim
#define gridDim emu::grid_dim
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) alignas(n)
#define __trap() abort()

namespace emu {
struct Fiber { ucontext_t ctx; char* stack = nullptr; bool done = false; unsigned tid = 0; };
inline ucontext_t sched;
inline std::vector<Fiber> fibers;
inline int current = -1, live = 0, block_arrived = 0;
inline unsigned long block_gen = 0;
inline std::vector<unsigned long> warp_gen;
inline std::vector<int> warp_arrived, warp_live;
inline std::vector<uint64_t> slots;
inline void* fn = nullptr;
inline int nargs = 0;
inline void** args = nullptr;
constexpr size_t kStack = 256 * 1024;

inline void yield() { swapcontext(&fibers[current].ctx, &sched); }
inline void syncthreads() {
  unsigned long gen = block_gen;
  if (++block_arrived == live) { block_arrived = 0; ++block_gen; return; }
  while (block_gen == gen) yield();
}
inline void syncwarp() {
  int w = fibers[current].tid / 32;
  unsigned long gen = warp_gen[w];
  if (++warp_arrived[w] == warp_live[w]) { warp_arrived[w] = 0; ++warp_gen[w]; return; }
  while (warp_gen[w] == gen) yield();
}
// Kernel parameters are all pointers: call `fn` with nargs of them.
template <size_t... I>
inline void call_with(std::index_sequence<I...>) {
  using F = void (*)(decltype((void)I, (void*)nullptr)...);
  ((F)fn)(args[I]...);
}
template <size_t... N>
inline void dispatch(int n, std::index_sequence<N...>) {
  const bool called = ((n == (int)N ? (call_with(std::make_index_sequence<N>{}), true) : false) || ...);
  if (!called) { fprintf(stderr, "emu: %d kernel arguments are too many\n", n); abort(); }
}
inline void call() { dispatch(nargs, std::make_index_sequence<65>{}); }
inline void fiber_main() {
  call();
  fibers[current].done = true;
}
inline void release_if_ready() {
  if (block_arrived > 0 && block_arrived == live) { block_arrived = 0; ++block_gen; }
  for (size_t w = 0; w < warp_live.size(); ++w)
    if (warp_arrived[w] > 0 && warp_arrived[w] == warp_live[w]) { warp_arrived[w] = 0; ++warp_gen[w]; }
}
}  // namespace emu

template <class T>
inline T __shfl_xor_sync(unsigned, T v, int lane_mask) {
  using namespace emu;
  unsigned tid = fibers[current].tid;
  std::memcpy(&slots[tid], &v, sizeof(T));
  syncwarp();
  T out;
  std::memcpy(&out, &slots[(tid & ~31u) | ((tid & 31u) ^ (unsigned)lane_mask)], sizeof(T));
  syncwarp();
  return out;
}
inline void __syncthreads() { emu::syncthreads(); }
inline int atomicMax(int* p, int v) { int old = *p; if (v > old) *p = v; return old; }
inline int atomicCAS(int* p, int compare, int v) { int old = *p; if (old == compare) *p = v; return old; }

extern "C" void emu_launch(void* fn, int nargs, void** args, unsigned gx, unsigned gy, unsigned gz,
                           unsigned bx, unsigned by, unsigned bz) {
  using namespace emu;
  emu::fn = fn; emu::nargs = nargs; emu::args = args;
  grid_dim = {gx, gy, gz}; block_dim = {bx, by, bz};
  const int threads = (int)(bx * by * bz), warps = (threads + 31) / 32;
  if ((int)fibers.size() < threads) fibers.resize(threads);
  for (auto& f : fibers) if (!f.stack) f.stack = (char*)malloc(kStack);
  slots.assign(threads, 0);
  for (unsigned z = 0; z < gz; ++z) for (unsigned y = 0; y < gy; ++y) for (unsigned x = 0; x < gx; ++x) {
    block_idx = {x, y, z};
    live = threads; block_arrived = 0;
    warp_gen.assign(warps, 0); warp_arrived.assign(warps, 0); warp_live.assign(warps, 32);
    if (threads % 32) warp_live[warps - 1] = threads % 32;
    for (int t = 0; t < threads; ++t) {
      Fiber& f = fibers[t];
      getcontext(&f.ctx);
      f.ctx.uc_stack.ss_sp = f.stack; f.ctx.uc_stack.ss_size = kStack; f.ctx.uc_link = &sched;
      makecontext(&f.ctx, (void (*)())fiber_main, 0);
      f.done = false; f.tid = t;
    }
    long rounds = 0;
    while (live > 0) {
      for (int t = 0; t < threads; ++t) {
        if (fibers[t].done) continue;
        current = t;
        thread_idx = {t % bx, (t / bx) % by, t / (bx * by)};
        swapcontext(&sched, &fibers[t].ctx);
        if (fibers[t].done) { --live; --warp_live[t / 32]; release_if_ready(); }
      }
      if (++rounds > 100000000) { fprintf(stderr, "emu: deadlock\n"); abort(); }
    }
  }
}
