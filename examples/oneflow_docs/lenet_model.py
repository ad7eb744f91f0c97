# The LeNet of the quick_start programs, shared by lenet_train.py, lenet_eval.py, lenet_test.py and the
# lenet_mnist_*.py programs as the documentation's programs each define it: two 5x5 convolutions with
# max pooling (data_format given, as OneFlow 0.3's pages give it), then two dense layers, with dropout
# while training.
import flow


def lenet(images, train=False):
    init = flow.truncated_normal(0.1)
    x = flow.layers.conv2d(images, 32, 5, padding="SAME", activation=flow.nn.relu, name="conv1",
                           kernel_initializer=init)
    x = flow.nn.max_pool2d(x, ksize=2, strides=2, padding="SAME", name="pool1", data_format="NCHW")
    x = flow.layers.conv2d(x, 64, 5, padding="SAME", activation=flow.nn.relu, name="conv2",
                           kernel_initializer=init)
    x = flow.nn.max_pool2d(x, ksize=2, strides=2, padding="SAME", name="pool2", data_format="NCHW")
    x = flow.reshape(x, [x.shape[0], -1])
    x = flow.layers.dense(x, 512, activation=flow.nn.relu, kernel_initializer=init, name="dense1")
    if train:
        x = flow.nn.dropout(x, rate=0.5, name="dropout")
    return flow.layers.dense(x, 10, kernel_initializer=init, name="dense2")
