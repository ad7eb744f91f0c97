// A link stub of the CUDA driver (flowc export --device gpu): the driver API functions the exported
// library calls, each returning CUDA_ERROR_STUB_LIBRARY, in a shared object named libcuda.so.1.
// build.sh links against it so that the library records libcuda.so.1 as NEEDED on a machine that
// has the CUDA toolkit but no driver (the toolkit's own lib64/stubs/libcuda.so is not always
// installed); it is deleted after the link and never loaded: at run time the real driver is.
// cuda.h's macros give each definition the versioned symbol (cuMemAlloc -> cuMemAlloc_v2, ...)
// that the library's calls use.
#include <cuda.h>

#define FLOWC_STUB { return CUDA_ERROR_STUB_LIBRARY; }

CUresult cuInit(unsigned int) FLOWC_STUB
CUresult cuDeviceGet(CUdevice*, int) FLOWC_STUB
CUresult cuDevicePrimaryCtxRetain(CUcontext*, CUdevice) FLOWC_STUB
CUresult cuDevicePrimaryCtxRelease(CUdevice) FLOWC_STUB
CUresult cuCtxPushCurrent(CUcontext) FLOWC_STUB
CUresult cuCtxPopCurrent(CUcontext*) FLOWC_STUB
CUresult cuModuleLoadData(CUmodule*, const void*) FLOWC_STUB
CUresult cuModuleUnload(CUmodule) FLOWC_STUB
CUresult cuModuleGetFunction(CUfunction*, CUmodule, const char*) FLOWC_STUB
CUresult cuStreamCreate(CUstream*, unsigned int) FLOWC_STUB
CUresult cuStreamDestroy(CUstream) FLOWC_STUB
CUresult cuStreamSynchronize(CUstream) FLOWC_STUB
CUresult cuMemAlloc(CUdeviceptr*, size_t) FLOWC_STUB
CUresult cuMemFree(CUdeviceptr) FLOWC_STUB
CUresult cuMemcpyHtoD(CUdeviceptr, const void*, size_t) FLOWC_STUB
CUresult cuMemcpyHtoDAsync(CUdeviceptr, const void*, size_t, CUstream) FLOWC_STUB
CUresult cuMemcpyDtoHAsync(void*, CUdeviceptr, size_t, CUstream) FLOWC_STUB
CUresult cuMemcpyDtoDAsync(CUdeviceptr, CUdeviceptr, size_t, CUstream) FLOWC_STUB
CUresult cuMemsetD32Async(CUdeviceptr, unsigned int, size_t, CUstream) FLOWC_STUB
CUresult cuLaunchKernel(CUfunction, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int,
                        unsigned int, unsigned int, CUstream, void**, void**) FLOWC_STUB
CUresult cuGetErrorName(CUresult, const char**) FLOWC_STUB
CUresult cuGetErrorString(CUresult, const char**) FLOWC_STUB
