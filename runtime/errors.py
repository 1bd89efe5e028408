"""The one error hierarchy of nnrun.

Every error a user can see derives from `NnrunError`. Errors raised while a node
is being prepared or run name the node (index, name, op type) and the phase, in
the manner of TFLite's `Node number 12 (CONV_2D) failed to prepare`.
"""


class NnrunError(Exception):
    """Base of every error nnrun raises on purpose."""


class ModelError(NnrunError):
    """The model file is malformed, hostile or inconsistent.

    The message names what is wrong and where: a byte offset, a tensor or a node.
    """


class UnsupportedOperatorError(NnrunError):
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


class InputError(NnrunError):
    """A feed does not match the model: unknown name, missing input, wrong shape or dtype."""


class ExecutionError(NnrunError):
    """A kernel failed while running a node; the message names the node."""


def node_label(index, node):
    """The one way an error names a node: `node 12 'conv1' (Conv)`."""
    name = f" '{node.name}'" if node.name else ""
    return f"node {index}{name} ({node.op_type})"
