// Everything a generated CPU step may include, in one header that compiler/core_library.py
// precompiles (flowc_prelude.h.gch) once per machine: a step's compile then parses none of it.
#pragma once
#include <cstdint>
#include <cstring>
#include <cmath>
#include <limits>
#include <algorithm>
#include <vector>
#ifdef _OPENMP
#include <omp.h>
#endif
#include "flowc_runtime.h"
#include "flowc_gemm.h"
#include "im2col.h"
