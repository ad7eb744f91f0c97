#!/usr/bin/env bash
# The GPU run book (issue 16): run it first whenever a machine with an NVIDIA GPU is available.
# It prints one verdict per line (PASS, FAIL, SKIP or UNVERIFIED, each with its reason) and exits 1
# on any FAIL; the checks themselves are benchmarks/gpu_check.py (`--list` names them).
#
#   benchmarks/gpu_check.sh                  # on the GPU machine, from the repository root
#   benchmarks/gpu_check.sh --fake-driver    # without a GPU: tests/fake_cuda_driver.py stands in, so
#                                            # every line that needs a GPU says UNVERIFIED, never PASS
#   benchmarks/gpu_check.sh --only device-tests,large-sizes
#
# Set-up, as the GPU kit's setup_device.sh does it: where nvidia-smi lists a GPU, PyCUDA cannot be
# imported and a kit folder
# is given ($FLOWC_GPU_KIT, default /work/shared/gpu when it exists, or ./shared/gpu), its
# setup_device.sh builds PyCUDA (or installs the wheel it left beside itself) into /tmp/site and
# puts nvcc's folder on PATH.  $PYTHON picks the interpreter (default: .venv/bin/python, else python3).
# FLOWC_GPU_CHECK_TIMEOUT bounds each command it runs (seconds, default 1800).
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
if [ -z "${PYTHON:-}" ]; then
  if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
export PYTHON
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fake=0
for arg in "$@"; do [ "$arg" = --fake-driver ] && fake=1; done
gpu_listed=0
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then gpu_listed=1; fi
if [ "$fake" = 0 ] && [ "$gpu_listed" = 1 ] && ! "$PYTHON" -c 'import pycuda.driver' >/dev/null 2>&1; then
  kit="${FLOWC_GPU_KIT:-}"
  if [ -z "$kit" ]; then
    for candidate in /work/shared/gpu shared/gpu; do
      if [ -f "$candidate/setup_device.sh" ]; then kit="$candidate"; break; fi
    done
  fi
  if [ -n "$kit" ] && [ -f "$kit/setup_device.sh" ]; then
    echo "gpu_check: PyCUDA is not importable; building it with $kit/setup_device.sh" >&2
    # shellcheck disable=SC1091
    source "$kit/setup_device.sh" || echo "gpu_check: $kit/setup_device.sh failed; the GPU lines will say why" >&2
  fi
fi
exec "$PYTHON" -m benchmarks.gpu_check "$@"
