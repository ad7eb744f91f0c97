"""`flow.function_config()`: every option of OneFlow 0.3's FunctionConfig, from one rule table.

`OPTIONS` maps each option's name (dotted for nested ones: `train.primary_lr`) to what flowc does
with it and how its argument is checked.  The statuses:

* implemented: flowc honours it (`default_data_type`, `default_placement_scope`, ...);
* recorded: kept in the config for the compiler, whose use of it is not written yet; a job that sets
  it warns once per process that it is not applied (never silently pretends);
* always: a no-op because flowc always does what it asks (fusion, in-place updates, memory reuse);
* meaningless: a no-op because it has no meaning in flowc (cuDNN knobs, NCCL, several devices);
* refused: it would change results in a way flowc does not implement: setting it fails (the neutral
  value, e.g. `enable_qat(False)`, is accepted).

A misspelled option fails with an AttributeError naming the closest option.  docs/function_config.md
is generated from this table (`python -m flowc.runtime.function_config > docs/function_config.md`)
and a test checks that it is current.

Example:
    config = flow.function_config()
    config.default_placement_scope(flow.scope.placement("cpu", "0:0"))
    config.enable_fuse_add_to_output(True)      # accepted: flowc always fuses
    config.enable_inplac(True)                  # AttributeError: ... did you mean 'enable_inplace'?
"""
from __future__ import annotations

import difflib
import warnings
from dataclasses import dataclass
from typing import Any, Callable

from flowc.compiler.errors import UnsupportedError
from flowc.compiler.ir import dtype_name

IMPLEMENTED = "implemented"
RECORDED = "recorded"
ALWAYS = "always"
MEANINGLESS = "meaningless"
REFUSED = "refused"
STATUSES = (IMPLEMENTED, RECORDED, ALWAYS, MEANINGLESS, REFUSED)

# Three stages overlap: the caller feeds step k+2 while step k+1 computes and step k's callback runs.
DEFAULT_PIPELINE_DEPTH = 3
_NO_ARGUMENT = object()


class OptionRefused(UnsupportedError):
    """A FunctionConfig option flowc knows but does not implement was set to a value that matters."""


# -- argument checks: each returns the value to record or raises --------------------------------------
def _bool(option: str, value: Any) -> bool:
    if value is _NO_ARGUMENT:
        return True                   # OneFlow's flags default to True when called without argument
    if not isinstance(value, bool):
        raise TypeError(f"function_config.{option}: expected True or False, got {value!r}")
    return value


def _int(option: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"function_config.{option}: expected an int, got {value!r}")
    return value


def _positive_int(option: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"function_config.{option}: expected an int >= 1, got {value!r}")
    return value


def _number(option: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"function_config.{option}: expected a number, got {value!r}")
    return float(value)


def _str(option: str, value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"function_config.{option}: expected a string, got {value!r}")
    return value


def _dict(option: str, value: Any) -> dict:
    if not isinstance(value, dict):
        raise TypeError(f"function_config.{option}: expected a dict, got {value!r}")
    return value


def _update_conf(option: str, value: Any) -> Any:
    return value          # compiler/optimizers.py from_model_update_conf checks it when the job is traced


def _anything(option: str, value: Any) -> Any:
    return None if value is _NO_ARGUMENT else value


def _dtype(option: str, value: Any) -> str:
    try:
        return dtype_name(value)
    except TypeError as err:
        raise TypeError(f"function_config.{option}: {err}") from None


def _placement(option: str, value: Any) -> Any:
    if not hasattr(value, "device_tag") or not hasattr(value, "__enter__"):
        raise TypeError(f"function_config.{option}: expected a placement scope such as "
                        f"flow.scope.placement(\"cpu\", \"0:0\"), got {value!r}")
    return value


def _view(option: str, value: Any) -> str:
    if value not in ("consistent", "mirrored"):
        raise TypeError(f"function_config.{option}: expected flow.scope.consistent_view() or "
                        f"flow.scope.mirrored_view(), got {value!r}")
    return str(value)       # flow.scope's LogicalView is also the plain string


def _mode(option: str, value: Any) -> str:
    if value not in ("non_distributed", "distributed_split"):
        raise ValueError(f"function_config.{option}: expected 'non_distributed' or 'distributed_split', "
                         f"got {value!r}")
    return value


def _refuse(option: str, value: Any) -> None:
    raise OptionRefused(f"function_config.{option} is not supported by flowc: {OPTIONS[option].note}")


def _refuse_true(option: str, value: Any) -> bool:
    flag = _bool(option, value)
    if flag:
        raise OptionRefused(f"function_config.{option}(True) is not supported by flowc: "
                            f"{OPTIONS[option].note}")
    return flag


@dataclass(frozen=True)
class Option:
    """One FunctionConfig option: what flowc does with it (`status`, `note`) and its argument check."""
    name: str
    status: str
    check: Callable[[str, Any], Any]
    note: str

    @property
    def argument(self) -> str:
        """The argument's kind, as the docs table shows it."""
        return _ARGUMENT_NAMES[self.check]


_ARGUMENT_NAMES: dict[Callable, str] = {
    _bool: "bool (default True)", _int: "int", _positive_int: "int >= 1", _number: "number", _str: "str",
    _dict: "dict", _update_conf: "dict", _anything: "any", _dtype: "dtype", _placement: "flow.scope.placement(...)",
    _view: "flow.scope.consistent_view() / mirrored_view()", _mode: "'non_distributed' / 'distributed_split'",
    _refuse_true: "bool (True refused)", _refuse: "refused",
}

_FUSES = "flowc always fuses element-wise chains into their producer's epilogue"
_NO_CUDNN = "flowc generates its own kernels and does not call cuDNN"
_NO_STAGES = ("stage-parallel (SSP) pipelining: flowc does not cut a job into pipeline stages; each rank runs "
              "the whole job (data and model parallelism, docs/distributed.md)")
_ENGINES = "flowc's GPU jobs on several ranks sum through NCCL, its CPU jobs through MPI (docs/distributed.md)"
_OWN_COLLECTIVES = ("flowc plans its own collectives (compiler/passes/data_parallel.py, model_parallel.py): "
                    "there is no boxing to tune")
_BUCKETS = ("flowc groups the gradient sums in buckets of flow.config.collective_boxing.nccl_fusion_threshold_mb, "
            "each started as its last gradient is written")
_OPTIMIZER_SHARDS = ("OneFlow's sharding of the optimizer over the devices; flowc's ranks each update every "
                     "replicated variable whole (the same values; no memory saved)")
_OWN_MEMORY = "flowc's memory plan always reuses buffers (liveness-based)"
_XRT = "flowc compiles the whole job itself; there is no second compiler (XLA, TensorRT) to hand it to"
_NO_HALF = "a cuDNN half-precision knob: flowc computes float16 in float32 in its own kernels"

_TABLE: list[tuple[str, str, Callable[[str, Any], Any], str]] = [
    # -- implemented ----------------------------------------------------------------------------------
    ("default_data_type", IMPLEMENTED, _dtype,
     "the dtype of variables and initializers declared without one"),
    ("default_placement_scope", IMPLEMENTED, _placement,
     "a flow.scope.placement applied to the whole job, as if its body were inside it"),
    ("default_logical_view", IMPLEMENTED, _view,
     "on several ranks the consistent view splits the global batch and the mirrored view takes one "
     "tp.ListNumpy array per rank (docs/distributed.md); on one device both compute the same"),
    ("default_distribute_strategy", IMPLEMENTED, _view,
     "OneFlow's older name of default_logical_view; recorded the same way"),
    ("concurrency_width", IMPLEMENTED, _positive_int,
     "how many calls of the job may be in flight at once, results waiting for callbacks included "
     "(a call blocks beyond)"),
    ("check_numerics", IMPLEMENTED, _bool,
     "flowc's own debug option (not OneFlow's): a NaN or infinity in any op's output fails the step "
     "with a StepError naming the op and the user's line; free when off"),
    ("train.primary_lr", IMPLEMENTED, _number,
     "the learning rate of the old training style (flow.losses.add_loss)"),
    ("train.model_update_conf", IMPLEMENTED, _update_conf,
     "the update rule of the old training style (naive_conf, momentum_conf, adam_conf, rmsprop_conf, lars_conf, "
     "lazy_adam_conf, lamb_conf) and OneFlow's learning_rate_decay, warmup_conf, clip_conf and weight_decay_conf"),
    ("enable_auto_mixed_precision", IMPLEMENTED, _bool,
     "OneFlow's AMP rewrite (compiler/passes/mixed_precision.py): matmuls and the ops between them in "
     "float16, float32 master weights; pair it with flow.optimizer.loss_scale.dynamic_loss_scale()"),
    ("indexed_slices_optimizer_conf", IMPLEMENTED, _dict,
     "dict(include_op_names=dict(op_name=[...])): the named variables read only by a gather get OneFlow's "
     "indexed-slices SGD, momentum or Adam update, touching only the gathered rows (compiler/indexed_slices.py; "
     "LazyAdam is always sparse)"),
    # -- refused --------------------------------------------------------------------------------------
    ("train.secondary_lr", REFUSED, _number,
     "OneFlow's learning rate of `bias` variables; accepted only equal to train.primary_lr"),
    ("default_initializer_conf", REFUSED, _refuse,
     "a protobuf initializer conf for variables without one; pass an initializer to get_variable"),
    ("enable_qat", REFUSED, _refuse_true, "quantization-aware training is not implemented"),
    ("enable_quantization_aware_training", REFUSED, _refuse_true,
     "quantization-aware training is not implemented"),
    # -- always done ----------------------------------------------------------------------------------
    ("enable_fuse_add_to_output", ALWAYS, _bool, _FUSES),
    ("enable_fuse_cast_scale", ALWAYS, _bool, _FUSES),
    ("enable_fuse_model_update_ops", ALWAYS, _bool,
     "flowc fuses each variable's update (scaling, weight decay, the rule) into one kernel"),
    ("enable_inplace", ALWAYS, _bool, "flowc updates variables and element-wise results in place"),
    ("enable_inplace_in_reduce_struct", ALWAYS, _bool, "flowc updates in place where it can"),
    ("enable_reused_mem", ALWAYS, _bool, _OWN_MEMORY),
    ("use_memory_allocation_algorithm_v2", ALWAYS, _bool, _OWN_MEMORY),
    ("enable_float_compute_for_half_gemm", ALWAYS, _bool, "flowc's GEMMs accumulate in float32 or wider"),
    ("enable_keep_header_only", ALWAYS, _bool, "flowc keeps only the data a step needs"),
    ("prune_parallel_cast_ops", ALWAYS, _bool, "flowc's simplify pass removes identity ops"),
    ("prune_cast_to_static_shape_ops", ALWAYS, _bool, "flowc's simplify pass removes identity ops"),
    # -- meaningless here -----------------------------------------------------------------------------
    ("train.loss_scale_factor", MEANINGLESS, _number,
     "the old training style's loss scale; scaling the loss and unscaling its gradients cancel in the "
     "float32 update (use an optimizer's loss_scale_policy for float16 and AMP jobs)"),
    ("enable_cudnn", MEANINGLESS, _bool, _NO_CUDNN),
    # set through OneFlow's C++-registered job-conf attributes: stage-parallel (SSP) pipelining across devices
    ("enable_ssp", MEANINGLESS, _bool, _NO_STAGES),
    ("ssp_partition_strategy", MEANINGLESS, _anything, _NO_STAGES),
    ("ssp_partition_scope_ids", MEANINGLESS, _anything, _NO_STAGES),
    ("enable_pseudo_chain_merge", MEANINGLESS, _bool, "flowc has no task graph of chains to merge"),
    ("cudnn_buf_limit_mbyte", MEANINGLESS, _int, _NO_CUDNN),
    ("cudnn_conv_force_fwd_algo", MEANINGLESS, _int, _NO_CUDNN),
    ("cudnn_conv_force_bwd_data_algo", MEANINGLESS, _int, _NO_CUDNN),
    ("cudnn_conv_force_bwd_filter_algo", MEANINGLESS, _int, _NO_CUDNN),
    ("cudnn_conv_heuristic_search_algo", MEANINGLESS, _bool, _NO_CUDNN),
    ("cudnn_conv_use_deterministic_algo_only", MEANINGLESS, _bool, _NO_CUDNN),
    ("enable_cudnn_fused_normalization_add_relu", MEANINGLESS, _bool, _NO_CUDNN),
    ("cudnn_conv_enable_pseudo_half", MEANINGLESS, _bool, _NO_HALF),
    ("enable_cudnn_conv_pseudo_half", MEANINGLESS, _bool, _NO_HALF),
    ("cudnn_conv_enable_true_half", MEANINGLESS, _bool, _NO_HALF),
    ("enable_true_half_config_when_conv", MEANINGLESS, _bool, _NO_HALF),
    ("use_xla_jit", MEANINGLESS, _bool, _XRT),
    ("use_tensorrt", MEANINGLESS, _bool, _XRT),
    ("tensorrt.use_fp16", MEANINGLESS, _bool, _XRT),
    ("tensorrt.use_int8", MEANINGLESS, _bool, _XRT),
    ("tensorrt.int8_calibration", MEANINGLESS, _str, _XRT),
    ("enable_nccl", MEANINGLESS, _bool, _ENGINES),
    ("use_nccl_inter_node_communication", MEANINGLESS, _bool, _ENGINES),
    ("use_boxing_v2", MEANINGLESS, _bool, _OWN_COLLECTIVES),
    ("do_parallel_cast_before_widening_type_cast", MEANINGLESS, _bool, _OWN_COLLECTIVES),
    ("enable_all_reduce_group", MEANINGLESS, _bool, _BUCKETS),
    ("all_reduce_group_num", MEANINGLESS, _int, _BUCKETS),
    ("all_reduce_lazy_ratio", MEANINGLESS, _number, _BUCKETS),
    ("all_reduce_group_min_mbyte", MEANINGLESS, _int, _BUCKETS),
    ("all_reduce_group_size_warmup", MEANINGLESS, _number, _BUCKETS),
    ("all_reduce_fp16", MEANINGLESS, _bool,
     "flowc sums each gradient over the ranks in its own dtype, never narrowed to float16"),
    ("disable_all_reduce_sequence", MEANINGLESS, _bool, _BUCKETS),
    ("enable_non_distributed_optimizer", MEANINGLESS, _bool, _OPTIMIZER_SHARDS),
    ("non_distributed_optimizer_group_size_mbyte", MEANINGLESS, _int, _OPTIMIZER_SHARDS),
    ("optimizer_placement_optimization_mode", MEANINGLESS, _mode, _OPTIMIZER_SHARDS),
    ("optimizer_placement_optimization_threshold", MEANINGLESS, _int, _OPTIMIZER_SHARDS),
    ("train.optimizer_placement_optimization_mode", MEANINGLESS, _mode, _OPTIMIZER_SHARDS),
    ("train.optimizer_placement_optimization_threshold", MEANINGLESS, _int, _OPTIMIZER_SHARDS),
    ("enable_gradients_stats_aggregation", MEANINGLESS, _bool,
     "flowc computes its gradient statistics (clip_by_global_norm's norm, dynamic loss scaling's finite "
     "check) in its own kernels"),
    ("allow_cpu_return_op", MEANINGLESS, _bool, "results always come back to the host"),
    ("exp_run_conf", MEANINGLESS, _dict, "OneFlow's experimental-run settings have no counterpart"),
    ("static_mem_alloc_policy_white_list.has", MEANINGLESS, _anything, _OWN_MEMORY),
    ("static_mem_alloc_policy_white_list.add", MEANINGLESS, _anything, _OWN_MEMORY),
    ("static_mem_alloc_policy_white_list.remove", MEANINGLESS, _anything, _OWN_MEMORY),
    ("static_mem_alloc_policy_white_list.policy_mem_size_first", MEANINGLESS, _anything, _OWN_MEMORY),
    ("static_mem_alloc_policy_white_list.policy_mutual_exclusion_first", MEANINGLESS, _anything, _OWN_MEMORY),
    ("static_mem_alloc_policy_white_list.policy_time_line", MEANINGLESS, _anything, _OWN_MEMORY),
    ("static_mem_alloc_algo_white_list.show", MEANINGLESS, _anything, _OWN_MEMORY),
    ("qat.per_channel_weight_quantization", MEANINGLESS, _bool, "applies only with enable_qat, refused"),
    ("qat.symmetric", MEANINGLESS, _bool, "applies only with enable_qat, refused"),
    ("qat.moving_min_max_momentum", MEANINGLESS, _number, "applies only with enable_qat, refused"),
    ("qat.moving_min_max_stop_update_after_iters", MEANINGLESS, _int, "applies only with enable_qat, refused"),
    ("qat.target_backend", MEANINGLESS, _str, "applies only with enable_qat, refused"),
]
OPTIONS: dict[str, Option] = {name: Option(name, status, check, note) for name, status, check, note in _TABLE}
# Namespaces of nested options: "train", "tensorrt", ... (config.train.primary_lr(...)).
_NAMESPACES = {name.rsplit(".", 1)[0] for name in OPTIONS if "." in name}


def _unknown(name: str) -> AttributeError:
    """The error for an option no table row has, naming the closest option."""
    close = difflib.get_close_matches(name, list(OPTIONS) + sorted(_NAMESPACES), n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]!r}?" if close else "; docs/function_config.md lists every option"
    return AttributeError(f"function_config has no option {name!r}{hint}")


class _Setter:
    """`config.<option>`: call it to set the option (OneFlow's FunctionConfig setters)."""

    def __init__(self, config: FunctionConfig, option: Option) -> None:
        self._config = config
        self._option = option
        self.__doc__ = f"{option.name} ({option.status}): {option.note}"

    def __call__(self, value: Any = _NO_ARGUMENT) -> None:
        option = self._option
        if value is _NO_ARGUMENT and option.check not in (_bool, _refuse_true, _refuse, _anything):
            raise TypeError(f"function_config.{option.name}: expected a value "
                            f"({option.argument}), got no argument")
        self._config.values[option.name] = option.check(option.name, value)

    def __repr__(self) -> str:
        return f"<function_config.{self._option.name}: {self._option.status}>"


class _Namespace:
    """`config.train`, `config.tensorrt`, ...: holds the nested options."""

    def __init__(self, config: FunctionConfig, prefix: str) -> None:
        self._config = config
        self._prefix = prefix

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return self._config._lookup(f"{self._prefix}.{name}")


class FunctionConfig:
    """What `flow.function_config()` returns: every OneFlow FunctionConfig option, checked against `OPTIONS`.

    Example:
        config = flow.function_config()
        config.default_data_type(flow.float)
        config.default_placement_scope(flow.scope.placement("cpu", "0:0"))
        @flow.global_function(type="train", function_config=config)
        def train_job(...): ...
    """

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}      # option name -> checked value, for the options set

    def _lookup(self, name: str) -> Any:
        option = OPTIONS.get(name)
        if option is not None:
            return _Setter(self, option)
        if name in _NAMESPACES:
            return _Namespace(self, name)
        raise _unknown(name)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "values":    # copy/pickle probes, and before __init__ ran
            raise AttributeError(name)
        return self._lookup(name)

    # -- what the compiler and the runtime read ------------------------------------------------------
    @property
    def default_dtype(self) -> str:
        return self.values.get("default_data_type", "float32")

    @property
    def default_device(self) -> str | None:
        """The device tag of `default_placement_scope`, or None."""
        scope = self.values.get("default_placement_scope")
        return None if scope is None else scope.device_tag

    @property
    def logical_view(self) -> str:
        return self.values.get("default_logical_view", self.values.get("default_distribute_strategy",
                                                                        "consistent"))

    @property
    def auto_mixed_precision(self) -> bool:
        return bool(self.values.get("enable_auto_mixed_precision", False))

    @property
    def depth(self) -> int:
        return self.values.get("concurrency_width", DEFAULT_PIPELINE_DEPTH)

    @property
    def numerics_checked(self) -> bool:
        return self.values.get("check_numerics", False)

    @property
    def primary_lr(self) -> float | None:
        return self.values.get("train.primary_lr")

    @property
    def model_update_conf(self) -> dict | None:
        return self.values.get("train.model_update_conf")

    @property
    def trains(self) -> bool:
        """Does the config carry the old style's training settings (global_function(config))?"""
        return "train.primary_lr" in self.values or "train.model_update_conf" in self.values

    def check_for_job(self, job_name: str) -> None:
        """Checks that need several options, and the once-per-process warnings of recorded options;
        run when a job using this config is traced."""
        secondary = self.values.get("train.secondary_lr")
        if secondary is not None and secondary != self.primary_lr:
            raise OptionRefused(f"job {job_name!r}: function_config.train.secondary_lr({secondary}) differs from "
                                f"train.primary_lr({self.primary_lr}); flowc uses one learning rate for every "
                                "variable (OneFlow's secondary_lr applies to `bias` variables)")
        for name in (n for n, o in OPTIONS.items() if o.status == RECORDED):
            if self.values.get(name) and name not in _warned:
                _warned.add(name)
                warnings.warn(f"job {job_name!r}: function_config.{name} is recorded but not applied yet: "
                              f"{OPTIONS[name].note}", RuntimeWarning, stacklevel=_user_stacklevel())


_warned: set[str] = set()


def _user_stacklevel() -> int:
    import sys

    from flowc.compiler.trace import is_flowc_frame
    frame = sys._getframe(1)
    level = 1
    while frame is not None and is_flowc_frame(frame):
        frame, level = frame.f_back, level + 1    # type: ignore[assignment]
    return level


def markdown_table() -> str:
    """docs/function_config.md: the rule table as Markdown (a test checks the file is current)."""
    counts = {s: sum(o.status == s for o in OPTIONS.values()) for s in STATUSES}
    lines = [
        "# FunctionConfig options",
        "",
        "Generated from `runtime/function_config.py` (`OPTIONS`) by",
        "`python -m flowc.runtime.function_config > docs/function_config.md`; "
        "tests/test_function_config.py checks it is current.",
        "",
        "Statuses: **implemented** (flowc honours it); **recorded** (kept for the compiler, not applied yet: "
        "a job setting it warns once); **always** (a no-op: flowc always does this); **meaningless** "
        "(a no-op: no meaning in flowc); **refused** (setting it to a value that matters fails).",
        "",
        "Counts: " + ", ".join(f"{s} {counts[s]}" for s in STATUSES) + f"; {len(OPTIONS)} options.",
        "",
        "| option | status | argument | what flowc does |",
        "|---|---|---|---|",
    ]
    for option in OPTIONS.values():
        lines.append(f"| `{option.name}` | {option.status} | {option.argument} | {option.note} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown_table(), end="")
