"""Two jobs that, between them, need every kernel the seed programs do not (CUDA coverage, golden code).

Their line numbers appear in generated comments: edit this file only with `python -m tests.golden_sources`.
"""
import flow
import flow.typing as tp


def coverage_jobs():
    """A train and a predict job that, between them, need every kernel the seeds do not."""
    @flow.global_function(type="train")
    def coverage_train(x: tp.Numpy.Placeholder((4, 3, 8, 8)),
                       y: tp.Numpy.Placeholder((4,), dtype=flow.int32)) -> tp.Numpy:
        with flow.scope.placement("gpu", "0:0"):
            h = flow.layers.conv2d(x, 4, 3, padding="SAME", activation=flow.nn.relu, name="cov_conv")
            a = flow.nn.avg_pool2d(h, ksize=2, strides=2, padding="VALID")
            m = flow.nn.max_pool2d(h, ksize=2, strides=2, padding="VALID")
            f = flow.reshape(flow.concat([a, m], axis=1), [4, -1])
            logits = flow.layers.dense(f, 5, name="cov_dense")
            xent = flow.nn.sparse_softmax_cross_entropy_with_logits(y, logits)
            # squared: the gradient depends on the loss, so loss and gradient stay two kernels
            loss = flow.math.square(xent) + flow.math.reduce_max(flow.nn.softmax(logits), axis=1)
        flow.optimizer.Adam(flow.optimizer.PiecewiseConstantScheduler([], [1e-3])).minimize(loss)
        return loss

    @flow.global_function(type="predict")
    def coverage_predict(x: tp.Numpy.Placeholder((2, 3, 4)), w: tp.Numpy.Placeholder((2, 4, 5)),
                         y: tp.Numpy.Placeholder((6,), dtype=flow.int32)) -> tp.Numpy:
        with flow.scope.placement("gpu", "0:0"):
            logits = flow.reshape(flow.matmul(x, w), [6, 5])     # batched
            return flow.math.argmax(logits) + flow.cast(
                flow.nn.sparse_softmax_cross_entropy_with_logits(y, logits), flow.int32)
    return coverage_train, coverage_predict
