"""The scaling cost model's table (Markdown for docs/scaling.md, or aligned text) and its plot.

    python -m benchmarks.scaling_model --markdown
    python -m benchmarks.scaling_model --plot docs/scaling.png
"""
from __future__ import annotations

from benchmarks.scaling_extract import ModelTable
from benchmarks.scaling_model import MB, Study, fractions, gbit_to_bytes_per_s, predict_step, study_rows

MS = 1e3


def _model_cells(tables: dict[str, ModelTable], study: Study) -> tuple[list[str], list[list[str]]]:
    head = ["Model", "Batch/GPU", "GFLOP/step (fwd+bwd)", "Achieved (of peak)", "1-GPU step (ms)",
            "Gradients (MB)", f"Buckets ({study.bucket_bytes // MB} MB)"]
    rows = []
    for model, fraction in fractions(tables).items():
        t = tables[model]
        rate = 1.0 / (fraction * study.peak_flops)
        one = predict_step(t, 1, study.alpha, 1.0, rate, study.bucket_bytes)
        rows.append([model, str(t.samples), f"{(t.forward_flops + t.backward_flops) / 1e9:.0f}",
                     f"{fraction * 100:.0f}%", f"{one.step * MS:.1f}", f"{t.gradient_bytes / MB:.1f}",
                     str(one.buckets)])
    return head, rows


def _scaling_cells(tables: dict[str, ModelTable], study: Study) -> tuple[list[str], list[list[str]]]:
    other = study.other_bucket_bytes // MB
    head = ["Model", "GPUs", "Link (Gbit/s)", "Step (ms)", "Exposed comm (ms)", "Efficiency", "Samples/s",
            "No overlap: step (ms)", "No overlap: efficiency", f"Efficiency, {other} MB buckets"]
    rows = []
    for r in study_rows(tables, study):
        rows.append([r.model, str(r.p), str(r.gbit), f"{r.overlapped.step * MS:.1f}",
                     f"{r.overlapped.exposed * MS:.1f}", f"{r.efficiency:.2f}", f"{r.throughput:,.0f}",
                     f"{r.serial.step * MS:.1f}", f"{r.serial_efficiency:.2f}", f"{r.other_efficiency:.2f}"])
    return head, rows


def _markdown_table(head: list[str], rows: list[list[str]]) -> str:
    rule = "|" + "|".join("---" if i == 0 else "---:" for i in range(len(head))) + "|"     # text left, numbers right
    lines = ["| " + " | ".join(head) + " |", rule]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _text_table(head: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(c) for c in col) for col in zip(head, *rows)]
    return "\n".join("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
                     for r in [head] + rows)


def markdown(tables: dict[str, ModelTable], study: Study) -> str:
    """The two tables of docs/scaling.md: the models, then their predicted scaling."""
    return _markdown_table(*_model_cells(tables, study)) + "\n\n" + _markdown_table(*_scaling_cells(tables, study))


def text(tables: dict[str, ModelTable], study: Study) -> str:
    return _text_table(*_model_cells(tables, study)) + "\n\n" + _text_table(*_scaling_cells(tables, study))


def plot(tables: dict[str, ModelTable], study: Study, path: str, links: tuple[int, ...] = (100, 400)) -> None:
    """Scaling efficiency t(1)/t(p) against p (log scale), one line per model x link speed."""
    import matplotlib                       # the bench extra; imported only when a plot is asked for
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    gpus = [2 ** k for k in range(0, 11)]
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=100)
    for (model, fraction), colour in zip(fractions(tables).items(), ("tab:blue", "tab:red", "tab:green")):
        rate = 1.0 / (fraction * study.peak_flops)
        t = tables[model]
        single = predict_step(t, 1, study.alpha, 1.0, rate, study.bucket_bytes).step
        for gbit, style in zip(links, ("--", "-")):
            beta = gbit_to_bytes_per_s(gbit)
            eff = [single / predict_step(t, p, study.alpha, beta, rate, study.bucket_bytes).step for p in gpus]
            ax.plot(gpus, eff, style, color=colour, marker="o", markersize=3, label=f"{model}, {gbit} Gbit/s")
    ax.set_xscale("log", base=2)
    ax.set_xticks(gpus, [str(p) for p in gpus])
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("GPUs (one network link each, flat ring)")
    ax.set_ylabel("scaling efficiency t(1) / t(p)")
    ax.set_title(f"Predicted weak scaling, {study.bucket_bytes // MB} MB buckets overlapped with backward")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
