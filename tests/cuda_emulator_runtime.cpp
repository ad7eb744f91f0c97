// The CUDA emulator's runtime (a test aid, libflowc_emu.so; the kernel side is cuda_emulator.h).
//
// Execution: one block at a time; each CUDA thread of the block is a ucontext fiber that runs
// until it waits at __syncthreads() or a warp collective (__shfl_*_sync, __ballot_sync,
// __syncwarp), so threads interleave as on a GPU at exactly the points where CUDA orders them.
//
// Checks, per launch; the first violation stops the launch and emu_run returns 1 with a message
// naming the kernel, the block and thread, the address and the class of error:
//   * launch limits of sm_90: block <= 1024 threads (x, y <= 1024, z <= 64), grid x < 2^31,
//     y and z <= 65535, no zero dimension, static shared memory <= 48 KiB, static + dynamic
//     shared memory <= 227 KiB;
//   * out-of-bounds accesses: device memory comes from emu_alloc, one mapping per allocation
//     with 64 KiB guards on both sides; an access that touches a guard is out of bounds;
//   * uninitialised reads: an initialised bit per byte of device and shared memory (emu_alloc
//     poisons, host writes and kernel stores initialise, shared memory is poisoned per block);
//   * races: shadow memory records per byte the last writer and the reader(s) (block, thread,
//     barrier epoch, warp epoch).  Two accesses of one byte, one a write, by different threads
//     race unless a __syncthreads() of their block (or a warp collective of their warp) lies
//     between them; accesses from different blocks of one launch always race (flowc's kernels do
//     not synchronise across blocks); accesses from different launches never do;
//   * barriers: every thread of a block that has not exited must reach the same __syncthreads()
//     (the same file and line) before any passes it; warp collectives need every lane of their
//     mask, none exited, at the same call; a block where no thread can proceed is a deadlock.
// Shared memory is the kernel module's writable segment (its static arrays); each registered
// array (__asan_register_globals) is followed by a redzone, so an access past its end is out of
// bounds.  Approximations (documented, not hidden): template static arrays (block_reduce's
// partial[]) are not registered, so only the segment's ends bound them; warp shuffles count as
// memory ordering within the warp (CUDA only promises that of __syncwarp).
#include <link.h>
#include <sys/mman.h>
#include <ucontext.h>

#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

struct uint3 { unsigned x, y, z; };
struct dim3 { unsigned x, y, z; };

namespace {

// --- device memory -----------------------------------------------------------------------------------

// Shadow of one byte: who last wrote it and who read it since (stamp = launch's first block
// stamp + linear block index; epochs = the block's barrier count and the warp's collective count).
struct Cell {
  uint32_t ws, wb, ww, rs, rb, rw;
  uint16_t wt, rt;
};
constexpr uint16_t kManyThreads = 0xFFFF, kManyBlocks = 0xFFFE;
constexpr size_t kGuard = 64 * 1024;

struct Region {
  uintptr_t map_lo, map_hi, lo, hi;
  size_t id;
  uint8_t* init;
  Cell* cells;
};
std::map<uintptr_t, Region*> regions;      // by map_lo
Region* last_region = nullptr;
size_t next_region_id = 1;

Region* find_region(uintptr_t a) {
  if (last_region && a >= last_region->map_lo && a < last_region->map_hi) return last_region;
  auto it = regions.upper_bound(a);
  if (it == regions.begin()) return nullptr;
  --it;
  if (a >= it->second->map_hi) return nullptr;
  return last_region = it->second;
}

// --- static (shared) arrays, as g++ registers them -----------------------------------------------------

struct AsanGlobal {                        // gcc/asan.c's __asan_global (ABI v8)
  uintptr_t beg, size, size_with_redzone;
  const char* name;
  const char* module_name;
  uintptr_t has_dynamic_init;
  void* location;
  uintptr_t odr_indicator;
};
std::map<uintptr_t, const AsanGlobal*> globals;   // by beg

const AsanGlobal* find_global(uintptr_t a) {
  auto it = globals.upper_bound(a);
  if (it == globals.begin()) return nullptr;
  --it;
  return a < it->second->beg + it->second->size_with_redzone ? it->second : nullptr;
}

// --- the launch ------------------------------------------------------------------------------------

enum State : uint8_t { kRun, kBarrier, kWarp, kDone };
struct Fiber { ucontext_t ctx; State state = kRun; };
struct Warp {
  unsigned exited = 0, arrived = 0, mask = 0;
  uint32_t gen = 0;
  int kind = 0, line = 0;
  const char* file = nullptr;
  uint64_t slots[2][32] = {};
};
constexpr size_t kStack = 256 * 1024;     // the first page of each is a guard: an overflow faults
constexpr unsigned kMaxThreads = 1024;

ucontext_t sched;
Fiber fibers[kMaxThreads];
char* stacks = nullptr;                    // one mapping: kMaxThreads stacks
Warp warps[kMaxThreads / 32];
bool in_launch = false, aborting = false;
int current = -1, live = 0, bar_arrived = 0, bar_line = 0;
const char* bar_file = nullptr;
uint32_t block_gen = 0, stamp = 0, launch_stamp0 = 1, next_stamp = 1;
uint3 thread_idx, block_idx;
dim3 block_dim, grid_dim;
const char* kernel_name = "";
void* kernel_fn = nullptr;
int kernel_nargs = 0;
void** kernel_args = nullptr;
uintptr_t shared_lo = 0, shared_hi = 0, block_lo = 0, block_hi = 0;   // block_*: shared bytes this block touched
size_t shared_used = 0;                    // most distinct shared bytes one block touched
std::vector<uint8_t> shared_init, shared_redzone;
std::vector<Cell> shared_cells;
thread_local std::string error;             // the calling thread's last launch's violation
// Python threads may launch at once (cffi releases the GIL): one launch or host copy at a time.
std::mutex lock;

std::string where(uintptr_t a) {
  char buf[160];
  if (const AsanGlobal* g = a >= shared_lo && a < shared_hi ? find_global(a) : nullptr) {
    snprintf(buf, sizeof buf, "0x%lx (shared memory, byte %ld of %s[], %lu bytes)", (unsigned long)a,
             (long)(a - g->beg), g->name, (unsigned long)g->size);
  } else if (a >= shared_lo && a < shared_hi) {
    snprintf(buf, sizeof buf, "0x%lx (shared memory, byte %lu of the module's %lu)", (unsigned long)a,
             (unsigned long)(a - shared_lo), (unsigned long)(shared_hi - shared_lo));
  } else if (Region* r = find_region(a)) {
    snprintf(buf, sizeof buf, "0x%lx (byte %ld of allocation #%lu, %lu bytes at 0x%lx)", (unsigned long)a,
             (long)(a - r->lo), (unsigned long)r->id, (unsigned long)(r->hi - r->lo), (unsigned long)r->lo);
  } else {
    snprintf(buf, sizeof buf, "0x%lx", (unsigned long)a);
  }
  return buf;
}

std::string thread_name(uint32_t s, unsigned tid) {
  const unsigned long b = s - launch_stamp0;
  char buf[120];
  snprintf(buf, sizeof buf, "block (%lu,%lu,%lu) thread (%u,%u,%u)", b % grid_dim.x, b / grid_dim.x % grid_dim.y,
           b / ((unsigned long)grid_dim.x * grid_dim.y), tid % block_dim.x, tid / block_dim.x % block_dim.y,
           tid / (block_dim.x * block_dim.y));
  return buf;
}

// Records the first violation of the launch; from a fiber, abandons the launch (the faulting
// access is never made).
void violation(const char* cls, const std::string& at, const char* fmt, ...) {
  if (error.empty()) {
    char detail[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    error = std::string("kernel ") + kernel_name + ": " + cls;
    if (current >= 0) error += " in " + thread_name(stamp, (unsigned)current);
    if (!at.empty()) error += " at address " + at;
    error += ": " + std::string(detail);
  }
  aborting = true;
  if (current >= 0) swapcontext(&fibers[current].ctx, &sched);
}

// --- happens-before --------------------------------------------------------------------------------

inline bool ordered(uint32_t s, unsigned t, uint32_t bg, uint32_t wg) {
  if (s < launch_stamp0) return true;                     // an earlier launch (or never)
  if (s != stamp) return false;                           // another block of this launch
  if (t == (unsigned)current) return true;
  if (bg != block_gen) return true;                       // a __syncthreads() since
  return (t >> 5) == ((unsigned)current >> 5) && wg != warps[current >> 5].gen;
}

void check_byte(uintptr_t a, Cell& c, uint8_t& init, bool write) {
  const unsigned tid = (unsigned)current;
  const uint32_t wg = warps[tid >> 5].gen;
  if (!write) {
    if (!init) violation("uninitialised read", where(a), "the byte was never written");
    if (!ordered(c.ws, c.wt, c.wb, c.ww))
      violation("write/read race", where(a), "written by %s with no barrier in between",
                thread_name(c.ws, c.wt).c_str());
    if (c.rs < launch_stamp0 || (c.rt < kManyBlocks && c.rt != tid && ordered(c.rs, c.rt, c.rb, c.rw)) ||
        (c.rt == kManyThreads && c.rs == stamp && c.rb != block_gen) || (c.rt == tid && c.rs == stamp)) {
      c.rs = stamp; c.rt = (uint16_t)tid; c.rb = block_gen; c.rw = wg;
    } else if (c.rt != kManyBlocks) {
      if (c.rs != stamp) { c.rt = kManyBlocks; c.rs = stamp; } else { c.rt = kManyThreads; c.rb = block_gen; }
    }
    return;
  }
  if (!ordered(c.ws, c.wt, c.wb, c.ww))
    violation("write/write race", where(a), "also written by %s with no barrier in between",
              thread_name(c.ws, c.wt).c_str());
  if (c.rs >= launch_stamp0) {
    bool race;
    if (c.rt == kManyBlocks) race = true;
    else if (c.rt == kManyThreads) race = c.rs != stamp || c.rb == block_gen;
    else race = !ordered(c.rs, c.rt, c.rb, c.rw);
    if (race)
      violation("read/write race", where(a), "read by %s with no barrier in between",
                c.rt >= kManyBlocks ? (c.rt == kManyBlocks ? "threads of other blocks" : "other threads of the block")
                                    : thread_name(c.rs, c.rt).c_str());
  }
  c.ws = stamp; c.wt = (uint16_t)tid; c.wb = block_gen; c.ww = wg;
  init = 1;
}

// The bytes of one access usually share their history: check the first, and give each later
// byte with the same shadow the same outcome.
void check_bytes(uintptr_t a, size_t n, Cell* cells, uint8_t* init, bool write) {
  const Cell before = cells[0];
  const uint8_t init_before = init[0];
  check_byte(a, cells[0], init[0], write);
  for (size_t i = 1; i < n; ++i) {
    if (init[i] == init_before && std::memcmp(&cells[i], &before, sizeof(Cell)) == 0) {
      cells[i] = cells[0];
      init[i] = init[0];
    } else {
      check_byte(a + i, cells[i], init[i], write);
    }
  }
}

void access(uintptr_t a, size_t n, bool write) {
  if (!in_launch || current < 0 || aborting) return;
  const uintptr_t stack_lo = (uintptr_t)stacks;
  if (a - stack_lo < kStack * kMaxThreads) return;        // a fiber's own stack: private
  const char* kind = write ? "out-of-bounds write" : "out-of-bounds read";
  if (a + n > shared_lo && a < shared_hi) {
    if (a < shared_lo || a + n > shared_hi)
      violation(kind, where(a), "%lu bytes cross the end of the module's shared memory", (unsigned long)n);
    const uint8_t* redzone = shared_redzone.data() + (a - shared_lo);
    if (redzone[0] | redzone[n - 1]) {
      const AsanGlobal* g = find_global(a);
      violation(kind, where(a), "%lu bytes, outside the shared array %s[] of %lu bytes", (unsigned long)n,
                g ? g->name : "?", g ? (unsigned long)g->size : 0ul);
    }
    if (block_hi == 0 || a < block_lo) block_lo = a;
    if (a + n > block_hi) block_hi = a + n;
    check_bytes(a, n, shared_cells.data() + (a - shared_lo), shared_init.data() + (a - shared_lo), write);
    return;
  }
  Region* r = find_region(a);
  if (!r) r = find_region(a + n - 1);
  if (!r) return;                                         // not device memory (host globals)
  if (a < r->lo || a + n > r->hi)
    violation(kind, where(a), "%lu bytes, outside allocation #%lu of %lu bytes at 0x%lx", (unsigned long)n,
              (unsigned long)r->id, (unsigned long)(r->hi - r->lo), (unsigned long)r->lo);
  check_bytes(a, n, r->cells + (a - r->lo), r->init + (a - r->lo), write);
}

// --- fibers, barriers, warp collectives ----------------------------------------------------------------

template <size_t... I>
void call_with(std::index_sequence<I...>) {
  using F = void (*)(decltype((void)I, (void*)nullptr)...);
  ((F)kernel_fn)(kernel_args[I]...);
}
template <size_t... N>
void dispatch(int n, std::index_sequence<N...>) {
  ((n == (int)N ? (call_with(std::make_index_sequence<N>{}), true) : false) || ...);
}

void yield_to_scheduler() { swapcontext(&fibers[current].ctx, &sched); }

void release_block_if_ready() {
  if (bar_arrived == 0 || bar_arrived != live) return;
  for (int t = 0; t < (int)(block_dim.x * block_dim.y * block_dim.z); ++t)
    if (fibers[t].state == kBarrier) fibers[t].state = kRun;
  bar_arrived = 0;
  ++block_gen;
}

void fiber_main() {
  dispatch(kernel_nargs, std::make_index_sequence<65>{});
  const unsigned tid = (unsigned)current, bit = 1u << (tid & 31);
  Warp& w = warps[tid >> 5];
  fibers[tid].state = kDone;
  w.exited |= bit;
  --live;
  if (w.arrived && (w.mask & bit))
    violation("warp collective after lanes exited", "", "lane %u exited while lanes 0x%08x wait at %s:%d for mask 0x%08x",
              tid & 31, w.arrived, w.file, w.line, w.mask);
  release_block_if_ready();
}

// The writable segment of the module that holds `fn`: its static (shared) arrays.
struct ModuleFind { uintptr_t fn, lo, hi; };
int find_module(dl_phdr_info* info, size_t, void* data) {
  ModuleFind* f = (ModuleFind*)data;
  bool mine = false;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& p = info->dlpi_phdr[i];
    const uintptr_t lo = info->dlpi_addr + p.p_vaddr;
    if (p.p_type == PT_LOAD && f->fn >= lo && f->fn < lo + p.p_memsz) mine = true;
  }
  if (!mine) return 0;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& p = info->dlpi_phdr[i];
    if (p.p_type != PT_LOAD || !(p.p_flags & PF_W)) continue;
    const uintptr_t lo = info->dlpi_addr + p.p_vaddr;
    if (!f->lo || lo < f->lo) f->lo = lo;
    if (lo + p.p_memsz > f->hi) f->hi = lo + p.p_memsz;
  }
  return 1;
}

}  // namespace

extern "C" {

void __asan_register_globals(const AsanGlobal* g, size_t n) {
  for (size_t i = 0; i < n; ++i) globals[g[i].beg] = &g[i];
}
void __asan_unregister_globals(const AsanGlobal* g, size_t n) {
  for (size_t i = 0; i < n; ++i) globals.erase(g[i].beg);
}
void __asan_before_dynamic_init(const char*) {}
void __asan_after_dynamic_init(void) {}

uint3 emu_thread_idx(void) { return thread_idx; }
uint3 emu_block_idx(void) { return block_idx; }
dim3 emu_block_dim(void) { return block_dim; }
dim3 emu_grid_dim(void) { return grid_dim; }
const char* emu_error(void) { return error.c_str(); }

void emu_syncthreads(const char* file, int line) {
  if (current < 0) return;
  if (bar_arrived > 0 && (line != bar_line || strcmp(file, bar_file) != 0))
    violation("divergent barrier", "", "reached __syncthreads() at %s:%d while %d thread(s) wait at %s:%d", file, line,
              bar_arrived, bar_file, bar_line);
  bar_file = file; bar_line = line;
  ++bar_arrived;
  fibers[current].state = kBarrier;
  release_block_if_ready();
  while (fibers[current].state == kBarrier) yield_to_scheduler();
}

void emu_warp(int kind, unsigned mask, const void* in, void* out, int size, int arg, int width, const char* file,
              int line) {
  static const char* names[] = {"__shfl_sync", "__shfl_xor_sync", "__shfl_down_sync", "__shfl_up_sync",
                                "__ballot_sync", "__syncwarp"};
  const unsigned tid = (unsigned)current, lane = tid & 31, bit = 1u << lane;
  Warp& w = warps[tid >> 5];
  if (!(mask & bit)) violation("warp collective outside its mask", "", "%s at %s:%d with mask 0x%08x", names[kind], file, line, mask);
  if (mask & w.exited)
    violation("warp collective after lanes exited", "", "%s at %s:%d names lanes 0x%08x that have exited (or do not exist)",
              names[kind], file, line, mask & w.exited);
  if (w.arrived && (w.kind != kind || w.line != line || w.mask != mask || strcmp(w.file, file) != 0))
    violation("divergent warp collective", "", "%s at %s:%d (mask 0x%08x) while lanes 0x%08x wait at %s %s:%d (mask 0x%08x)",
              names[kind], file, line, mask, w.arrived, names[w.kind], w.file, w.line, w.mask);
  const int buffer = (int)(w.gen & 1);
  w.kind = kind; w.file = file; w.line = line; w.mask = mask;
  uint64_t value = 0;
  std::memcpy(&value, in, (size_t)size);
  w.slots[buffer][lane] = value;
  w.arrived |= bit;
  fibers[tid].state = kWarp;
  if (w.arrived == mask) {
    for (unsigned l = 0; l < 32; ++l)
      if (mask >> l & 1) fibers[(tid & ~31u) | l].state = kRun;
    w.arrived = 0;
    ++w.gen;
  }
  while (fibers[tid].state == kWarp) yield_to_scheduler();
  if (kind == 5) return;
  if (kind == 4) {
    unsigned ballot = 0;
    for (unsigned l = 0; l < 32; ++l)
      if ((mask >> l & 1) && w.slots[buffer][l]) ballot |= 1u << l;
    std::memcpy(out, &ballot, sizeof ballot);
    return;
  }
  const unsigned base = lane & ~(unsigned)(width - 1), sub = lane - base;
  unsigned src = lane;
  if (kind == 0) src = base + ((unsigned)arg & (unsigned)(width - 1));
  if (kind == 1) src = base + ((sub ^ (unsigned)arg) & (unsigned)(width - 1));
  if (kind == 2) src = sub + (unsigned)arg < (unsigned)width ? lane + (unsigned)arg : lane;
  if (kind == 3) src = sub >= (unsigned)arg ? lane - (unsigned)arg : lane;
  if (!(mask >> src & 1))
    violation("shuffle from a lane outside the mask", "", "%s at %s:%d: lane %u reads lane %u, mask 0x%08x", names[kind],
              file, line, lane, src, mask);
  std::memcpy(out, &w.slots[buffer][src], (size_t)size);
}

void emu_atomic(const void* p, int size) {
  if (!in_launch || current < 0 || aborting) return;
  const uintptr_t a = (uintptr_t)p;
  Region* r = find_region(a);
  if (!r) return;
  if (a < r->lo || a + size > r->hi)
    violation("out-of-bounds atomic", where(a), "outside allocation #%lu of %lu bytes", (unsigned long)r->id,
              (unsigned long)(r->hi - r->lo));
  for (int i = 0; i < size; ++i)
    if (!r->init[a + i - r->lo]) violation("uninitialised read", where(a + i), "an atomic on a byte never written");
}

// The instrumentation hooks (g++ -fsanitize=kernel-address, call threshold 0).
#define EMU_HOOKS(n)                                                               \
  void __asan_load##n##_noabort(uintptr_t a) { access(a, n, false); }            \
  void __asan_store##n##_noabort(uintptr_t a) { access(a, n, true); }
EMU_HOOKS(1) EMU_HOOKS(2) EMU_HOOKS(4) EMU_HOOKS(8) EMU_HOOKS(16)
void __asan_loadN_noabort(uintptr_t a, size_t n) { access(a, n, false); }
void __asan_storeN_noabort(uintptr_t a, size_t n) { access(a, n, true); }
void __asan_handle_no_return(void) {}

// --- device memory for the host ---------------------------------------------------------------------

// Poisoned (0xFF bytes, a NaN in every float type) and marked uninitialised.
void* emu_alloc(size_t n) {
  std::lock_guard<std::mutex> guard(lock);
  const size_t body = (n + 4095) & ~(size_t)4095, total = body + 2 * kGuard;
  char* map = (char*)mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (map == MAP_FAILED) return nullptr;
  // The allocation ends where the guard starts, so even one byte past it is seen.
  Region* r = new Region{(uintptr_t)map, (uintptr_t)map + total, 0, 0, next_region_id++, nullptr, nullptr};
  r->hi = r->map_lo + kGuard + body;
  r->lo = (r->hi - n) & ~(uintptr_t)255;                 // 256-byte aligned, as cudaMalloc
  r->hi = r->lo + n;
  r->init = (uint8_t*)calloc(n ? n : 1, 1);
  r->cells = (Cell*)calloc(n ? n : 1, sizeof(Cell));      // lazily committed by the OS
  std::memset((void*)r->lo, 0xFF, n);
  regions[r->map_lo] = r;
  last_region = nullptr;
  return (void*)r->lo;
}

void emu_free(void* p) {
  std::lock_guard<std::mutex> guard(lock);
  Region* r = find_region((uintptr_t)p);
  if (!r || (uintptr_t)p != r->lo) return;
  regions.erase(r->map_lo);
  last_region = nullptr;
  munmap((void*)r->map_lo, r->map_hi - r->map_lo);
  free(r->init);
  free(r->cells);
  delete r;
}

// Marks [p, p+n) initialised when it is device memory (a host write or a memset).
void emu_mark_written(void* p, size_t n) {
  std::lock_guard<std::mutex> guard(lock);
  Region* r = find_region((uintptr_t)p);
  if (r && (uintptr_t)p >= r->lo && (uintptr_t)p + n <= r->hi) std::memset(r->init + ((uintptr_t)p - r->lo), 1, n);
}

void emu_write(void* dst, const void* src, size_t n) {
  std::memcpy(dst, src, n);
  emu_mark_written(dst, n);
}

// A device-to-device copy carries the initialised bits along.
void emu_copy(void* dst, const void* src, size_t n) {
  std::lock_guard<std::mutex> guard(lock);
  std::memmove(dst, src, n);
  Region* s = find_region((uintptr_t)src);
  Region* d = find_region((uintptr_t)dst);
  if (!d || (uintptr_t)dst < d->lo || (uintptr_t)dst + n > d->hi) return;
  if (s && (uintptr_t)src >= s->lo && (uintptr_t)src + n <= s->hi)
    std::memmove(d->init + ((uintptr_t)dst - d->lo), s->init + ((uintptr_t)src - s->lo), n);
  else
    std::memset(d->init + ((uintptr_t)dst - d->lo), 1, n);
}

// --- the host step's log (tests/cuda_emulator.h's flowc_host functions append one line per call) ---------

static std::string host_log;

void emu_host_record(const char* line) {
  std::lock_guard<std::mutex> guard(lock);
  host_log += line;
  host_log += '\n';
}

const char* emu_host_log(void) { return host_log.c_str(); }

void emu_host_log_clear(void) {
  std::lock_guard<std::mutex> guard(lock);
  host_log.clear();
}

// --- the launch ------------------------------------------------------------------------------------------

int emu_run(const char* name, void* fn, int nargs, void** args, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
            unsigned by, unsigned bz, unsigned dynamic_shared) {
  std::lock_guard<std::mutex> guard(lock);
  error.clear();
  aborting = false;
  current = -1;
  kernel_name = name; kernel_fn = fn; kernel_nargs = nargs; kernel_args = args;
  grid_dim = {gx, gy, gz}; block_dim = {bx, by, bz};
  const unsigned long threads = (unsigned long)bx * by * bz;
  if (nargs < 0 || nargs > 64) violation("launch over limits", "", "%d kernel arguments (the emulator takes 64)", nargs);
  else if (!gx || !gy || !gz || !bx || !by || !bz)
    violation("launch over limits", "", "grid (%u,%u,%u) block (%u,%u,%u) has a zero dimension", gx, gy, gz, bx, by, bz);
  else if (threads > kMaxThreads || bx > 1024 || by > 1024 || bz > 64)
    violation("launch over limits", "", "block (%u,%u,%u) = %lu threads; sm_90 allows 1024 (x, y <= 1024, z <= 64)", bx, by,
              bz, threads);
  else if (gx > 0x7fffffffu || gy > 65535 || gz > 65535)
    violation("launch over limits", "", "grid (%u,%u,%u); sm_90 allows x < 2^31, y and z <= 65535", gx, gy, gz);
  else if (dynamic_shared > 227 * 1024)
    violation("launch over limits", "", "%u bytes of dynamic shared memory; sm_90 allows 227 KiB per block", dynamic_shared);
  if (aborting) return 1;
  if (!stacks) {
    stacks = (char*)mmap(nullptr, kStack * kMaxThreads, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (stacks == MAP_FAILED) { stacks = nullptr; violation("emulator", "", "no memory for fiber stacks"); return 1; }
    for (unsigned t = 0; t < kMaxThreads; ++t) mprotect(stacks + t * kStack, 4096, PROT_NONE);
  }
  ModuleFind module{(uintptr_t)fn, 0, 0};
  dl_iterate_phdr(find_module, &module);
  shared_lo = module.lo; shared_hi = module.hi;
  block_lo = block_hi = 0;
  shared_used = 0;
  shared_init.assign(shared_hi - shared_lo, 0);
  shared_redzone.assign(shared_hi - shared_lo, 0);
  for (auto it = globals.lower_bound(shared_lo); it != globals.end() && it->first < shared_hi; ++it) {
    const AsanGlobal* g = it->second;
    const uintptr_t end = std::min<uintptr_t>(g->beg + g->size_with_redzone, shared_hi);
    for (uintptr_t b = g->beg + g->size; b < end; ++b) shared_redzone[b - shared_lo] = 1;
  }
  shared_cells.assign(shared_hi - shared_lo, Cell{});
  launch_stamp0 = next_stamp;
  const int nthreads = (int)threads, nwarps = (nthreads + 31) / 32;
  in_launch = true;
  for (unsigned z = 0; z < gz && !aborting; ++z)
    for (unsigned y = 0; y < gy && !aborting; ++y)
      for (unsigned x = 0; x < gx && !aborting; ++x) {
        block_idx = {x, y, z};
        stamp = next_stamp++;
        block_gen = 0; bar_arrived = 0; live = nthreads;
        // Shared memory is uninitialised at each block's start, and its shadow starts afresh
        // (after counting the bytes the last block touched: they have a shadow).
        if (block_hi > block_lo) {
          size_t used = 0;
          for (uintptr_t b = block_lo; b < block_hi; ++b) {
            const Cell& c = shared_cells[b - shared_lo];
            used += c.ws >= launch_stamp0 || c.rs >= launch_stamp0;
          }
          shared_used = std::max(shared_used, used);
          std::memset(shared_init.data() + (block_lo - shared_lo), 0, block_hi - block_lo);
          std::memset((void*)(shared_cells.data() + (block_lo - shared_lo)), 0, (block_hi - block_lo) * sizeof(Cell));
        }
        block_lo = block_hi = 0;
        for (int w = 0; w < nwarps; ++w) {
          warps[w] = Warp{};
          const int lanes = nthreads - 32 * w;
          if (lanes < 32) warps[w].exited = ~((1u << lanes) - 1);   // lanes that do not exist
        }
        for (int t = 0; t < nthreads; ++t) {
          Fiber& f = fibers[t];
          getcontext(&f.ctx);
          f.ctx.uc_stack.ss_sp = stacks + (size_t)t * kStack;
          f.ctx.uc_stack.ss_size = kStack;
          f.ctx.uc_link = &sched;
          makecontext(&f.ctx, (void (*)())fiber_main, 0);
          f.state = kRun;
        }
        while (live > 0 && !aborting) {
          bool ran = false;
          for (int t = 0; t < nthreads && !aborting; ++t) {
            if (fibers[t].state != kRun) continue;
            current = t;
            thread_idx = {t % bx, (t / bx) % by, t / (bx * by)};
            swapcontext(&sched, &fibers[t].ctx);
            ran = true;
          }
          current = -1;
          if (!ran && !aborting) {
            int at_barrier = 0, at_warp = 0, first_warp = -1;
            for (int t = 0; t < nthreads; ++t) {
              at_barrier += fibers[t].state == kBarrier;
              if (fibers[t].state == kWarp) { ++at_warp; if (first_warp < 0) first_warp = t; }
            }
            char detail[300];
            snprintf(detail, sizeof detail, "%d thread(s) wait at __syncthreads() %s:%d, %d at a warp collective%s%s%s, %d exited",
                     at_barrier, bar_file ? bar_file : "-", bar_line, at_warp, first_warp >= 0 ? " (" : "",
                     first_warp >= 0 ? warps[first_warp >> 5].file : "", first_warp >= 0 ? ")" : "", nthreads - live);
            char block[80];
            snprintf(block, sizeof block, " in block (%u,%u,%u)", x, y, z);
            violation("barrier not reached by every thread (deadlock)", "", "%s%s", detail, block);
          }
        }
      }
  in_launch = false;
  current = -1;
  size_t used = 0;
  for (uintptr_t b = block_lo; b < block_hi; ++b) {
    const Cell& c = shared_cells[b - shared_lo];
    used += c.ws >= launch_stamp0 || c.rs >= launch_stamp0;
  }
  shared_used = std::max(shared_used, used);
  // Distinct bytes touched: a lower bound of the kernel's static shared memory (the module's
  // section holds every kernel's arrays).
  if (!aborting && shared_used > 48 * 1024)
    violation("launch over limits", "", "%lu bytes of static shared memory used; sm_90 allows 48 KiB",
              (unsigned long)shared_used);
  else if (!aborting && shared_used + dynamic_shared > 227 * 1024)
    violation("launch over limits", "", "static + dynamic shared memory over 227 KiB");
  return aborting ? 1 : 0;
}

}  // extern "C"
