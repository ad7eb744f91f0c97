"""The engine calls of a data-parallel step are code, never swallowed by a comment.

Regression: a call to a kernel function shared with an earlier, identical kernel (three layers of one
shape) ends with a `// name` comment naming its own kernel; the bucket start and progress poke
appended after it landed inside that comment, so the bucket was never started, its wait passed at
once and the updates read a NULL bucket (every rank crashed on its first step).  The engine now
also refuses a wait for a bucket it did not start (codegen_templates/cpu/flowc_comm_mpi.c).
"""
import re

import flow
import flow.typing as tp
from flowc.runtime.session import default_session

INIT = flow.truncated_normal(0.1)


def test_every_bucket_of_repeated_layers_is_started_and_awaited_in_code():
    session = default_session()
    session.joined, session.ranks, session.bucket_bytes = True, 2, 0      # one gradient per bucket

    @flow.global_function(type="train")
    def train_job(x: tp.Numpy.Placeholder((16, 32)), y: tp.Numpy.Placeholder((16,), dtype=flow.int32)) -> tp.Numpy:
        h = x
        for i in range(3):          # three layers of one shape: their kernels share functions
            h = flow.layers.dense(h, 32, activation=flow.nn.relu, kernel_initializer=INIT, name=f"h{i}")
        logits = flow.layers.dense(h, 10, kernel_initializer=INIT, name="out")
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(y, logits)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0.9).minimize(loss)
        return loss

    source = train_job.compile().source()
    step = source[source.index('extern "C" int flowc_step'):]
    code_part = "\n".join(line.partition("//")[0] for line in step.splitlines())
    started = sorted(int(b) for b in re.findall(r"comm->start\(comm->ctx, (\d+),", code_part))
    awaited = sorted(int(b) for b in re.findall(r"comm->wait\(comm->ctx, (\d+)\)", code_part))
    assert started == awaited == list(range(8))        # 4 layers x (weight, bias), one bucket each
    assert "  // " in step                              # some calls do share a function
