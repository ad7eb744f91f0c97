"""`flow.config.*` (flow/config.py's table), unsupported features failing at the call with their name
(flow/unsupported.py), eager mode, and the dtype names (flow.char ... flow.float16)."""
import numpy as np
import pytest

import flow
import flow.config as config_module
import flow.typing as tp
from flow import unsupported


def resolve(qualified: str):
    target = flow
    for part in qualified.split("."):
        target = getattr(target, part)
    return target


# -- flow.config ---------------------------------------------------------------------------------------
SAMPLE = {config_module._bool: True, config_module._count: 1}


@pytest.mark.parametrize("name", list(config_module.OPTIONS))
def test_every_config_setting_accepts_its_argument(name, monkeypatch):
    monkeypatch.setattr(config_module, "values", {})
    option = config_module.OPTIONS[name]
    resolve(f"config.{name}")(SAMPLE[option.check])
    assert config_module.values == {name: SAMPLE[option.check]}
    assert option.status in ("always", "meaningless", "implemented") and option.note


def test_the_settings_the_issue_names_exist():
    for name in ("enable_legacy_model_io", "enable_model_io_v2", "gpu_device_num", "cpu_device_num", "machine_num",
                 "enable_debug_mode", "collective_boxing.enable_fusion", "collective_boxing.nccl_fusion_threshold_mb"):
        assert name in config_module.OPTIONS


def test_config_settings_check_their_arguments(monkeypatch):
    monkeypatch.setattr(config_module, "values", {})
    flow.config.enable_legacy_model_io()                  # bare: True, as OneFlow's default
    flow.config.enable_debug_mode(True)
    assert config_module.values == {"enable_legacy_model_io": True, "enable_debug_mode": True}
    flow.config.enable_legacy_model_io(False)
    assert flow.config.legacy_model_io_enabled() is False
    with pytest.raises(ValueError, match="gpu_device_num: expected an int >= 0, got -1"):
        flow.config.gpu_device_num(-1)
    with pytest.raises(TypeError, match="enable_model_io_v2: expected True or False, got 'yes'"):
        flow.config.enable_model_io_v2("yes")
    with pytest.raises(TypeError, match="enable_model_io_v2: missing its argument"):
        flow.config.enable_model_io_v2()
    flow.config.machine_num(2)                            # several machines: recorded, checked at launch
    assert config_module.values["machine_num"] == 2       # (tests/test_world.py)


@pytest.mark.parametrize("wrong, closest", [("gpu_device_nums", "gpu_device_num"),
                                            ("enable_legacy_model_i0", "enable_legacy_model_io"),
                                            ("collective_boxing.enable_fusio", "collective_boxing.enable_fusion")])
def test_a_misspelled_setting_names_the_closest(wrong, closest):
    with pytest.raises(AttributeError, match=f"no setting '{wrong}'; did you mean '{closest}'"):
        resolve(f"config.{wrong}")


def test_a_setting_changed_after_the_first_job_call_warns_that_it_has_no_effect(monkeypatch):
    import warnings
    import flow.env as env_module
    monkeypatch.setattr(config_module, "values", {"gpu_device_num": 1})
    monkeypatch.setattr(env_module, "values", {})

    @flow.global_function()
    def started(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        return x + 1.0
    started(np.zeros(2, np.float32))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        flow.config.gpu_device_num(1)          # what the session runs with: nothing to say
        flow.config.enable_debug_mode(True)    # changes nothing in flowc anyway
    with pytest.warns(RuntimeWarning, match=r"flow.config.gpu_device_num\(2\) has no effect: the session is running"):
        flow.config.gpu_device_num(2)
    with pytest.warns(RuntimeWarning, match=r"flow.config.collective_boxing.nccl_fusion_threshold_mb\(4\)"):
        flow.config.collective_boxing.nccl_fusion_threshold_mb(4)
    with pytest.warns(RuntimeWarning, match=r"flow.env.machine\(...\) has no effect"):
        flow.env.machine([{"addr": "10.0.0.1"}, {"addr": "10.0.0.2"}])
    flow.clear_default_session()               # launched alone: the next first call reads them again
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        flow.config.gpu_device_num(1)
        flow.env.world_size(1)


def test_load_library_fails_naming_the_feature():
    with pytest.raises(flow.UnsupportedError, match=r"test_flow_config.py:\d+: flow.config.load_library is not "
                                                    r"supported by flowc: custom C\+\+ ops"):
        flow.config.load_library("/tmp/my_op.so")


# -- unsupported features ------------------------------------------------------------------------------
@pytest.mark.parametrize("qualified", list(unsupported.UNSUPPORTED))
def test_every_unsupported_name_fails_at_the_call_naming_it(qualified):
    stub = resolve(qualified)                             # never an AttributeError
    args, kwargs = ((True,), {}) if qualified == "enable_eager_execution" else (("anything",), {"batch_size": 1})
    with pytest.raises(flow.UnsupportedError, match=f"flow.{qualified} is not supported by flowc: "):
        stub(*args, **kwargs)
    with pytest.raises(NotImplementedError):              # also a NotImplementedError and a FlowError
        stub()


def test_the_names_the_issue_lists_are_unsupported_not_missing():
    for name in ("user_op_module_builder", "data.ofrecord_reader", "data.OFRecordRawDecoder",
                 "data.ofrecord_image_decoder", "config.load_library", "enable_eager_execution"):
        assert name in unsupported.UNSUPPORTED
    # user_op_builder runs OneFlow's built-in op types (tests/test_user_op_builder.py); a custom one fails at .Build()
    with pytest.raises(flow.UnsupportedError, match="flowc has no op 'my_op'"):
        flow.user_op_builder("mine").Op("my_op").Output("out").Build()
    assert "ofrecord_reader" in flow.data.__all__ and "load_mnist" in flow.data.__all__


def test_eager_execution():
    assert flow.eager_execution_enabled() is False
    flow.enable_eager_execution(False)                    # lazy mode is what flowc runs
    with pytest.raises(flow.UnsupportedError, match="enable_eager_execution is not supported by flowc: eager "
                                                    "execution"):
        flow.enable_eager_execution()
    with pytest.raises(TypeError):
        flow.enable_eager_execution("no")


# -- dtypes --------------------------------------------------------------------------------------------
def test_dtype_names_and_their_numpy_types():
    convert = flow.convert_oneflow_dtype_to_numpy_dtype
    expected = {flow.char: np.int8, flow.int8: np.int8, flow.uint8: np.uint8, flow.int32: np.int32,
                flow.int64: np.int64, flow.float: np.float32, flow.float32: np.float32, flow.double: np.float64,
                flow.float64: np.float64, flow.float16: np.float16}
    for dtype, numpy_type in expected.items():
        assert convert(dtype) is numpy_type, dtype
    assert repr(flow.char) == "flow.char" and repr(flow.float16) == "flow.float16"
    assert flow.char == flow.int8 == np.int8               # char is stored as NumPy's byte
    assert flow.float16 == np.float16 and flow.float16 != flow.float32
    with pytest.raises(TypeError, match="expected a flow dtype"):
        convert(np.float32)


def test_a_dtype_flowc_has_no_kernels_for_is_a_clear_error():
    from flowc.compiler.dtypes import DType
    with pytest.raises(TypeError, match="Numpy.Placeholder: flow.bfloat16 is not supported by flowc's kernels"):
        tp.Numpy.Placeholder((2,), dtype=DType("bfloat16"))


def test_int8_uint8_int64_double_placeholders_round_trip():
    @flow.global_function(type="predict")
    def ints(a: tp.Numpy.Placeholder((3,), dtype=flow.int8), b: tp.Numpy.Placeholder((3,), dtype=flow.uint8),
             c: tp.Numpy.Placeholder((3,), dtype=flow.int64), d: tp.Numpy.Placeholder((3,), dtype=flow.double)
             ) -> tp.Numpy:
        return flow.cast(a, flow.double) + flow.cast(b, flow.double) + flow.cast(c, flow.double) + d
    a = np.array([-3, 0, 5], np.int8)
    b = np.array([250, 1, 2], np.uint8)
    c = np.array([2 ** 40, -1, 7], np.int64)
    d = np.array([0.5, 0.25, -1.0])
    np.testing.assert_array_equal(ints(a, b, c, d), a.astype(np.float64) + b + c + d)
