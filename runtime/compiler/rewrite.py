"""Graph rewrites before shape inference: pass-through nodes dropped, Constant nodes as weights,
Conv+BatchNormalization folding, a bias Add folded into its Conv, activation fusion, a residual
Add fused into the Conv before it.

Each rewrite takes the topologically ordered node list and the weights dict,
returns a new node list, and may add weights (anonymous arrays: packed weights).
The loader's Graph is never mutated. Each can be switched off in SessionOptions.
"""

import hashlib

import numpy as np

from ..ir import Graph, Node
from ..weights import ExternalData, weight_array
from ..ops.activation import FUSABLE
from ..ops.registry import FUSED


def weight_identity(value):
    """A file weight's id, or a digest of an array's bytes: what a packed value's name is made of."""
    if value is None:
        return "-"
    if isinstance(value, ExternalData):
        return f"w{value.id}"
    array = np.ascontiguousarray(value)
    return f"{array.dtype.str}{array.shape}:" + hashlib.sha256(array.tobytes()).hexdigest()[:16]


def _folded(w, b, bn_params, eps):
    """(W', B') of a Conv with the BatchNormalization after it folded in."""
    w = weight_array(w)
    scale, bias, mean, var = (weight_array(p).astype(np.float64) for p in bn_params)
    factor = scale / np.sqrt(var + eps)
    b = weight_array(b).astype(np.float64) if b is not None else np.zeros(w.shape[0])
    new_w = (w * factor.reshape((-1,) + (1,) * (w.ndim - 1)).astype(w.dtype)).astype(w.dtype)
    return new_w, ((b - mean) * factor + bias).astype(w.dtype)


def _consumers(nodes):
    users = {}
    for i, node in enumerate(nodes):
        for name in node.inputs:
            if name:
                users.setdefault(name, []).append(i)
    return users


def _single_use(name, users, graph_outputs):
    return len(users.get(name, ())) == 1 and name not in graph_outputs


def _convs_and_their_reader(nodes, users, graph_outputs, op_type):
    """(i, conv, j, reader) for each Conv whose one output is read by one node only, of `op_type`
    (and is not a graph output): the shape both folds look for."""
    for i, conv in enumerate(nodes):
        if conv.op_type != "Conv" or conv.domain or len(conv.outputs) != 1:
            continue
        y = conv.outputs[0]
        if not _single_use(y, users, graph_outputs):
            continue
        j = users[y][0]
        if nodes[j].op_type == op_type and not nodes[j].domain:
            yield i, conv, j, nodes[j]


def fold_batchnorm(nodes, weights, graph_outputs, copied=lambda weight: None, keep=None):
    """Conv -> BatchNormalization (inference, constant parameters) becomes one Conv.

    W' = W * scale / sqrt(var + eps) per output channel, B' = (B - mean) * that + bias.
    The new W' and B' are packed weights, made by `keep(name, make)` when given (a
    weight cache, which may hold them already and then does not make them); `copied`
    is told of each original that no other node reads, so its mapped pages can go at once.
    """
    keep = keep or (lambda name, make: make())
    users = _consumers(nodes)
    fused_into = {}  # index of a BatchNormalization -> replacement Conv
    dropped = set()
    for i, conv, j, bn in _convs_and_their_reader(nodes, users, graph_outputs, "BatchNormalization"):
        if bn.inputs[0] != conv.outputs[0]:
            continue
        if bn.attrs.get("training_mode", 0) or any(o for o in bn.outputs[1:]):
            continue
        params = conv.inputs[1:3] + bn.inputs[1:5]
        if len(conv.inputs) < 2 or not all(p in weights for p in params if p) or len(bn.inputs) < 5:
            continue
        w = weights[conv.inputs[1]]
        b = weights[conv.inputs[2]] if len(conv.inputs) > 2 and conv.inputs[2] else None
        stats = [weights[p] for p in bn.inputs[1:5]]
        # Anything but float weights and one float per output channel is left to the kernels'
        # shape rules, which refuse it by name.
        if np.dtype(w.dtype).kind != "f" or len(w.shape) < 2 \
                or any(tuple(v.shape) != (w.shape[0],) or np.dtype(v.dtype).kind != "f" for v in stats) \
                or not isinstance(bn.attrs.get("epsilon", 1e-5), float):
            continue
        if b is not None and (tuple(b.shape) != (w.shape[0],) or np.dtype(b.dtype).kind != "f"):
            continue
        eps = bn.attrs.get("epsilon", 1e-5)
        name = (f"fold_batchnorm/eps={eps!r}/"
                + "/".join(weight_identity(v) for v in (w, b, *(weights[p] for p in bn.inputs[1:5]))))
        new_w, new_b = keep(name, lambda: _folded(w, b, [weights[p] for p in bn.inputs[1:5]], eps))
        if len(users.get(conv.inputs[1], ())) == 1:
            copied(weights[conv.inputs[1]])
        base = conv.name or conv.outputs[0]
        w_name, b_name = f"{base}/bn_folded_weight", f"{base}/bn_folded_bias"
        weights[w_name] = new_w
        weights[b_name] = new_b
        fused_into[j] = Node(conv.name, "Conv", "", [conv.inputs[0], w_name, b_name],
                             [bn.outputs[0]], dict(conv.attrs), conv.index)
        dropped.add(i)
    out = []
    for i, node in enumerate(nodes):
        if i in dropped:
            continue
        out.append(fused_into.get(i, node))
    return out


def fold_conv_bias(nodes, weights, graph_outputs, copied=lambda weight: None, keep=None):
    """Conv -> Add of a constant per output channel (Paddle's exports write every bias so)
    becomes one Conv whose bias is the sum: the activation after the Add then fuses into the
    Conv, and with compiled kernels bias and activation are one pass. `keep` and `copied` as
    in fold_batchnorm."""
    keep = keep or (lambda name, make: make())
    users = _consumers(nodes)
    producers = {name: node for node in nodes for name in node.outputs}
    fused_into, dropped = {}, set()
    for i, conv, j, add in _convs_and_their_reader(nodes, users, graph_outputs, "Add"):
        y = conv.outputs[0]
        if len(conv.inputs) < 2 or conv.inputs[1] not in weights or len(add.inputs) != 2 or len(set(add.inputs)) < 2:
            continue
        constant = add.inputs[1] if add.inputs[0] == y else add.inputs[0]
        bias_name = conv.inputs[2] if len(conv.inputs) > 2 else ""
        c = weights[constant] if constant in weights else _reshaped_weight(producers.get(constant), weights)
        w, b = weights[conv.inputs[1]], weights.get(bias_name) if bias_name else None
        if c is None or (bias_name and b is None) or not _per_output_channel(c, w):
            continue
        if b is not None and (tuple(b.shape) != (w.shape[0],) or b.dtype != w.dtype):
            continue
        name = "fold_conv_bias/" + "/".join(weight_identity(v) for v in (b, c)) + f"/{w.shape[0]}"
        new_b = keep(name, lambda: _bias_sum(b, c, w.shape[0], w.dtype))
        if len(users.get(constant, ())) == 1:
            copied(c)
        if b is not None and len(users.get(bias_name, ())) == 1:
            copied(b)
        b_name = f"{conv.name or y}/folded_bias"
        weights[b_name] = new_b
        fused_into[j] = Node(conv.name, "Conv", "", [conv.inputs[0], conv.inputs[1], b_name], [add.outputs[0]],
                             dict(conv.attrs), conv.index)
        dropped.add(i)
    return [fused_into.get(i, node) for i, node in enumerate(nodes) if i not in dropped]


def _per_output_channel(c, w):
    """Whether constant c, added to the output of a Conv of weight w (Cout, Cin/g, *kernel), is
    one value per output channel (or one in all) that leaves the output's shape as it is: shape
    (1, Cout or 1, 1, ...) of the output's rank, or that without the leading 1."""
    rank, shape = len(w.shape), tuple(c.shape)
    if c.dtype != w.dtype or np.dtype(w.dtype).kind != "f" or rank < 3 or len(shape) > rank:
        return False
    if all(d == 1 for d in shape):  # one value in all
        return True
    if len(shape) == rank:  # (1, C, 1, ...): drop the batch
        if shape[0] != 1:
            return False
        shape = shape[1:]
    return len(shape) == rank - 1 and shape[0] == w.shape[0] and all(d == 1 for d in shape[1:])


def _reshaped_weight(node, weights):
    """The value of a Reshape of a weight by a constant shape (Paddle writes a squeeze-excite
    block's biases so, (C,) into (1, C, 1, 1)), or None. A shape that copies a dimension (0) or does
    not fit is left to the Reshape kernel, which names what is wrong."""
    if node is None or node.op_type != "Reshape" or node.domain or len(node.inputs) != 2 \
            or not all(name in weights for name in node.inputs):
        return None
    data, shape = (weight_array(weights[name]) for name in node.inputs)
    if shape.ndim != 1 or shape.dtype != np.int64 or data.size > 1 << 16 or np.any(shape == 0):
        return None
    try:
        return data.reshape(tuple(int(d) for d in shape))
    except ValueError:
        return None


def _bias_sum(b, c, channels, dtype):
    """The Conv's bias (or zero) plus the Add's constant, one per output channel."""
    total = np.broadcast_to(weight_array(c).reshape(-1), (channels,)).astype(dtype)
    return total if b is None else (weight_array(b) + total).astype(dtype)


_CONSTANT_VALUES = {"value": None, "value_float": np.float32, "value_floats": np.float32,
                    "value_int": np.int64, "value_ints": np.int64}


def drop_identities(nodes, graph_outputs):
    """Identity, and Dropout at inference, hand their input on: the nodes that read their output
    read the input itself, and the node goes. One whose output is a graph output stays (the
    output is named by it), and so does a Dropout given training_mode (it checks the value) or
    asked for its mask. A node with subgraphs reads its captured values by position (`_captured`
    names them), so renaming its inputs is safe too."""
    renamed, kept = {}, []
    for node in nodes:
        node = renamed_inputs(node, renamed)
        if passes_through(node) and node.inputs[0] and node.outputs[0] not in graph_outputs:
            renamed[node.outputs[0]] = node.inputs[0]
            continue
        kept.append(node)
    return kept


def renamed_inputs(node, renamed):
    """`node` reading renamed[name] for each input name that `renamed` holds (itself if none)."""
    inputs = [renamed.get(name, name) for name in node.inputs]
    if inputs == node.inputs:
        return node
    return Node(node.name, node.op_type, node.domain, inputs, list(node.outputs), node.attrs, node.index)


def passes_through(node):
    """Whether `node` hands its first input on unchanged: Identity, and Dropout at inference."""
    if node.domain or not node.inputs or len(node.outputs) < 1:
        return False
    if node.op_type == "Identity":
        return len(node.outputs) == 1
    if node.op_type == "Dropout":
        mask = len(node.outputs) > 1 and node.outputs[1]
        training = len(node.inputs) > 2 and node.inputs[2]
        return not mask and not training
    return False


def constants_as_weights(nodes, weights, graph_outputs):
    """Constant nodes of a numeric value become weights (what an initializer would have been),
    so the rewrites after this one see them: Paddle exports give BatchNormalization's
    parameters as Constant nodes. A value given as a tensor stays where the loader put it
    (a view of the mapped file); the node is dropped. Strings, sparse values and graph
    outputs are left to the Constant kernel."""
    out = []
    for node in nodes:
        given = [k for k in node.attrs if not k.startswith("_")]
        if (node.op_type != "Constant" or node.domain or len(given) != 1 or given[0] not in _CONSTANT_VALUES
                or len(node.outputs) != 1 or node.outputs[0] in graph_outputs or node.outputs[0] in weights):
            out.append(node)
            continue
        key = given[0]
        value = node.attrs[key]
        if key == "value":
            if np.dtype(value.dtype).kind not in "biufc":
                out.append(node)
                continue
        else:
            value = np.array(value, dtype=_CONSTANT_VALUES[key])
            value = value.reshape(-1) if key.endswith("s") else value
        weights[node.outputs[0]] = value
    return out


def _activation_params(node, weights):
    """(op_type, params) for a fusable activation node, or None if it cannot be fused."""
    if node.op_type == "Clip":
        params = {"min": node.attrs.get("min"), "max": node.attrs.get("max")}
        for key, name in zip(("min", "max"), node.inputs[1:3]):
            if not name:
                continue
            if name not in weights:
                return None
            bound = weight_array(weights[name])
            if bound.size != 1 or bound.ndim > 1 or bound.dtype.kind not in "iuf":
                return None  # not a scalar: Clip's own shape rule refuses it by name
            params[key] = float(bound.reshape(()))
        if params["min"] is None and "min" in node.attrs:
            params["min"] = node.attrs["min"]
        return ("Clip", params)
    keep = {"LeakyRelu": ("alpha",), "HardSigmoid": ("alpha", "beta")}.get(node.op_type, ())
    return (node.op_type, {k: node.attrs[k] for k in keep if k in node.attrs})


def fuse_activations(nodes, weights, graph_outputs, producers=("Conv", "Gemm", "MatMul", "Add")):
    """Producer -> activation becomes the producer applying the activation in place."""
    users = _consumers(nodes)
    replaced = {}
    dropped = set()
    for i, prod in enumerate(nodes):
        if prod.op_type not in producers or prod.domain or len(prod.outputs) != 1:
            continue
        if "_activation" in prod.attrs:
            continue
        y = prod.outputs[0]
        if not _single_use(y, users, graph_outputs):
            continue
        j = users[y][0]
        act = nodes[j]
        if act.op_type not in FUSABLE or act.domain not in ("", FUSED) or act.inputs[0] != y:
            continue
        activation = _activation_params(act, weights)
        if activation is None:
            continue
        attrs = dict(prod.attrs)
        attrs["_activation"] = activation
        replaced[j] = Node(prod.name, prod.op_type, "", list(prod.inputs), [act.outputs[0]], attrs,
                           prod.index)
        dropped.add(i)
    return [replaced.get(i, n) for i, n in enumerate(nodes) if i not in dropped]


def fuse_residual(nodes, graph_outputs):
    """Conv -> Add of another value (a residual connection), the Add's fused activation with it,
    becomes one Conv that adds that value before the activation, where the Add stood: the
    compiled epilogue makes bias, residual and activation one pass over the output instead of
    three, and the Conv's output is the block's (one tensor fewer live). The Conv's inputs are
    (X, W, B or "", the residual), marked by `_residual`; Conv.infer checks the shapes."""
    users = _consumers(nodes)
    replaced = {}
    dropped = set()
    for i, conv, j, add in _convs_and_their_reader(nodes, users, graph_outputs, "Add"):
        y = conv.outputs[0]
        if "_activation" in conv.attrs or "_residual" in conv.attrs or len(add.inputs) != 2:
            continue
        other = add.inputs[1] if add.inputs[0] == y else add.inputs[0]
        if not other or other == y or len(conv.inputs) < 2:
            continue
        attrs = dict(conv.attrs, _residual=True)
        if "_activation" in add.attrs:
            attrs["_activation"] = add.attrs["_activation"]
        bias = conv.inputs[2] if len(conv.inputs) > 2 else ""
        if j in replaced:  # both operands are convolutions: the later one takes the Add
            dropped.discard(replaced[j][0])
        replaced[j] = (i, Node(conv.name, "Conv", "", [conv.inputs[0], conv.inputs[1], bias, other],
                               [add.outputs[0]], attrs, conv.index))
        dropped.add(i)
    return [replaced[i][1] if i in replaced else n for i, n in enumerate(nodes) if i not in dropped]


def free_names(graph):
    """Names a (sub)graph reads but does not define: the outer-scope values it captures."""
    defined = {v.name for v in graph.inputs} | set(graph.initializers)
    free = []
    for node in graph.nodes:
        used = list(node.inputs)
        for value in node.attrs.values():
            for sub in value if isinstance(value, list) else [value]:
                if isinstance(sub, Graph):
                    used.extend(free_names(sub))
        for name in used:
            if name and name not in defined and name not in free:
                free.append(name)
        defined.update(n for n in node.outputs if n)
    free.extend(v.name for v in graph.outputs if v.name not in defined and v.name not in free)
    return free


def capture_outer_values(nodes):
    """Nodes with subgraphs (If, Loop, Scan) read outer-scope values implicitly; make that explicit.

    The captured names are appended to the node's inputs, so ordering, lifetimes
    and the arena see them, and listed in the attribute `_captured` for the kernel.
    """
    out = []
    for node in nodes:
        subgraphs = [g for v in node.attrs.values() for g in (v if isinstance(v, list) else [v])
                     if isinstance(g, Graph)]
        if not subgraphs:
            out.append(node)
            continue
        captured = []
        for g in subgraphs:
            for name in free_names(g):
                if name not in captured:
                    captured.append(name)
        attrs = dict(node.attrs, _captured=captured)
        out.append(Node(node.name, node.op_type, node.domain, list(node.inputs) + captured,
                        list(node.outputs), attrs, node.index))
    return out
