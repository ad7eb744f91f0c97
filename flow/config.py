"""`flow.config`: OneFlow 0.3's environment settings, from one rule table (`OPTIONS`).

Every setting checks its argument as OneFlow does and records it in `values`.  The devices per
machine (`gpu_device_num`, `cpu_device_num`) and the machines (`machine_num`, with flow.env.machine)
say how many processes the job runs in, one per device: the runtime checks them against the launched
MPI world (`flowc.runtime.world.check_configuration`; launch with `flowc launch -n N script.py`, see
docs/distributed.md).  Most other settings tune what flowc does not have (RDMA, actor queues, NCCL
boxing fusion) and do nothing else (status `meaningless`), or ask for what flowc always does (status
`always`).  `load_library` fails naming the feature (flow/unsupported.py).  Misspelled names fail
with the closest name.  The first job call reads the settings; one of them (devices, machines,
bucket size) changed after it has no effect, and says so in a RuntimeWarning, as OneFlow prints
"Nothing happened because the session is running".

Example:
    flow.config.gpu_device_num(2)            # two processes per machine: flowc launch -n 2 train.py
    flow.config.enable_legacy_model_io(True)
    flow.config.collective_boxing.nccl_fusion_threshold_mb(16)
    flow.config.load_library("my_op.so")     # UnsupportedError: ... custom C++ ops ...
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any, Callable

from flow import unsupported as _unsupported
from flowc.runtime import environment as _environment
from flowc.runtime import session as _session

ALWAYS, MEANINGLESS, IMPLEMENTED = "always", "meaningless", "implemented"
_REQUIRED = object()


def _bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"flow.config.{name}: expected True or False, got {value!r}")
    return value


def _count(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"flow.config.{name}: expected an int >= 0, got {value!r}")
    return value


@dataclass(frozen=True)
class ConfigOption:
    """One `flow.config` setting: status, note, argument check and the default when called bare."""
    name: str
    status: str
    check: Callable[[str, Any], Any]
    default: Any
    note: str


_DEVICES = ("the devices per machine, one process each: the launched world must hold machines x devices "
            "processes (flowc launch -n N); {kind}")
_NETWORK = "MPI (NCCL between GPUs) carries the traffic between processes: no OneFlow transport to tune"
_BOXING = "tunes OneFlow's collective boxing; flowc plans its own collectives"
_IO = "flowc reads and writes both checkpoint formats (flow.train.CheckPoint and flow.checkpoint) always"

_TABLE: list[tuple[str, str, Callable[[str, Any], Any], Any, str]] = [
    ("machine_num", IMPLEMENTED, _count, _REQUIRED,
     "the number of machines (as flow.env.machine's list, which it must agree with), checked against the "
     "launched world"),
    ("gpu_device_num", IMPLEMENTED, _count, _REQUIRED,
     _DEVICES.format(kind="counts for GPU jobs, and for CPU jobs when cpu_device_num is not set")),
    ("cpu_device_num", IMPLEMENTED, _count, _REQUIRED,
     _DEVICES.format(kind="counts for CPU jobs (each CPU device's threads come from OpenMP)")),
    ("comm_net_worker_num", MEANINGLESS, _count, _REQUIRED, _NETWORK),
    ("max_mdsave_worker_num", MEANINGLESS, _count, _REQUIRED, "checkpoints are written by the calling thread"),
    ("enable_numa_aware_cuda_malloc_host", MEANINGLESS, _bool, True, "flowc allocates host memory with NumPy"),
    ("compute_thread_pool_size", MEANINGLESS, _count, _REQUIRED, "compiled steps use OpenMP's threads"),
    ("rdma_mem_block_mbyte", MEANINGLESS, _count, _REQUIRED, _NETWORK),
    ("rdma_recv_msg_buf_mbyte", MEANINGLESS, _count, _REQUIRED, _NETWORK),
    ("reserved_host_mem_mbyte", MEANINGLESS, _count, _REQUIRED, "the memory plan sizes every buffer exactly"),
    ("reserved_device_mem_mbyte", MEANINGLESS, _count, _REQUIRED, "the memory plan sizes every buffer exactly"),
    ("use_rdma", MEANINGLESS, _bool, True, _NETWORK),
    ("thread_enable_local_message_queue", MEANINGLESS, _bool, _REQUIRED, "flowc has no actor message queues"),
    ("enable_debug_mode", MEANINGLESS, _bool, True,
     "flowc's debugging switches are environment variables: FLOWC_DEBUG=1 (IR after each pass, generated "
     "code, memory plan) and FLOWC_PROFILE=1"),
    ("save_downloaded_file_to_local_fs", MEANINGLESS, _bool, True, "flowc reads local files only"),
    ("persistence_buf_byte", MEANINGLESS, _count, _REQUIRED, "checkpoints are written in one piece"),
    ("enable_legacy_model_io", ALWAYS, _bool, True, _IO),
    ("enable_model_io_v2", ALWAYS, _bool, _REQUIRED, _IO),
    ("collect_act_event", MEANINGLESS, _bool, True, "profile with FLOWC_PROFILE=1 and job.profile()"),
    ("enable_tensor_float_32_compute", MEANINGLESS, _bool, True, "flowc's GPU kernels compute in float32"),
    ("nccl_use_compute_stream", MEANINGLESS, _bool, False, _BOXING),
    ("disable_group_boxing_by_dst_parallel", MEANINGLESS, _bool, False, _BOXING),
    ("collective_boxing.enable_fusion", MEANINGLESS, _bool, True, _BOXING),
    ("collective_boxing.num_callback_threads", MEANINGLESS, _count, _REQUIRED, _BOXING),
    ("collective_boxing.nccl_num_streams", MEANINGLESS, _count, _REQUIRED, _BOXING),
    ("collective_boxing.nccl_fusion_threshold_mb", IMPLEMENTED, _count, _REQUIRED,
     "the most megabytes of gradients one all-reduce bucket of a data-parallel step holds (16 by default; 0: "
     "one gradient per bucket)"),
    ("collective_boxing.nccl_fusion_all_reduce_use_buffer", MEANINGLESS, _bool, _REQUIRED, _BOXING),
    ("collective_boxing.nccl_fusion_all_reduce", MEANINGLESS, _bool, _REQUIRED, _BOXING),
    ("collective_boxing.nccl_fusion_reduce_scatter", MEANINGLESS, _bool, _REQUIRED, _BOXING),
    ("collective_boxing.nccl_fusion_all_gather", MEANINGLESS, _bool, _REQUIRED, _BOXING),
    ("collective_boxing.nccl_fusion_reduce", MEANINGLESS, _bool, _REQUIRED, _BOXING),
    ("collective_boxing.nccl_fusion_broadcast", MEANINGLESS, _bool, _REQUIRED, _BOXING),
    ("collective_boxing.nccl_fusion_max_ops", MEANINGLESS, _count, _REQUIRED, _BOXING),
    ("collective_boxing.nccl_enable_all_to_all", MEANINGLESS, _bool, _REQUIRED, _BOXING),
    ("collective_boxing.nccl_enable_mixed_fusion", MEANINGLESS, _bool, _REQUIRED, _BOXING),
]
OPTIONS: dict[str, ConfigOption] = {row[0]: ConfigOption(*row) for row in _TABLE}
# What the settings were last set to (process-wide, as OneFlow's environment config).
values: dict[str, Any] = _environment.config_values     # the runtime reads them there


def _setter(option: ConfigOption) -> Callable[..., None]:
    def set_option(val: Any = _REQUIRED) -> None:
        if val is _REQUIRED:
            val = option.default
            if val is _REQUIRED:
                raise TypeError(f"flow.config.{option.name}: missing its argument")
        val = option.check(option.name, val)
        if option.status == IMPLEMENTED and values.get(option.name, _REQUIRED) != val:
            _session.warn_if_started(f"flow.config.{option.name}({val!r})")
        values[option.name] = val
    set_option.__name__ = set_option.__qualname__ = option.name.rsplit(".", 1)[-1]
    set_option.__doc__ = f"flow.config.{option.name} ({option.status}): {option.note}"
    return set_option


class _Namespace:
    """`flow.config.collective_boxing`: the nested settings."""

    def __init__(self, prefix: str) -> None:
        self._prefix = prefix
        for name, option in OPTIONS.items():
            if name.startswith(prefix + "."):
                setattr(self, name[len(prefix) + 1:], _setter(option))

    def __getattr__(self, name: str) -> Any:
        raise _unknown(f"{self._prefix}.{name}")


def _unknown(name: str) -> AttributeError:
    known = list(OPTIONS) + list(_unsupported.stubs("config")) + ["legacy_model_io_enabled"]
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return AttributeError(f"flow.config has no setting {name!r}{hint}")


def legacy_model_io_enabled() -> bool:
    """What `enable_legacy_model_io` was last set to (True by default: flowc supports both formats).

    Example:
        flow.config.legacy_model_io_enabled()   # True
    """
    return values.get("enable_legacy_model_io", True)


collective_boxing = _Namespace("collective_boxing")
globals().update({name: _setter(option) for name, option in OPTIONS.items() if "." not in name})
globals().update(_unsupported.stubs("config"))     # load_library, load_library_now


def __getattr__(name: str) -> Any:
    raise _unknown(name)
