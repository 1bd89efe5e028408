"""Activations that exporters write out op by op, recognised and run as one kernel: `fuse_patterns`.

    GELU       x * 0.5 * (1 + Erf(x / sqrt 2))      Div|Mul, Erf, Add, Mul, Mul (any order of the Muls)
               or its tanh form, x * 0.5 * (1 + Tanh(sqrt(2/pi) * (x + 0.044715 x^3)))
    HardSwish  x * Clip(x + 3, 0, 6) / 6            Add, Clip, Mul, Div|Mul;  or x * HardSigmoid(x, 1/6, 1/2)
    HardSigmoid Clip(x + 3, 0, 6) / 6, Clip(a x + b, 0, 1)   Add, Clip, Div|Mul;  Mul, Add, Clip
    SiLU       x * Sigmoid(x)                       Sigmoid, Mul
    Attention  softmax(q @ k_t [* or / c] [+ mask]) @ v      MatMul, Div|Mul, Add, Softmax, MatMul (nnrun's
               ScaledDotProductAttention: the scores one scratch buffer, worked in place)
    LayerNorm  (x - mean) / sqrt(var + eps) * scale + bias, over the last axes:
               ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt, Div, Mul[, Add]  (Paddle and PyTorch
               exports before opset 17)

Each pass over the tensor costs its whole size in memory traffic; the pattern's four or five
become one kernel's (GELU: the fused kernel works in L2-sized blocks). The fused node is an op
of the domain FUSED, whose kernels are the ONNX ones (Gelu, HardSwish, Swish) registered for
every opset; it takes the name and index of the pattern's last node, so errors and profiles
still name a node of the file. A value inside a pattern that anything else reads (or a graph
output) leaves the pattern as it is.
"""

import math

import numpy as np

from ..ir import Node
from ..ops.registry import FUSED
from ..weights import weight_array


def _constant(name, weights):
    """The scalar value of weight `name` (any shape of one element), or None."""
    if name not in weights:
        return None
    value = np.asarray(weight_array(weights[name]))
    if value.size != 1 or value.dtype.kind != "f":
        return None
    return float(value.reshape(-1)[0])


def _near(value, target):
    return value is not None and math.isclose(value, target, rel_tol=1e-5, abs_tol=1e-7)


class _Graph:
    """Who reads each value, what the weights are: the queries a pattern asks."""

    def __init__(self, nodes, weights, graph_outputs):
        self.nodes, self.weights, self.outputs = nodes, weights, graph_outputs
        self.readers, self.producer = {}, {}
        for i, node in enumerate(nodes):
            for name in node.inputs:
                if name:
                    self.readers.setdefault(name, []).append(i)
            for name in node.outputs:
                self.producer[name] = i

    def only_reader(self, value, op_type):
        """The node (index) that alone reads `value`, when it is a plain `op_type`; else None."""
        readers = self.readers.get(value, ())
        if len(readers) != 1 or value in self.outputs:
            return None
        node = self.nodes[readers[0]]
        return readers[0] if node.op_type == op_type and not node.domain else None

    def other_input(self, node, value):
        """The input of a two-input node that is not `value` (None if both or neither are)."""
        if len(node.inputs) != 2 or node.inputs.count(value) != 1:
            return None
        return node.inputs[1] if node.inputs[0] == value else node.inputs[0]

    def scalar_operand(self, node, value, target):
        """Whether the other operand of two-input `node` beside `value` is the constant `target`."""
        return _near(_constant(self.other_input(node, value), self.weights), target)


def _gelu(g, i):
    """GELU from Erf at index i: [indices of the pattern's nodes], input x, output; or None."""
    erf = g.nodes[i]
    if len(erf.inputs) != 1:
        return None
    scaled = erf.inputs[0]
    first = g.producer.get(scaled)
    if first is None:
        return None
    head = g.nodes[first]
    if head.domain or g.only_reader(scaled, "Erf") is None or len(head.inputs) != 2:
        return None
    x = head.inputs[0]
    if not ((head.op_type == "Div" and _near(_constant(head.inputs[1], g.weights), math.sqrt(2)))
            or (head.op_type == "Mul" and g.scalar_operand(head, x, 1 / math.sqrt(2)))):
        return None
    tail = _half_x_times_one_plus(g, erf.outputs[0], x)
    return None if tail is None else ([first, i] + tail[0], x, tail[1])


def _gelu_tanh(g, i):
    """GELU's tanh form from the Tanh at index i: x/2 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))),
    the cube a Pow(x, 3) or x * (x * x)."""
    tanh = g.nodes[i]
    scaled = tanh.inputs[0]
    outer = g.producer.get(scaled)
    if outer is None or g.only_reader(scaled, "Tanh") != i or g.nodes[outer].op_type != "Mul":
        return None
    inner = next((n for n in g.nodes[outer].inputs if _constant(n, g.weights) is None), None)
    if inner is None or not g.scalar_operand(g.nodes[outer], inner, math.sqrt(2 / math.pi)):
        return None
    add = g.producer.get(inner)
    if add is None or g.only_reader(inner, "Mul") != outer or g.nodes[add].op_type != "Add" \
            or len(g.nodes[add].inputs) != 2:
        return None
    for x, term in (g.nodes[add].inputs, reversed(g.nodes[add].inputs)):
        cube = _cube_term(g, term, x, add)
        if cube is not None:
            tail = _half_x_times_one_plus(g, tanh.outputs[0], x)
            if tail is None:
                return None
            return cube + [add, outer, i] + tail[0], x, tail[1]
    return None


def _cube_term(g, term, x, add):
    """The nodes of `term` = 0.044715 * x^3, read by the Add at `add` alone; else None."""
    times = g.producer.get(term)
    if times is None or g.only_reader(term, "Add") != add or g.nodes[times].op_type != "Mul":
        return None
    cubed = next((n for n in g.nodes[times].inputs if _constant(n, g.weights) is None), None)
    if cubed is None or not g.scalar_operand(g.nodes[times], cubed, 0.044715):
        return None
    power = g.producer.get(cubed)
    if power is None or g.only_reader(cubed, "Mul") != times:
        return None
    node = g.nodes[power]
    if node.op_type == "Pow" and node.inputs[0] == x and _near(_constant(node.inputs[1], g.weights), 3.0):
        return [power, times]
    if node.op_type == "Mul" and x in node.inputs and not node.domain:  # x * (x * x)
        square = g.other_input(node, x)
        squared = g.producer.get(square)
        if (squared is not None and g.only_reader(square, "Mul") == power
                and g.nodes[squared].inputs == [x, x]):
            return [squared, power, times]
    return None


def _half_x_times_one_plus(g, value, x):
    """From `value` (erf or tanh of the scaled x): 1 + it, times x, times 0.5, in any of the
    orders exporters write; ([the nodes], output) or None."""
    add = g.only_reader(value, "Add")
    if add is None or not g.scalar_operand(g.nodes[add], value, 1.0):
        return None
    one_plus = g.nodes[add].outputs[0]
    mul = g.only_reader(one_plus, "Mul")
    if mul is None:
        return None
    other = g.other_input(g.nodes[mul], one_plus)
    if other == x:  # (1 + erf) * x, then * 0.5
        half = g.only_reader(g.nodes[mul].outputs[0], "Mul")
        if half is None or not g.scalar_operand(g.nodes[half], g.nodes[mul].outputs[0], 0.5):
            return None
        return [add, mul, half], g.nodes[half].outputs[0]
    if _near(_constant(other, g.weights), 0.5):  # (1 + erf) * 0.5, then * x
        times_x = g.only_reader(g.nodes[mul].outputs[0], "Mul")
        if times_x is None or g.other_input(g.nodes[times_x], g.nodes[mul].outputs[0]) != x:
            return None
        return [add, mul, times_x], g.nodes[times_x].outputs[0]
    halved = g.producer.get(other)  # (x * 0.5) * (1 + erf)
    if (halved is None or g.only_reader(other, "Mul") is None or g.nodes[halved].op_type != "Mul"
            or not g.scalar_operand(g.nodes[halved], x, 0.5)):
        return None
    return [halved, add, mul], g.nodes[mul].outputs[0]


def _clip_bounds(g, node):
    lo, hi = node.attrs.get("min"), node.attrs.get("max")
    if len(node.inputs) > 1 and node.inputs[1]:
        lo = _constant(node.inputs[1], g.weights)
    if len(node.inputs) > 2 and node.inputs[2]:
        hi = _constant(node.inputs[2], g.weights)
    return lo, hi


def _hard_swish(g, i):
    """HardSwish from the Add at index i (x + 3), or from a HardSigmoid(1/6, 1/2) at index i."""
    node = g.nodes[i]
    if node.op_type == "HardSigmoid":
        if not (_near(node.attrs.get("alpha", 0.2), 1 / 6) and _near(node.attrs.get("beta", 0.5), 0.5)):
            return None
        x = node.inputs[0]
        mul = g.only_reader(node.outputs[0], "Mul")
        if mul is None or g.other_input(g.nodes[mul], node.outputs[0]) != x:
            return None
        return [i, mul], x, g.nodes[mul].outputs[0]
    if len(node.inputs) != 2:
        return None
    x = next((n for n in node.inputs if _constant(n, g.weights) is None), None)
    if x is None or not g.scalar_operand(node, x, 3.0):
        return None
    clip = g.only_reader(node.outputs[0], "Clip")
    if clip is None or g.nodes[clip].inputs[0] != node.outputs[0]:
        return None
    lo, hi = _clip_bounds(g, g.nodes[clip])
    if not (_near(lo, 0.0) and _near(hi, 6.0)):
        return None
    relu6 = g.nodes[clip].outputs[0]
    mul = g.only_reader(relu6, "Mul")
    if mul is None or g.other_input(g.nodes[mul], relu6) != x:
        return None
    last = _a_sixth_of(g, g.nodes[mul].outputs[0])
    return None if last is None else ([i, clip, mul, last], x, g.nodes[last].outputs[0])


def _a_sixth_of(g, value):
    """The node that alone reads `value` and divides it by 6, or multiplies it by 1/6; else None."""
    div = g.only_reader(value, "Div")
    if div is not None and g.nodes[div].inputs[0] == value \
            and _near(_constant(g.nodes[div].inputs[1], g.weights), 6.0):
        return div
    mul = g.only_reader(value, "Mul")
    return mul if mul is not None and g.scalar_operand(g.nodes[mul], value, 1 / 6) else None


def _hard_sigmoid(g, i):
    """HardSigmoid from the Clip at index i: Clip(x + 3, 0, 6) / 6 (or * 1/6), or Clip(x * alpha +
    beta, 0, 1); returns the nodes, x, the output and alpha and beta."""
    clip = g.nodes[i]
    add = g.producer.get(clip.inputs[0])
    if add is None or g.nodes[add].op_type != "Add" or g.only_reader(clip.inputs[0], "Clip") != i:
        return None
    lo, hi = _clip_bounds(g, clip)
    added = next((n for n in g.nodes[add].inputs if _constant(n, g.weights) is None), None)
    beta = _constant(g.other_input(g.nodes[add], added), g.weights) if added is not None else None
    if beta is None or not _near(lo, 0.0):
        return None
    if _near(hi, 6.0) and _near(beta, 3.0):  # relu6(x + 3) / 6
        last = _a_sixth_of(g, clip.outputs[0])
        if last is None:
            return None
        return [add, i, last], added, g.nodes[last].outputs[0], {"alpha": 1 / 6, "beta": 0.5}
    if not _near(hi, 1.0):  # clip(x * alpha + beta, 0, 1)
        return None
    scale = g.producer.get(added)
    if scale is None or g.nodes[scale].op_type != "Mul" or g.only_reader(added, "Add") != add:
        return None
    x = next((n for n in g.nodes[scale].inputs if _constant(n, g.weights) is None), None)
    alpha = _constant(g.other_input(g.nodes[scale], x), g.weights) if x is not None else None
    if alpha is None:
        return None
    return [scale, add, i], x, clip.outputs[0], {"alpha": alpha, "beta": beta}


def _silu(g, i):
    """SiLU from the Sigmoid at index i: x * Sigmoid(x)."""
    sigmoid = g.nodes[i]
    x = sigmoid.inputs[0]
    mul = g.only_reader(sigmoid.outputs[0], "Mul")
    if mul is None or g.other_input(g.nodes[mul], sigmoid.outputs[0]) != x:
        return None
    return [i, mul], x, g.nodes[mul].outputs[0]


def _mish(g, i):
    """Mish from the Softplus at index i: x * Tanh(Softplus(x))."""
    softplus = g.nodes[i]
    x = softplus.inputs[0]
    tanh = g.only_reader(softplus.outputs[0], "Tanh")
    if tanh is None:
        return None
    mul = g.only_reader(g.nodes[tanh].outputs[0], "Mul")
    if mul is None or g.other_input(g.nodes[mul], g.nodes[tanh].outputs[0]) != x:
        return None
    return [i, tanh, mul], x, g.nodes[mul].outputs[0]


def _trailing_axes(g, node):
    """The first of the axes a keepdims ReduceMean averages over when they are the last ones, given
    from the end (-k .. -1: the rank is not known yet); else None."""
    if node.op_type != "ReduceMean" or node.domain or not node.attrs.get("keepdims", 1):
        return None
    axes = node.attrs.get("axes")
    if len(node.inputs) > 1 and node.inputs[1]:  # opset 18: the axes are an input
        if node.inputs[1] not in g.weights:
            return None
        axes = np.asarray(weight_array(g.weights[node.inputs[1]])).reshape(-1).tolist()
    if not axes or sorted(axes) != list(range(-len(axes), 0)):
        return None
    return -len(axes)


def _weight_within(g, name, axes):
    """Whether `name` is a float weight of at most `axes` dimensions (one that broadcasts over the
    normalized axes only, as LayerNormalization's Scale and B do)."""
    if name not in g.weights:
        return False
    value = g.weights[name]
    return len(value.shape) <= axes and np.dtype(value.dtype).kind == "f"


def _layer_norm(g, i):
    """LayerNormalization from the Pow at index i, the squared deviation from the mean: returns the
    pattern's nodes, the inputs [x, scale(, bias)], the output and the attributes."""
    power = g.nodes[i]
    if len(power.inputs) != 2 or not _near(_constant(power.inputs[1], g.weights), 2.0):
        return None
    deviation = power.inputs[0]
    sub = g.producer.get(deviation)
    if sub is None or g.nodes[sub].op_type != "Sub" or g.nodes[sub].domain or len(g.nodes[sub].inputs) != 2:
        return None
    x, mean = g.nodes[sub].inputs
    first = g.producer.get(mean)
    if first is None or g.only_reader(mean, "Sub") != sub or g.nodes[first].inputs[0] != x:
        return None
    axis = _trailing_axes(g, g.nodes[first])
    second = g.only_reader(power.outputs[0], "ReduceMean")
    if axis is None or second is None or _trailing_axes(g, g.nodes[second]) != axis:
        return None
    add = g.only_reader(g.nodes[second].outputs[0], "Add")
    if add is None:
        return None
    epsilon = _constant(g.other_input(g.nodes[add], g.nodes[second].outputs[0]), g.weights)
    root = g.only_reader(g.nodes[add].outputs[0], "Sqrt")
    if epsilon is None or root is None:
        return None
    div = g.only_reader(g.nodes[root].outputs[0], "Div")
    if div is None or g.nodes[div].inputs != [deviation, g.nodes[root].outputs[0]]:
        return None
    if sorted(g.readers.get(deviation, ())) != sorted((i, div)) or deviation in g.outputs:
        return None
    mul = g.only_reader(g.nodes[div].outputs[0], "Mul")
    if mul is None:
        return None
    scale = g.other_input(g.nodes[mul], g.nodes[div].outputs[0])
    if not _weight_within(g, scale, -axis):
        return None
    members, inputs, y = [first, sub, i, second, add, root, div, mul], [x, scale], g.nodes[mul].outputs[0]
    shift = g.only_reader(y, "Add")
    if shift is not None:
        bias = g.other_input(g.nodes[shift], y)
        if _weight_within(g, bias, -axis):
            members, inputs, y = members + [shift], inputs + [bias], g.nodes[shift].outputs[0]
    return members, inputs, y, {"axis": axis, "epsilon": epsilon}


def _sole_producer(g, value, reader):
    """The index of the plain node that makes `value` when the node at `reader` alone reads it."""
    if g.readers.get(value) != [reader] or value in g.outputs:
        return None
    node = g.producer.get(value)
    return node if node is not None and not g.nodes[node].domain else None


def _attention(g, i):
    """Attention from the Softmax at index i: softmax(q @ k_t [/ c | * c] [+ mask]) @ v, each value
    between read by the next op alone; returns the nodes, the inputs [q, k_t, v(, mask)], the
    output and the attributes of nnrun's ScaledDotProductAttention."""
    softmax = g.nodes[i]
    after = g.only_reader(softmax.outputs[0], "MatMul")
    if after is None or g.nodes[after].inputs[0] != softmax.outputs[0] or len(g.nodes[after].inputs) != 2:
        return None
    members, mask = [i, after], None
    node = _sole_producer(g, softmax.inputs[0], i)
    if node is not None and g.nodes[node].op_type == "Add" and len(g.nodes[node].inputs) == 2:
        add = g.nodes[node]
        for scaled, other in ((add.inputs[0], add.inputs[1]), (add.inputs[1], add.inputs[0])):
            made_by = g.producer.get(scaled)
            if made_by is not None and g.nodes[made_by].op_type in ("MatMul", "Div", "Mul"):
                members.append(node)
                mask, node = other, _sole_producer(g, scaled, node)
                break
        else:
            return None
    scale, divide = 1.0, 0
    if node is not None and g.nodes[node].op_type in ("Div", "Mul") and len(g.nodes[node].inputs) == 2:
        product, factor = g.nodes[node].inputs
        if g.nodes[node].op_type == "Mul" and _constant(product, g.weights) is not None:
            product, factor = factor, product
        scale, divide = _constant(factor, g.weights), int(g.nodes[node].op_type == "Div")
        if not scale:  # not a constant (or a zero)
            return None
        members.append(node)
        node = _sole_producer(g, product, node)
    if node is None or g.nodes[node].op_type != "MatMul" or len(g.nodes[node].inputs) != 2:
        return None
    q, k_t = g.nodes[node].inputs
    legacy = g.opset < 13
    attrs = {"scale": float(scale), "divide": divide, "coerce_2d": int(legacy),
             "axis": int(softmax.attrs.get("axis", 1 if legacy else -1))}
    return [node] + members, [q, k_t, g.nodes[after].inputs[1]] + ([mask] if mask else []), \
        g.nodes[after].outputs[0], attrs


PATTERNS = (("Erf", _gelu, ("Gelu", {})),
            ("Tanh", _gelu_tanh, ("Gelu", {"approximate": "tanh"})),
            ("Softplus", _mish, ("Mish", {})),
            ("Add", _hard_swish, ("HardSwish", {})),
            ("HardSigmoid", _hard_swish, ("HardSwish", {})),
            ("Clip", _hard_sigmoid, ("HardSigmoid", {})),
            ("Sigmoid", _silu, ("Swish", {"alpha": 1.0})),
            ("Pow", _layer_norm, ("LayerNormalization", {})),
            ("Softmax", _attention, ("ScaledDotProductAttention", {})))


def fuse_patterns(nodes, weights, graph_outputs, opset=21):
    """The node list with each recognised pattern replaced by its fused node, at the place of the
    pattern's last node (its inputs are all produced before any node of the pattern); `opset`, the
    graph's default-domain one, decides what a Softmax without an axis means."""
    g = _Graph(nodes, weights, graph_outputs)
    g.opset = opset
    replaced, dropped = {}, set()
    for i, node in enumerate(nodes):
        if node.domain or i in dropped:
            continue
        for op_type, match, (fused_op, attrs) in PATTERNS:
            if node.op_type != op_type:
                continue
            found = match(g, i)
            if found is None or dropped.intersection(found[0]):
                continue
            members, x, y = found[:3]  # a match with inputs besides x gives them, and attributes
            inputs, fused_attrs = (x, found[3]) if len(found) > 3 else ([x], attrs)
            last = nodes[max(members)]
            replaced[max(members)] = Node(last.name, fused_op, FUSED, inputs, [y], dict(fused_attrs), last.index)
            dropped.update(m for m in members if m != max(members))
            break
    return [replaced.get(i, n) for i, n in enumerate(nodes) if i not in dropped]
