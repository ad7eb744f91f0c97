"""A lowered job as a Graphviz DOT picture.

Forward, backward and update nodes get their own colours; each kernel of two or
more nodes is a cluster labelled with the kernel's name, so the picture shows
what fusion did.  Placeholders, variables and results have their own shapes.
"""
from __future__ import annotations

from flowc.compiler.ir import Node

# node role -> fill colour (the legend is drawn in the picture too)
ROLE_COLOURS = {"forward": "#dbe9f6", "backward": "#fde0c5", "update": "#d4efd4"}
# op -> node shape, for the values that enter or leave a step
OP_SHAPES = {"input": "invhouse", "variable": "cylinder", "scalar": "diamond", "constant": "plaintext"}


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


def _quote(text: str) -> str:
    return f'"{_escape(text)}"'


def _node_line(n: Node, outputs: set[int], assigned: dict[int, str]) -> str:
    rows = ([n.name] if n.name else []) + [f"%{n.id} {n.op}", str(n.type)]
    if n.id in assigned:
        rows.append(f"-> {assigned[n.id]}")
    label = '"' + "\\n".join(_escape(r) for r in rows) + '"'      # DOT's \n: a line break
    attrs = {"shape": OP_SHAPES.get(n.op, "box"), "style": "filled",
             "fillcolor": ROLE_COLOURS.get(n.role, "white"), "tooltip": n.loc}
    if n.id in outputs:
        attrs["penwidth"] = "2.5"
    return f"n{n.id} [label={label}, " + ", ".join(f"{k}={_quote(v)}" for k, v in attrs.items()) + "];"


def to_dot(program) -> str:
    """DOT text for a lowered `Program` (its graph, and its kernels as clusters)."""
    graph = program.graph
    outputs = set(graph.outputs)
    assigned = {node: var for var, node in graph.assigns.items()}
    legend = (f"{graph.name}: forward (blue), backward (orange), update (green); "
              "clusters are fused kernels; bold outline = result")
    lines = [f"digraph {_quote(graph.name)} {{",
             '  rankdir=TB; node [fontname=Helvetica, fontsize=10]; edge [color="#555555"];',
             f"  label={_quote(legend)}; labelloc=t;"]
    clustered: set[int] = set()
    for i, k in enumerate(program.kernels or []):
        members = [graph.node(n) for n in k.nodes()]
        if len(members) < 2:
            continue
        title = _quote(f"[{i}] {k.name}")
        lines.append(f'  subgraph cluster_{i} {{ label={title}; style=rounded; color="#7a7a7a";')
        lines.extend(f"    {_node_line(n, outputs, assigned)}" for n in members)
        lines.append("  }")
        clustered.update(n.id for n in members)
    lines.extend(f"  {_node_line(n, outputs, assigned)}" for n in graph.nodes if n.id not in clustered)
    for n in graph.nodes:
        lines.extend(f"  n{x} -> n{n.id};" for x in n.inputs)
    lines.append("}")
    return "\n".join(lines) + "\n"
