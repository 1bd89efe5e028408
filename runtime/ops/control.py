"""Control flow: If, Loop and Scan (opset 8 and 9 on), whose bodies are subgraphs.

A body is planned like the main graph (its own arena, folding, order), once per
signature of what it is fed, by the planner PREPARE hands these kernels when it
makes them (the session's plan cache): they never import the compiler or the
executor. A planner has one method,

    planner.executor(graph, feeds, constants, body=True) -> an executor

where `feeds` maps input name -> (shape, dtype), `constants` name -> array, and
the executor has `plan` (a frozen Plan) and `run(feeds) -> {output name: array}`.

Values the body reads from the outer scope arrive as extra node inputs (the
compiler appends them and names them in `_captured`). Small integer captured
values known at PREPARE are planned as constants, so shape arithmetic on them
folds inside the body; everything else is fed. A sequence or an optional (see
registry.SequenceInfo) is fed with shape None: the body's plan is the same
whatever it holds, and the steps that read it run eagerly.
"""

import numpy as np

from .. import size_limit, terminate
from ..errors import NnrunError
from .registry import REQUIRED, Kernel, SequenceInfo, TensorInfo, info_of, register

# Captured integer values this small are planned as constants inside a body.
CONSTANT_CAPTURE_LIMIT = 64


class Body:
    """One subgraph, the opset it inherits, and the planner that plans it."""

    def __init__(self, graph, opset, planner):
        self.graph = graph
        if not graph.opsets:
            graph.opsets = {"": opset}
        self.planner = planner
        self.input_names = [v.name for v in graph.inputs]
        self.output_names = [v.name for v in graph.outputs]

    def executor(self, feeds, captured, constant_names):
        """The executor for feeds (name -> TensorInfo or array) and captured values.

        Captured values named in `constant_names` are planned as constants.
        """
        fed, constants = {}, {}
        for name, v in list(feeds.items()) + list(captured.items()):
            info = v if isinstance(v, (TensorInfo, SequenceInfo)) else info_of(v)
            if info is None or info.shape is None:
                fed[name] = (None, None)  # a sequence or an optional
            elif name in constant_names and info.value is not None:
                constants[name] = np.asarray(info.value)
            else:
                fed[name] = (tuple(info.shape), info.dtype)
        return self.planner.executor(self.graph, fed, constants, body=True)

    def output_infos(self, feeds, captured, constant_names):
        """(shape, dtype) of each body output for these feeds, or None where only a run can tell."""
        return self.executor(feeds, captured, constant_names).plan.output_infos

    def run(self, feeds, captured, constant_names):
        executor = self.executor(feeds, captured, constant_names)
        results = executor.run({**feeds, **{n: v for n, v in captured.items()
                                            if n in executor.plan.feeds}})
        return [results[n] for n in self.output_names]


def _small_int(value):
    value = np.asarray(value)
    return value.dtype.kind in "iub" and value.size <= CONSTANT_CAPTURE_LIMIT


class ControlFlow(Kernel):
    """Base of the ops that run subgraphs (If, Loop, Scan; SequenceMap and FlexAttention too):
    each body attribute becomes a `Body` planned by the session's planner."""

    foldable = False
    uses_planner = True
    body_attributes = ()

    def __init__(self, node, opset, planner=None):
        if planner is None:
            raise RuntimeError(f"{node.op_type} plans its bodies through a planner; "
                               f"compile it through a PlanCache")
        self.planner = planner
        super().__init__(node, opset)

    def fresh(self):
        return type(self)(self.node, self.opset, planner=self.planner)

    def decode(self):
        self.captured = list(self.node.attrs.get("_captured", []))
        self.bodies = {attr: Body(getattr(self, attr), self.opset, self.planner)
                       for attr in self.body_attributes}

    def split(self, args):
        """(regular inputs, {captured name: value}) from the node's inputs."""
        n = len(args) - len(self.captured)
        return list(args[:n]), dict(zip(self.captured, args[n:]))

    def constant_names_of(self, infos):
        """The captured values the bodies take as constants: the small integer ones known now
        (shape arithmetic inside the body then folds)."""
        _, captured = self.split(infos)
        return frozenset(n for n, i in captured.items()
                         if isinstance(i, TensorInfo) and i.value is not None and _small_int(i.value))

    def prepare(self, *infos):
        self.constant_names = self.constant_names_of(infos)
        return []


def _constant_output(plan, index):
    """The value of a body output the plan folded to a constant: True/False for a flag, else None."""
    _, slot = plan.outputs[index]
    value = plan.constants.get(slot)
    if value is None or np.asarray(value).size != 1:
        return None
    return bool(np.asarray(value).reshape(-1)[0])


def _same(infos_a, infos_b):
    """Whether two lists of (shape, dtype) are alike, every shape known (not None: a sequence's)."""
    return all(a is not None and b is not None and a[0] is not None and b[0] is not None
               and tuple(a[0]) == tuple(b[0]) and a[1] == b[1] for a, b in zip(infos_a, infos_b))


def _alike(values_a, values_b):
    """Whether two lists of values are arrays of the same shapes and dtypes."""
    return all(isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.shape == b.shape
               and a.dtype == b.dtype for a, b in zip(values_a, values_b))


def _output_info(shape_dtype):
    """A body output's TensorInfo; one that only a run tells (a sequence, an optional): shape None."""
    if shape_dtype is None or shape_dtype[0] is None:
        return TensorInfo(None, None)
    return TensorInfo(tuple(shape_dtype[0]), np.dtype(shape_dtype[1]))


@register("If", since=1)
class If(ControlFlow):
    attributes = {"then_branch": REQUIRED, "else_branch": REQUIRED}
    body_attributes = ("then_branch", "else_branch")

    def infer(self, cond, *rest):
        _, captured = self.split((cond, *rest))
        constant_names = self.constant_names_of((cond, *rest))
        if cond.value is not None:
            branches = ["then_branch" if bool(np.asarray(cond.value).reshape(-1)[0]) else "else_branch"]
        else:
            branches = ["then_branch", "else_branch"]
        try:
            results = [self.bodies[b].output_infos({}, captured, constant_names) for b in branches]
        except NnrunError:
            if len(branches) == 1:
                raise
            # A branch that cannot be planned for these inputs is one that will not be
            # taken for them (exporters leave such branches); which one runs decides.
            self.needs_value("cond")
        if len(branches) == 1:
            return [_output_info(r) for r in results[0]]
        if not all(_same(results[0], r) for r in results):
            self.needs_value("cond")  # the branches' outputs differ: which one runs decides
        return [TensorInfo(tuple(shape), np.dtype(dtype)) for shape, dtype in results[0]]

    def run(self, cond, *rest, outs, scratch):
        _, captured = self.split((cond, *rest))
        branch = "then_branch" if bool(np.asarray(cond).reshape(-1)[0]) else "else_branch"
        return tuple(self.bodies[branch].run({}, captured, self.constant_names))


@register("Loop", since=1)
class Loop(ControlFlow):
    """Loop(M, cond, v_initial...) -> (v_final..., scan_outputs...)."""

    attributes = {"body": REQUIRED}
    body_attributes = ("body",)

    def _feeds(self, iteration, carried, infos=False):
        # The body's cond input is always True when the body runs: it is planned as a
        # constant (see _captured), so a body that passes it through cannot stop early.
        names = self.bodies["body"].input_names
        values = [np.array(iteration, np.int64)] + list(carried)
        if infos:
            values = [TensorInfo.of(v) if isinstance(v, np.ndarray) else v for v in values]
        return dict(zip(names[:1] + names[2:], values))

    def _captured(self, captured, constant_names):
        cond_name = self.bodies["body"].input_names[1]
        return {**captured, cond_name: np.array(True)}, constant_names | {cond_name}

    def infer(self, m, cond, *rest):
        regular, captured = self.split((m, cond, *rest))
        carried = regular[2:]
        body = self.bodies["body"]
        n_scan = len(body.output_names) - 1 - len(carried)
        # A carried sequence or optional (SequenceInfo, None) is fed as it is: shape None.
        plain = [TensorInfo(c.shape, c.dtype) if isinstance(c, TensorInfo) else c for c in carried]
        captured, constant_names = self._captured(captured, self.constant_names_of((m, cond, *rest)))
        executor = body.executor(self._feeds(0, plain, infos=True), captured, constant_names)
        outs = executor.plan.output_infos
        runs_to_the_end = _constant_output(executor.plan, 0) is True
        carried_out = outs[1:1 + len(carried)]
        stable = _same(carried_out, [(c.shape, c.dtype) if c is not None else None for c in carried])
        scan_infos = outs[1 + len(carried):]
        known = all(i is None or i.value is not None for i in regular[:2])
        trips = self._trip_count(m, cond, runs_to_the_end) if known else None
        if stable and (not n_scan or trips is not None and all(o is not None for o in scan_infos)):
            return plain + [TensorInfo((trips, *shape), np.dtype(dtype))
                            for shape, dtype in scan_infos]
        if all(i is None or i.value is not None for i in regular):
            # Run eagerly with every value at hand: shapes the iterations decide are left
            # open (None) and the run returns those outputs.
            carried_infos = plain if stable else [TensorInfo(None, getattr(c, "dtype", None)) for c in carried]
            return carried_infos + [TensorInfo(None, np.dtype(d) if d is not None else None)
                                    for d in (o[1] if o else None for o in scan_infos)]
        self.needs_value("M" if m is not None and m.value is None else "cond")

    def _runs_to_the_end(self, carried, captured, constant_names):
        """Whether the body's plan for these feeds cannot stop the loop (its cond output is True)."""
        executor = self.bodies["body"].executor(self._feeds(0, carried), captured, constant_names)
        return _constant_output(executor.plan, 0) is True

    @staticmethod
    def _trip_count(m, cond, runs_to_the_end):
        """Iterations known before running: M given and the body cannot stop early."""
        if m is None or not runs_to_the_end:
            return None
        if cond is not None and not bool(np.asarray(cond.value).reshape(-1)[0]):
            return 0
        return int(np.asarray(m.value).reshape(-1)[0])

    def run(self, m, cond, *rest, outs, scratch):
        regular, captured = self.split((m, cond, *rest))
        captured, constant_names = self._captured(captured, self.constant_names)
        carried = first = list(regular[2:])
        body = self.bodies["body"]
        n_scan = len(body.output_names) - 1 - len(carried)
        trips = None if m is None else int(np.asarray(m).reshape(-1)[0])
        keep_going = True if cond is None else bool(np.asarray(cond).reshape(-1)[0])
        scans = [[] for _ in range(n_scan)]
        scanned = 0  # bytes of the scan values so far
        i = 0
        while keep_going and (trips is None or i < trips):
            terminate.check()  # a trip count a file sets to 2^62 can be stopped
            results = body.run(self._feeds(i, carried), captured, constant_names)
            keep_going = bool(np.asarray(results[0]).reshape(-1)[0])
            carried = results[1:1 + len(carried)]
            for acc, value in zip(scans, results[1 + len(carried):]):
                acc.append(value)
            i += 1
            if n_scan:
                scanned += sum(getattr(v, "nbytes", 0) for v in results[1 + len(carried):])
                if i == 1 and trips is not None and trips > 1 and _alike(first, carried) \
                        and self._runs_to_the_end(first, captured, constant_names):
                    # Every iteration runs the same plan, which cannot stop the loop, and scans
                    # values of these sizes: all of them are checked now, not after hours.
                    size_limit.held_bytes(trips * n_scan, trips * scanned, f"the scan outputs of {trips:,} iterations")
                size_limit.held_bytes(i * n_scan, scanned, f"the scan outputs after {i:,} iterations")
        stacked = []
        for k, acc in enumerate(scans):
            if acc:
                stacked.append(np.stack(acc))
            else:
                out = outs[len(carried) + k]
                stacked.append(np.empty((0,) if out is None else out.shape, np.float32
                                        if out is None else out.dtype))
        return tuple(carried) + tuple(stacked)


@register("Scan", since=9)
class Scan(ControlFlow):
    """Scan(initial_state..., scan_input...) -> (final_state..., scan_output...)."""

    attributes = {"body": REQUIRED, "num_scan_inputs": REQUIRED, "scan_input_axes": None,
                  "scan_input_directions": None, "scan_output_axes": None,
                  "scan_output_directions": None}
    body_attributes = ("body",)

    def _layout(self, regular):
        n_in = self.num_scan_inputs
        states, scan_inputs = regular[:len(regular) - n_in], regular[len(regular) - n_in:]
        axes = [a % len(x.shape) for a, x in
                zip(self.scan_input_axes or [0] * n_in, scan_inputs)]
        directions = self.scan_input_directions or [0] * n_in
        return states, scan_inputs, axes, directions

    def infer(self, *args):
        regular, captured = self.split(args)
        states, scan_inputs, axes, _ = self._layout(regular)
        steps = {x.shape[a] for x, a in zip(scan_inputs, axes)}
        if len(steps) != 1:
            self.fail(f"scan inputs have different lengths {sorted(steps)} along their axes")
        (t,) = steps
        body = self.bodies["body"]
        slices = [TensorInfo(tuple(d for k, d in enumerate(x.shape) if k != a), x.dtype)
                  for x, a in zip(scan_inputs, axes)]
        plain = [TensorInfo(s.shape, s.dtype) for s in states]
        feeds = dict(zip(body.input_names, plain + slices))
        outs = body.output_infos(feeds, captured, self.constant_names_of(args))
        if any(o is None for o in outs):
            self.needs_value(body.input_names[0])
        result = [TensorInfo(tuple(shape), np.dtype(dtype)) for shape, dtype in outs[:len(states)]]
        out_axes = self.scan_output_axes or [0] * (len(outs) - len(states))
        for (shape, dtype), axis in zip(outs[len(states):], out_axes):
            axis = axis % (len(shape) + 1)
            result.append(TensorInfo((*shape[:axis], t, *shape[axis:]), np.dtype(dtype)))
        return result

    def run(self, *args, outs, scratch):
        regular, captured = self.split(args)
        states, scan_inputs, axes, directions = self._layout(regular)
        body = self.bodies["body"]
        t = scan_inputs[0].shape[axes[0]] if scan_inputs else 0
        n_states = len(states)
        collected = [[] for _ in range(len(body.output_names) - n_states)]
        for i in range(t):
            terminate.check()
            slices = [np.take(x, t - 1 - i if d else i, axis=a)
                      for x, a, d in zip(scan_inputs, axes, directions)]
            results = body.run(dict(zip(body.input_names, list(states) + slices)), captured,
                               self.constant_names)
            states = results[:n_states]
            for acc, value in zip(collected, results[n_states:]):
                acc.append(value)
        out_axes = self.scan_output_axes or [0] * len(collected)
        out_dirs = self.scan_output_directions or [0] * len(collected)
        for k, (acc, axis, d) in enumerate(zip(collected, out_axes, out_dirs)):
            target = outs[n_states + k]
            if d:
                acc = acc[::-1]
            if acc:
                np.copyto(target, np.stack(acc, axis=axis % target.ndim))
        for target, value in zip(outs[:n_states], states):
            np.copyto(target, value)


@register("Scan", since=8)
class Scan8(ControlFlow):
    """Scan of opset 8: (sequence_lens, initial_state..., scan_input...) -> (final_state...,
    scan_output...), every value with a batch axis first and the scan inputs and outputs their
    sequence axis second. Each batch row is scanned on its own, over its sequence length; scan
    outputs are padded with zeros beyond it."""

    attributes = {"body": REQUIRED, "num_scan_inputs": REQUIRED, "directions": None}
    body_attributes = ("body",)

    def _layout(self, regular):
        rest = regular[1:]
        n_states = len(rest) - self.num_scan_inputs
        return regular[0], rest[:n_states], rest[n_states:]

    def infer(self, *args):
        regular, captured = self.split(args)
        _, states, scan_inputs = self._layout(regular)
        if any(len(x.shape) < 2 for x in scan_inputs) or any(len(s.shape) < 1 for s in states):
            self.fail("every state needs a batch axis, every scan input a batch and a sequence axis")
        batches = {x.shape[0] for x in list(states) + list(scan_inputs)}
        steps = {x.shape[1] for x in scan_inputs}
        if len(batches) != 1 or len(steps) > 1:
            self.fail(f"batch sizes {sorted(batches)} and sequence lengths {sorted(steps)} must agree")
        (batch,), t = batches, (steps.pop() if steps else 0)
        body = self.bodies["body"]
        feeds = dict(zip(body.input_names, [TensorInfo(s.shape[1:], s.dtype) for s in states]
                         + [TensorInfo(x.shape[2:], x.dtype) for x in scan_inputs]))
        outs = body.output_infos(feeds, captured, self.constant_names_of(args))
        if any(o is None or o[0] is None for o in outs):
            self.needs_value(body.input_names[0])
        n = len(states)
        return ([TensorInfo((batch, *shape), np.dtype(dtype)) for shape, dtype in outs[:n]]
                + [TensorInfo((batch, t, *shape), np.dtype(dtype)) for shape, dtype in outs[n:]])

    def run(self, *args, outs, scratch):
        regular, captured = self.split(args)
        lens, states, scan_inputs = self._layout(regular)
        body = self.bodies["body"]
        n = len(states)
        directions = self.directions or [0] * len(scan_inputs)
        t = scan_inputs[0].shape[1] if scan_inputs else 0
        for target in outs[n:]:
            target[...] = 0
        for b in range(outs[0].shape[0] if outs else 0):
            length = t if lens is None else int(lens[b])
            if not 0 <= length <= t:
                self.fail(f"sequence length {length} of batch row {b} is beyond the {t} steps")
            carried = [s[b] for s in states]
            for i in range(length):
                terminate.check()
                slices = [x[b, length - 1 - i if d else i] for x, d in zip(scan_inputs, directions)]
                results = body.run(dict(zip(body.input_names, carried + slices)), captured, self.constant_names)
                carried = results[:n]
                for target, value in zip(outs[n:], results[n:]):
                    target[b, i] = value
            for target, value in zip(outs[:n], carried):
                target[b] = value
