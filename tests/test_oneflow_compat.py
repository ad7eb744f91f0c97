"""docs/oneflow_compat.md: every public name of OneFlow 0.3 has a status computed from flowc's exports
(tests/compat_table.py), the document is current, and the unsupported names fail at the call with
UnsupportedError naming the feature, never with an AttributeError."""
from __future__ import annotations

import pathlib

import pytest

import flow
from flow import unsupported
from flowc.compiler.errors import UnsupportedError
from tests import compat_table

DOC = pathlib.Path(__file__).resolve().parent.parent / "docs" / "oneflow_compat.md"


def test_every_oneflow_name_has_a_status():
    missing = [r.name for r in compat_table.rows() if r.status == compat_table.UNKNOWN]
    assert not missing, f"OneFlow names with no status in flowc (implement them or add them to " \
                        f"flow/unsupported.py with a reason): {missing}"


def test_the_compatibility_document_is_current():
    assert DOC.read_text() == compat_table.markdown(), \
        "docs/oneflow_compat.md is stale: python -m tests.compat_table > docs/oneflow_compat.md"


@pytest.mark.parametrize("name", sorted(unsupported.UNSUPPORTED))
def test_an_unsupported_name_raises_naming_the_feature(name):
    obj = compat_table._resolve(name)        # bound where OneFlow has it: no AttributeError
    with pytest.raises(UnsupportedError, match=rf"flow\.{name.replace('.', '[.]')} is not supported by flowc: "):
        obj()


def test_a_supported_name_is_not_a_stub():
    for row in compat_table.rows():
        if row.status != compat_table.SUPPORTED or row.name.startswith("FunctionConfig."):
            continue
        obj = compat_table._resolve(row.name[len("flow."):])
        assert getattr(obj, "__module__", None) != "flow.unsupported", row.name


def test_unsupported_features_of_the_issue_fail_at_the_call():
    with pytest.raises(UnsupportedError, match="eager"):
        flow.enable_eager_execution()
    assert flow.eager_execution_enabled() is False
    with pytest.raises(UnsupportedError, match="user_op_module_builder"):
        flow.user_op_module_builder("my_op")
    with pytest.raises(UnsupportedError, match="flowc has no op 'my_custom_op'"):    # built-in op types run
        flow.user_op_builder("my_op").Op("my_custom_op").Output("out").Build()
    with pytest.raises(UnsupportedError, match="OFRecord"):
        flow.data.ofrecord_reader("/data", batch_size=32)


def test_env_settings_check_their_argument_and_record_several_machines(monkeypatch):
    monkeypatch.setattr(flow.env, "values", {})
    flow.env.ctrl_port(9988)
    flow.env.machine([{"addr": "127.0.0.1"}])
    with pytest.raises(ValueError, match="port"):
        flow.env.ctrl_port(70000)
    flow.env.machine([{"addr": "192.168.1.12"}, {"addr": "192.168.1.11"}])     # checked at launch (test_world.py)
    assert flow.env.values == {"ctrl_port": 9988, "machine": [{"addr": "192.168.1.12"}, {"addr": "192.168.1.11"}]}
