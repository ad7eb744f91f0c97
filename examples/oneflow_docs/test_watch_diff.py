# extended_topics (debugging): flow.watch_diff hands the gradient of the loss with respect to a blob,
# here the logits, to a Python function at every train step.
import flow
import flow.typing as tp

BATCH = 100
norms = []


def logits_grad(grad: tp.Numpy):
    norms.append(float((grad ** 2).sum() ** 0.5))


@flow.global_function(type="train")
def train_job(images: tp.Numpy.Placeholder((BATCH, 1, 28, 28), dtype=flow.float),
              labels: tp.Numpy.Placeholder((BATCH,), dtype=flow.int32)) -> tp.Numpy:
    with flow.scope.placement("cpu", "0:0"):
        init = flow.truncated_normal(0.1)
        flat = flow.reshape(images, [images.shape[0], -1])
        hidden = flow.layers.dense(flat, 512, activation=flow.nn.relu, kernel_initializer=init, name="hidden")
        logits = flow.layers.dense(hidden, 10, kernel_initializer=init, name="output")
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)
    flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0).minimize(loss)
    flow.watch_diff(logits, logits_grad)
    return loss


if __name__ == "__main__":
    flow.train.CheckPoint().init()
    (images, labels), _ = flow.data.load_mnist_sample(BATCH)
    for step, (x, y) in enumerate(zip(images, labels)):
        loss = train_job(x, y)
        if step % 15 == 0:
            print(f"step {step}: loss {loss.mean():.4f}, |d loss / d logits| {norms[-1]:.4f}")
    print(f"{len(norms)} gradients watched")
