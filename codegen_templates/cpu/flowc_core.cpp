// flowc's core library: the parts of every generated CPU step that do not depend on the job
// (the packed GEMM driver and tile kernel, float col2im), compiled once per machine and compiler by
// compiler/core_library.py and loaded (RTLD_GLOBAL) before any step library.
#define FLOWC_CORE_IMPLEMENTATION 1
#include "flowc_gemm.h"
#include "im2col.h"
