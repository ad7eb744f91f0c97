// The exported GPU LeNet (`flowc export --device gpu --prefix lenet`) on device buffers: each batch of
// images is uploaded with the driver API into buffers allocated in the model's context, run with
// lenet_run_device, and downloaded; lenet_run on the host buffers must give the same bytes.
// tests/test_export_cuda_emulated.py runs it under the fake driver, tests/test_export_cuda_gpu.py on a GPU.
//
//   export_cuda_run_device WEIGHTS IMAGES LOGITS_OUT
#include <cuda.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <vector>

#include "lenet.h"

static std::vector<char> read_file(const char* path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(f), {});
}

static int cuda_failed(CUresult r, const char* what) {
  const char* name = "?";
  cuGetErrorName(r, &name);
  std::fprintf(stderr, "%s: %s\n", what, name);
  return 1;
}

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s WEIGHTS IMAGES LOGITS_OUT\n", argv[0]);
    return 2;
  }
  const std::vector<char> images = read_file(argv[2]);
  lenet_model* model = nullptr;
  if (lenet_create_from_file(argv[1], &model) != LENET_OK) {
    std::fprintf(stderr, "%s\n", lenet_last_error());
    return 1;
  }
  lenet_tensor_info in, out;
  lenet_input_info(0, &in);
  lenet_output_info(0, &out);
  const size_t batches = images.size() / in.nbytes;
  std::vector<char> logits(batches * out.nbytes), host(out.nbytes);
  CUcontext ctx = static_cast<CUcontext>(lenet_context(model));
  CUresult r;
  if ((r = cuCtxPushCurrent(ctx)) != CUDA_SUCCESS) return cuda_failed(r, "cuCtxPushCurrent");
  CUdeviceptr d_in = 0, d_out = 0;
  if ((r = cuMemAlloc(&d_in, in.nbytes)) != CUDA_SUCCESS) return cuda_failed(r, "cuMemAlloc");
  if ((r = cuMemAlloc(&d_out, out.nbytes)) != CUDA_SUCCESS) return cuda_failed(r, "cuMemAlloc");
  for (size_t b = 0; b < batches; ++b) {
    if ((r = cuMemcpyHtoD(d_in, images.data() + b * in.nbytes, in.nbytes)) != CUDA_SUCCESS)
      return cuda_failed(r, "cuMemcpyHtoD");
    const void* inputs[1] = {reinterpret_cast<const void*>(d_in)};
    void* outputs[1] = {reinterpret_cast<void*>(d_out)};
    if (lenet_run_device(model, inputs, outputs) != LENET_OK) {
      std::fprintf(stderr, "lenet_run_device: %s\n", lenet_last_error());
      return 1;
    }
    if ((r = cuMemcpyDtoH(logits.data() + b * out.nbytes, d_out, out.nbytes)) != CUDA_SUCCESS)
      return cuda_failed(r, "cuMemcpyDtoH");
    const void* host_inputs[1] = {images.data() + b * in.nbytes};
    void* host_outputs[1] = {host.data()};
    if (lenet_run(model, host_inputs, host_outputs) != LENET_OK) {
      std::fprintf(stderr, "lenet_run: %s\n", lenet_last_error());
      return 1;
    }
    if (std::memcmp(host.data(), logits.data() + b * out.nbytes, out.nbytes) != 0) {
      std::fprintf(stderr, "batch %zu: lenet_run and lenet_run_device differ\n", b);
      return 1;
    }
  }
  cuMemFree(d_in);
  cuMemFree(d_out);
  CUcontext popped;
  cuCtxPopCurrent(&popped);
  lenet_destroy(model);
  std::FILE* f = std::fopen(argv[3], "wb");
  if (!f || std::fwrite(logits.data(), 1, logits.size(), f) != logits.size()) return 1;
  std::fclose(f);
  std::printf("%zu batches on device buffers: equal to lenet_run\n", batches);
  return 0;
}
