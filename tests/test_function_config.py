"""`flow.function_config()`: every OneFlow 0.3 FunctionConfig option, from one rule table
(runtime/function_config.py OPTIONS), documented in docs/function_config.md.

Most tests only trace (`job.graph`): nothing is compiled, except one run of a job placed by
`default_placement_scope`.
"""
import os
import warnings

import numpy as np
import pytest

import flow
import flow.typing as tp
import flowc.runtime.function_config as fc

DOC = os.path.join(os.path.dirname(__file__), "..", "docs", "function_config.md")

# A valid argument for each kind of check; options whose check refuses are tested apart.
SAMPLE = {
    fc._bool: True, fc._int: 4, fc._positive_int: 2, fc._number: 0.5, fc._str: "x", fc._dict: {},
    fc._update_conf: {"naive_conf": {}}, fc._anything: "use_time_line_algo", fc._dtype: flow.float32,
    fc._placement: None, fc._view: "mirrored", fc._mode: "non_distributed", fc._refuse_true: False,
}


def setter(config, name):
    target = config
    for part in name.split("."):
        target = getattr(target, part)
    return target


def test_every_option_has_a_known_status_note_and_argument():
    assert len(fc.OPTIONS) >= 70
    for option in fc.OPTIONS.values():
        assert option.status in fc.STATUSES, option
        assert option.note and option.argument, option


def test_the_options_the_issue_names_are_in_the_table():
    for name in ("default_placement_scope", "default_logical_view", "default_distribute_strategy",
                 "enable_auto_mixed_precision", "enable_fuse_add_to_output", "enable_fuse_model_update_ops",
                 "enable_inplace", "cudnn_buf_limit_mbyte", "cudnn_conv_force_fwd_algo",
                 "indexed_slices_optimizer_conf", "use_xla_jit", "use_tensorrt", "train.primary_lr",
                 "train.secondary_lr", "train.model_update_conf", "train.loss_scale_factor", "concurrency_width",
                 "default_data_type", "check_numerics"):
        assert name in fc.OPTIONS, name


@pytest.mark.parametrize("name", [n for n, o in fc.OPTIONS.items() if o.check is not fc._refuse])
def test_every_option_accepts_its_argument(name):
    option = fc.OPTIONS[name]
    config = flow.function_config()
    value = flow.scope.placement("cpu", "0:0") if option.check is fc._placement else SAMPLE[option.check]
    setter(config, name)(value)
    assert name in config.values


def test_flags_default_to_true_and_check_their_argument():
    config = flow.function_config()
    config.enable_inplace()
    config.use_xla_jit()
    assert config.values == {"enable_inplace": True, "use_xla_jit": True}
    with pytest.raises(TypeError, match="enable_fuse_add_to_output: expected True or False, got 1"):
        config.enable_fuse_add_to_output(1)
    with pytest.raises(TypeError, match="cudnn_buf_limit_mbyte: expected an int"):
        config.cudnn_buf_limit_mbyte("1024")
    with pytest.raises(TypeError, match="cudnn_buf_limit_mbyte: expected a value"):
        config.cudnn_buf_limit_mbyte()
    with pytest.raises(ValueError, match="concurrency_width: expected an int >= 1"):
        config.concurrency_width(0)
    with pytest.raises(TypeError, match="default_logical_view: expected flow.scope.consistent_view"):
        config.default_logical_view("sideways")
    with pytest.raises(TypeError, match="default_placement_scope: expected a placement scope"):
        config.default_placement_scope("cpu")


@pytest.mark.parametrize("wrong, closest", [("enable_inplac", "enable_inplace"),
                                            ("default_placement", "default_placement_scope"),
                                            ("use_xla", "use_xla_jit"),
                                            ("train.primary_rate", "train.primary_lr")])
def test_a_misspelled_option_fails_naming_the_closest(wrong, closest):
    config = flow.function_config()
    with pytest.raises(AttributeError, match=f"no option '{wrong}'; did you mean '{closest}'"):
        setter(config, wrong)
    assert not hasattr(config, "no_such_option_at_all")


def test_refused_options_fail_naming_the_option():
    config = flow.function_config()
    config.enable_qat(False)                              # the neutral value is fine
    with pytest.raises(flow.UnsupportedError, match="enable_qat.*quantization-aware training"):
        config.enable_qat(True)
    with pytest.raises(NotImplementedError, match="default_initializer_conf is not supported"):
        config.default_initializer_conf({"constant_conf": {"value": 0.0}})


def test_the_documented_table_is_current():
    with open(DOC) as f:
        assert f.read() == fc.markdown_table(), \
            "regenerate: python -m flowc.runtime.function_config > docs/function_config.md"


# -- options with meaning ----------------------------------------------------------------------------
def placed_job(config, name):
    def job(x: tp.Numpy.Placeholder((4,))) -> tp.Numpy:
        w = flow.get_variable("w_" + name, shape=(4,), initializer=flow.constant_initializer(2.0))
        return x * w + 1.0
    job.__name__ = name
    return flow.global_function(type="predict", function_config=config)(job)


def devices(job):
    return {node.type.device for node in job.graph.nodes}


@pytest.mark.filterwarnings("ignore:job .on_gpu. is placed on .gpu.")
def test_default_placement_scope_places_the_whole_job_and_can_be_traced_again():
    config = flow.function_config()
    scope = flow.scope.placement("gpu", "0:0")
    config.default_placement_scope(scope)
    assert config.default_device == "gpu"
    job = placed_job(config, "on_gpu")
    assert devices(job) == {"gpu"}                        # inputs, variables and ops alike
    flow.clear_default_session()
    assert devices(job) == {"gpu"}                        # the scope object is entered again
    assert devices(placed_job(flow.function_config(), "default")) == {"cpu"}

    inner = flow.function_config()
    inner.default_placement_scope(flow.scope.placement("gpu", "0:0"))

    @flow.global_function(type="predict", function_config=inner)
    def mixed(x: tp.Numpy.Placeholder((4,))) -> tp.Numpy:
        with flow.scope.placement("cpu", "0:0"):          # an explicit scope inside still wins
            y = x + 1.0
        return y * 2.0
    assert [n.type.device for n in mixed.graph.nodes if n.op in ("add", "multiply")] == ["cpu", "gpu"]


def test_a_job_with_a_cpu_default_placement_runs():
    config = flow.function_config()
    config.default_placement_scope(flow.scope.placement("cpu", "0:0"))
    job = placed_job(config, "on_cpu")
    np.testing.assert_allclose(job(np.arange(4, dtype=np.float32)), np.arange(4) * 2.0 + 1.0)


def test_default_logical_view_is_recorded():
    config = flow.function_config()
    assert config.logical_view == "consistent"
    config.default_logical_view(flow.scope.mirrored_view())
    assert config.logical_view == "mirrored"
    assert devices(placed_job(config, "mirrored_job")) == {"cpu"}     # identity on one device


def test_auto_mixed_precision_is_applied_without_a_warning():
    config = flow.function_config()
    config.enable_auto_mixed_precision(True)
    assert config.auto_mixed_precision
    assert fc.OPTIONS["enable_auto_mixed_precision"].status == fc.IMPLEMENTED
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert placed_job(config, "amp_job").graph.nodes
    assert not flow.function_config().auto_mixed_precision


def test_secondary_lr_must_equal_primary_lr():
    config = flow.function_config()
    config.train.primary_lr(0.1)
    config.train.secondary_lr(0.1)
    assert placed_job(config, "same_lr").graph.nodes
    config.train.secondary_lr(0.2)
    with pytest.raises(flow.UnsupportedError, match="secondary_lr.*differs from train.primary_lr"):
        assert placed_job(config, "other_lr").graph.nodes


def test_old_style_global_function_config_with_train_options_makes_a_train_job():
    config = flow.function_config()
    config.train.primary_lr(0.1)
    config.train.model_update_conf({"naive_conf": {}})
    with pytest.warns(DeprecationWarning):
        decorate = flow.global_function(config)

    @decorate
    def old(x: tp.Numpy.Placeholder((4,))) -> tp.Numpy:
        w = flow.get_variable("w_old", shape=(4,), initializer=flow.constant_initializer(1.0))
        loss = flow.math.reduce_sum(x * w)
        flow.losses.add_loss(loss)
        return loss
    assert old.job_type == "train"
