"""Debugging a wrong answer: every intermediate value of one run, by name.

Built on the executor's knobs (RunOptions.trace and stop_after): compare these
with another runtime's intermediates to find the first node that goes wrong,
and switch compiler passes off (`SessionOptions.disabled_passes`) to see
whether one of them is the cause.
"""

import numpy as np

from .session import RunOptions


def intermediates(session, feeds, names=None, stop_after=None):
    """{value name: array} of the values the run's steps produce, in step order.

    `names` keeps only those values; `stop_after` (node name or step position) ends the
    run after that step. Values folded at PREPARE are no step's output, so they are not
    here: the plan holds them as constants (`session.plan().constants`).
    """
    wanted = None if names is None else set(names)
    found = {}

    def keep(step, outputs):
        for name, array in zip(step.node.outputs, outputs):
            if name and array is not None and (wanted is None or name in wanted):
                # the arena reuses its bytes later; a sequence (a tuple) is never changed
                found[name] = array if isinstance(array, tuple) else np.array(array, copy=True)

    options = RunOptions()
    options.trace = keep
    options.stop_after = stop_after
    session.run([], feeds, options)
    if wanted is not None and wanted - set(found):
        missing = sorted(wanted - set(found))
        raise KeyError(f"no step of the run produced {missing}")
    return found
