"""EXECUTE: run a frozen Plan over one arena.

Per-run state — the arena, the slot table, the output arrays — lives in an
`ArenaState` (reused between runs, one per concurrent run) and in locals; the
Plan is only read. Kernels write into arena views; nothing allocates per step
except what a kernel cannot avoid.

Sizes were checked at PREPARE against max_tensor_bytes (size_limit.py), except those a run's
values decide: an eager step's outputs and scratch are checked here before they are made, and
the limit is in force during a run for kernels that check what they make (a Loop's scan
outputs, sequences). What cannot be allocated (the arena, an output) is an NnrunError naming
it and its size, never a bare MemoryError.
"""

import math
import mmap
import threading
import time

import numpy as np

from .. import size_limit, terminate
from ..errors import ExecutionError, SizeLimitError, located, raise_located
from ..ops.registry import info_of
from ..paging import DIRECT_IO_ALIGNMENT, round_up, storage_bytes
from .band import run_banded
from .prefetch import Prefetcher
from .spill import SpillFile


class ArenaState:
    """One arena buffer and the slot table with every arena view made once."""

    def __init__(self, plan, limit):
        spills = plan.streaming.spills if plan.streaming is not None else ()
        if spills:  # page-aligned, for the spill file's direct I/O
            self.arena = _allocate("the arena", plan.arena_bytes, limit, lambda: np.frombuffer(
                mmap.mmap(-1, max(plan.arena_bytes, 1)), np.uint8)[:plan.arena_bytes])
        else:
            self.arena = _allocate("the arena", plan.arena_bytes, limit,
                                   lambda: np.empty(plan.arena_bytes, dtype=np.uint8))
        table = [None] * len(plan.slot_names)
        for slot, value in plan.constants.items():
            table[slot] = value.array() if hasattr(value, "array") else value
        for a in plan.arena:
            nbytes = math.prod(a.shape) * a.dtype.itemsize  # not np.prod: a hundred times slower on a tuple
            table[a.slot] = self.arena[a.offset:a.offset + nbytes].view(a.dtype).reshape(a.shape)
        self.table = table
        # Under a budget: each spilled activation's bytes where it is written from and read back to
        # (whole pages), its view there, and the file it waits in.
        offset = {a.slot: a.offset for a in plan.arena}
        pages = [round_up(s.nbytes, DIRECT_IO_ALIGNMENT) for s in spills]
        self.out_bytes = tuple(self.arena[offset[s.slot]:offset[s.slot] + n] for s, n in zip(spills, pages))
        self.back_bytes = tuple(self.arena[s.offset:s.offset + n] for s, n in zip(spills, pages))
        self.back = tuple(b[:s.nbytes].view(table[s.slot].dtype).reshape(table[s.slot].shape)
                          for b, s in zip(self.back_bytes, spills))
        # Under a budget that bands steps: the band area they share, and the file holds the
        # activations that live there.
        streaming = plan.streaming
        area = streaming.band_area_bytes if streaming is not None else 0
        self.band_area = _allocate("the band area", area, limit, lambda: np.frombuffer(
            mmap.mmap(-1, area), np.uint8)) if area else None
        self.spill_file = SpillFile() if spills or area else None
        self.fixed_arrays = None  # per step, its outputs and scratch when they are arena views (Executor._take)


class RunIO:
    """What a run under a budget read and waited for."""

    def __init__(self):
        self.read_bytes = 0  # from storage, by the whole process (/proc/self/io) during the run
        self.stalled_ns = 0  # waiting for streamed weights and spilled activations
        self.spill_written_bytes = 0
        self.spill_read_bytes = 0


class Executor:
    """Runs a Plan; thread-safe: concurrent runs take different ArenaStates.

    `max_tensor_bytes` bounds what a run's values may make an eager step allocate (None: the
    limit in force when the executor is made, see size_limit.py).
    """

    def __init__(self, plan, max_tensor_bytes=None):
        self.plan = plan
        self.max_tensor_bytes = size_limit.current() if max_tensor_bytes is None else max_tensor_bytes
        # slot -> position of the step that writes it (feeds and constants: none)
        self._producer = {slot: pos for pos, step in enumerate(plan.steps) for slot in step.outputs if slot >= 0}
        self._free = []
        self._lock = threading.Lock()
        # Kernels of eager steps, kept between runs (their caches, such as a body's plans,
        # survive) and handed to one run at a time.
        self._eager_kernels = {}
        # Under a memory budget: streamed weights read ahead of their steps and dropped after,
        # activations spilled and read back; runs take turns (two arenas would not fit).
        streaming = getattr(plan, "streaming", None)
        self.prefetcher = Prefetcher(streaming) if streaming is not None else None
        self._budgeted = threading.Lock() if streaming is not None else None
        spills = streaming.spills if streaming is not None else ()
        self._out_after = [[] for _ in plan.steps]
        self._back_at = [[] for _ in plan.steps]
        for i, spill in enumerate(spills):
            if spill.write:
                self._out_after[spill.out_after].append(i)
            self._back_at[spill.back_at].append(i)
        self.last_io = None  # RunIO of the last run under a budget
        self._bound = tuple(_bind(step) for step in plan.steps)
        # Slots whose arrays are the arena's own views, the same in every run on one ArenaState: a
        # kernel step whose outputs and scratch are all such gets them as tuples made once per
        # arena (`_fixed_arrays`), not gathered from the slot table on every run.
        varying = set(plan.fresh) | set(plan.dynamic) | {slot for slot, _, _ in plan.feeds.values()}
        varying.update(step.outputs[0] for step in plan.steps if step.alias_of >= 0)
        arena = {a.slot for a in plan.arena}
        self._fixed = tuple(kind is _KERNEL and all(o < 0 or (o in arena and o not in varying) for o in outs)
                            and all(s in arena and s not in varying for s in scratch)
                            for kind, _, _, outs, scratch in self._bound)

    def _take(self):
        with self._lock:
            if self._free:
                return self._free.pop()
        state = ArenaState(self.plan, self.max_tensor_bytes)
        state.fixed_arrays = self._fixed_arrays(state)
        return state

    def _fixed_arrays(self, state):
        """Per step, (outputs, scratch) as tuples of `state`'s arena views where `_fixed` says they
        are the same in every run, else None."""
        table = list(state.table) + [None]  # slot -1, an omitted output, is None
        return tuple((tuple([table[o] for o in outs]), tuple([table[s] for s in scratch])) if fixed else None
                     for fixed, (_, _, _, outs, scratch) in zip(self._fixed, self._bound))

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

    def close(self):
        """Stop the prefetch thread (after the run under way, if any) and drop the arenas."""
        if self.prefetcher is not None:
            with self._budgeted:
                self.prefetcher.close()
        self.release_arenas()
        with self._lock:
            self._eager_kernels.clear()

    def run(self, feeds, profile=None, trace=None, stop_after=None, into=None):
        """feeds: name -> array (validated by the caller). Returns {output name: array}.

        `into`, name -> array: graph outputs the caller wants written into its own arrays (I/O
        binding). An output its kernel writes straight (a `fresh` one) is written there when
        shape and dtype match the plan's; the result is then that array. The caller copies the
        others.

        `profile`, a list, gets `(position, start_ns, duration_ns)` appended for every step.
        The debugging knobs: `trace(step, outputs)` is called after each step with the
        PlannedStep and its output arrays (views the run may overwrite later: copy what
        you keep); `stop_after`, a step position, ends the run after that step, and the
        results then hold only the graph outputs computed by then.
        """
        with size_limit.in_force(self.max_tensor_bytes):  # for kernels that check what values decide
            if self._budgeted is not None:
                with self._budgeted:
                    return self._run(feeds, profile, trace, stop_after, into)
            return self._run(feeds, profile, trace, stop_after, into)

    def _run(self, feeds, profile, trace, stop_after, into=None):
        plan = self.plan
        state = self._take()
        try:
            env = list(state.table)
            env.append(None)  # slot -1, an omitted input or output, reads None
            for name, (slot, _, _) in plan.feeds.items():
                env[slot] = feeds[name]
            try:
                for slot, (shape, dtype) in plan.fresh.items():
                    env[slot] = np.empty(shape, dtype)
            except MemoryError as e:
                raise _out_of_memory(f"output {plan.slot_names[slot]!r}", _nbytes(shape, dtype),
                                     self.max_tensor_bytes, e) from e
            if into:
                _write_into(plan, into, env)
            # inf and NaN are values like any other here, as in onnxruntime: no warnings.
            with np.errstate(all="ignore"):
                if self.prefetcher is None and profile is None and trace is None and stop_after is None:
                    self._bound_steps(env, state.fixed_arrays)
                elif self.prefetcher is None:
                    self._steps(env, profile, trace, stop_after)
                else:
                    self._steps_within_budget(env, state, profile, trace, stop_after)
            results = {}
            for name, slot in plan.outputs:
                if stop_after is not None and self._producer.get(slot, -1) > stop_after:
                    continue
                value = env[slot]
                owned = slot in plan.fresh or slot in plan.dynamic
                try:
                    results[name] = value if owned else np.array(value, copy=True)
                except MemoryError as e:
                    raise _out_of_memory(f"output {name!r}", value.nbytes, self.max_tensor_bytes, e) from e
            return results
        finally:
            self._give(state)

    def _steps_within_budget(self, env, state, profile, trace, stop):
        """The steps, with weights streamed and activations spilled around them."""
        io, prefetcher, spills = RunIO(), self.prefetcher, self.plan.streaming.spills
        read_before, pending = storage_bytes(), {}
        prefetcher.start()

        def before(position):
            prefetcher.before(position)
            # A write started two steps ago, a read one step ago: the arena bytes are needed now.
            for key in ((position - 2, "out"), (position - 1, "back")):
                for job in pending.pop(key, ()):
                    started = time.perf_counter_ns()
                    job.result()
                    io.stalled_ns += time.perf_counter_ns() - started
            if self._back_at[position]:
                pending[(position, "back")] = [state.spill_file.read_back(state.back_bytes[i], spills[i].file_offset)
                                               for i in self._back_at[position]]
                for i in self._back_at[position]:
                    env[spills[i].slot] = state.back[i]

        def after(position):
            prefetcher.after(position)
            if self._out_after[position]:
                pending[(position, "out")] = [state.spill_file.write(state.out_bytes[i], spills[i].file_offset)
                                              for i in self._out_after[position]]

        def banded(position, step):
            run_banded(step, self.plan.streaming.banded[position], env, state.band_area, state.spill_file, io)

        try:
            self._steps(env, profile, trace, stop, before, after, banded if state.band_area is not None else None)
        finally:
            for jobs in pending.values():  # a run that ends early: nothing may touch the arena later
                for job in jobs:
                    job.exception()
            io.stalled_ns += prefetcher.stalled_ns
            io.read_bytes = storage_bytes() - read_before
            if state.spill_file is not None:
                io.spill_written_bytes, io.spill_read_bytes = (state.spill_file.written_bytes,
                                                               state.spill_file.read_bytes)
                state.spill_file.written_bytes = state.spill_file.read_bytes = 0
            self.last_io = io

    def _bound_steps(self, env, fixed_arrays):
        """The steps in order, as `_steps` runs them without a budget, profile, trace or stop: the
        plain loop, each step's kernel and slots bound when the executor was made, and its arena
        arrays when the arena was (`fixed_arrays`)."""
        position = 0
        options = terminate.current()
        try:
            for position, (kind, run, ins, outs, scratch) in enumerate(self._bound):
                if options is not None and options.terminate:
                    raise ExecutionError(terminate.MESSAGE)
                if kind is _KERNEL:
                    fixed = fixed_arrays[position]
                    if fixed is None:
                        arrays, spare = tuple([env[o] for o in outs]), tuple([env[s] for s in scratch])
                    else:
                        arrays, spare = fixed
                    result = run(*[env[i] for i in ins], outs=arrays, scratch=spare)
                    if result is not None:
                        _store(result, arrays)
                elif kind is _ALIAS:
                    env[outs] = env[ins].reshape(scratch)
                else:
                    self._eager(position, self.plan.steps[position], env)
        except Exception as e:  # noqa: BLE001 - every failure must name the node
            raise_located(e, "EXECUTE", None, self.plan.steps[position].node)

    def _eager(self, position, step, env):
        kernel = self._take_kernel(position, step)
        try:
            _run_eager(step, kernel, env, self.max_tensor_bytes)
        finally:
            with self._lock:
                self._eager_kernels[position].append(kernel)

    def _steps(self, env, profile, trace, stop, before=None, after=None, banded=None):
        """The steps in order; `banded(position, step)` runs those the budget put in bands."""
        clock = time.perf_counter_ns
        prefetcher = self.prefetcher
        in_bands = self.plan.streaming.banded if banded is not None else ()
        options = terminate.current()
        for position, step in enumerate(self.plan.steps):
            if stop is not None and position > stop:
                break
            if options is not None and options.terminate:
                raise located(ExecutionError(terminate.MESSAGE), "EXECUTE", None, step.node)
            if before is not None:
                before(position)
            if profile is not None:
                started = clock()
            try:
                if step.alias_of >= 0:
                    env[step.outputs[0]] = env[step.alias_of].reshape(step.alias_shape)
                elif in_bands and in_bands[position] is not None:
                    banded(position, step)
                elif step.eager:
                    self._eager(position, step, env)
                else:
                    _, run, ins, outs, scratch = self._bound[position]
                    args = [env[i] for i in ins]  # slot -1 reads the None at env's end
                    outs = tuple([env[o] for o in outs])
                    scratch = tuple([env[s] for s in scratch])
                    stream = prefetcher.blocks(position) if prefetcher is not None else None
                    if stream is None:
                        result = run(*args, outs=outs, scratch=scratch)
                    else:
                        result = run(*args, outs=outs, scratch=scratch, stream=stream)
                    if result is not None:
                        _store(result, outs)
            except Exception as e:  # noqa: BLE001 - every failure must name the node
                raise_located(e, "EXECUTE", None, step.node)
            if after is not None:
                after(position)
            if profile is not None:
                profile.append((position, started, clock() - started))
            if trace is not None:
                trace(step, [env[o] if o >= 0 else None for o in step.outputs])


_KERNEL, _ALIAS, _EAGER = "kernel", "alias", "eager"


def _write_into(plan, into, env):
    """The caller's arrays in place of the fresh arrays of the outputs it bound, where they fit."""
    for name, slot in plan.outputs:
        target = into.get(name)
        if target is None or slot not in plan.fresh:
            continue
        shape, dtype = plan.fresh[slot]
        if target.shape == tuple(shape) and target.dtype == dtype and target.flags.c_contiguous \
                and target.flags.writeable:
            env[slot] = target


def _bind(step):
    """(kind, run, inputs, outputs, scratch) of a step for `_bound_steps`: a kernel's bound run
    and its slots; an alias's source slot, output slot and shape; an eager step's kind alone."""
    if step.alias_of >= 0:
        return _ALIAS, None, step.alias_of, step.outputs[0], step.alias_shape
    if step.eager:
        return _EAGER, None, (), (), ()
    return _KERNEL, step.kernel.run, tuple(step.inputs), tuple(step.outputs), tuple(step.scratch)


def _run_eager(step, kernel, env, limit):
    """A step whose shapes depend on values known only now: infer, prepare, allocate, run.

    The kernel is this run's alone; the outputs are new arrays (never views of
    the arena, whose bytes later steps may reuse), sequences (tuples of arrays)
    or empty optionals (None): those never live in the arena. Outputs and scratch are
    checked against `limit` (max_tensor_bytes) before they are made.
    """
    args = [env[i] if i >= 0 else None for i in step.inputs]
    infos = [info_of(a) for a in args]
    inferred = kernel.shape_rule(*infos)
    out_infos = list(inferred)[:len(step.outputs)]
    for k, info in enumerate(out_infos):
        if info.shape is not None:
            name = step.node.outputs[k] if k < len(step.node.outputs) else ""
            size_limit.tensor_bytes(info.shape, info.dtype, f"output {name or k!r}", limit)
    spec = kernel.ready(inferred.derived, *infos)
    for k, (s, d) in enumerate(spec):
        size_limit.tensor_bytes(s, d, f"scratch {k}", limit)
    scratch = tuple(np.empty(s, d) for s, d in spec)
    args = [None if k in kernel.packed else a for k, a in enumerate(args)]
    # A shape of None: known only once the kernel has run (a Loop's scan outputs, a
    # sequence); the kernel then returns that output instead of writing it.
    outs = tuple(np.empty(info.shape, info.dtype) if o >= 0 and info.shape is not None else None
                 for o, info in zip(step.outputs, out_infos))
    result = kernel.run(*args, outs=outs, scratch=scratch)
    if result is not None:
        results = result if isinstance(result, (tuple, list)) else (result,)
        outs = tuple(_returned(r) if out is None else out for r, out in zip(results, outs))
        _store(results, outs)
    for o, out in zip(step.outputs, outs):
        if o >= 0:
            env[o] = out


def _nbytes(shape, dtype):
    n = np.dtype(dtype).itemsize
    for d in shape:
        n *= int(d)
    return n


def _allocate(what, nbytes, limit, make):
    """make(), which allocates `nbytes` for `what`; memory that cannot be had is an NnrunError
    naming them (see _out_of_memory)."""
    try:
        return make()
    except (MemoryError, OSError) as e:  # numpy's MemoryError; ENOMEM from an anonymous mmap
        raise _out_of_memory(what, nbytes, limit, e) from e


def _out_of_memory(what, nbytes, limit, e):
    """The error for `nbytes` of `what` that could not be allocated: SizeLimitError beyond `limit`
    (max_tensor_bytes), else ExecutionError."""
    if nbytes > limit:
        error = SizeLimitError(f"cannot allocate {what} of {nbytes:,} bytes, beyond max_tensor_bytes "
                               f"({limit:,}): {type(e).__name__}: {e}")
    else:
        error = ExecutionError(f"cannot allocate {what} of {nbytes:,} bytes: {type(e).__name__}: {e}")
    return located(error, "EXECUTE")


def _returned(value):
    """An eager kernel's returned output as the run keeps it: a sequence or None as it is."""
    return value if value is None or isinstance(value, tuple) else np.asarray(value)


def _store(result, outs):
    results = result if isinstance(result, (tuple, list)) else (result,)
    for out, value in zip(outs, results):
        if out is None or value is out:
            continue
        value = np.asarray(value)
        if value.shape != out.shape:
            raise ExecutionError(f"the kernel returned shape {value.shape}, the plan expected {out.shape}")
        np.copyto(out, value, casting="unsafe")
