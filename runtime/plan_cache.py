"""Every plan a session prepares, in one cache: the main graph's, one per input signature, and each
control-flow body's, one per signature of what the body is fed.

The cache is the service PREPARE hands to control-flow kernels (If, Loop, Scan): they ask it
for a body's executor instead of reaching up into the compiler and the executor themselves.
A body is planned with the session's passes, except that it never releases weights: its
weights lie in the model's mapping, whose pages the main plan's release accounts for.

The kernels hold the cache weakly (a proxy): it holds their plans, and a cycle between the two
would keep every plan, and the model's mapping with them, alive after the session is gone until
the garbage collector found it.
"""

import threading
import weakref

import numpy as np

from . import ops
from .compiler.build import CompileOptions, compile_graph
from .executor import Executor


class PlanCache:
    """(graph, feeds' shapes and dtypes, values planned as constants) -> Executor of its Plan.

    Thread-safe. Planning holds the cache's lock (a reentrant one: planning a graph plans
    its bodies through this same cache), so two threads never plan the same thing twice.
    """

    def __init__(self, options=CompileOptions(), packer=None):
        ops.load_all()
        self.options = options
        self.packer = packer  # keeps what kernels pack: a WeightCache, or None (memory)
        self.body_options = CompileOptions(options.disabled_passes | {"release_weights"},
                                           options.order_search_seconds,
                                           max_tensor_bytes=options.max_tensor_bytes,
                                           compiled_kernels=options.compiled_kernels,
                                           kernel_threads=options.kernel_threads)
        self._executors = {}
        self._graphs = {}  # id -> graph: keeps each keyed graph alive, so its id is never reused
        self._lock = threading.RLock()
        self._planner = weakref.proxy(self)  # what kernels that plan bodies hold (see above)

    def executor(self, graph, feeds, constants=None, body=False):
        """The Executor for `graph` fed `feeds` (name -> (shape, dtype)), planned on first use.

        `constants` (name -> array) are inputs whose values are known and planned as constants
        (a body's small captured integers); `body` plans it as a control-flow body.
        """
        key = _key(graph, feeds, constants)
        with self._lock:
            found = self._executors.get(key)
            if found is None:
                options = self.body_options if body else self.options
                try:
                    plan = compile_graph(graph, feeds, options, constants, planner=self._planner,
                                         packer=self.packer)
                except BaseException:
                    if self.packer is not None:
                        self.packer.abort()
                    raise
                if self.packer is not None:
                    self.packer.commit()
                found = self._executors[key] = Executor(plan, options.max_tensor_bytes)
                self._graphs[id(graph)] = graph
        return found

    def get(self, graph, feeds, constants=None):
        """The Executor already planned for these, or None."""
        with self._lock:
            return self._executors.get(_key(graph, feeds, constants))

    def plans(self, graph):
        """The plans of `graph` so far, in the order they were made."""
        with self._lock:
            return [e.plan for key, e in self._executors.items() if key[0] == id(graph)]

    def close(self):
        """Stop every executor's threads and forget every plan (a session being closed)."""
        with self._lock:
            executors, self._executors, self._graphs = list(self._executors.values()), {}, {}
        for executor in executors:
            executor.close()


def _key(graph, feeds, constants):
    # A shape of None: a sequence or an optional, whose plan is the same whatever it holds.
    fed = tuple((name, tuple(shape), np.dtype(dtype).str) if shape is not None else (name, None, None)
                for name, (shape, dtype) in feeds.items())
    known = tuple((name, np.dtype(value.dtype).str, tuple(value.shape), np.asarray(value).tobytes())
                  for name, value in (constants or {}).items())
    return id(graph), fed, known
