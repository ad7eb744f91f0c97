"""flow.scope views as OneFlow 0.3.4 uses them, op names under flow.scope.namespace, flow.assign on a
variable the optimizer trains, and flow.random.*."""
from __future__ import annotations

import numpy as np
import pytest

import flow
import flow.typing as tp
from flowc.compiler.trace import TraceError


def test_views_are_with_blocks_and_function_config_values():
    """OneFlow 0.3.4's scope.mirrored_view / consistent_view are strategy objects: usable in `with`
    (the *_view_enabled() queries answer for the innermost block) and as default_logical_view."""
    flow.clear_default_session()
    seen = {}
    config = flow.function_config()
    config.default_logical_view(flow.scope.mirrored_view())
    assert config.logical_view == "mirrored"

    @flow.global_function(function_config=config)
    def views_in_blocks(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        seen["job"] = flow.scope.mirrored_view_enabled()
        with flow.scope.consistent_view():
            seen["consistent_block"] = (flow.scope.consistent_view_enabled(), flow.scope.mirrored_view_enabled())
            with flow.scope.mirrored_view() as view:
                seen["nested"] = flow.scope.mirrored_view_enabled()
                seen["view"] = view
        seen["after"] = flow.scope.mirrored_view_enabled()
        return x + 1.0
    np.testing.assert_array_equal(views_in_blocks(np.zeros(2, np.float32)), [1.0, 1.0])
    assert seen["job"] is True
    assert seen["consistent_block"] == (True, False)
    assert seen["nested"] is True and seen["view"].is_mirrored
    assert seen["after"] is True
    with flow.scope.mirrored_view():
        assert flow.scope.mirrored_view_enabled()
    assert flow.scope.consistent_view_enabled()
    assert flow.scope.mirrored_view() == "mirrored" and not flow.scope.consistent_view().is_mirrored
    flow.clear_default_session()


def test_op_names_under_a_namespace_get_its_prefix():
    """OneFlow's user_op_builder prefixes every op name with the open namespaces, like variables."""
    flow.clear_default_session()
    names = {}

    @flow.global_function(type="predict")
    def namespaced_ops(x: tp.Numpy.Placeholder((2, 3))) -> tp.Numpy:
        with flow.scope.namespace("enc"):
            a = flow.math.relu(x, name="act")
            with flow.scope.namespace("inner"):
                h = flow.layers.dense(a, 4, name="fc")
        b = flow.math.relu(h, name="outside")
        names.update(act=a.op_name, fc=h.op_name, outside=b.op_name)
        return b
    namespaced_ops.lower()
    assert names == {"act": "enc-act", "fc": "enc-inner-fc", "outside": "outside"}
    assert "enc-inner-fc-weight" in flow.get_all_variables()
    flow.clear_default_session()


def test_assigning_a_variable_the_optimizer_trains_names_the_variable_and_line():
    flow.clear_default_session()

    @flow.global_function(type="train")
    def assign_and_train(x: tp.Numpy.Placeholder((2, 3))) -> tp.Numpy:
        w = flow.get_variable("assigned_w", shape=(3,), initializer=flow.ones_initializer())
        loss = flow.math.reduce_sum(x * w)
        flow.assign(w, w * 2.0)                       # ASSIGN_LINE
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1])).minimize(loss)
        return loss
    line = next(i for i, text in enumerate(open(__file__), 1) if "# ASSIGN_LINE" in text and "flow.assign" in text)
    with pytest.raises(TraceError, match=rf"test_scope_and_random.py:{line}: flow.assign: variable 'assigned_w'"):
        assign_and_train.lower()
    flow.clear_default_session()

    @flow.global_function(type="train")
    def assign_untrained(x: tp.Numpy.Placeholder((2, 3))) -> tp.Numpy:
        w = flow.get_variable("trained_w", shape=(3,), initializer=flow.ones_initializer())
        c = flow.get_variable("counter", shape=(1,), initializer=flow.zeros_initializer(), trainable=False)
        loss = flow.math.reduce_sum(x * w)
        flow.assign(c, c + 1.0)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1])).minimize(loss)
        return loss
    assign_untrained(np.ones((2, 3), np.float32))
    assign_untrained(np.ones((2, 3), np.float32))
    assert flow.get_all_variables()["counter"].numpy()[0] == 2.0
    flow.clear_default_session()
