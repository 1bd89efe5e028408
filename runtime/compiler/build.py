"""PREPARE: turn a loaded Graph and concrete input shapes into a frozen Plan.

`compile_graph` runs the passes of passes.PASSES in their order, each a function
from one frozen stage (stages.py) to the next:

    check_supported, capture_outer_values, topological_order   the graph as it may run
    constants_as_weights, fold_batchnorm, fold_conv_bias, flush_denormals,
    fuse_patterns, fuse_activations, fuse_residual             rewrites (switchable)
    infer_shapes (with fold_constants), drop_dead              what every value is
    prepare_kernels                                            packing and scratch
    arena_buffers, memory_aware_order, lifetimes,
    assign_offsets                                             the arena
    build_plan, release_weights                                the Plan; mapped pages back
"""

import math
import time
from dataclasses import replace

import numpy as np

from .. import ops, size_limit
from ..cache_file import in_cache_file
from ..errors import ModelError, UnsupportedOperatorError, raise_located
from ..ir import Graph
from ..memory_limit import anonymous_bytes
from ..onnx_types import type_name
from ..ops import jit, parallel
from ..ops.conv_core import scratch_limit
from ..ops.registry import NeedsValueError, NoElements, TensorInfo, inputs_digest, instantiate, node_digest
from ..weights import ExternalData, is_anonymous, weight_array
from .arena import assign_offsets
from .lifetimes import lifetimes, live_bytes, lower_bound
from .order import topological
from .budget import plan_budget
from .order_search import best_order
from .passes import PassRunner
from .plan import (ALIAS, ARENA, CACHED, CONSTANT, EAGER, FEED, FRESH, MAPPED, MEMORY, PACKED, ArenaBuffer,
                   ArenaSlot, Plan, PlannedStep, ValueSlot, WeightRead)
from .release import EagerRelease, mapped_weights, release_unused
from .denormals import flush_denormal_weights
from .fuse_patterns import fuse_patterns
from .inline import inlined, taken_branch
from .rewrite import (capture_outer_values, constants_as_weights, drop_identities, fold_batchnorm, fold_conv_bias,
                      fuse_activations, fuse_residual, passes_through, renamed_inputs)
from .stages import (Buffers, Context, NodeList, Placement, Prepared, PreparedStep, Shaped, ShapedStep,
                     frozen_map)

FOLD_MIN_BYTES = 1 << 20  # a folded value may always be this large...
# ...or as large as the known inputs it was computed from; beyond that, folding
# would trade a per-run computation for resident memory, which is not our trade.


class CompileOptions:
    """Which passes to skip (by name, see passes.PASSES); the five switches of old are names too."""

    def __init__(self, disabled_passes=(), order_search_seconds=1.0, memory_budget=None, memory_budget_auto=None,
                 max_tensor_bytes=None, compiled_kernels=None, kernel_threads=1, **switches):
        disabled = set(disabled_passes)
        for name, on in switches.items():
            if not on:
                disabled.add(name)
        self.disabled_passes = frozenset(disabled)
        self.order_search_seconds = order_search_seconds  # the memory-optimal order's time budget
        self.memory_budget = memory_budget  # bytes beyond the baseline, or None: no budget
        # 'auto': the process's anonymous bytes when the budget was read from the cgroup. Before
        # plan_budget the budget loses what they grew by since (the model's structure, the
        # kernels' plans: what loading and compiling took) and two sets of graph outputs (a
        # caller holds the last run's while the next runs). Page cache is not counted: PREPARE
        # fills it with the weights it reads, and it is handed back.
        self.memory_budget_auto = memory_budget_auto
        # The largest tensor the graph or its feeds may make (SessionOptions.max_tensor_bytes,
        # resolved); None: the limit in force (size_limit.current()).
        self.max_tensor_bytes = max_tensor_bytes
        # Whether kernels may be compiled by numba (ops/jit.py); None: as NNRUN_JIT says.
        self.compiled_kernels = compiled_kernels
        # The threads of the kernels' pool the plan runs on (threads.kernel_threads): kernels that
        # serve one thread better than the pool's split choose by it (ops/parallel.planned_threads).
        self.kernel_threads = kernel_threads

    def __repr__(self):
        return (f"CompileOptions(disabled_passes={sorted(self.disabled_passes)}, "
                f"order_search_seconds={self.order_search_seconds})")


SCRATCH_FLOOR = 256 * 1024  # the least scratch per tile a budget leaves a convolution


def default_opset(graph, domain):
    if domain in graph.opsets:
        return graph.opsets[domain]
    if domain == "":
        return 21
    return 1


def compile_graph(graph, feeds, options=CompileOptions(), constants=None, planner=None, packer=None):
    """Plan the graph for `feeds`: input name -> (shape tuple, numpy dtype).

    `constants` (name -> array) are values known at PREPARE besides the graph's
    initializers: a subgraph's captured outer-scope constants. `planner` plans the
    bodies of control-flow nodes (a plan_cache.PlanCache; see ops/control.py); `packer`
    keeps what kernels pack (`Kernel.pack`; None: in memory). Under a memory budget a
    convolution's scratch per tile is at most a sixteenth of it (4 MiB otherwise).
    No feed, value or scratch may be larger than `options.max_tensor_bytes` (size_limit.py),
    which is in force for the shape rules and kernels while the graph is planned.
    """
    limit = size_limit.current() if options.max_tensor_bytes is None else options.max_tensor_bytes
    with size_limit.in_force(limit), jit.chosen(options.compiled_kernels), \
            parallel.planned(options.kernel_threads) as planned:
        if options.memory_budget is None:
            plan = _compile_graph(graph, feeds, options, constants, planner, packer, limit)
        else:
            with scratch_limit(max(SCRATCH_FLOOR, options.memory_budget // 16)):
                plan = _compile_graph(graph, feeds, options, constants, planner, packer, limit)
    return replace(plan, on_team=True) if planned.team else plan


def _compile_graph(graph, feeds, options, constants, planner, packer, limit):
    started = time.perf_counter()
    run = PassRunner(options.disabled_passes)
    run("check_supported", check_supported, graph)
    weights_in_files = mapped_weights(graph)
    sources = {id(w.source): w.source for w in weights_in_files}.values()
    released_before = sum(s.released_bytes for s in sources)
    context = Context(graph, frozen_map(feeds), tuple(v.name for v in graph.outputs),
                      EagerRelease(run.enabled("release_weights")), planner, packer)
    weights = dict(graph.initializers)
    weights.update(constants or {})
    nodes = NodeList(tuple(graph.nodes), frozen_map(weights))

    nodes = run("capture_outer_values", lambda n: NodeList(tuple(capture_outer_values(n.nodes)), n.weights),
                nodes)
    nodes = run("topological_order", topological_order, nodes, context)
    nodes = run("drop_identities", drop_identities_pass, nodes, context)
    nodes = run("constants_as_weights", constants_as_weights_pass, nodes, context)
    nodes = run("fold_batchnorm", fold_batchnorm_pass, nodes, context)
    nodes = run("fold_conv_bias", fold_conv_bias_pass, nodes, context)
    nodes = run("flush_denormals", flush_denormals_pass, nodes, context)
    nodes = run("fuse_patterns", fuse_patterns_pass, nodes, context)
    nodes = run("fuse_activations", fuse_activations_pass, nodes, context)
    nodes = run("fuse_residual", fuse_residual_pass, nodes, context)
    shaped = run("infer_shapes", infer_shapes, nodes, context, run.enabled("fold_constants"),
                 run.enabled("inline_if"), limit, run.enabled("drop_identities"))
    run("check_output_types", check_output_types, shaped, graph)
    shaped = run("drop_dead", drop_dead, shaped, context)
    prepared = run("prepare_kernels", prepare_kernels, shaped, context, limit)
    buffers = run("arena_buffers", arena_buffers, prepared, context)
    search = run("memory_aware_order", memory_aware_order, buffers, options.order_search_seconds,
                 otherwise=lambda buffers, seconds: memory_aware_order(buffers, None))
    order = search.order
    spans = run("lifetimes", buffer_lifetimes, buffers, order)
    placement = run("assign_offsets", place, order, spans, buffers)
    plan = run("build_plan", build_plan, prepared, buffers, placement, context)

    if run.enabled("release_weights"):
        run("release_weights", release_unused, weights_in_files, plan.mapped_weights)
    if options.memory_budget is not None:
        budget = options.memory_budget
        if options.memory_budget_auto is not None:
            grown = max(0, anonymous_bytes() - options.memory_budget_auto)
            outputs = sum(math.prod(shape) * np.dtype(dtype).itemsize
                          for shape, dtype in filter(None, plan.output_infos))
            budget = max(1, budget - grown - 2 * outputs)
        plan = run("plan_budget", plan_budget, plan, budget)
    stats = dict(plan.stats)
    mapped = [w for w in graph.initializers.values() if isinstance(w, ExternalData)]
    stats["weights_mapped_bytes"] = sum(w.nbytes for w in mapped)
    stats["weights_packed_bytes"] = _packed_bytes(plan)
    stats["weights_released_bytes"] = sum(s.released_bytes for s in sources) - released_before
    stats["passes_ms"] = dict(run.ms)
    stats["order_search"] = search.summary()
    stats["file_order_peak_bytes"] = search.file_order_peak_bytes
    stats["prepare_ms"] = (time.perf_counter() - started) * 1e3
    return Plan(**{**plan.__dict__, "stats": stats})


# --- the graph as it may run -----------------------------------------------------------------------

def check_supported(graph):
    """Every (domain, op, opset) without a kernel, in the graph and in the bodies of its control-flow
    nodes at any depth, raised at once: a body's op is refused when the session is made, not when
    a run first takes that branch."""
    missing = list(unsupported(graph))
    if missing:
        raise UnsupportedOperatorError(missing)


def unsupported(graph):
    """(domain, op, opset) of each node of `graph` and its bodies that has no kernel; the bodies are
    walked without recursion (they nest as deep as the file says)."""
    pending = [graph]
    while pending:
        graph = pending.pop()
        for node in graph.nodes:
            version = default_opset(graph, node.domain)
            if ops.lookup(node.domain, node.op_type, version) is None:
                yield node.domain, node.op_type, version
            for value in node.attrs.values():
                for body in value if isinstance(value, list) else (value,):
                    if isinstance(body, Graph):
                        pending.append(body)


def topological_order(nodes, context):
    available = set(nodes.weights) | set(context.feeds)
    order = topological([n.inputs for n in nodes.nodes], [n.outputs for n in nodes.nodes], available)
    return NodeList(tuple(nodes.nodes[i] for i in order), nodes.weights)


def fold_batchnorm_pass(nodes, context):
    weights = dict(nodes.weights)
    keep = context.packer.pack if context.packer is not None else None
    folded = fold_batchnorm(list(nodes.nodes), weights, set(context.outputs), context.release.copied, keep)
    return NodeList(tuple(folded), frozen_map(weights))


def fold_conv_bias_pass(nodes, context):
    weights = dict(nodes.weights)
    keep = context.packer.pack if context.packer is not None else None
    folded = fold_conv_bias(list(nodes.nodes), weights, set(context.outputs), context.release.copied, keep)
    return NodeList(tuple(folded), frozen_map(weights))


def drop_identities_pass(nodes, context):
    return NodeList(tuple(drop_identities(list(nodes.nodes), set(context.outputs))), nodes.weights)


def constants_as_weights_pass(nodes, context):
    weights = dict(nodes.weights)
    kept = constants_as_weights(list(nodes.nodes), weights, set(context.outputs))
    return NodeList(tuple(kept), frozen_map(weights))


def flush_denormals_pass(nodes, context):
    weights = dict(nodes.weights)
    used = dict.fromkeys(name for node in nodes.nodes for name in node.inputs if name in weights)
    keep = context.packer.pack if context.packer is not None else None
    flush_denormal_weights(weights, used, keep, context.release.copied)
    return NodeList(nodes.nodes, frozen_map(weights))


def fuse_patterns_pass(nodes, context):
    fused = fuse_patterns(list(nodes.nodes), nodes.weights, set(context.outputs), default_opset(context.graph, ""))
    return NodeList(tuple(fused), nodes.weights)


def fuse_activations_pass(nodes, context):
    return NodeList(tuple(fuse_activations(list(nodes.nodes), nodes.weights, set(context.outputs))),
                    nodes.weights)


def fuse_residual_pass(nodes, context):
    return NodeList(tuple(fuse_residual(list(nodes.nodes), set(context.outputs))), nodes.weights)


# --- what every value is ----------------------------------------------------------------------------

def _weight_info(w):
    """What infer_shapes knows of a weight: its value, and the mapped bytes it views, if any."""
    return TensorInfo(tuple(w.shape), np.dtype(w.dtype), weight_array(w),
                      weight=w if isinstance(w, ExternalData) else None)


def infer_shapes(nodes, context, fold, inline=True, limit=None, pass_through=True):
    """Each node's shape rule on concrete shapes, in order; with `fold`, known values computed now;
    with `inline`, an If whose condition is known by then is replaced by the branch it takes, and
    with `pass_through` (drop_identities), an Identity or Dropout among the branch's nodes hands its
    input on as drop_identities does before (the nodes after it read the input itself), and so does
    a node whose output is its input unchanged on these shapes (a Cast to the input's own type).
    Every feed and every output a shape rule gives is checked against `limit`
    (max_tensor_bytes; None: the limit in force) before anything is made of it.

    Folding runs inside this walk, node by node, because later shape rules need the
    values it produces (a Reshape's shape computed from a Shape). A node whose shape
    depends on a value known only per run becomes an eager step (outputs None), and so
    does one whose shape rule gives an output no shape (a sequence, an optional).
    A feed of shape None is a sequence or an optional: known only per run too.
    """
    graph = context.graph
    limit = size_limit.current() if limit is None else limit
    for name, (shape, dtype) in context.feeds.items():
        if shape is not None:
            size_limit.tensor_bytes(shape, dtype, f"input {name!r}", limit)
    infos = {name: TensorInfo(tuple(shape), np.dtype(dtype)) if shape is not None else None
             for name, (shape, dtype) in context.feeds.items()}
    for name, w in nodes.weights.items():
        infos[name] = _weight_info(w)
    steps = []
    # values whose shapes are known only when the model runs
    dynamic = {name for name, (shape, _) in context.feeds.items() if shape is None}
    defined = set(infos) | {o for node in nodes.nodes for o in node.outputs if o}  # for inline_if
    pending = list(reversed(nodes.nodes))  # a stack: an inlined If pushes its branch's nodes
    renamed = {}  # the output of a dropped Identity of an inlined branch -> the value it hands on
    while pending:
        node = pending.pop()
        if renamed:
            node = renamed_inputs(node, renamed)
        if (pass_through and passes_through(node) and node.inputs[0] in infos
                and node.outputs[0] not in context.outputs):
            renamed[node.outputs[0]] = node.inputs[0]
            infos[node.outputs[0]] = infos[node.inputs[0]]
            if node.inputs[0] in dynamic:
                dynamic.add(node.outputs[0])
            continue
        pass_name = "infer_shapes"
        cond = infos.get(node.inputs[0]) if inline and node.inputs and node.inputs[0] else None
        branch = taken_branch(node, cond, defined) if cond is not None else None
        if branch is not None:
            spliced, branch_weights = inlined(node, branch)
            for name, w in branch_weights.items():
                infos[name] = _weight_info(w)
            defined |= set(branch_weights) | {o for n in spliced for o in n.outputs if o}
            pending.extend(reversed(spliced))
            continue
        try:
            version = default_opset(graph, node.domain)
            kernel = instantiate(ops.lookup(node.domain, node.op_type, version), node, version,
                                 context.planner)
            in_infos = []
            for name in node.inputs:
                if not name:
                    in_infos.append(None)
                elif name in infos:
                    in_infos.append(infos[name])
                else:
                    raise ModelError(f"input {name!r} is not known here")
            inferred = None
            if not any(name in dynamic for name in node.inputs):
                try:
                    inferred = kernel.shape_rule(*in_infos)
                except NeedsValueError:
                    pass
                if inferred is not None and any(info.shape is None for info in inferred):
                    inferred = None  # an output outside the arena: made per run
            if inferred is None:
                for name in node.outputs:
                    if name:
                        dynamic.add(name)
                        infos[name] = None
                steps.append(ShapedStep(node, kernel, tuple(in_infos), None))
                continue
            out_infos = list(inferred)[:len(node.outputs)]
            derived = frozen_map(inferred.derived)
            if len(out_infos) < len([o for o in node.outputs if o]):
                raise ModelError(f"the shape rule gave {len(out_infos)} outputs for {len(node.outputs)}")
            for k, (name, info) in enumerate(zip(node.outputs, out_infos)):
                size_limit.tensor_bytes(info.shape, info.dtype, f"output {name or k!r}", limit)
            if fold and _foldable(kernel, in_infos, out_infos):
                pass_name = "fold_constants"
                out_infos = fold_constants(kernel, derived, in_infos, out_infos, limit)
        except Exception as e:  # noqa: BLE001 - every failure must name the node
            raise_located(e, "PREPARE", pass_name, node)
        if pass_through and _unchanged(node, in_infos, out_infos, context.outputs):
            # a Cast to its own type, a Reshape to its own shape: the nodes after it read the input
            renamed[node.outputs[0]] = node.inputs[0]
            infos[node.outputs[0]] = infos[node.inputs[0]]
            continue
        if context.packer is not None:
            out_infos = _kept_in_cache(context.packer, node, in_infos, out_infos)
        for name, info in zip(node.outputs, out_infos):
            if name:
                infos[name] = info
        if not all(info.value is not None for name, info in zip(node.outputs, out_infos) if name):
            steps.append(ShapedStep(node, kernel, tuple(in_infos), tuple(out_infos), derived))
    for name in context.outputs:
        if name not in infos:
            raise ModelError(f"graph output {name!r} is produced by no node")
    return Shaped(tuple(steps), frozen_map(infos))


def _unchanged(node, in_infos, out_infos, graph_outputs):
    """Whether `node`'s one output is its first input as it is: its buffer (alias), shape and type,
    a value known only per run, and not a graph output (which must be produced by that name)."""
    if len(out_infos) != 1 or len(node.outputs) != 1 or node.outputs[0] in graph_outputs or not in_infos:
        return False
    out, source = out_infos[0], in_infos[0]
    return (out.alias_of == 0 and out.value is None and source is not None and source.value is None
            and tuple(out.shape) == tuple(source.shape) and out.dtype == source.dtype)


CACHED_VALUE_MIN_BYTES = 4096  # smaller values made at PREPARE stay in memory


def _kept_in_cache(packer, node, in_infos, out_infos):
    """Values made at PREPARE (folded, or given by a shape rule: a widened fp16 weight) kept by the
    weight cache: views of its file, so that they take no anonymous memory."""
    kept = []
    for k, info in enumerate(out_infos):
        value = info.value
        if (isinstance(value, np.ndarray) and value.nbytes >= CACHED_VALUE_MIN_BYTES and info.weight is None
                and is_anonymous(value)):
            name = f"value/{node.index}/{node_digest(node)}/{k}/{inputs_digest(in_infos)}"
            info = TensorInfo(info.shape, info.dtype, packer.pack(name, value), info.alias_of)
        kept.append(info)
    return kept


def _foldable(kernel, in_infos, out_infos):
    if not kernel.foldable:
        return False
    if any(i is not None and i.value is None for i in in_infos):
        return False
    if all(o.value is not None for o in out_infos):
        return False
    budget = max(FOLD_MIN_BYTES, sum(i.value.nbytes for i in in_infos if i is not None))
    return sum(o.nbytes for o in out_infos) <= budget


def fold_constants(kernel, derived, in_infos, out_infos, limit=None):
    """The node's outputs computed now, from inputs all known at PREPARE; its scratch checked
    against `limit` (None: the limit in force) first."""
    values = [i.value if i is not None else None for i in in_infos]
    if len(out_infos) == 1 and out_infos[0].alias_of is not None:
        source = in_infos[out_infos[0].alias_of]  # a view of the same bytes: of the same weight
        view = values[out_infos[0].alias_of].reshape(out_infos[0].shape)
        return [TensorInfo(view.shape, view.dtype, view, weight=source.weight)]
    spec = kernel.ready(derived, *in_infos)
    for k, (s, d) in enumerate(spec):
        size_limit.tensor_bytes(s, d, f"scratch {k}", limit)
    scratch = [np.empty(s, d) for s, d in spec]
    args = [None if k in kernel.packed else v for k, v in enumerate(values)]
    outs = tuple(np.empty(o.shape, o.dtype) for o in out_infos)
    with np.errstate(all="ignore"):  # inf and NaN are values, as in a run (executor.run)
        result = kernel.run(*args, outs=outs, scratch=tuple(scratch))
    if result is not None:
        results = result if isinstance(result, (tuple, list)) else (result,)
        outs = tuple(np.asarray(r, dtype=o.dtype).reshape(o.shape) for r, o in zip(results, out_infos))
    return [TensorInfo.of(o) for o in outs]


def check_output_types(shaped, graph):
    """ModelError for a graph output whose element type is not the one the model declares for it
    (onnxruntime refuses such a model at load): a caller reading the declared type would misread it."""
    for v in graph.outputs:
        info = shaped.infos.get(v.name)
        if v.dtype is None or v.containers or not isinstance(info, TensorInfo) or info.dtype is None:
            continue
        if np.dtype(info.dtype) != np.dtype(v.dtype):
            raise ModelError(f"graph output {v.name!r} is declared {type_name(v.dtype)}, but the node that "
                             f"makes it gives {type_name(info.dtype)}")


def drop_dead(shaped, context):
    """Only the steps some graph output depends on."""
    needed = set(context.outputs)
    live = []
    for step in reversed(shaped.steps):
        if any(o in needed for o in step.node.outputs if o):
            live.append(step)
            needed.update(n for n in step.node.inputs if n)
    return Shaped(tuple(reversed(live)), shaped.infos)


def prepare_kernels(shaped, context, limit=None):
    """Each kernel packs its constant inputs and sizes its scratch, each scratch buffer no larger
    than `limit` (None: the limit in force); eager steps prepare per run."""
    steps = []
    for step in shaped.steps:
        scratch = ()
        if step.outputs and all(o.shape is not None and o.alias_of is None and o.size == 0 for o in step.outputs):
            step = replace(step, kernel=NoElements(step.node, step.kernel.opset), derived={})
        elif step.outputs is not None:
            try:
                spec = step.kernel.ready(step.derived, *step.inputs, packer=context.packer)
                for k, (s, d) in enumerate(spec):
                    size_limit.tensor_bytes(s, d, f"scratch {k}", limit)
            except Exception as e:  # noqa: BLE001
                raise_located(e, "PREPARE", "prepare_kernels", step.node)
            scratch = tuple((tuple(s), np.dtype(d)) for s, d in spec)
        steps.append(PreparedStep(step.node, step.kernel, step.inputs, step.outputs, step.derived, scratch))
    return Prepared(tuple(steps), shaped.infos)


# --- the arena ---------------------------------------------------------------------------------------

def arena_buffers(prepared, context):
    """Which arena buffers each step reads and writes; a value's buffer is itself or an alias's source."""
    output_set = set(context.outputs)
    produced = {}  # value name -> step position
    root = {}
    fresh, dynamic = set(), set()
    for pos, step in enumerate(prepared.steps):
        if step.outputs is None:
            dynamic.update(n for n in step.node.outputs if n)
            produced.update((n, pos) for n in step.node.outputs if n)
            continue
        for name, info in zip(step.node.outputs, step.outputs):
            if not name:
                continue
            produced[name] = pos
            if info.alias_of is not None:
                source = step.node.inputs[info.alias_of]
                root[name] = root.get(source)
            elif name in output_set or info.dtype.kind == "O":
                # Strings are Python objects, not bytes an arena can hold: new arrays each run.
                fresh.add(name)
            else:
                root[name] = name
    reads, writes, scratch_names, sizes = [], [], [], {}
    for pos, step in enumerate(prepared.steps):
        reads.append(tuple(root[n] for n in step.node.inputs if n and root.get(n)))
        writes.append(tuple(n for n in step.node.outputs if n and root.get(n) == n))
        label = step.node.name or step.node.op_type
        names = tuple(f"{label}#{pos}/scratch{k}" for k in range(len(step.scratch)))
        scratch_names.append(names)
        for name, (shape, dtype) in zip(names, step.scratch):
            sizes[name] = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    for name, r in root.items():
        if r == name:
            sizes[name] = prepared.infos[name].nbytes
    deps = tuple(frozenset(produced[n] for n in step.node.inputs if n in produced) for step in prepared.steps)
    pinned = frozenset(root[n] for n in context.outputs if root.get(n))
    return Buffers(tuple(reads), tuple(writes), tuple(scratch_names), frozen_map(sizes), pinned, deps,
                   frozen_map(root), frozenset(fresh), frozenset(dynamic))


def memory_aware_order(buffers, seconds=1.0):
    """The order of least peak that `seconds` of search proves (order_search.py); None: the file's."""
    scratch_bytes = [sum(buffers.sizes[s] for s in names) for names in buffers.scratch]
    return best_order(list(buffers.deps), list(buffers.reads), list(buffers.writes), buffers.sizes,
                      scratch_bytes, buffers.pinned, seconds)


def buffer_lifetimes(buffers, order):
    producers, readers = {}, {}
    for pos, i in enumerate(order):
        for b in buffers.writes[i]:
            producers[b] = pos
        for b in buffers.reads[i]:
            readers.setdefault(b, []).append(pos)
        for s in buffers.scratch[i]:
            producers[s] = pos
    return frozen_map(lifetimes(producers, readers, keep_to_end=buffers.pinned, n_steps=len(order)))


def place(order, spans, buffers):
    offsets, arena_bytes = assign_offsets(dict(spans), buffers.sizes)
    return Placement(tuple(order), spans, frozen_map(offsets), arena_bytes)


# --- the Plan ----------------------------------------------------------------------------------------

def build_plan(prepared, buffers, placement, context):
    """Slots for every value, the PlannedSteps in order, and the constants they read."""
    infos = prepared.infos
    slots, names = {}, []

    def slot(name):
        if name not in slots:
            slots[name] = len(names)
            names.append(name)
        return slots[name]

    # A feed of shape None is a sequence or an optional, held by no arena slot.
    feed_slots = {name: (slot(name), tuple(shape), np.dtype(dtype)) if shape is not None else (slot(name), None, None)
                  for name, (shape, dtype) in context.feeds.items()}
    produced = {n for step in prepared.steps for n in step.node.outputs if n}
    constants = {name: info.value for name, info in infos.items()
                 if info is not None and info.value is not None and name not in produced}

    arena = []
    for buf, offset in placement.offsets.items():
        if buf in infos:
            arena.append(ArenaSlot(slot(buf), offset, infos[buf].shape, infos[buf].dtype))
    for pos, scratch in enumerate(buffers.scratch):
        for name, (shape, dtype) in zip(scratch, prepared.steps[pos].scratch):
            arena.append(ArenaSlot(slot(name), placement.offsets[name], shape, dtype))

    # The constants some step reads at run time, aligned where the file left them unaligned (one a
    # kernel packed is read by it no more: an aligned copy of it would be held for nothing); the
    # weights whose mapped bytes they still view are the ones the plan keeps mapped.
    const_values, kept = {}, {}
    for n in dict.fromkeys(n for step in prepared.steps for k, n in enumerate(step.node.inputs)
                           if k not in step.kernel.packed):
        if n in constants:
            weight = infos[n].weight
            const_values[n], copied = _aligned(constants[n], weight, context.release, context.packer)
            if weight is not None and not copied:
                kept[weight.id] = weight

    value_slots = {}  # name -> its ValueSlot, made once: a value is written by one step and read by others

    def value_slot(name):
        found = value_slots.get(name)
        if found is None:
            found = value_slots[name] = _value_slot(name)
        return found

    def _value_slot(name, kind=None):
        info = infos.get(name)
        if kind is None:
            if name in feed_slots:
                kind = FEED
            elif name in constants:
                kind = CONSTANT
            elif name in buffers.dynamic:
                kind = EAGER
            elif name in buffers.fresh:
                kind = FRESH
            elif buffers.root.get(name) == name:
                kind = ARENA
            else:
                kind = ALIAS
        offset = placement.offsets.get(name, -1) if kind == ARENA else -1
        return ValueSlot(slot(name), name, kind, None if info is None else tuple(info.shape),
                         None if info is None else info.dtype, offset)

    steps = []
    for i in placement.order:
        step = prepared.steps[i]
        node, kernel = step.node, step.kernel
        kernel.freeze()
        ins = tuple(-1 if (not n or k in kernel.packed) else slot(n) for k, n in enumerate(node.inputs))
        outs = tuple(slot(n) if n else -1 for n in node.outputs)
        input_values = tuple(value_slot(n) if n else None for n in node.inputs)
        output_values = tuple(value_slot(n) if n else None for n in node.outputs)
        weights = tuple(_weight_read(n, k, kernel, infos, kept) for k, n in enumerate(node.inputs)
                        if n and (n in const_values or k in kernel.packed and n in constants))
        common = dict(input_values=input_values, output_values=output_values, weights=weights)
        if step.outputs is None:
            steps.append(PlannedStep(node.index, node, kernel, ins, outs, eager=True, **common))
            continue
        alias = step.outputs[0].alias_of if len(step.outputs) == 1 else None
        scratch_slots = tuple(slot(s) for s in buffers.scratch[i])
        steps.append(PlannedStep(
            node.index, node, kernel, ins, outs, scratch_slots,
            alias_of=ins[alias] if alias is not None else -1,
            alias_shape=tuple(step.outputs[0].shape) if alias is not None else (),
            scratch_bytes=sum(buffers.sizes[s] for s in buffers.scratch[i]), **common))

    fresh = {slot(n): (infos[n].shape, infos[n].dtype) for n in buffers.fresh}
    const_slots = {slots[n]: v for n, v in const_values.items() if n in slots}
    for n in context.outputs:  # a graph output known at PREPARE is copied out of its slot per run
        slot(n)
        if n in constants:
            const_slots[slots[n]] = constants[n]
            if infos[n].weight is not None:
                kept[infos[n].weight.id] = infos[n].weight
    outputs = tuple((n, slots[n]) for n in context.outputs)
    # The run owns these values: a graph output among them is handed out as it is (a sequence or an
    # optional fed as an output is never changed by a run, so it needs no copy either).
    dynamic_slots = frozenset(slots[n] for n in buffers.dynamic if n in slots) | frozenset(
        s for s, shape, _ in feed_slots.values() if shape is None)
    output_infos = tuple(None if infos[n] is None else (infos[n].shape, infos[n].dtype)
                         for n in context.outputs)
    live = live_bytes(placement.spans, buffers.sizes, len(placement.order))
    arena_buffers = tuple(sorted((ArenaBuffer(b, offset, buffers.sizes[b], *placement.spans[b])
                                  for b, offset in placement.offsets.items()),
                                 key=lambda b: (b.offset, b.first)))
    return Plan(tuple(steps), tuple(names), const_slots, feed_slots, tuple(arena), fresh, outputs,
                dynamic_slots, placement.arena_bytes, lower_bound(placement.spans, buffers.sizes),
                {"steps": len(steps), "eager_steps": sum(1 for s in steps if s.eager)}, output_infos, live,
                arena_buffers, tuple(kept.values()))


def _weight_read(name, k, kernel, infos, kept):
    """What step input `k`, the constant `name`, reads: the weight's id in the file when it has one."""
    info = infos[name]
    weight_id = info.weight.id if info.weight is not None else -1
    if k in kernel.packed:
        where = CACHED if kernel.packed_cached_bytes and not kernel.packed_bytes else PACKED
    elif weight_id in kept:
        where = MAPPED
    elif in_cache_file(info.value):
        where = CACHED  # made at PREPARE (a folded filter, a folded value) and kept in the cache file
    else:
        where = MEMORY
    return WeightRead(name, info.nbytes, where, weight_id)


def _aligned(value, weight, release, packer=None):
    """(the value itself, False), or (an aligned copy, True) when it lies unaligned in the file.

    A raw_data payload starts wherever protobuf put it; numpy hands an unaligned
    operand to BLAS only after copying it, on every call. Copying it once here
    is packing like any other (through the weight cache when there is one): the
    mapped pages of `weight` are then released.
    """
    array = value.array() if isinstance(value, ExternalData) else value
    if isinstance(array, np.ndarray) and not array.flags.aligned:
        copy = None
        if packer is not None and weight is not None:
            # A weight cache writes the bytes straight from the mapping into its file: no
            # anonymous copy of the weight, ever (a 64 MB one would count against a memory limit).
            kept = packer.pack(f"aligned/w{weight.id}", lambda: array)
            copy = kept if isinstance(kept, np.ndarray) and kept.flags.aligned else None
        if copy is None:
            copy = np.array(array, copy=True)
        release.copied(weight)
        return copy, True
    return value, False


def _packed_bytes(plan):
    """Weight bytes PREPARE made that live in anonymous memory: what rewrites and folding made that
    a step reads (a weight a kernel packed is dropped after: ResNet-50's folded weights packed in
    the compiled product's tiles were counted twice, 145 MB where 102 MB stay), and what kernels
    packed (`Kernel.pack`), unless a weight cache holds them."""
    made = {id(value): value for value in plan.constants.values()}
    total = sum(a.nbytes for a in made.values() if isinstance(a, np.ndarray) and a.base is None)
    return total + sum(step.kernel.packed_bytes for step in plan.steps)
