// Four LeNet instances (exported with --prefix lenet) on four threads, each classifying every image
// of the file; each thread's logits must equal the first thread's (and the caller compares those with
// the Python job's).
//
//   predict_threads WEIGHTS IMAGES THREADS LOGITS_OUT
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "lenet.h"

static std::vector<char> read_file(const char* path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(f), {});
}

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: %s WEIGHTS IMAGES THREADS LOGITS_OUT\n", argv[0]);
    return 2;
  }
  const std::vector<char> weights = read_file(argv[1]), images = read_file(argv[2]);
  const int threads = std::stoi(argv[3]);
  lenet_tensor_info in, out;
  lenet_input_info(0, &in);
  lenet_output_info(0, &out);
  const size_t batches = images.size() / in.nbytes;
  std::vector<std::vector<float>> logits(threads, std::vector<float>(batches * out.nbytes / sizeof(float)));
  std::vector<std::string> errors(threads);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      lenet_model* model = nullptr;        // one instance per thread, from the weights in memory
      if (lenet_create_from_memory(weights.data(), weights.size(), &model) != LENET_OK) {
        errors[t] = lenet_last_error();
        return;
      }
      lenet_set_num_threads(model, 1);
      for (size_t b = 0; b < batches; ++b) {
        const void* inputs[1] = {images.data() + b * in.nbytes};
        void* outputs[1] = {reinterpret_cast<char*>(logits[t].data()) + b * out.nbytes};
        if (lenet_run(model, inputs, outputs) != LENET_OK) {
          errors[t] = lenet_last_error();
          break;
        }
      }
      lenet_destroy(model);
    });
  }
  for (auto& th : pool) th.join();
  int failed = 0;
  for (int t = 0; t < threads; ++t) {
    if (!errors[t].empty()) {
      std::fprintf(stderr, "thread %d: %s\n", t, errors[t].c_str());
      failed = 1;
    } else if (std::memcmp(logits[t].data(), logits[0].data(), logits[0].size() * sizeof(float)) != 0) {
      std::fprintf(stderr, "thread %d: logits differ from thread 0's\n", t);
      failed = 1;
    }
  }
  std::FILE* f = std::fopen(argv[4], "wb");
  if (!f) return 1;
  std::fwrite(logits[0].data(), sizeof(float), logits[0].size(), f);
  std::fclose(f);
  std::printf("%d instances on %d threads, %zu batches each: %s\n", threads, threads, batches,
              failed ? "FAILED" : "all equal");
  return failed;
}
