"""PREPARE: turn a loaded Graph and concrete input shapes into a frozen Plan.

The passes, in order, each switchable in `CompileOptions`:
1. kernels looked up for every node; all unsupported ops reported at once;
2. nodes put in topological order;
3. Conv+BatchNormalization folding, activation fusion (rewrite.py);
4. shape inference and constant folding in one walk: each kernel's shape rule
   runs on concrete shapes, and a node whose inputs are all known runs now;
5. dead steps dropped; each remaining kernel prepared (packing weights);
6. a memory-aware order, lifetimes, arena offsets;
7. mapped weights that nothing reads any more are released.
"""

import time
from dataclasses import dataclass

import numpy as np

from .. import ops
from ..errors import ModelError, NnrunError, UnsupportedOperatorError, node_label
from ..ir import weight_array
from ..loader.mapped import ExternalData
from ..ops.registry import NeedsValueError, TensorInfo
from .arena import assign_offsets
from .lifetimes import lifetimes, lower_bound
from .order import memory_aware, topological
from .plan import ArenaSlot, Plan, Step
from .release import EagerRelease, kept_arrays, mapped_sources, release_unused
from .rewrite import capture_outer_values, fold_batchnorm, fuse_activations

FOLD_MIN_BYTES = 1 << 20  # a folded value may always be this large...
# ...or as large as the known inputs it was computed from; beyond that, folding
# would trade a per-run computation for resident memory, which is not our trade.


@dataclass(frozen=True)
class CompileOptions:
    fold_constants: bool = True
    fold_batchnorm: bool = True
    fuse_activations: bool = True
    memory_aware_order: bool = True
    release_weights: bool = True


def default_opset(graph, domain):
    if domain in graph.opsets:
        return graph.opsets[domain]
    if domain == "":
        return 21
    return 1


def check_supported(graph):
    """Every (domain, op, opset) of the graph without a kernel, raised at once."""
    missing = []
    for node in graph.nodes:
        version = default_opset(graph, node.domain)
        if ops.lookup(node.domain, node.op_type, version) is None:
            missing.append((node.domain, node.op_type, version))
    if missing:
        raise UnsupportedOperatorError(missing)


def _fail(index, node, phase, error):
    if isinstance(error, NnrunError):
        message = str(error)
        if node_label(index, node) in message:
            return error
        return type(error)(f"{node_label(index, node)} failed to {phase}: {message}")
    return ModelError(f"{node_label(index, node)} failed to {phase}: "
                      f"{type(error).__name__}: {error}")


def compile_graph(graph, feeds, options=CompileOptions(), constants=None):
    """Plan the graph for `feeds`: input name -> (shape tuple, numpy dtype).

    `constants` (name -> array) are values known at PREPARE besides the graph's
    initializers: a subgraph's captured outer-scope constants.
    """
    started = time.perf_counter()
    check_supported(graph)
    weights = dict(graph.initializers)
    weights.update(constants or {})
    graph_outputs = [v.name for v in graph.outputs]
    output_set = set(graph_outputs)
    available = set(weights) | set(feeds)
    nodes = capture_outer_values(graph.nodes)
    index_of = {id(n): i for i, n in enumerate(nodes)}
    order = topological([n.inputs for n in nodes], [n.outputs for n in nodes], available)
    nodes = [nodes[i] for i in order]

    sources = mapped_sources(graph)
    released_before = sum(s.released_bytes for s in sources)
    eager = EagerRelease(sources, options.release_weights)
    if options.fold_batchnorm:
        nodes = fold_batchnorm(nodes, weights, output_set, eager.copied)
    if options.fuse_activations:
        nodes = fuse_activations(nodes, weights, output_set)

    # 4. shape inference and constant folding
    infos = {name: TensorInfo(tuple(shape), np.dtype(dtype)) for name, (shape, dtype) in feeds.items()}
    for name, w in weights.items():
        infos[name] = TensorInfo(tuple(w.shape), np.dtype(w.dtype), weight_array(w))
    steps = []  # (index, node, kernel, in_infos, out_infos); out_infos None: an eager step
    dynamic = set()  # values whose shapes are known only when the model runs
    for node in nodes:
        index = index_of.get(id(node), -1)
        version = default_opset(graph, node.domain)
        try:
            kernel = ops.lookup(node.domain, node.op_type, version)(node, version)
            in_infos = []
            for name in node.inputs:
                if not name:
                    in_infos.append(None)
                elif name in infos:
                    in_infos.append(infos[name])
                else:
                    raise ModelError(f"input {name!r} is not known here")
            if any(name in dynamic for name in node.inputs):
                out_infos = None
            else:
                try:
                    out_infos = list(kernel.infer(*in_infos))[:len(node.outputs)]
                except NeedsValueError:
                    out_infos = None
            if out_infos is None:
                for name in node.outputs:
                    if name:
                        dynamic.add(name)
                        infos[name] = None
                steps.append((index, node, kernel, in_infos, None))
                continue
            if len(out_infos) < len([o for o in node.outputs if o]):
                raise ModelError(f"the shape rule gave {len(out_infos)} outputs for "
                                 f"{len(node.outputs)}")
            if options.fold_constants and _foldable(kernel, in_infos, out_infos):
                out_infos = _fold(kernel, in_infos, out_infos)
        except Exception as e:  # noqa: BLE001 - every failure must name the node
            raise _fail(index, node, "prepare", e) from e
        for name, info in zip(node.outputs, out_infos):
            if name:
                infos[name] = info
        if not all(info.value is not None for name, info in zip(node.outputs, out_infos) if name):
            steps.append((index, node, kernel, in_infos, out_infos))

    for name in graph_outputs:
        if name not in infos:
            raise ModelError(f"graph output {name!r} is produced by no node")

    # 5. drop dead steps, prepare the rest
    needed = set(graph_outputs)
    live_steps = []
    for step in reversed(steps):
        if any(o in needed for o in step[1].outputs if o):
            live_steps.append(step)
            needed.update(n for n in step[1].inputs if n)
    live_steps.reverse()

    scratch_specs = []
    for index, node, kernel, in_infos, out_infos in live_steps:
        if out_infos is None:
            scratch_specs.append([])
            continue
        try:
            spec = kernel.prepare(*in_infos) or []
        except Exception as e:  # noqa: BLE001
            raise _fail(index, node, "prepare", e) from e
        scratch_specs.append([(tuple(s), np.dtype(d)) for s, d in spec])

    plan = _layout(graph, feeds, infos, live_steps, scratch_specs, graph_outputs, options, eager)
    stats_eager = sum(1 for s in plan.steps if s.eager)

    stats = dict(plan.stats, eager_steps=stats_eager)
    output_infos = tuple(None if infos[n] is None else (infos[n].shape, infos[n].dtype)
                         for n in graph_outputs)
    mapped = [w for w in graph.initializers.values() if isinstance(w, ExternalData)]
    stats["weights_mapped_bytes"] = sum(w.nbytes for w in mapped)
    stats["weights_packed_bytes"] = _packed_bytes(plan, weights, graph.initializers)
    if options.release_weights:
        release_unused(sources, kept_arrays(plan.constants.values(), [s.kernel for s in plan.steps]))
    stats["weights_released_bytes"] = sum(s.released_bytes for s in sources) - released_before
    stats["prepare_ms"] = (time.perf_counter() - started) * 1e3
    return Plan(**{**plan.__dict__, "stats": stats, "output_infos": output_infos})


def _foldable(kernel, in_infos, out_infos):
    if not kernel.foldable:
        return False
    if any(i is not None and i.value is None for i in in_infos):
        return False
    if all(o.value is not None for o in out_infos):
        return False
    budget = max(FOLD_MIN_BYTES, sum(i.value.nbytes for i in in_infos if i is not None))
    return sum(o.nbytes for o in out_infos) <= budget


def _fold(kernel, in_infos, out_infos):
    values = [i.value if i is not None else None for i in in_infos]
    if len(out_infos) == 1 and out_infos[0].alias_of is not None:
        return [TensorInfo.of(values[out_infos[0].alias_of].reshape(out_infos[0].shape))]
    scratch = [np.empty(s, d) for s, d in (kernel.prepare(*in_infos) or [])]
    args = [None if k in kernel.packed else v for k, v in enumerate(values)]
    outs = tuple(np.empty(o.shape, o.dtype) for o in out_infos)
    result = kernel.run(*args, outs=outs, scratch=tuple(scratch))
    if result is not None:
        results = result if isinstance(result, (tuple, list)) else (result,)
        outs = tuple(np.asarray(r, dtype=o.dtype).reshape(o.shape) for r, o in zip(results, out_infos))
    return [TensorInfo.of(o) for o in outs]


def _layout(graph, feeds, infos, live_steps, scratch_specs, graph_outputs, options, eager):
    """Slots, order, lifetimes and offsets for the live steps."""
    slots = {}
    names = []

    def slot(name):
        if name not in slots:
            slots[name] = len(names)
            names.append(name)
        return slots[name]

    constants = {}
    feed_slots = {}
    for name, (shape, dtype) in feeds.items():
        feed_slots[name] = (slot(name), tuple(shape), np.dtype(dtype))

    produced = {}  # value name -> step position
    root = {}  # value name -> arena buffer name it lives in (itself, or an alias's source)
    output_set = set(graph_outputs)
    fresh_names = set()
    dynamic_names = set()
    for pos, (index, node, kernel, in_infos, out_infos) in enumerate(live_steps):
        if out_infos is None:
            dynamic_names.update(n for n in node.outputs if n)
            produced.update((n, pos) for n in node.outputs if n)
            continue
        for name, info in zip(node.outputs, out_infos):
            if not name:
                continue
            produced[name] = pos
            if info.alias_of is not None:
                source = node.inputs[info.alias_of]
                root[name] = root.get(source, None) if source in root else None
            elif name in output_set:
                fresh_names.add(name)
            else:
                root[name] = name
    for name, info in infos.items():
        if info is not None and info.value is not None and name not in produced:
            constants[name] = info.value

    # Buffers each step reads and writes, in arena terms.
    step_reads, step_writes = [], []
    scratch_names = []
    for pos, (index, node, kernel, in_infos, out_infos) in enumerate(live_steps):
        reads = [root[n] for n in node.inputs if n and root.get(n)]
        writes = [n for n in node.outputs if n and root.get(n) == n]
        scratch = [f"{node.name or node.op_type}#{pos}/scratch{k}" for k in range(len(scratch_specs[pos]))]
        scratch_names.append(scratch)
        step_reads.append(reads)
        step_writes.append(writes)
    sizes = {}
    for name, r in root.items():
        if r == name:
            sizes[name] = infos[name].nbytes
    for pos, scratch in enumerate(scratch_names):
        for name, (shape, dtype) in zip(scratch, scratch_specs[pos]):
            sizes[name] = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize

    pinned = {root[n] for n in graph_outputs if root.get(n)}
    scratch_bytes = [sum(sizes[s] for s in sc) for sc in scratch_names]
    if options.memory_aware_order:
        deps = [{produced[n] for n in node.inputs if n in produced} for _, node, *_ in live_steps]
        order = memory_aware(deps, step_reads, step_writes, sizes, scratch_bytes, pinned)
    else:
        order = list(range(len(live_steps)))

    producers, readers = {}, {}
    for pos, i in enumerate(order):
        for b in step_writes[i]:
            producers[b] = pos
        for b in step_reads[i]:
            readers.setdefault(b, []).append(pos)
        for s in scratch_names[i]:
            producers[s] = pos
    spans = lifetimes(producers, readers, keep_to_end=pinned, n_steps=len(order))
    offsets, arena_bytes = assign_offsets(spans, sizes)

    arena = []
    for buf, offset in offsets.items():
        if buf in infos:
            info = infos[buf]
            arena.append(ArenaSlot(slot(buf), offset, info.shape, info.dtype))
    for pos, scratch in enumerate(scratch_names):
        for name, (shape, dtype) in zip(scratch, scratch_specs[pos]):
            arena.append(ArenaSlot(slot(name), offsets[name], shape, dtype))

    steps = []
    for i in order:
        index, node, kernel, in_infos, out_infos = live_steps[i]
        ins = tuple(-1 if (not n or k in kernel.packed) else slot(n) for k, n in enumerate(node.inputs))
        outs = tuple(slot(n) if n else -1 for n in node.outputs)
        if out_infos is None:
            steps.append(Step(index, node, kernel, ins, outs, eager=True))
            continue
        alias = out_infos[0].alias_of if len(out_infos) == 1 else None
        steps.append(Step(index, node, kernel, ins, outs,
                          tuple(slot(s) for s in scratch_names[i]),
                          alias_of=ins[alias] if alias is not None else -1,
                          alias_shape=tuple(out_infos[0].shape) if alias is not None else ()))
        for n in node.inputs:
            if n and n in constants:
                slot(n)
    fresh = {slot(n): (infos[n].shape, infos[n].dtype) for n in fresh_names}
    const_slots = {slots[n]: _aligned(v, eager) for n, v in constants.items() if n in slots}
    for n in graph_outputs:
        slot(n)
        if n in constants:
            const_slots[slots[n]] = constants[n]
    outputs = tuple((n, slots[n]) for n in graph_outputs)
    lb = lower_bound(spans, sizes)
    dynamic_slots = frozenset(slots[n] for n in dynamic_names if n in slots)
    return Plan(tuple(steps), tuple(names), const_slots, feed_slots, tuple(arena), fresh, outputs,
                dynamic_slots, arena_bytes, lb, {"steps": len(steps)})


def _aligned(value, eager):
    """The value itself, or an aligned copy when it lies unaligned in the file.

    A raw_data payload starts wherever protobuf put it; numpy hands an unaligned
    operand to BLAS only after copying it, on every call. Copying it once here
    is packing like any other: the mapped pages are then released.
    """
    array = value.array() if isinstance(value, ExternalData) else value
    if isinstance(array, np.ndarray) and not array.flags.aligned:
        copy = np.array(array, copy=True)
        eager.copied(array)
        return copy
    return value


def _packed_bytes(plan, weights, initializers):
    """Anonymous weight bytes the plan holds: folded/packed arrays, not mapped views."""
    total = 0
    seen = set()

    def count(a):
        nonlocal total
        if isinstance(a, np.ndarray) and a.base is None and id(a) not in seen:
            seen.add(id(a))
            total += a.nbytes

    for name, value in weights.items():
        if name not in initializers:
            count(value)
    for value in plan.constants.values():
        count(value)
    for step in plan.steps:
        for value in vars(step.kernel).values():
            count(value)
    return total
