"""The one error hierarchy of nnrun, and the one way an error names where it arose.

Every error a user can see derives from `NnrunError`. An error raised while a node
is prepared or run names the phase, the pass, and the node by name, op type and
index in the file, whatever rewrote the node in between:

    PREPARE/fold_batchnorm: node 'bn3' (BatchNormalization, #41): epsilon must be a float

Kernels and passes raise plain messages; the compiler's pass runner and the
executor add the location once (`located`).

Each class also derives from the onnxruntime status classes (status.py) that onnxruntime raises
in the same cases, so code written to catch onnxruntime's errors catches nnrun's:

    ModelError               InvalidGraph, Fail (a file that does not parse: also InvalidProtobuf;
                             one that cannot be opened: also NoSuchFile; a shape rule that fails
                             for a run's feeds is one too, and onnxruntime's is Fail; a file
                             changed after the session was created: ModelFileChangedError)
    UnsupportedOperatorError NotImplemented, InvalidGraph, Fail (onnxruntime's three answers
                             to an operator it has no kernel or schema for)
    InputError               InvalidArgument, and ValueError (onnxruntime's for a missing feed)
    SizeLimitError           as ModelError (a tensor beyond SessionOptions.max_tensor_bytes)
    ExecutionError           RuntimeException, Fail (a kernel that failed)
    BudgetError, UnsupportedFeatureError   Fail (the latter NotImplemented too)
    SessionClosedError       Fail (nnrun's own: onnxruntime's sessions cannot be closed)
"""

from . import status


class NnrunError(Exception):
    """Base of every error nnrun raises on purpose.

    `where` is the location the message starts with (phase, pass, node), once known.
    """

    where = None


class ModelError(NnrunError, status.InvalidGraph, status.Fail):
    """The model file is malformed, hostile or inconsistent.

    The message names what is wrong and where: a byte offset, a tensor or a node.
    """


class ModelFileError(ModelError, status.NoSuchFile):
    """The model file (or an external data file) cannot be opened or mapped."""


class ModelFileChangedError(ModelError):
    """A file the session maps (the model, an external data file, a weight cache file) was
    truncated or rewritten in place after the session was created: reading it again could end
    the process (SIGBUS) or give other outputs. `path` names the file. A file replaced by a
    rename is not changed: the session keeps the file it mapped."""

    def __init__(self, message="", path=None):
        super().__init__(message)
        self.path = path


class SizeLimitError(ModelError):
    """A tensor the model or its feeds would make exceeds SessionOptions.max_tensor_bytes.

    Raised before anything of that size is allocated or looped over: at PREPARE for sizes the
    file fixes, at EXECUTE for sizes a run's values decide. The message names the node (or the
    input), the tensor's shape, its bytes and the limit.
    """


class MalformedModelError(ModelError, status.InvalidProtobuf):
    """The model's bytes do not parse: not a protobuf (or flatbuffer) of a model."""


class UnsupportedOperatorError(NnrunError, status.NotImplemented, status.InvalidGraph, status.Fail):
    """The model uses operators nnrun does not implement.

    `ops` lists every unsupported (domain, op_type, opset) of the model at once.
    """

    def __init__(self, ops):
        self.ops = sorted(set(ops))
        listed = ", ".join(
            f"{domain + '.' if domain else ''}{op_type} (opset {version})"
            for domain, op_type, version in self.ops
        )
        super().__init__(f"unsupported operators: {listed}")


class UnsupportedFeatureError(NnrunError, status.NotImplemented, status.Fail):
    """An onnxruntime feature nnrun does not have (a custom op library, a device binding)."""


class BudgetError(NnrunError, status.Fail):
    """The memory budget is below the least the model can run in."""


class InputError(NnrunError, status.InvalidArgument, ValueError):
    """A feed does not match the model: unknown name, missing input, wrong shape or dtype."""


class ExecutionError(NnrunError, status.RuntimeException, status.Fail):
    """A kernel failed while running a node; the message names the node."""


class SessionClosedError(NnrunError, status.Fail):
    """The session was closed (`InferenceSession.close`, or the end of its `with` block)."""


def node_label(node):
    """The one way a message names a node: `node 'conv1' (Conv, #12)`."""
    index = getattr(node, "index", -1)
    number = f", #{index}" if index is not None and index >= 0 else ""
    return f"node {node.name!r} ({node.op_type}{number})"


def count_words(op_type, what, least, most, count):
    """`Relu takes 1 input, the node has 2`: the one way a message says a node's count of inputs
    (or outputs, `what`) is not one its op takes; `most` at or past 2**30 means no upper bound."""
    allowed = f"{least}" if least == most else f"at least {least}" if most >= 1 << 30 else f"{least} to {most}"
    return f"{op_type} takes {allowed} {what}{'' if allowed == '1' else 's'}, the node has {count}"


def location(phase, pass_name=None, node=None):
    """`PREPARE/fold_batchnorm: node 'bn3' (BatchNormalization, #41)`, or less where less is known."""
    where = f"{phase}/{pass_name}" if pass_name else phase
    return f"{where}: {node_label(node)}" if node is not None else where


def located(error, phase, pass_name=None, node=None):
    """`error` with its location in front, as an NnrunError; an error already located is kept.

    A foreign exception (a kernel's ValueError, numpy's) becomes `ModelError` at PREPARE
    and `ExecutionError` at EXECUTE, naming its type. nnrun's own errors keep their
    class and attributes (an UnsupportedOperatorError keeps its `ops`).
    """
    if isinstance(error, NnrunError):
        if error.where is not None:
            return error
        # A copy made without calling __init__, whose arguments differ by class.
        found = type(error).__new__(type(error))
        found.__dict__.update(error.__dict__)
        message = str(error)
    else:
        found = (ExecutionError if phase == "EXECUTE" else ModelError)()
        message = f"{type(error).__name__}: {error}"
    where = location(phase, pass_name, node)
    found.args = (f"{where}: {message}",)
    found.where = where
    return found


def raise_located(error, phase, pass_name=None, node=None):
    """Raise `located(error, ...)` from `error`, or `error` itself when it was located already
    (raising it from itself would make it its own cause, a loop for whatever walks the chain)."""
    found = located(error, phase, pass_name, node)
    if found is error:
        raise error
    raise found from error
