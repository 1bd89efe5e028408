"""Hand back the mapped pages of weights the plan no longer reads.

After PREPARE, a mapped weight is still needed only if the plan reads its bytes at
run time: the Plan lists those (`Plan.mapped_weights`, by the loader's weight ids).
Every other weight — packed, folded into another, copied aligned, or dead — is
released: its pages are dropped with madvise(MADV_DONTNEED), except pages it
shares with a weight still in use (MappedFile keeps that account).
"""

from ..ir import Graph
from ..weights import ExternalData


def mapped_weights(graph):
    """Every ExternalData of the graph: initializers, Constant values and subgraphs, by id. Walked
    depth first without recursion: subgraphs nest as deep as the file says."""
    # A loop over a stack rather than two closures calling each other: such closures form a
    # reference cycle that outlives the call, and with it the weights and their file's mapping.
    found = {}
    pending = [graph]
    while pending:
        v = pending.pop()
        if isinstance(v, ExternalData):
            found[id(v)] = v
        elif isinstance(v, Graph):
            inside = [*v.initializers.values(), *(a for node in v.nodes for a in node.attrs.values())]
            pending.extend(reversed(inside))
        elif isinstance(v, (list, tuple)):
            pending.extend(reversed(v))
    return list(found.values())


class EagerRelease:
    """Release a weight's pages the moment PREPARE has copied it.

    Packing a weight (Conv+BatchNormalization folding, an aligned copy) makes a
    second copy of it; releasing the mapped one at once, rather than after the
    whole plan is built, keeps the two from being resident together: PREPARE's
    peak grows by one weight, not by all of them. Releasing is always safe: a
    dropped page that is read again is only re-read from the file.
    """

    def __init__(self, enabled=True):
        self.enabled = enabled

    def copied(self, weight):
        """`weight` (an ExternalData; anything else is ignored) was copied and will not be read again."""
        if not self.enabled or not isinstance(weight, ExternalData) or not weight.source.releasable:
            return 0
        return weight.release()


def release_unused(weights, kept):
    """Release every weight of `weights` not in `kept` (ExternalData, by the loader's ids); the bytes dropped.

    A weight made outside a loader has no id (-1): one such kept keeps them all.
    """
    keep = {w.id for w in kept}
    return sum(w.release() for w in weights if w.id not in keep and w.source.releasable)


def return_free_heap():
    """Hand the C heap's free memory back to the system (glibc's malloc_trim); False elsewhere.

    Packing at PREPARE makes and frees temporaries of every weight's size. glibc raises
    its mmap threshold after the first large free, so later ones come from the heap,
    and what is freed there stays resident as anonymous memory: 7 MB after a first
    start of ResNet-50. One trim after PREPARE returns it."""
    global _malloc_trim
    if _malloc_trim is None:
        import ctypes
        import ctypes.util

        try:
            _malloc_trim = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
        except (OSError, AttributeError):
            _malloc_trim = False
    if not _malloc_trim:
        return False
    _malloc_trim(0)
    return True


_malloc_trim = None
