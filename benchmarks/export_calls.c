/* The serving benchmark's C side (benchmarks/serve.py): time single calls of an exported LeNet
 * (`flowc export ... --prefix lenet`) as a C program makes them, with no Python anywhere.
 *
 *   export_calls WEIGHTS THREADS SECONDS
 *
 * Loads the model, runs a few untimed calls, then times calls one by one for about SECONDS and
 * prints "calls N median_s M mean_s A" (the input is zeros: the step's work does not depend on it). */
#define _POSIX_C_SOURCE 199309L
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "lenet.h"

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int by_value(const void* a, const void* b) {
  const double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

int main(int argc, char** argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: %s WEIGHTS THREADS SECONDS\n", argv[0]);
    return 2;
  }
  lenet_model* model = NULL;
  lenet_tensor_info in, out;
  if (lenet_create_from_file(argv[1], &model) != LENET_OK || lenet_set_num_threads(model, atoi(argv[2])) != LENET_OK ||
      lenet_input_info(0, &in) != LENET_OK || lenet_output_info(0, &out) != LENET_OK) {
    fprintf(stderr, "%s\n", lenet_last_error());
    return 1;
  }
  const double budget = atof(argv[3]);
  float* images = calloc(in.nbytes, 1);
  float* logits = malloc(out.nbytes);
  const void* inputs[1] = {images};
  void* outputs[1] = {logits};
  enum { MAX_CALLS = 200000, WARMUP = 5 };
  double* times = malloc(sizeof(double) * MAX_CALLS);
  int calls = 0;
  for (int i = 0; i < WARMUP; ++i) lenet_run(model, inputs, outputs);
  const double end = now() + budget;
  double total = 0;
  while (calls < MAX_CALLS && (calls < 3 || now() < end)) {
    const double t0 = now();
    if (lenet_run(model, inputs, outputs) != LENET_OK) {
      fprintf(stderr, "%s\n", lenet_last_error());
      return 1;
    }
    times[calls] = now() - t0;
    total += times[calls++];
  }
  qsort(times, (size_t)calls, sizeof(double), by_value);
  printf("calls %d median_s %.9g mean_s %.9g\n", calls, times[calls / 2], total / calls);
  lenet_destroy(model);
  free(images);
  free(logits);
  free(times);
  return 0;
}
