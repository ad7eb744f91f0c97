// flowc's core library: the parts of every generated CPU step that do not depend on the job
// (the packed GEMM driver and tile kernel, float col2im), compiled once per machine and compiler by
// compiler/core_library.py and loaded (RTLD_GLOBAL) before any step library.
#define FLOWC_CORE_IMPLEMENTATION 1
#include "flowc_gemm.h"
#include "im2col.h"

#include <omp.h>

// The calling thread's OpenMP team size, for runtime/fork.py: in a child forked after a step ran,
// libgomp's workers of the forking thread are gone and a parallel region there would wait for them
// forever; with one thread it never starts them.  Exported here because the core is loaded with
// RTLD_GLOBAL by every process that runs a CPU step, so the runtime can always find it.
extern "C" void flowc_set_num_threads(int n) { omp_set_num_threads(n); }
