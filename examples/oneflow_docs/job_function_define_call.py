# extended_topics (job_function_define_call): a job function is defined once - `type` and a
# `function_config` given to the decorator, placeholders for its parameters, an annotated return - and
# then called like a Python function, each call one training step returning NumPy data.
import flow
import flow.typing as tp

BATCH = 100
EPOCHS = 2


def get_train_config():
    config = flow.function_config()
    config.default_data_type(flow.float)
    return config


@flow.global_function(type="train", function_config=get_train_config())
def train_job(images: tp.Numpy.Placeholder((BATCH, 1, 28, 28), dtype=flow.float),
              labels: tp.Numpy.Placeholder((BATCH,), dtype=flow.int32)) -> tp.Numpy:
    initializer = flow.truncated_normal(0.1)
    reshape = flow.reshape(images, [images.shape[0], -1])
    hidden = flow.layers.dense(reshape, 512, activation=flow.nn.relu, kernel_initializer=initializer,
                               name="hidden")
    logits = flow.layers.dense(hidden, 10, kernel_initializer=initializer, name="output")
    loss = flow.nn.sparse_softmax_cross_entropy_with_logits(labels, logits, name="softmax_loss")
    flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0).minimize(loss)
    for blob in (images, reshape, hidden, logits, loss):      # placeholders: a shape and a dtype, no data
        assert isinstance(blob, flow.Blob)
    print("defined: loss", loss.shape, loss.dtype)
    return loss


if __name__ == "__main__":
    (train_images, train_labels), _ = flow.data.load_mnist_sample(BATCH, BATCH)
    for epoch in range(EPOCHS):
        for i, (images, labels) in enumerate(zip(train_images, train_labels)):
            loss = train_job(images, labels)
            if i % 15 == 0:
                print(f"epoch {epoch}, step {i}: loss {loss.mean():.4f} ({type(loss).__name__} {loss.shape})")
