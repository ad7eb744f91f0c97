// A test double of the CUDA driver, built as libcuda.so.1, that runs an exported GPU library
// (`flowc export --device gpu`, codegen_templates/export/model_cuda.cpp.j2) on the CUDA emulator
// (tests/cuda_emulator_runtime.cpp) on a machine without a GPU.  tests/test_export_cuda_emulated.py
// builds it and puts its folder first on LD_LIBRARY_PATH, so the library's NEEDED libcuda.so.1 is this.
//
// What it models, and checks as the driver would:
//   * device memory is emulated memory (emu_alloc: guarded, poisoned until written), so a kernel that
//     reads past a buffer or reads bytes nobody wrote fails its launch with the emulator's message;
//   * cuModuleLoadData takes the embedded image and checks that it is a fat binary (its magic), then
//     loads the same kernels built for the emulator from $FLOWC_FAKE_CUDA_KERNELS (a shared object
//     of the step's source over tests/cuda_emulator.h); cuModuleGetFunction finds them by name;
//   * every call but cuInit, cuDeviceGet, cuGetError* and the primary context's own needs cuInit
//     first, and the calls that work in a context need one current on the calling thread (a
//     thread-local stack, as cuCtxPushCurrent/cuCtxPopCurrent keep it);
//   * one device (ordinal 0) unless $FLOWC_FAKE_CUDA_DEVICES says how many;
//   * $FLOWC_FAKE_CUDA_FAIL=NAME makes the call NAME (its unversioned name) fail with
//     CUDA_ERROR_OUT_OF_MEMORY, to test the library's error path.
// fake_cuda_counts() reports live allocations, modules, streams and retained contexts, so a test sees
// that destroy frees everything.
//
// cuLaunchKernel's parameter array carries no count; the exported library ends it with a NULL (the
// real driver reads only the kernel's own count), and this double counts up to it.
#include <cuda.h>
#include <dlfcn.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

extern "C" {
void* emu_alloc(size_t);
void emu_free(void*);
void emu_write(void*, const void*, size_t);
void emu_copy(void*, const void*, size_t);
const char* emu_error(void);
int emu_run(const char* name, void* fn, int nargs, void** args, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
            unsigned by, unsigned bz, unsigned dynamic_shared);
}

struct CUctx_st { int device; };
struct CUmod_st { void* handle; };
struct CUfunc_st { std::string name; void* fn; };
struct CUstream_st { int unused; };

namespace {

CUctx_st primary[8] = {{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}};
std::atomic<int> initialised{0}, allocations{0}, modules{0}, streams{0}, retained{0}, launches{0};
thread_local std::vector<CUcontext> current;

bool failing(const char* name) {
  const char* f = std::getenv("FLOWC_FAKE_CUDA_FAIL");
  return f != nullptr && std::strcmp(f, name) == 0;
}

int devices() {
  const char* n = std::getenv("FLOWC_FAKE_CUDA_DEVICES");
  return n ? std::atoi(n) : 1;
}

// The checks every call in a context makes: initialised, a context current, no injected failure.
CUresult in_context(const char* name) {
  if (!initialised) return CUDA_ERROR_NOT_INITIALIZED;
  if (current.empty()) return CUDA_ERROR_INVALID_CONTEXT;
  if (failing(name)) return CUDA_ERROR_OUT_OF_MEMORY;
  return CUDA_SUCCESS;
}

}  // namespace

extern "C" void fake_cuda_counts(int* out) {
  out[0] = allocations;
  out[1] = modules;
  out[2] = streams;
  out[3] = retained;
  out[4] = launches;
}

CUresult cuInit(unsigned int flags) {
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (failing("cuInit")) return CUDA_ERROR_NO_DEVICE;
  initialised = 1;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice* device, int ordinal) {
  if (!initialised) return CUDA_ERROR_NOT_INITIALIZED;
  if (ordinal < 0 || ordinal >= devices() || ordinal >= 8) return CUDA_ERROR_INVALID_DEVICE;
  *device = ordinal;
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext* ctx, CUdevice device) {
  if (!initialised) return CUDA_ERROR_NOT_INITIALIZED;
  if (device < 0 || device >= devices()) return CUDA_ERROR_INVALID_DEVICE;
  ++retained;
  *ctx = &primary[device];
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease(CUdevice device) {
  if (device < 0 || device >= devices() || retained <= 0) return CUDA_ERROR_INVALID_DEVICE;
  --retained;
  return CUDA_SUCCESS;
}

CUresult cuCtxPushCurrent(CUcontext ctx) {
  if (ctx == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  current.push_back(ctx);
  return CUDA_SUCCESS;
}

CUresult cuCtxPopCurrent(CUcontext* ctx) {
  if (current.empty()) return CUDA_ERROR_INVALID_CONTEXT;
  if (ctx) *ctx = current.back();
  current.pop_back();
  return CUDA_SUCCESS;
}

CUresult cuModuleLoadData(CUmodule* module, const void* image) {
  if (CUresult r = in_context("cuModuleLoadData")) return r;
  static const unsigned char kFatbinMagic[4] = {0x50, 0xed, 0x55, 0xba};
  if (image == nullptr || std::memcmp(image, kFatbinMagic, 4) != 0) return CUDA_ERROR_INVALID_IMAGE;
  const char* path = std::getenv("FLOWC_FAKE_CUDA_KERNELS");
  void* handle = path ? dlopen(path, RTLD_NOW | RTLD_LOCAL) : nullptr;
  if (handle == nullptr) return CUDA_ERROR_FILE_NOT_FOUND;
  ++modules;
  *module = new CUmod_st{handle};
  return CUDA_SUCCESS;
}

CUresult cuModuleUnload(CUmodule module) {
  if (module == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  dlclose(module->handle);
  delete module;
  --modules;
  return CUDA_SUCCESS;
}

CUresult cuModuleGetFunction(CUfunction* fn, CUmodule module, const char* name) {
  if (CUresult r = in_context("cuModuleGetFunction")) return r;
  void* symbol = dlsym(module->handle, name);
  if (symbol == nullptr) return CUDA_ERROR_NOT_FOUND;
  *fn = new CUfunc_st{name, symbol};    // freed with the process (the driver frees them with the module)
  return CUDA_SUCCESS;
}

CUresult cuStreamCreate(CUstream* stream, unsigned int) {
  if (CUresult r = in_context("cuStreamCreate")) return r;
  ++streams;
  *stream = new CUstream_st{0};
  return CUDA_SUCCESS;
}

CUresult cuStreamDestroy(CUstream stream) {
  if (CUresult r = in_context("cuStreamDestroy")) return r;
  delete stream;
  --streams;
  return CUDA_SUCCESS;
}

// Launches run when they are made, so the stream is always done.
CUresult cuStreamSynchronize(CUstream) { return in_context("cuStreamSynchronize"); }

CUresult cuMemAlloc(CUdeviceptr* p, size_t n) {
  if (CUresult r = in_context("cuMemAlloc")) return r;
  if (n == 0) return CUDA_ERROR_INVALID_VALUE;
  void* q = emu_alloc(n);
  if (q == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
  ++allocations;
  *p = reinterpret_cast<CUdeviceptr>(q);
  return CUDA_SUCCESS;
}

CUresult cuMemFree(CUdeviceptr p) {
  if (CUresult r = in_context("cuMemFree")) return r;
  emu_free(reinterpret_cast<void*>(p));
  --allocations;
  return CUDA_SUCCESS;
}

CUresult cuMemcpyHtoD(CUdeviceptr dst, const void* src, size_t n) {
  if (CUresult r = in_context("cuMemcpyHtoD")) return r;
  emu_write(reinterpret_cast<void*>(dst), src, n);
  return CUDA_SUCCESS;
}

CUresult cuMemcpyHtoDAsync(CUdeviceptr dst, const void* src, size_t n, CUstream) {
  if (CUresult r = in_context("cuMemcpyHtoDAsync")) return r;
  emu_write(reinterpret_cast<void*>(dst), src, n);
  return CUDA_SUCCESS;
}

CUresult cuMemcpyDtoH(void* dst, CUdeviceptr src, size_t n) {
  if (CUresult r = in_context("cuMemcpyDtoH")) return r;
  emu_copy(dst, reinterpret_cast<const void*>(src), n);
  return CUDA_SUCCESS;
}

CUresult cuMemcpyDtoHAsync(void* dst, CUdeviceptr src, size_t n, CUstream) {
  if (CUresult r = in_context("cuMemcpyDtoHAsync")) return r;
  emu_copy(dst, reinterpret_cast<const void*>(src), n);
  return CUDA_SUCCESS;
}

CUresult cuMemcpyDtoDAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream) {
  if (CUresult r = in_context("cuMemcpyDtoDAsync")) return r;
  emu_copy(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), n);
  return CUDA_SUCCESS;
}

CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned int value, size_t count, CUstream) {
  if (CUresult r = in_context("cuMemsetD32Async")) return r;
  std::vector<unsigned int> words(count, value);
  emu_write(reinterpret_cast<void*>(dst), words.data(), count * sizeof(unsigned int));
  return CUDA_SUCCESS;
}

CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                        unsigned int by, unsigned int bz, unsigned int shared, CUstream, void** params, void** extra) {
  if (CUresult r = in_context("cuLaunchKernel")) return r;
  if (f == nullptr || params == nullptr || extra != nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::vector<void*> args;
  for (int i = 0; params[i] != nullptr; ++i) args.push_back(*static_cast<void**>(params[i]));
  ++launches;
  return emu_run(f->name.c_str(), f->fn, (int)args.size(), args.data(), gx, gy, gz, bx, by, bz, shared)
             ? CUDA_ERROR_LAUNCH_FAILED : CUDA_SUCCESS;
}

CUresult cuGetErrorName(CUresult error, const char** name) {
  switch (error) {
    case CUDA_SUCCESS: *name = "CUDA_SUCCESS"; return CUDA_SUCCESS;
    case CUDA_ERROR_OUT_OF_MEMORY: *name = "CUDA_ERROR_OUT_OF_MEMORY"; return CUDA_SUCCESS;
    case CUDA_ERROR_NO_DEVICE: *name = "CUDA_ERROR_NO_DEVICE"; return CUDA_SUCCESS;
    case CUDA_ERROR_INVALID_DEVICE: *name = "CUDA_ERROR_INVALID_DEVICE"; return CUDA_SUCCESS;
    case CUDA_ERROR_LAUNCH_FAILED: *name = "CUDA_ERROR_LAUNCH_FAILED"; return CUDA_SUCCESS;
    case CUDA_ERROR_INVALID_CONTEXT: *name = "CUDA_ERROR_INVALID_CONTEXT"; return CUDA_SUCCESS;
    default: *name = nullptr; return CUDA_ERROR_INVALID_VALUE;
  }
}

CUresult cuGetErrorString(CUresult error, const char** text) {
  switch (error) {
    case CUDA_ERROR_OUT_OF_MEMORY: *text = "out of memory"; return CUDA_SUCCESS;
    case CUDA_ERROR_NO_DEVICE: *text = "no CUDA-capable device is detected"; return CUDA_SUCCESS;
    case CUDA_ERROR_INVALID_DEVICE: *text = "invalid device ordinal"; return CUDA_SUCCESS;
    case CUDA_ERROR_LAUNCH_FAILED: *text = emu_error(); return CUDA_SUCCESS;
    default: *text = nullptr; return CUDA_ERROR_INVALID_VALUE;
  }
}
