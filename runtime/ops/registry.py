"""The operator registry and the contract every kernel follows.

An op is a `Kernel` subclass registered under (domain, op type, since-version);
the model's opset picks the largest registered version at or below it.
Registering the same key twice is an error.

A kernel object belongs to one node. Its life:

1. `__init__` decodes the node's attributes once, with the spec's defaults
   (class attribute `attributes`: name -> default, `REQUIRED` for none).
2. `infer(*inputs)` is the shape rule, a pure function: from `TensorInfo`s
   (shape, dtype, and `value` when the input is known at PREPARE) it returns one
   `TensorInfo` per output and changes nothing (`shape_rule` runs it sealed:
   setting an attribute raises). What it works out on the way that `run` needs
   (a normalised axis, a view shape, a chosen code path) it returns too:
   `Inferred(outputs, axis=..., view=...)`; the compiler keeps those on the
   kernel before prepare (`ready`). It may fill `value` itself (Shape does), or
   set `alias_of=i` when the output is input i's buffer under a new shape
   (Reshape, Flatten, Squeeze...).
   Omitted optional inputs arrive as None. When the shape depends on an input's
   value and that value is unknown, infer raises `NeedsValueError`
   (`self.needs_value(name)`): the node then runs eagerly, its shapes inferred
   at each run from the actual inputs. So does a node with an output whose shape
   is None: a sequence or an optional (`SequenceInfo`), or a shape only a run
   tells; its kernel returns that output.
3. `prepare(*inputs)` runs once the shapes are known, with the same inputs as
   `infer` and what infer derived already kept. It may turn constant inputs into
   the layout the kernel wants with `self.pack(indices, make)`, `make` a function
   that makes the arrays (a weight cache that holds them already does not call
   it): those inputs are then not passed to `run`, their mapped pages may be
   released, and the plan counts the packed bytes. It may ask for scratch
   buffers by returning a list of (shape, dtype); they live in the arena for
   this step.
4. `run(*inputs, outs, scratch)` computes. `outs` is a tuple of preallocated
   arrays (arena views or the caller's output arrays) to write into; `scratch`
   the tuple of scratch arrays. A kernel that cannot write in place returns its
   results instead (an array, or a tuple for several outputs) and the executor
   copies them into `outs`.

Once prepared, a kernel is frozen (`freeze`, called by the compiler): every run of
its plan shares it, from any thread, so `run` keeps what it computes per run in
locals; setting an attribute then raises.
"""

import functools
import hashlib
import inspect
import math
from dataclasses import dataclass

import numpy as np

from ..errors import ModelError, count_words
from ..cache_file import in_cache_file

REQUIRED = object()


class NeedsValueError(ModelError):
    """A shape rule needs the value of an input that is only known when the model runs.

    The compiler then runs the node eagerly: its shapes are inferred per run from
    the actual inputs, outside the arena.
    """

_registry = {}  # (domain, op_type) -> sorted list of (since, cls)

# The domain of the nodes the compiler's fuse_patterns makes (GELU, HardSwish, SiLU written out op
# by op): their kernels are the ONNX ones, registered here too for every opset of a model.
FUSED = "nnrun.fused"


class Inferred(list):
    """A shape rule's result: the output TensorInfos (it is their list) and, in `derived`,
    the values it worked out that `run` needs, kept on the kernel by `Kernel.ready`."""

    def __init__(self, outputs, **derived):
        super().__init__(outputs)
        self.derived = {**getattr(outputs, "derived", {}), **derived}  # a base class's rule's too


@dataclass(frozen=True)
class TensorInfo:
    """What the compiler knows of a value: shape, dtype, maybe its value.

    `weight` is the loader's ExternalData whose bytes `value` views (a weight, or a
    folded reshape of one), so the plan knows which mapped weights it still reads.
    """
    shape: tuple
    dtype: np.dtype
    value: np.ndarray | None = None
    alias_of: int | None = None
    weight: object = None

    @property
    def nbytes(self):
        n = self.dtype.itemsize
        for d in self.shape:
            n *= d
        return n

    @property
    def size(self):
        n = 1
        for d in self.shape:
            n *= d
        return n

    @classmethod
    def of(cls, array):
        """A known value."""
        array = np.asarray(array)
        return cls(tuple(array.shape), array.dtype, array)


@dataclass(frozen=True)
class SequenceInfo:
    """What a shape rule knows of a sequence: its elements' dtype (None: not known) and, at run
    time, its value, a tuple of arrays.

    Sequences and optionals never live in the arena. At run time an optional is its element
    (an array or a tuple) or None when empty, as an omitted input is. A shape rule says an
    output is one of them with an info whose `shape` is None (this, or `TensorInfo(None, ...)`):
    the compiler then runs the node as an eager step, and its kernel returns that output.
    """
    dtype: np.dtype | None = None
    value: tuple | None = None
    shape = None  # not a tensor: nothing to lay out
    alias_of = None
    weight = None


def info_of(value):
    """What a shape rule is told of a value known at run time: a TensorInfo of an array, a
    SequenceInfo of a sequence (a tuple of arrays), None of None (an omitted input, an empty
    optional)."""
    if value is None:
        return None
    if isinstance(value, tuple):
        return SequenceInfo(value[0].dtype if value else None, value)
    return TensorInfo.of(value)


class Kernel:
    """Base of every op; see the module docstring for the contract."""

    attributes = {}
    foldable = True  # may run at PREPARE when every input is known
    uses_planner = False  # made with the planner of its bodies (control flow: see control.py)
    packed = frozenset()  # inputs the kernel holds in a layout of its own (see pack)
    packed_arrays = ()  # the arrays it keeps for them: what a run reads instead of those inputs
    packed_bytes = 0  # the bytes of what it made of them that live in memory...
    packed_cached_bytes = 0  # ...and in a weight cache file
    _sealed = None  # None: open; "infer" while its shape rule runs; "frozen" once prepared
    _packer = None  # while prepare runs: what keeps packed values (see ready and pack)
    _packing_for = ()  # while prepare runs: its inputs

    def __setattr__(self, name, value):
        if self._sealed == "frozen":
            raise AttributeError(f"{type(self).__name__} is prepared: every run of its plan shares it, "
                                 f"so a run may not set {name!r}; keep per-run values in locals")
        if self._sealed == "infer":
            raise AttributeError(f"{type(self).__name__}.infer is a shape rule and may not set {name!r}; "
                                 f"keep what run needs in prepare")
        object.__setattr__(self, name, value)

    def shape_rule(self, *inputs):
        """`infer`, sealed: an Inferred for these inputs (the outputs, what run needs), the
        kernel left as it was."""
        if self._sealed == "frozen":
            raise RuntimeError(f"{type(self).__name__} is prepared; its shape rule ran before")
        least, most = _arity(type(self))
        if not least <= len(inputs) <= most:
            self.fail(count_words(self.node.op_type, "input", least, most, len(inputs)))
        object.__setattr__(self, "_sealed", "infer")
        try:
            result = self.infer(*inputs)
        finally:
            object.__setattr__(self, "_sealed", None)
        return result if isinstance(result, Inferred) else Inferred(result)

    def ready(self, derived, *inputs, packer=None):
        """Keep what the shape rule derived (Inferred.derived), then prepare for these inputs:
        the scratch spec. `packer` keeps what prepare packs (see `pack`); None: memory."""
        for name, value in derived.items():
            setattr(self, name, value)
        object.__setattr__(self, "_packer", packer)
        object.__setattr__(self, "_packing_for", inputs)
        try:
            return self.prepare(*inputs) or []
        finally:
            object.__setattr__(self, "_packer", None)
            object.__setattr__(self, "_packing_for", ())

    def freeze(self):
        """Called by the compiler once the kernel is prepared: from then on nothing may change it."""
        object.__setattr__(self, "_sealed", "frozen")

    def __init__(self, node, opset):
        self.node = node
        self.opset = opset
        for name, default in self.attributes.items():
            if name in node.attrs:
                value = node.attrs[name]
            elif default is REQUIRED:
                raise ModelError(f"attribute {name!r} is required")
            else:
                value = default
            setattr(self, name, value)
        self.decode()

    def decode(self):
        """Check and normalise attributes once; raise ModelError when they are wrong."""

    def fresh(self):
        """An unprepared kernel for the same node, for a run that prepares its own (an eager step)."""
        return type(self)(self.node, self.opset)

    def pack(self, inputs, make, form=""):
        """Keep what prepare makes of the constant inputs `inputs` (their indices) as this kernel's
        own: those inputs are then not passed to `run`, their mapped pages may be released, and
        the plan counts its bytes as packed. `make` is that value (an array or a tuple of arrays)
        or a function that makes it; the packer `ready` was given may hold it already (a weight
        cache) and then returns its copy without calling `make`. `form` tells apart what one kernel
        may make of the same inputs in more than one way (it names the value in the cache).
        Returns the value to keep."""
        if self._packer is not None and not (isinstance(make, tuple) and not make):  # () keeps nothing
            name = (f"{self.node.index}/{node_digest(self.node)}/{'-'.join(map(str, sorted(inputs)))}/"
                    f"{inputs_digest(self._packing_for)}{'/' + form if form else ''}")
            value = self._packer.pack(name, make)
        else:
            value = make() if callable(make) else make
        arrays = value if isinstance(value, (tuple, list)) else (value,)
        self.packed = self.packed | frozenset(inputs)
        made = [a for a in arrays if isinstance(a, np.ndarray)]
        self.packed_arrays = self.packed_arrays + tuple(made)
        self.packed_bytes += sum(a.nbytes for a in made if not in_cache_file(a))
        self.packed_cached_bytes += sum(a.nbytes for a in made if in_cache_file(a))
        return value

    def fail(self, message):
        """Raise a ModelError; the compiler or the executor puts the node's location in front."""
        raise ModelError(message)

    def needs_value(self, what):
        """Raise NeedsValueError: input `what` decides a shape and is not known at PREPARE."""
        raise NeedsValueError(f"input {what!r} decides a shape and is only known at run time")

    def infer(self, *inputs):
        raise NotImplementedError

    def prepare(self, *inputs):
        return []

    def run(self, *inputs, outs, scratch):
        raise NotImplementedError

    def band_granule(self):
        """0, or (prepared) the multiple of rows in which the kernel can make its output's rows
        (axis 2 of NCHW) in bands, each from a band of the rows of its inputs (see `band`)."""
        return 0

    def band(self, r0, r1, scratch_limit, plans=None):
        """The Band that makes output rows [r0, r1) (bands.Band); only when band_granule() > 0.
        `plans`: a dict where the kernel keeps the plans of its bands, shared by bands alike."""
        raise NotImplementedError


class NoElements(Kernel):
    """The kernel of a step whose every output has no element (a batch of 0): there is nothing to
    compute, so the op's own kernel, which may divide by a dim, is neither prepared nor run."""

    def run(self, *inputs, outs, scratch):
        return None


@functools.lru_cache(maxsize=None)
def _arity(cls):
    """(least, most) inputs a kernel class's shape rule takes, from its signature: a node with
    another count is refused by name before the rule runs."""
    least, most = 0, 0
    for p in list(inspect.signature(cls.infer).parameters.values())[1:]:
        if p.kind == p.VAR_POSITIONAL:
            most = math.inf
        elif p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            most += 1
            least += p.default is p.empty
    return least, most


def node_digest(node):
    """A digest of a node's op and attributes (subgraphs named only by their being there): a
    packed value's name includes it, with the node's index, so nodes alike in place but not in
    attributes (a body's node and the main graph's) never share a packed value."""
    h = hashlib.sha256(f"{node.domain}.{node.op_type}".encode())
    for name in sorted(node.attrs):
        value = node.attrs[name]
        if isinstance(value, np.ndarray):
            text = f"{value.dtype.str}{value.shape}" + value.tobytes().hex()
        elif isinstance(value, (int, float, str, bytes, bool, type(None))):
            text = repr(value)
        elif isinstance(value, (list, tuple)) and all(isinstance(v, (int, float, str, bytes)) for v in value):
            text = repr(list(value))
        else:
            text = type(value).__name__
        h.update(f"{name}={text};".encode())
    return h.hexdigest()[:16]


def inputs_digest(inputs):
    """A digest of what a packed value is made from: each input's shape and dtype, and its
    identity when known (a file weight's id, else a digest of its bytes). A packed value's name
    includes it, so a value made from other inputs never takes its place."""
    h = hashlib.sha256()
    for info in inputs:
        if info is None:
            h.update(b"-")
            continue
        h.update(repr((tuple(info.shape), str(info.dtype))).encode())
        if info.weight is not None:
            h.update(f"w{info.weight.id}".encode())
        elif info.value is not None:
            h.update(np.ascontiguousarray(info.value).tobytes())
    return h.hexdigest()[:16]


def register(op_type, since=1, domain=""):
    """Class decorator: register a Kernel for (domain, op_type) from opset `since`."""

    def wrap(cls):
        versions = _registry.setdefault((domain, op_type), [])
        if any(v == since for v, _ in versions):
            raise RuntimeError(f"{domain or 'ai.onnx'}.{op_type} version {since} registered twice")
        versions.append((since, cls))
        versions.sort(key=lambda vc: vc[0])
        return cls

    return wrap


def instantiate(cls, node, opset, planner=None):
    """A kernel of `cls` for `node`; one that plans bodies (`uses_planner`) gets `planner`."""
    if cls.uses_planner:
        return cls(node, opset, planner=planner)
    return cls(node, opset)


def lookup(domain, op_type, opset):
    """The kernel class for the largest registered version <= opset, or None."""
    best = None
    for since, cls in _registry.get((domain, op_type), ()):
        if since <= opset:
            best = cls
    return best


def registered():
    return {key: [v for v, _ in versions] for key, versions in _registry.items()}
