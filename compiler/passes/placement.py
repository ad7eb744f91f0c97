"""Device placement: settle where each node runs, and make every device crossing explicit.

Nodes carry the device of the `flow.scope.placement` they were traced under (`node.type.device`).
Not every node was traced under one, so the devices are settled first:

* sources (placeholders, variables, runtime scalars) and constants have no device of their
  own: the runtime puts them where their readers are.  A reshape is where its input is,
  a device_copy where it copies to;
* a forward op runs where it was placed;
* a backward or update node is created by autodiff outside any placement scope; it runs with
  the forward values it differentiates: on the device of its first input that a forward op
  placed, else of its first input with any device (the incoming gradient).  One that reads
  only sources stays without a device, like a constant.

Then, wherever an op reads a value computed on the other device, a `device_copy` node is put
between them (one per value and destination), so the IR dump shows every crossing.

A graph with no node off the host is returned unchanged (the very same object): all-CPU jobs
do not pay for this pass.
"""
from __future__ import annotations

from flowc.compiler.backends import HOST_DEVICE
from flowc.compiler.ir import Graph, GraphBuilder
from flowc.compiler.ops import OPS

UNPLACED_OPS = ("input", "variable", "scalar", "constant")


def needs_placement(graph: Graph) -> bool:
    """Does any node ask for a device other than the host?"""
    return any(n.type.device != HOST_DEVICE for n in graph.nodes)


def settle_devices(graph: Graph) -> dict[int, str | None]:
    """node id -> the device it runs on, or None for a value with no device of its own."""
    device: dict[int, str | None] = {}
    placed_forward: set[int] = set()
    for n in graph.nodes:
        kind = OPS[n.op].kind
        if n.op in UNPLACED_OPS:
            device[n.id] = None
        elif n.op == "device_copy":      # already placed (a graph lowered before): it lands on `dst`
            device[n.id] = n.attr("dst")
            placed_forward.add(n.id)
        elif kind == "view":
            device[n.id] = device[n.inputs[0]]
            if n.inputs[0] in placed_forward:
                placed_forward.add(n.id)
        elif n.role == "forward":
            device[n.id] = n.type.device
            placed_forward.add(n.id)
        else:
            forward = [device[i] for i in n.inputs if i in placed_forward]
            placed = [device[i] for i in n.inputs if device[i] is not None]
            device[n.id] = (forward or placed or [None])[0]
    return device


def insert_device_copies(graph: Graph) -> Graph:
    """Settle devices and put a `device_copy` on every edge between two devices.

    Example (a dense layer on the GPU feeding a softmax placed on the CPU):
        %7: float32[100x10] = matmul(%3, %5)               <- gpu
        %9: float32[100x10] = device_copy(%7) {dst='cpu', src='gpu'}
        %10: float32[100x10] = softmax(%9)                 <- cpu
    """
    if not needs_placement(graph):
        return graph
    device = settle_devices(graph)
    builder = GraphBuilder()
    new_id: dict[int, int] = {}
    copies: dict[tuple[int, str], int] = {}
    for n in graph.nodes:
        here = device[n.id]
        inputs = []
        for i in n.inputs:
            there = device[i]
            moved = new_id[i]
            if here is not None and there is not None and there != here and OPS[n.op].kind != "view":
                if (i, here) not in copies:
                    copies[(i, here)] = builder.add("device_copy", [moved], {"src": there, "dst": here},
                                                    loc=n.loc, role=n.role, device=here)
                moved = copies[(i, here)]
            inputs.append(moved)
        new_id[n.id] = builder.add(n.op, inputs, n.attr_dict, loc=n.loc, name=n.name, role=n.role,
                                   device=here or n.type.device)
    return Graph(graph.name, builder.nodes, [new_id[o] for o in graph.outputs],
                 {v: new_id[i] for v, i in graph.assigns.items()}, dict(graph.variables),
                 dict(graph.scalars), [new_id[p] for p in graph.placeholders])
