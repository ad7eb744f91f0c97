"""`flow.user_op_builder(name)`: OneFlow's builder of user ops, for the ops OneFlow has built in.

OneFlow's own model zoo builds some built-in ops through the builder rather than through their
layer functions (its Pix2Pix and SRGAN build `normalization` to name the batch norm's variables
themselves).  `BUILTIN_OPS` is the rule table: each op type flowc runs, its inputs, outputs and
attributes as OneFlow declares them, and the flowc ops it becomes.  An op type outside the table
(a custom C++ op, which needs OneFlow's op registry) fails at `.Build()` naming it; so does an
input, output or attribute the op does not have, or a required one left out.

Example:
    y = (flow.user_op_builder("act").Op("leaky_relu").Input("x", [x]).Output("y")
         .Attr("alpha", 0.1).Build().InferAndTryRun().RemoteBlobList()[0])
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from flowc.compiler.errors import TraceError, UnsupportedError
from flowc.compiler.trace import Blob, current, emit, user_location
from flow import math, nn
from flow._ops import check_blob
from flow.indexing import identity
from flow.layers import _normalize     # the layer's batch norm, given the variables

_REQUIRED = object()       # an attribute without a default: the builder must set it


@dataclass(frozen=True)
class BuiltinOp:
    """One built-in op type: its inputs (`optional` ones may be left out), the outputs it can make
    (`outputs[0]` is the one every call asks for; `made(attrs)`, when given, says which of them
    those attributes make), its attributes with their types and defaults (`_REQUIRED`: none), and
    `run(inputs, attrs, op_name) -> {output: Blob}`."""
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: dict[str, tuple[type, Any]]
    run: Callable[[dict[str, Blob], dict[str, Any], str], dict[str, Blob]]
    optional: tuple[str, ...] = ()
    made: Callable[[dict[str, Any]], tuple[str, ...]] | None = None


def _normalization(inputs: dict[str, Blob], attrs: dict[str, Any], op_name: str) -> dict[str, Blob]:
    api = 'flow.user_op_builder(...).Op("normalization")'
    x = inputs["x"]
    rank = len(x.shape)
    axis = attrs["axis"]
    if not -rank <= axis < rank:
        raise TraceError(f"{user_location()}: {api}: axis {axis} is out of range for shape {list(x.shape)}")
    axis %= rank
    for name, blob in inputs.items():
        if name != "x" and blob.shape != (x.shape[axis],):
            raise TraceError(f"{user_location()}: {api}: input {name!r} has shape {list(blob.shape)}; it needs "
                             f"one value per channel of axis {axis} of x {list(x.shape)}")
    variables = set(current(api).variable_nodes.values())
    for name in ("moving_mean", "moving_variance"):
        if attrs["training"] and inputs[name].id not in variables:
            raise TraceError(f"{user_location()}: {api}: in training the op updates {name!r}, so it must be a "
                             "variable (flow.get_variable)")
    y = _normalize(x, axis, attrs["momentum"], attrs["epsilon"], inputs.get("gamma"), inputs.get("beta"),
                  inputs["moving_mean"], inputs["moving_variance"], attrs["training"], op_name, api)
    outputs = {"y": y}
    if attrs["training"]:      # the batch's statistics, as OneFlow's op gives them in training
        reduce_axes = [d for d in range(rank) if d != axis]
        mean = math.reduce_mean(x, axis=reduce_axes)
        centered = x - math.reduce_mean(x, axis=reduce_axes, keepdims=True)
        variance = math.reduce_mean(centered * centered, axis=reduce_axes)
        outputs.update(mean=mean, inv_variance=math.rsqrt(variance + attrs["epsilon"]))
    return outputs


def _bias_add(inputs: dict[str, Blob], attrs: dict[str, Any], op_name: str) -> dict[str, Blob]:
    a, b = inputs["a"], inputs["b"]
    rank, axis = len(a.shape), attrs["axis"]
    if not -rank <= axis < rank or len(b.shape) != 1 or b.shape[0] != a.shape[axis]:
        raise TraceError(f"{user_location()}: flow.user_op_builder(...).Op(\"bias_add\"): b of shape "
                         f"{list(b.shape)} does not match axis {axis} of a {list(a.shape)}")
    shape = [1] * rank
    shape[axis % rank] = b.shape[0]
    return {"out": emit("add", [a, emit("reshape", [b], {"shape": tuple(shape)})], name=op_name)}


def _unary(function: Callable[..., Blob], arg: str, result: str) -> BuiltinOp:
    """An op of one input and one output and no attributes, run by `function(x, name=...)`."""
    return BuiltinOp((arg,), (result,), {}, lambda inputs, attrs, op_name: {result: function(inputs[arg],
                                                                                              name=op_name)})


# Op type -> how flowc runs it; the names of inputs, outputs and attributes are OneFlow 0.3's.
BUILTIN_OPS: dict[str, BuiltinOp] = {
    "normalization": BuiltinOp(
        ("x", "moving_mean", "moving_variance", "gamma", "beta"), ("y", "mean", "inv_variance"),
        {"axis": (int, _REQUIRED), "epsilon": (float, _REQUIRED), "training": (bool, _REQUIRED),
         "momentum": (float, 0.9)},
        _normalization, optional=("gamma", "beta"),
        made=lambda attrs: ("y", "mean", "inv_variance") if attrs["training"] else ("y",)),
    "leaky_relu": BuiltinOp(("x",), ("y",), {"alpha": (float, _REQUIRED)},
                            lambda inputs, attrs, op_name: {"y": nn.leaky_relu(inputs["x"], attrs["alpha"],
                                                                               name=op_name)}),
    "bias_add": BuiltinOp(("a", "b"), ("out",), {"axis": (int, _REQUIRED)}, _bias_add),
    "relu": _unary(nn.relu, "in", "out"),
    "sigmoid": _unary(math.sigmoid, "in", "out"),
    "tanh": _unary(math.tanh, "x", "y"),
    "identity": _unary(identity, "in", "out"),
    "softmax": _unary(nn.softmax, "in", "out"),
}


@dataclass
class UserOp:
    """What `.Build()` returns: `InferAndTryRun()` adds the op to the job, then `RemoteBlobList()`,
    `RemoteBlobDict()` or `SoleOutputBlob()` give its outputs in the order `.Output` named them."""
    op_name: str
    op_type: str
    inputs: dict[str, Blob]
    outputs: list[tuple[str, int]]
    attrs: dict[str, Any]
    results: dict[str, Blob] | None = None

    def InferAndTryRun(self) -> UserOp:  # noqa: N802 - OneFlow's name
        spec = BUILTIN_OPS[self.op_type]
        attrs = {name: self.attrs.get(name, default) for name, (_, default) in spec.attrs.items()}
        made = spec.made(attrs) if spec.made else spec.outputs
        for name, _ in self.outputs:
            if name not in made:
                raise TraceError(f"{user_location()}: {self._api()}: with these attributes the op makes only "
                                 f"{', '.join(made)}, not {name!r}")
        self.results = spec.run(self.inputs, attrs, self.op_name)
        return self

    def RemoteBlobList(self) -> tuple[Blob, ...]:  # noqa: N802 - OneFlow's name
        results = self._results()
        return tuple(results[name] for name, _ in self.outputs)

    def RemoteBlobDict(self) -> dict[str, list[Blob]]:  # noqa: N802 - OneFlow's name
        results = self._results()
        return {name: [results[name]] for name, _ in self.outputs}

    def SoleOutputBlob(self) -> Blob:  # noqa: N802 - OneFlow's name
        blobs = self.RemoteBlobList()
        if len(blobs) != 1:
            raise TraceError(f"{user_location()}: {self._api()}: SoleOutputBlob() of an op with {len(blobs)} "
                             "outputs; use RemoteBlobList()")
        return blobs[0]

    def _results(self) -> dict[str, Blob]:
        if self.results is None:
            raise TraceError(f"{user_location()}: {self._api()}: call .InferAndTryRun() before asking for its "
                             "outputs")
        return self.results

    def _api(self) -> str:
        return f"flow.user_op_builder({self.op_name!r}).Op({self.op_type!r})"


@dataclass
class UserOpConfBuilder:
    """What `flow.user_op_builder(op_name)` returns; each method returns the builder.

    Example:
        bn = (flow.user_op_builder("bn1").Op("normalization")
              .Input("x", [x]).Input("moving_mean", [mean]).Input("moving_variance", [variance])
              .Input("gamma", [gamma]).Input("beta", [beta]).Output("y")
              .Attr("axis", 1).Attr("epsilon", 1e-5).Attr("training", True).Attr("momentum", 0.99)
              .Build().InferAndTryRun().RemoteBlobList()[0])
    """
    op_name: str
    op_type: str | None = None
    inputs: dict[str, Blob] = field(default_factory=dict)
    outputs: list[tuple[str, int]] = field(default_factory=list)
    attrs: dict[str, Any] = field(default_factory=dict)

    def Op(self, op_type_name: str) -> UserOpConfBuilder:  # noqa: N802 - OneFlow's name
        """The op's type, one of `BUILTIN_OPS`."""
        self.op_type = op_type_name
        return self

    def OpName(self, op_name: str) -> UserOpConfBuilder:  # noqa: N802 - OneFlow's name
        self.op_name = _checked_name(op_name)
        return self

    def Input(self, input_name: str, input_blob_list) -> UserOpConfBuilder:  # noqa: N802 - OneFlow's name
        """Input `input_name`: a list of one Blob (flowc's built-in ops take one Blob per input)."""
        if not isinstance(input_blob_list, (list, tuple)) or len(input_blob_list) != 1:
            raise TraceError(f"{user_location()}: {self._api()}.Input({input_name!r}, ...): expected a list of "
                             f"one Blob, got {input_blob_list!r}")
        self.inputs[input_name] = check_blob(input_blob_list[0], f"{self._api()}.Input", input_name)
        return self

    def Output(self, output_name: str, num: int = 1) -> UserOpConfBuilder:  # noqa: N802 - OneFlow's name
        """Output `output_name` (one Blob: `num` must be 1 for flowc's built-in ops)."""
        if num != 1:
            raise TraceError(f"{user_location()}: {self._api()}.Output({output_name!r}, num={num!r}): the built-in "
                             "ops flowc runs have one Blob per output")
        self.outputs.append((output_name, num))
        return self

    def Attr(self, attr_name: str, attr_value: Any, attr_type_name: str | None = None) -> UserOpConfBuilder:  # noqa: N802
        """Attribute `attr_name` (OneFlow 0.3 deprecated `attr_type_name`; it is ignored here too)."""
        self.attrs[attr_name] = attr_value
        return self

    def Build(self) -> UserOp:  # noqa: N802 - OneFlow's name
        """Check the op against its row of `BUILTIN_OPS`, naming what does not fit."""
        api = self._api()
        table = BUILTIN_OPS
        if self.op_type is None:
            raise TraceError(f"{user_location()}: {api}: call .Op(op_type_name) before .Build()")
        if self.op_type not in table:
            raise UnsupportedError(f"{user_location()}: {api}: flowc has no op {self.op_type!r}. Through the "
                                   f"builder it runs OneFlow's built-in ops {', '.join(sorted(table))}; a custom "
                                   "C++ op needs OneFlow's op registry and runtime")
        spec = table[self.op_type]
        _check_names(api, "input", self.inputs, spec.inputs)
        _check_names(api, "output", [name for name, _ in self.outputs], spec.outputs)
        _check_names(api, "attribute", self.attrs, tuple(spec.attrs))
        missing = [name for name in spec.inputs if name not in self.inputs and name not in spec.optional]
        missing += [f"Attr({name!r})" for name, (_, default) in spec.attrs.items()
                    if default is _REQUIRED and name not in self.attrs]
        if not self.outputs:
            missing.append(f"Output({spec.outputs[0]!r})")
        if missing:
            raise TraceError(f"{user_location()}: {api}: missing {', '.join(missing)}")
        for name, value in self.attrs.items():
            kind = spec.attrs[name][0]
            # as OneFlow's Attr asserts: a float attribute takes a Python float, an int one an int
            if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
                raise TraceError(f"{user_location()}: {api}: Attr({name!r}) takes a {kind.__name__}, got {value!r}")
        return UserOp(self.op_name, self.op_type, dict(self.inputs), list(self.outputs), dict(self.attrs))

    def _api(self) -> str:
        kind = f".Op({self.op_type!r})" if self.op_type else ""
        return f"flow.user_op_builder({self.op_name!r}){kind}"


def _check_names(api: str, kind: str, given, known: tuple[str, ...]) -> None:
    for name in given:
        if name not in known:
            raise TraceError(f"{user_location()}: {api}: the op has no {kind} {name!r} (its {kind}s: "
                             f"{', '.join(known) or 'none'})")


def _checked_name(op_name: Any) -> str:
    if not isinstance(op_name, str) or not op_name:
        raise TraceError(f"{user_location()}: flow.user_op_builder: op_name must be a non-empty string, got "
                         f"{op_name!r}")
    return op_name


def user_op_builder(op_name: str) -> UserOpConfBuilder:
    """`flow.user_op_builder(op_name)`: build one of OneFlow's built-in ops by its op type (see
    `BUILTIN_OPS`); the op and its outputs are named `op_name` (inside `flow.scope.namespace`
    blocks, prefixed as every op is).

    Example:
        y = flow.user_op_builder("act").Op("relu").Input("in", [x]).Output("out").Build() \\
                .InferAndTryRun().SoleOutputBlob()
    """
    return UserOpConfBuilder(_checked_name(op_name))


# What docs/oneflow_compat.md says of it (tests/compat_table.py reads it).
user_op_builder.__flowc_scope__ = (  # type: ignore[attr-defined]
    f"OneFlow's built-in op types {', '.join(sorted(BUILTIN_OPS))} (flow/user_ops.py); any other op type "
    "raises UnsupportedError naming it (custom C++ ops need OneFlow's op registry)")
# On one device a consistent op is the op itself.
consistent_user_op_builder = user_op_builder
