"""`flowc export MODULE.py:JOB --checkpoint DIR -o OUT/`: a predict job as a standalone C library.

Writes OUT/libPREFIX.so, OUT/libPREFIX.a, OUT/PREFIX.h (the documented C API), OUT/PREFIX.weights
(the checkpoint's variables, checked when loaded), OUT/README.txt (the build line) and OUT/src/
(the sources, to rebuild elsewhere); PREFIX is --prefix or the job's name.  compiler/export/ does
the work; see docs/export.md.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from flowc.cli.modules import CliError, JobRef, jobs_of
from flowc.cli.output import check_output_folder
from flowc.compiler.backends import HOST_DEVICE, backends, device_names, get_backend

EPILOG = """examples:
  flowc export examples/export/lenet_predict.py:predict_job --checkpoint lenet_ckpt -o lenet_c --prefix lenet
  cc app.c -Ilenet_c -Llenet_c -llenet -Wl,-rpath,"$PWD/lenet_c" -o app
  flowc export examples/export/lenet_predict.py:predict_job --checkpoint lenet_ckpt -o lenet_gpu --prefix lenet \
      --device gpu --arch sm_90

Only predict jobs export; inputs with dynamic shapes need --dynamic-at-max (the library then runs
their declared maximum shape, and callers pad to it)."""


def add_parser(sub) -> None:
    p = sub.add_parser("export", help="export a predict job as a C library (.so, .a, .h, weights)",
                       formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG,
                       description="Compile a predict job of MODULE.py with a checkpoint's variables into a "
                                   "standalone C library that needs no Python.")
    p.add_argument("job", metavar="MODULE.py:JOB", help="the Python file and the predict job in it")
    p.add_argument("--checkpoint", required=True, metavar="DIR",
                   help="a checkpoint folder (flow.checkpoint.save) holding the job's variables")
    p.add_argument("-o", "--output", required=True, metavar="OUT", help="the folder to write (made if missing)")
    p.add_argument("--prefix", metavar="NAME", help="the C symbols' and files' prefix (default: the job's name)")
    p.add_argument("--device", choices=device_names(), default=HOST_DEVICE,
                   help=f"{HOST_DEVICE} (default), or gpu: a library that runs the job on an NVIDIA GPU through "
                        f"the CUDA driver API (built with nvcc; no GPU needed to export)")
    p.add_argument("--arch", metavar="sm_XX", help="the GPU architecture of --device gpu (e.g. sm_90; default: "
                                                   "the current GPU's)")
    p.add_argument("--dynamic-at-max", action="store_true",
                   help="export dynamic-shaped inputs at their declared maximum shape")


def run(args: argparse.Namespace) -> int:
    from flowc.compiler.export import ExportError, export_job
    from flowc.compiler.toolchain import ToolchainError
    from flowc.runtime.checkpoint import CheckpointError, read_checkpoint
    ref = JobRef.parse(args.job)
    if ref.job is None:
        raise CliError(f"{args.job}: name the job to export, as MODULE.py:JOB")
    if args.arch and get_backend(args.device).is_host:
        accelerators = "|".join(b.name for b in backends() if not b.is_host)
        raise CliError(f"--arch needs --device {accelerators}")
    out = Path(args.output)
    check_output_folder(out, "-o")
    job = jobs_of(args.job)[0]
    try:
        # the checkpoint as flow.load_variables takes it: read (and checked) variable by variable
        result = export_job(job, read_checkpoint(args.checkpoint), out, prefix=args.prefix, device=args.device,
                            dynamic_at_max=args.dynamic_at_max, arch=args.arch)
    except (ExportError, ToolchainError, CheckpointError) as e:
        raise CliError(str(e)) from None
    spec = result.spec
    for path in (result.header, result.shared_library, result.static_library, result.weights, result.readme):
        print(f"wrote {path}")
    print(f"{len(spec.inputs)} input(s), {len(spec.outputs)} output(s), {len(spec.variables)} variable(s); "
          f"build with: cc app.c -I{out} -L{out} -l{spec.prefix} -Wl,-rpath,{out.resolve()}", file=sys.stdout)
    return 0
