"""`flowc export`: a predict job as a standalone C library (issue 18).

One module per responsibility: `spec` (what the library exposes, and what cannot be exported),
`weights` (the weights file format), `render` (the sources from codegen_templates/export/) and
`exporter` (checkpoint -> weights, sources -> libraries).

Example:
    >>> from flowc.compiler.export import export_job
    >>> export_job(eval_job, "lenet_models_1", "out", prefix="lenet")   # doctest: +SKIP
"""
from flowc.compiler.export.exporter import ExportResult, export_job
from flowc.compiler.export.spec import ExportError

__all__ = ["ExportError", "ExportResult", "export_job"]
