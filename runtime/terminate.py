"""RunOptions.terminate, read between steps and between a Loop's or Scan's iterations.

Another thread sets `run_options.terminate = True`; the run ends with an ExecutionError before its
next step or iteration (a step already running finishes first), as onnxruntime's does. The session
makes the run's options current around EXECUTE; the executor and the control-flow kernels read
them here, so a Loop a file sets to 2^62 iterations can be stopped by a caller's watchdog.
"""

import contextlib
import contextvars

from .errors import ExecutionError

MESSAGE = "Exiting due to terminate flag being set to true."

_OPTIONS = contextvars.ContextVar("nnrun_run_options", default=None)


@contextlib.contextmanager
def watching(run_options):
    """Make `run_options` the current run's (None: a run that cannot be terminated)."""
    token = enter(run_options)
    try:
        yield
    finally:
        leave(token)


def enter(run_options):
    """What `watching` does on entry, for the hot path of a run: returns the token for `leave`."""
    return _OPTIONS.set(run_options if hasattr(run_options, "terminate") else None)


def leave(token):
    _OPTIONS.reset(token)


def current():
    """The current run's options, or None."""
    return _OPTIONS.get()


def check():
    """ExecutionError if the current run was asked to terminate."""
    options = _OPTIONS.get()
    if options is not None and options.terminate:
        raise ExecutionError(MESSAGE)
