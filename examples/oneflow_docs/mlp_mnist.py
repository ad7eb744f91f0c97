# quick_start: a two-layer perceptron trained on MNIST with the old training style, in which the job's
# function_config holds the learning rate and the update rule and the job marks its loss.
import flow
import flow.typing as tp

BATCH = 100


def train_config():
    config = flow.function_config()
    config.default_data_type(flow.float)
    config.train.primary_lr(0.1)
    config.train.model_update_conf({"naive_conf": {}})     # plain SGD
    return config


@flow.global_function(train_config())
def train_job(images: tp.Numpy.Placeholder((BATCH, 1, 28, 28), dtype=flow.float),
              labels: tp.Numpy.Placeholder((BATCH,), dtype=flow.int32)):
    with flow.scope.placement("cpu", "0:0"):
        init = flow.truncated_normal(0.1)
        flat = flow.reshape(images, [images.shape[0], -1])
        hidden = flow.layers.dense(flat, 512, activation=flow.nn.relu, kernel_initializer=init)
        logits = flow.layers.dense(hidden, 10, kernel_initializer=init)
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)
    flow.losses.add_loss(loss)
    return loss


if __name__ == "__main__":
    flow.train.CheckPoint().init()
    (images, labels), _ = flow.data.load_mnist_sample(BATCH)
    for step, (x, y) in enumerate(zip(images, labels)):
        mean_loss = train_job(x, y).get().mean()
        if step % 15 == 0:
            print(f"step {step}: loss {mean_loss:.4f}")
    print(f"final loss {mean_loss:.4f}")
