"""An If whose condition is known at PREPARE becomes the nodes of the branch it takes.

Exporters write shape tests as If nodes (silero VAD: "is the batch 1? then Squeeze"),
and a plan is made for concrete shapes, so most conditions fold. Run as an If, each
costs a body executor per run (a plan lookup, an arena, a step loop), and the body's
weights, which it reads from the outer scope, are fed to it rather than known, so what
it computes from them (an LSTM's Slice/Concat of its weights) is computed every run.
Inlined, the branch's nodes are the graph's own: they fold, fuse and are placed like
any other, and the node that makes each branch output writes the If's output itself.

Names are kept as the branch has them, which ONNX makes unique against the outer
scope; an If whose branch defines a name the graph knows already (two sibling branches
alike) stays an If.
"""

from ..ir import Graph, Node
from .rewrite import capture_outer_values


def taken_branch(node, cond, defined):
    """The branch graph an If takes, when its condition `cond` (a TensorInfo or None) is
    known and the branch's names are free of `defined`; else None."""
    if node.op_type != "If" or node.domain or cond is None or cond.value is None or cond.value.size != 1:
        return None
    branch = node.attrs.get("then_branch" if bool(cond.value.reshape(-1)[0]) else "else_branch")
    if not isinstance(branch, Graph) or len(branch.outputs) < len([o for o in node.outputs if o]):
        return None
    names = set(branch.initializers) | {o for n in branch.nodes for o in n.outputs if o}
    if names & defined:
        return None
    return branch


def inlined(node, branch):
    """(nodes, weights) that stand for `node` taking `branch`: the branch's nodes (outer values
    their own subgraphs read made explicit), the node that makes a branch output writing the If's
    output itself; an Identity hands on an output the branch does not make (an outer value, one
    of its initializers) or makes for a second output too."""
    nodes = capture_outer_values(list(branch.nodes))
    made = {name for n in nodes for name in n.outputs if name}
    renamed = {}  # branch output -> the If output its node now writes
    for inner, outer in zip(branch.outputs, node.outputs):
        if outer and inner.name in made and inner.name not in renamed:
            renamed[inner.name] = outer
    if renamed:  # a node's subgraphs read their captured values as inputs: renaming those is enough
        nodes = [Node(n.name, n.op_type, n.domain, [renamed.get(i, i) for i in n.inputs],
                      [renamed.get(o, o) for o in n.outputs], n.attrs, n.index) for n in nodes]
    for k, (inner, outer) in enumerate(zip(branch.outputs, node.outputs)):
        if outer and renamed.get(inner.name) != outer:
            nodes.append(Node(f"{node.name or 'If'}/output{k}", "Identity", "", [renamed.get(inner.name, inner.name)],
                              [outer], {}, node.index))
    return nodes, dict(branch.initializers)
