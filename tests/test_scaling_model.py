"""The scaling cost model of issue 17 (benchmarks/scaling_model.py): the ring all-reduce formula,
bucket formation, the overlap simulation on hand-worked cases, monotonicity, the per-model tables read
from flowc's traced graphs (against benchmarks/workloads.py's independent FLOP counts), the alpha/beta
fit, docs/scaling.md's table against what the module prints, and (slow) the model against a fresh
2-rank MPI measurement on this machine.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from dataclasses import replace

import pytest

from benchmarks import scaling_report
from benchmarks.mpi_allreduce_probe import fit_alpha_beta
from benchmarks.scaling_extract import Gradient, ModelTable, zoo_table
from benchmarks.scaling_model import (Bucket, MeasuredTimes, Study, achieved_fraction, fractions, make_buckets,
                                      predict_comm_seconds, predict_step, ring_allreduce_seconds, simulate_overlap,
                                      split_step, studied_tables)
from benchmarks.workloads import BertShape, ResNetShape, bert_flops, resnet_zoo_flops

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, "docs", "scaling.md")


# ------------------------------------------------------------------------------------------ the formula

def test_ring_allreduce_by_hand():
    # 8 ranks, 25 MB at 100 Gbit/s, 5 us per step: 14 steps of latency, 2 * 7/8 of the bytes over the link
    assert ring_allreduce_seconds(25e6, 8, 5e-6, 12.5e9) == pytest.approx(14 * 5e-6 + 1.75 * 25e6 / 12.5e9)
    assert ring_allreduce_seconds(25e6, 8, 5e-6, 12.5e9) == pytest.approx(3.57e-3)
    assert ring_allreduce_seconds(1000, 2, 1e-6, 1e9) == pytest.approx(2e-6 + 1e-6)      # 2 steps, S / beta
    assert ring_allreduce_seconds(1e9, 1, 1.0, 1.0) == 0.0                               # nothing to reduce
    # for large p the bandwidth term tends to 2 S / beta, the latency term grows linearly
    assert ring_allreduce_seconds(1e6, 1000, 0.0, 1e9) == pytest.approx(2 * 999 / 1000 * 1e-3)
    with pytest.raises(ValueError, match="p: expected at least 1"):
        ring_allreduce_seconds(1.0, 0, 1.0, 1.0)


def test_comm_of_a_bucket_list_is_the_sum_of_its_all_reduces():
    assert predict_comm_seconds([100, 300], 4, 1e-6, 1e3) == pytest.approx(2 * 6e-6 + 1.5 * 400 / 1e3)


# ------------------------------------------------------------------------------------------ buckets

def test_buckets_are_formed_in_production_order():
    assert make_buckets([10, 10, 10, 30, 5], 25) == [Bucket(20, 1), Bucket(10, 2), Bucket(30, 3), Bucket(5, 4)]
    assert make_buckets([10, 15, 25], 25) == [Bucket(25, 1), Bucket(25, 2)]             # exactly full
    assert make_buckets([40, 1, 1], 25) == [Bucket(40, 0), Bucket(2, 2)]               # oversized: alone
    assert make_buckets([1] * 7, 1000) == [Bucket(7, 6)]
    assert make_buckets([], 25) == []
    with pytest.raises(ValueError, match="bucket_bytes"):
        make_buckets([1], 0)


# ------------------------------------------------------------------------------------------ simulation

def _two_layer_table() -> ModelTable:
    """Two 10-byte gradients, each after 1 FLOP of backward work."""
    return ModelTable("hand", samples=2, forward_flops=1, tail_backward_flops=0, update_bytes=40,
                      gradients=(Gradient("w2", 10, 1), Gradient("w1", 10, 1)))


def test_two_buckets_overlap_with_the_backward_pass():
    # forward 1 s, backward 4 s (each gradient after half of it: ready at 2 s and 4 s), update 0.5 s;
    # on 2 ranks with alpha 0 and beta 10/3 bytes/s each 10-byte all-reduce takes 3 s.
    table, times = _two_layer_table(), MeasuredTimes(forward=1.0, backward=4.0, update=0.5)
    pred = predict_step(table, 2, alpha=0.0, beta=10 / 3, times=times, bucket_bytes=10)
    assert pred.buckets == 2
    assert pred.timeline.ready == pytest.approx((2.0, 4.0))
    assert pred.timeline.start == pytest.approx((2.0, 5.0))     # the second waits for the link
    assert pred.timeline.end == pytest.approx((5.0, 8.0))
    assert pred.exposed == pytest.approx(4.0)                   # 8 - 4: 2 s of the 6 hidden
    assert pred.comm == pytest.approx(6.0)
    assert pred.step == pytest.approx(1.0 + 4.0 + 4.0 + 0.5)
    serial = predict_step(table, 2, alpha=0.0, beta=10 / 3, times=times, bucket_bytes=10, overlap=False)
    assert serial.timeline.start == pytest.approx((4.0, 7.0))
    assert serial.exposed == pytest.approx(6.0) and serial.step == pytest.approx(11.5)
    # one bucket of both: ready at 4 s, nothing to overlap with
    one = predict_step(table, 2, alpha=0.0, beta=10 / 3, times=times, bucket_bytes=20)
    assert one.buckets == 1 and one.exposed == pytest.approx(6.0)


def test_fast_links_hide_all_communication():
    table, times = _two_layer_table(), MeasuredTimes(forward=1.0, backward=4.0, update=0.5)
    pred = predict_step(table, 2, alpha=0.0, beta=100.0, times=times, bucket_bytes=10)   # 0.1 s each
    assert pred.timeline.end == pytest.approx((2.1, 4.1))
    assert pred.exposed == pytest.approx(0.1)                  # only the last bucket's all-reduce shows
    single = predict_step(table, 1, alpha=1.0, beta=1.0, times=times, bucket_bytes=10)
    assert single.exposed == 0.0 and single.step == pytest.approx(5.5)


def test_the_compute_rate_form_times_flops():
    table = _two_layer_table()
    pred = predict_step(table, 2, alpha=0.0, beta=1e12, times=0.5, bucket_bytes=10)
    assert (pred.forward, pred.backward) == pytest.approx((0.5, 1.0))
    assert pred.timeline.ready == pytest.approx((0.5, 1.0))


def test_gradients_without_products_are_spread_evenly():
    # a table of bias-like gradients (no products): their measured backward time is shared evenly
    table = replace(_two_layer_table(), gradients=(Gradient("b2", 10, 0), Gradient("b1", 10, 0)))
    pred = predict_step(table, 2, alpha=0.0, beta=1e12, times=MeasuredTimes(1.0, 4.0, 0.0), bucket_bytes=10)
    assert pred.timeline.ready == pytest.approx((2.0, 4.0))


def test_simulate_rejects_mismatched_lists():
    with pytest.raises(ValueError, match="ready and durations"):
        simulate_overlap([1.0], [1.0, 2.0])


# ------------------------------------------------------------------------------------------ the zoo's tables

@pytest.fixture(scope="module")
def tables() -> dict[str, ModelTable]:
    return studied_tables()


def test_resnet_table_matches_the_workloads_flop_count():
    table = zoo_table("ResNet-tiny")
    # examples/models/resnet.py's "tiny" config, stated independently in benchmarks/workloads.py's terms
    shape = ResNetShape("bottleneck", (2, 1, 1, 1), (16, 16, 24, 32), (4, 8, 8, 8), 8, 32, 4, 10)
    assert table.forward_flops == resnet_zoo_flops(shape, "predict")
    # the stem's input gradient is dead code (the images are data): not counted, as in workloads.py
    assert table.forward_flops + table.backward_flops == resnet_zoo_flops(shape, "train")
    names = [g.name for g in table.gradients]
    assert names[:2] == ["Resnet-fc1001-bias", "Resnet-fc1001-weight"]        # the last layer's first
    assert names[-1] == "Resnet-conv1-weight" and len(set(names)) == len(names)
    assert not any(n.endswith("-momentum") or "moving" in n for n in names)
    # fc1001 (32 -> 10, batch 4): its weight's gradient comes after the products of both its gradients
    assert table.gradients[1].nbytes == 32 * 10 * 4 and table.gradients[1].backward_flops == 2 * (2 * 4 * 10 * 32)
    assert table.gradients[0].backward_flops == 0           # the bias's: a reduction, no product


def test_bert_table_matches_the_workloads_flop_count():
    table = zoo_table("BERT-tiny")
    shape = BertShape(vocab_size=1024, seq_length=32, hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                      intermediate_size=512, batch_size=4, max_predictions_per_seq=5)
    assert table.forward_flops == bert_flops(shape, "predict")
    assert table.forward_flops + table.backward_flops == bert_flops(shape, "train")
    assert table.gradients[-1].name == "bert-embeddings-word_embeddings"      # tied: its last use is the first layer
    assert table.gradients[-1].nbytes == 1024 * 128 * 4


def test_any_train_job_gives_a_table_and_a_prediction():
    import flow
    from benchmarks.peers.flowc_jobs import job
    from benchmarks.scaling_extract import model_table_of_job
    from benchmarks.workloads import MLP_HIDDEN, MLP_IN, mlp_flops
    flow.clear_default_session()
    with warnings.catch_warnings():      # the seed job is placed on 'gpu'; where there is none it says so
        warnings.simplefilter("ignore", RuntimeWarning)
        table = model_table_of_job(job("mlp_train"), samples=100)
    flow.clear_default_session()
    assert [g.name for g in table.gradients] == ["output-bias", "output-weight", "hidden-bias", "hidden-weight"]
    assert table.gradients[-1].nbytes == MLP_IN * MLP_HIDDEN * 4
    assert table.forward_flops + table.backward_flops == mlp_flops("train")
    times = split_step(table, step_seconds=0.004, update_seconds=0.001)
    assert times.forward + times.backward + times.update == pytest.approx(0.004)
    # the first layer's input is data: its backward is the weight's gradient only, 2 GEMMs for 2
    hidden, output = 2 * 100 * MLP_IN * MLP_HIDDEN, 2 * 100 * MLP_HIDDEN * 10
    assert times.backward / times.forward == pytest.approx((hidden + 2 * output) / (hidden + output))
    pred = predict_step(table, 2, 2e-6, 5e9, times, bucket_bytes=1 << 20)
    assert pred.buckets == 2 and pred.step > times.forward + times.backward + times.update
    with pytest.raises(ValueError, match="more than the step"):
        split_step(table, 0.001, 0.002)


def test_real_tables_have_the_published_parameter_counts(tables):
    assert tables["ResNet-50"].gradient_bytes == 4 * 25_557_032              # torchvision's resnet50: 25.6 M
    assert 109e6 < tables["BERT-base"].gradient_bytes / 4 < 111e6              # BERT-base: 110 M
    assert 335e6 < tables["BERT-large"].gradient_bytes / 4 < 337e6             # BERT-large: 336 M (340 M in the paper)
    frac = fractions(tables)
    assert frac["ResNet-50"] == pytest.approx(achieved_fraction(2470, 24.3e9), rel=0.01)
    assert 0.5 < frac["BERT-base"] < 0.6


def test_more_bandwidth_or_overlap_is_never_slower(tables):
    study = Study()
    for model, fraction in fractions(tables).items():
        rate = 1.0 / (fraction * study.peak_flops)
        for p in (2, 8, 64, 512):
            for bucket in (1_000_000, 25_000_000, 100_000_000):
                previous = None
                for gbit in (10, 25, 100, 200, 400, 800, 1600):
                    beta = gbit * 1e9 / 8
                    step = predict_step(tables[model], p, study.alpha, beta, rate, bucket)
                    serial = predict_step(tables[model], p, study.alpha, beta, rate, bucket, overlap=False)
                    assert step.step <= serial.step + 1e-12
                    assert step.step >= step.compute
                    if previous is not None:
                        assert step.step <= previous + 1e-12, (model, p, bucket, gbit)
                    previous = step.step


# ------------------------------------------------------------------------------------------ the fit

@pytest.mark.parametrize("p", [2, 4, 16])
def test_fit_recovers_alpha_and_beta(p):
    alpha, beta = 3e-6, 7e9
    sizes = [4.0 ** k for k in range(1, 14)]
    times = [ring_allreduce_seconds(s, p, alpha, beta) for s in sizes]
    got_alpha, got_beta = fit_alpha_beta(p, sizes, times)
    assert got_alpha == pytest.approx(alpha, rel=1e-9) and got_beta == pytest.approx(beta, rel=1e-9)


def test_fit_rejects_bad_input():
    with pytest.raises(ValueError, match="at least 2 ranks"):
        fit_alpha_beta(1, [4, 8], [1.0, 2.0])
    with pytest.raises(ValueError, match="do not grow"):
        fit_alpha_beta(2, [4, 4e6], [2.0, 1.0])


# ------------------------------------------------------------------------------------------ the doc

def _doc_table() -> str:
    text = open(DOC).read()
    begin, end = "<!-- scaling table: python -m benchmarks.scaling_model --markdown -->", "<!-- end of table -->"
    assert begin in text and end in text, f"{DOC}: the table's markers are missing"
    return text.split(begin, 1)[1].split(end, 1)[0].strip()


def test_doc_table_is_what_the_module_prints(tables):
    assert _doc_table() == scaling_report.markdown(tables, Study()).strip(), (
        "docs/scaling.md's table is stale: regenerate it with python -m benchmarks.scaling_model --markdown")


def test_the_cli_prints_the_markdown_table(tables, capsys):
    from benchmarks.scaling_model import main
    assert main(["--markdown"]) == 0
    assert capsys.readouterr().out.strip() == scaling_report.markdown(tables, Study()).strip()


@pytest.mark.slow
def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    from benchmarks.scaling_model import main
    path = tmp_path / "scaling.png"
    assert main(["--plot", str(path)]) == 0
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000


# ------------------------------------------------------------------------------------------ validation

# The model's communication time of one step must be within this factor of a fresh measurement (both
# ways): the machine is shared and has 2 cores, so two ranks polling for messages compete with others.
TOLERANCE = 2.0


def _mpiexec() -> str | None:
    from flowc.compiler.comm_library import mpi_tool
    return mpi_tool("mpiexec")


@pytest.mark.slow
def test_model_predicts_a_fresh_two_rank_measurement(tmp_path):
    pytest.importorskip("mpi4py")
    mpiexec = _mpiexec()
    if mpiexec is None:
        pytest.skip("no mpiexec")
    # BERT-tiny's gradients in 256 KB buckets: a real step's all-reduces, small enough for 2 cores
    table = zoo_table("BERT-tiny")
    sizes = [b.nbytes for b in make_buckets([g.nbytes for g in table.gradients], 256 * 1024)]
    assert len(sizes) >= 5
    out = tmp_path / "probe.json"
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    subprocess.run([mpiexec, "-n", "2", sys.executable, "-m", "benchmarks.mpi_allreduce_probe",
                    "--max-bytes", str(4 << 20), "--buckets", ",".join(map(str, sizes)), "--json", str(out)],
                   check=True, env=env, cwd=ROOT, timeout=300, capture_output=True)
    result = json.loads(out.read_text())
    fit = result["fits"]["nonblocking"]
    assert result["ranks"] == 2 and fit["alpha"] >= 0 and fit["beta"] > 1e8
    measured, predicted = result["buckets"]["measured"], result["buckets"]["predicted"]
    assert predicted == pytest.approx(predict_comm_seconds(sizes, 2, fit["alpha"], fit["beta"]))
    assert 1 / TOLERANCE < measured / predicted < TOLERANCE, (measured, predicted)
    # and the fitted line against every bandwidth-bound message size (256 KB and up; below, MPICH's
    # switch from eager to rendezvous messages around 16-64 KB puts the times up to 2x above the line
    # when the machine is quiet, and more when it is not)
    for size, seconds in result["nonblocking"].items():
        if int(size) >= 256 * 1024:
            model = ring_allreduce_seconds(int(size), 2, fit["alpha"], fit["beta"])
            assert 1 / TOLERANCE < seconds / model < TOLERANCE, (size, seconds, model)


def test_a_single_bucket_is_all_exposed():
    # measured single-rank times (the form the 2-rank comparison uses): one bucket waits for the whole backward
    table = replace(_two_layer_table(), name="measured")
    pred = predict_step(table, 2, 1e-6, 1e9, MeasuredTimes(0.01, 0.02, 0.001), bucket_bytes=25_000_000)
    assert pred.buckets == 1 and pred.exposed == pytest.approx(2e-6 + 20 / 1e9)
