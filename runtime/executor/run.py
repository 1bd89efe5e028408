"""EXECUTE: run a frozen Plan over one arena.

Per-run state — the arena, the slot table, the output arrays — lives in an
`ArenaState` (reused between runs, one per concurrent run) and in locals; the
Plan is only read. Kernels write into arena views; nothing allocates per step
except what a kernel cannot avoid.
"""

import threading
import time

import numpy as np

from ..errors import ExecutionError, located
from ..ops.registry import TensorInfo
from .prefetch import Prefetcher


class ArenaState:
    """One arena buffer and the slot table with every arena view made once."""

    def __init__(self, plan):
        self.arena = np.empty(plan.arena_bytes, dtype=np.uint8)
        table = [None] * len(plan.slot_names)
        for slot, value in plan.constants.items():
            table[slot] = value.array() if hasattr(value, "array") else value
        for a in plan.arena:
            nbytes = int(np.prod(a.shape, dtype=np.int64)) * a.dtype.itemsize
            table[a.slot] = self.arena[a.offset:a.offset + nbytes].view(a.dtype).reshape(a.shape)
        self.table = table


class Executor:
    """Runs a Plan; thread-safe: concurrent runs take different ArenaStates."""

    def __init__(self, plan):
        self.plan = plan
        # slot -> position of the step that writes it (feeds and constants: none)
        self._producer = {slot: pos for pos, step in enumerate(plan.steps) for slot in step.outputs if slot >= 0}
        self._free = []
        self._lock = threading.Lock()
        # Kernels of eager steps, kept between runs (their caches, such as a body's plans,
        # survive) and handed to one run at a time.
        self._eager_kernels = {}
        # Under a memory budget: streamed weights read ahead of their steps and dropped after.
        self.prefetcher = Prefetcher(plan.streaming) if getattr(plan, "streaming", None) else None

    def _take(self):
        with self._lock:
            if self._free:
                return self._free.pop()
        return ArenaState(self.plan)

    def _give(self, state):
        with self._lock:
            self._free.append(state)

    def _take_kernel(self, position, step):
        with self._lock:
            free = self._eager_kernels.setdefault(position, [])
            if free:
                return free.pop()
        return step.kernel.fresh()

    def release_arenas(self):
        with self._lock:
            self._free.clear()

    def run(self, feeds, profile=None, trace=None, stop_after=None):
        """feeds: name -> array (validated by the caller). Returns {output name: array}.

        `profile`, a list, gets `(position, start_ns, duration_ns)` appended for every step.
        The debugging knobs: `trace(step, outputs)` is called after each step with the
        PlannedStep and its output arrays (views the run may overwrite later: copy what
        you keep); `stop_after`, a step position, ends the run after that step, and the
        results then hold only the graph outputs computed by then.
        """
        plan = self.plan
        state = self._take()
        try:
            env = list(state.table)
            for name, (slot, _, _) in plan.feeds.items():
                env[slot] = feeds[name]
            for slot, (shape, dtype) in plan.fresh.items():
                env[slot] = np.empty(shape, dtype)
            # inf and NaN are values like any other here, as in onnxruntime: no warnings.
            with np.errstate(all="ignore"):
                self._steps(env, profile, trace, stop_after)
            results = {}
            for name, slot in plan.outputs:
                if stop_after is not None and self._producer.get(slot, -1) > stop_after:
                    continue
                value = env[slot]
                owned = slot in plan.fresh or slot in plan.dynamic
                results[name] = value if owned else np.array(value, copy=True)
            return results
        finally:
            self._give(state)

    def _steps(self, env, profile, trace, stop):
        clock = time.perf_counter_ns
        prefetcher = self.prefetcher
        for position, step in enumerate(self.plan.steps):
            if stop is not None and position > stop:
                break
            if prefetcher is not None:
                prefetcher.before(position)
            if profile is not None:
                started = clock()
            try:
                if step.alias_of >= 0:
                    env[step.outputs[0]] = env[step.alias_of].reshape(step.alias_shape)
                elif step.eager:
                    kernel = self._take_kernel(position, step)
                    try:
                        _run_eager(step, kernel, env)
                    finally:
                        with self._lock:
                            self._eager_kernels[position].append(kernel)
                else:
                    args = [env[i] if i >= 0 else None for i in step.inputs]
                    outs = tuple(env[o] if o >= 0 else None for o in step.outputs)
                    stream = prefetcher.blocks(position) if prefetcher is not None else None
                    if stream is None:
                        result = step.kernel.run(*args, outs=outs, scratch=tuple(env[s] for s in step.scratch))
                    else:
                        result = step.kernel.run(*args, outs=outs, scratch=tuple(env[s] for s in step.scratch),
                                                 stream=stream)
                    if result is not None:
                        _store(result, outs)
            except Exception as e:  # noqa: BLE001 - every failure must name the node
                raise located(e, "EXECUTE", None, step.node) from e
            if prefetcher is not None:
                prefetcher.after(position)
            if profile is not None:
                profile.append((position, started, clock() - started))
            if trace is not None:
                trace(step, [env[o] if o >= 0 else None for o in step.outputs])


def _run_eager(step, kernel, env):
    """A step whose shapes depend on values known only now: infer, prepare, allocate, run.

    The kernel is this run's alone; the outputs are new arrays (never views of
    the arena, whose bytes later steps may reuse).
    """
    args = [env[i] if i >= 0 else None for i in step.inputs]
    infos = [TensorInfo.of(a) if a is not None else None for a in args]
    inferred = kernel.shape_rule(*infos)
    out_infos = list(inferred)[:len(step.outputs)]
    scratch = tuple(np.empty(s, d) for s, d in kernel.ready(inferred.derived, *infos))
    args = [None if k in kernel.packed else a for k, a in enumerate(args)]
    # A shape of None: known only once the kernel has run (a Loop's scan outputs);
    # the kernel then returns that output instead of writing it.
    outs = tuple(np.empty(info.shape, info.dtype) if o >= 0 and info.shape is not None else None
                 for o, info in zip(step.outputs, out_infos))
    result = kernel.run(*args, outs=outs, scratch=scratch)
    if result is not None:
        results = result if isinstance(result, (tuple, list)) else (result,)
        outs = tuple(np.asarray(r) if out is None else out for r, out in zip(results, outs))
        _store(results, outs)
    for o, out in zip(step.outputs, outs):
        if o >= 0:
            env[o] = out


def _store(result, outs):
    results = result if isinstance(result, (tuple, list)) else (result,)
    for out, value in zip(outs, results):
        if out is None or value is out:
            continue
        value = np.asarray(value)
        if value.shape != out.shape:
            raise ExecutionError(f"the kernel returned shape {value.shape}, the plan expected {out.shape}")
        np.copyto(out, value, casting="unsafe")
