/* Classify digits with a LeNet exported by `flowc export ... --prefix lenet` (see lenet_predict.py):
 *
 *   predict WEIGHTS IMAGES LABELS [LOGITS_OUT]
 *
 * IMAGES holds N float32 images (N x 1 x 28 x 28, raw little-endian), LABELS N int32 labels; the model
 * runs on them a batch at a time (its input's first dimension), prints the accuracy and, with
 * LOGITS_OUT, writes every logit (N x 10 float32) there.  Plain C99: only the library's header. */
#include <stdio.h>
#include <stdlib.h>

#include "lenet.h"

static void* read_file(const char* path, long* size) {
  FILE* f = fopen(path, "rb");
  if (!f) { perror(path); return NULL; }
  fseek(f, 0, SEEK_END);
  *size = ftell(f);
  fseek(f, 0, SEEK_SET);
  void* data = malloc(*size > 0 ? (size_t)*size : 1);
  if (data && fread(data, 1, (size_t)*size, f) != (size_t)*size) { free(data); data = NULL; }
  fclose(f);
  return data;
}

int main(int argc, char** argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: %s WEIGHTS IMAGES LABELS [LOGITS_OUT]\n", argv[0]);
    return 2;
  }
  lenet_model* model = NULL;
  if (lenet_create_from_file(argv[1], &model) != LENET_OK) {
    fprintf(stderr, "%s\n", lenet_last_error());
    return 1;
  }
  lenet_tensor_info in, out;
  if (lenet_input_info(0, &in) != LENET_OK || lenet_output_info(0, &out) != LENET_OK) {
    fprintf(stderr, "%s\n", lenet_last_error());
    return 1;
  }
  const long batch = (long)in.shape[0], classes = (long)out.shape[1];
  printf("input '%s' [%ld, 1, 28, 28], output '%s' [%ld, %ld]\n", in.name, batch, out.name, batch, classes);
  long image_bytes, label_bytes;
  float* images = read_file(argv[2], &image_bytes);
  int* labels = read_file(argv[3], &label_bytes);
  if (!images || !labels) return 1;
  const long n = label_bytes / (long)sizeof(int);
  if (n % batch != 0 || image_bytes != n * (long)(in.nbytes / (size_t)batch)) {
    fprintf(stderr, "%ld labels and %ld image bytes do not make whole batches of %ld\n", n, image_bytes, batch);
    return 1;
  }
  float* logits = malloc((size_t)n * (size_t)classes * sizeof(float));
  long right = 0;
  for (long b = 0; b < n / batch; ++b) {
    const void* inputs[1] = {images + b * batch * 28 * 28};
    void* outputs[1] = {logits + b * batch * classes};
    if (lenet_run(model, inputs, outputs) != LENET_OK) {
      fprintf(stderr, "%s\n", lenet_last_error());
      return 1;
    }
  }
  for (long i = 0; i < n; ++i) {
    long best = 0;
    for (long c = 1; c < classes; ++c)
      if (logits[i * classes + c] > logits[i * classes + best]) best = c;
    right += best == labels[i];
  }
  printf("accuracy %ld/%ld\n", right, n);
  if (argc > 4) {
    FILE* f = fopen(argv[4], "wb");
    if (!f || fwrite(logits, sizeof(float), (size_t)(n * classes), f) != (size_t)(n * classes)) {
      perror(argv[4]);
      return 1;
    }
    fclose(f);
  }
  lenet_destroy(model);
  free(images);
  free(labels);
  free(logits);
  return 0;
}
