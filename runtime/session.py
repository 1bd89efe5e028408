"""The Python API, with onnxruntime's names: InferenceSession, SessionOptions, NodeArg.

A session loads the model (MODEL_LOAD), prepares one Plan per input-shape
signature (PREPARE: at construction when every input shape is static, else on
the first run with a new signature) and runs plans (EXECUTE), recording each
phase's time and memory for `report()`.

Before each run the session checks that no file it maps (the model, its external
data files, the weight cache files its plans read) was truncated or rewritten in
place since it was mapped: a read of a truncated mapping ends the process
(SIGBUS), and a rewritten one gives other outputs. Such a file raises
`ModelFileChangedError`; one replaced by a rename is the old file still, and runs.
`close()` (or the end of a `with` block) unmaps the model and closes its files at
once; so does dropping the last reference, the session holding no reference cycle.
"""

import contextlib
import datetime
import gc
import os
import statistics
import sys
import threading
import time
from dataclasses import replace

import numpy as np

from . import ops, size_limit, terminate
from .compiler.release import return_free_heap
from .compiler.weight_cache import WeightCache, cache_key, model_origin
from .errors import ExecutionError, InputError, ModelError, NnrunError, SessionClosedError
from .ir import OPTIONAL, SEQUENCE, Graph
from .executor.profile import Profiler
from .loader import import_reader, load_model, model_format
from .memory_limit import anonymous_bytes, resolve_budget
from .onnx_types import type_name
from .options import RunOptions, SessionOptions
from .ortvalue import IOBinding, OrtValue
from .plan_cache import PlanCache
from .providers import CPU, requested
from .report import PhaseRecorder
from .threads import RunThreads

MEMORY_EVERY = 64  # runs between two readings of the process's RSS and HWM after the first ones


@contextlib.contextmanager
def _collector_paused():
    """Python's cycle collector held off while a session loads a model or prepares a plan: both make
    a great many objects that live as long as the session, and no garbage cycles worth finding
    early, while every collection of the older generations walks all of them again (a third of
    PREPARE on a graph of 100,000 nodes). Collection resumes after, as it was."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@contextlib.contextmanager
def _within_stack(error, phase):
    """A RecursionError as nnrun's `error`, never as itself. Nested graphs are loaded, planned and
    run by recursion, one level of frames per level of graphs; the loader bounds their depth to
    what protobuf allows, which fits Python's recursion limit with room to spare, unless the
    caller's own stack is already nearly as deep."""
    try:
        yield
    except RecursionError as e:
        raise _too_deep(error, phase, e) from None


def _too_deep(error, phase, e):
    return error(f"{phase}: the model's graphs nest deeper than Python's recursion limit "
                 f"({sys.getrecursionlimit()}) allows from this call ({e})")


class NodeArg:
    """An input or output as onnxruntime describes it."""

    def __init__(self, name, shape, type):
        self.name = name
        self.shape = shape
        self.type = type

    def __repr__(self):
        return f"NodeArg(name={self.name!r}, type={self.type!r}, shape={self.shape!r})"


class ModelMetadata:
    """What the model file says of itself: onnxruntime's `get_modelmeta()`."""

    def __init__(self, meta):
        self.producer_name = meta.producer_name
        self.graph_name = meta.graph_name
        self.domain = meta.domain
        self.description = meta.description
        self.graph_description = meta.graph_description
        self.version = meta.version
        self.custom_metadata_map = dict(meta.custom_metadata_map)


def _feed_rules(inputs):
    """name -> (its ValueInfo, its rank or None, the (axis, size) of its fixed dimensions): what
    `_check_feeds` checks of each feed, worked out once."""
    rules = {}
    for info in inputs:
        if info.dims is None:
            rules[info.name] = (info, None, ())
        else:
            fixed = tuple((axis, want) for axis, want in enumerate(info.dims) if isinstance(want, int) and want >= 0)
            rules[info.name] = (info, len(info.dims), fixed)
    return rules


def _stop_position(plan, stop_after):
    """The step position a RunOptions.stop_after (node name or position) names, or None."""
    if stop_after is None:
        return None
    if isinstance(stop_after, int):
        if not 0 <= stop_after < len(plan.steps):
            raise InputError(f"stop_after {stop_after} is not a step position (the plan has "
                             f"{len(plan.steps)} steps)")
        return stop_after
    for position, step in enumerate(plan.steps):
        if step.node.name == stop_after:
            return position
    raise InputError(f"stop_after {stop_after!r} names no step of the plan "
                     f"(a node folded at PREPARE or not needed for the outputs has none)")


def _budget_figures(plan, budget):
    """The report's memory budget fields (DESIGN.md): the plan's decision, or what holds without one."""
    streaming = getattr(plan, "streaming", None)
    if streaming is not None:
        return streaming.summary()
    return {"memory_budget_bytes": budget, "resident_weights_bytes": 0, "streamed_weights_bytes": 0,
            "spilled_activation_bytes": 0, "predicted_peak_bytes": 0}


def _with_run_io(phases, runs):
    """Under a budget, EXECUTE also gives the median per run of what streaming and spilling cost."""
    if not runs:
        return phases
    execute = dict(phases["EXECUTE"])
    execute["read_bytes_per_run"] = int(statistics.median(r.read_bytes for r in runs))
    execute["stalled_ms_per_run"] = round(statistics.median(r.stalled_ns for r in runs) / 1e6, 3)
    execute["spill_written_bytes_per_run"] = int(statistics.median(r.spill_written_bytes for r in runs))
    execute["spill_read_bytes_per_run"] = int(statistics.median(r.spill_read_bytes for r in runs))
    return {**phases, "EXECUTE": execute}


def _with_free_dimensions(graph, sizes):
    """The graph with its inputs' symbolic dims named in `sizes` given those sizes
    (SessionOptions.add_free_dimension_override_by_name)."""
    if not sizes:
        return graph
    graph.inputs = [v if v.dims is None else replace(v, dims=tuple(sizes.get(d, d) if isinstance(d, str) else d
                                                                   for d in v.dims))
                    for v in graph.inputs]
    return graph


def _described_outputs(graph):
    """The graph's outputs as onnxruntime describes them: a dim the file leaves symbolic or open
    takes the size ONNX shape inference finds for it, when it finds one."""
    if graph.format != "onnx" or graph.source is None or all(v.is_static for v in graph.outputs):
        return graph.outputs
    from .loader.onnx import inferred_outputs

    inferred = inferred_outputs(graph.source)
    described = []
    for v in graph.outputs:
        found = inferred.get(v.name)
        if found is not None and found.dims is not None:
            if v.dims is None:
                v = replace(v, dims=found.dims)
            elif len(v.dims) == len(found.dims):
                v = replace(v, dims=tuple(d if isinstance(d, int) or not isinstance(f, int) else f
                                          for d, f in zip(v.dims, found.dims)))
        described.append(v)
    return described


def _copied_into(name, result, target):
    """A bound output's array: the caller's, written by the run or copied into now."""
    if result is target:
        return target
    if result.shape != target.shape:
        raise InputError(f"output {name!r} is bound to an array of shape {list(target.shape)}; "
                         f"the run produced shape {list(result.shape)}")
    np.copyto(target, result, casting="same_kind")
    return target


def _type_name(dtype, containers=()):
    """onnxruntime's name of a value's type: `tensor(float)`, `seq(tensor(float))`, `optional(...)`."""
    name = type_name(dtype)
    for container in reversed(containers):
        name = f"seq({name})" if container == SEQUENCE else f"optional({name})"
    return name


def _container_feed(name, info, value):
    """A feed for an input declared a sequence or an optional: a tuple of arrays (given as a
    list), None for an empty optional, or the array an optional tensor holds."""
    if value is None:
        if info.containers[0] != OPTIONAL:
            raise InputError(f"input {name!r} is a {_type_name(info.dtype, info.containers)}, got None")
        return None
    if not isinstance(value, (list, tuple)):
        if SEQUENCE in info.containers:
            raise InputError(f"input {name!r} is a {_type_name(info.dtype, info.containers)}: "
                             f"give a list of arrays")
        return value
    if SEQUENCE not in info.containers:
        raise InputError(f"input {name!r} is a {_type_name(info.dtype, info.containers)}, got a list")
    elements = []
    for k, element in enumerate(value):
        array = np.asarray(element)
        if info.dtype is not None and array.dtype != info.dtype:
            if isinstance(element, np.ndarray) or not np.can_cast(array.dtype, info.dtype, "same_kind"):
                raise InputError(f"input {name!r}[{k}]: expected {_type_name(info.dtype)}, "
                                 f"got {_type_name(array.dtype)}")
            array = array.astype(info.dtype)
        elements.append(array if array.flags.c_contiguous else np.ascontiguousarray(array))
    return tuple(elements)


def _feed_array(name, info, value):
    """A tensor input's feed as an array of the declared dtype in native byte order: a value not
    yet an array (a list, a scalar) is converted where it loses nothing; anything else that is
    not the declared type is an InputError naming what was given."""
    expected = type_name(info.dtype) if info.dtype is not None else None
    if value is None:
        raise InputError(f"input {name!r}: expected {expected or 'a tensor'}, got None")
    if isinstance(value, np.ndarray):
        array = value
    elif isinstance(value, (list, tuple, int, float, complex, str, bytes, bool, np.generic)) \
            or hasattr(value, "__array__") or hasattr(value, "__array_interface__"):
        try:
            array = np.asarray(value)
        except ValueError as e:  # a ragged list
            raise InputError(f"input {name!r}: cannot make a tensor of the {type(value).__name__} "
                             f"given ({e})") from None
    else:
        raise InputError(f"input {name!r}: expected {expected or 'a tensor'} as a numpy array, "
                         f"got {type(value).__module__}.{type(value).__qualname__}")
    if info.dtype is None or array.dtype == info.dtype:
        return array
    if array.dtype.kind == "O" and info.dtype.kind != "O":
        raise InputError(f"input {name!r}: expected {expected}, got an array of Python objects")
    converts = (array.dtype.newbyteorder("=") == info.dtype  # to native byte order
                or (info.dtype.kind == "O" and array.dtype.kind in "US")  # numpy strings to a string tensor
                or (not isinstance(value, np.ndarray) and np.can_cast(array.dtype, info.dtype, "same_kind")))
    if not converts:
        raise InputError(f"input {name!r}: expected {expected}, got {type_name(array.dtype)}")
    try:
        return array.astype(info.dtype)
    except MemoryError:
        raise InputError(f"input {name!r}: no memory to convert the {array.nbytes:,} bytes given to "
                         f"{expected}") from None


class InferenceSession:
    def __init__(self, path_or_bytes, sess_options=None, providers=None, provider_options=None,
                 **kwargs):
        self._options = sess_options or SessionOptions()
        self._threads = RunThreads(self._options.intra_op_num_threads)
        requested(providers, provider_options)  # warns of any nnrun does not have, as onnxruntime
        ops.load_all()
        self._recorder = PhaseRecorder(poll=self._options.enable_mem_poll,
                                       interval_s=self._options.mem_poll_interval_ms / 1e3)
        is_path = isinstance(path_or_bytes, (str, os.PathLike))
        self._model_path = os.fspath(path_or_bytes) if is_path else None
        import_reader(model_format(path_or_bytes))  # its import cost is baseline, not MODEL_LOAD
        self._recorder.rebase()
        self._profiler = Profiler() if self._options.enable_profiling else None
        # The largest tensor the model or its feeds may make nnrun allocate, read once: the
        # loader, PREPARE and EXECUTE all check against this one number.
        self._max_tensor_bytes = size_limit.resolve(self._options.max_tensor_bytes)
        started = time.perf_counter_ns()
        with _within_stack(ModelError, "MODEL_LOAD"), _collector_paused(), self._recorder.phase("MODEL_LOAD"), \
                size_limit.in_force(self._max_tensor_bytes):
            self._graph = _with_free_dimensions(load_model(path_or_bytes), self._options.free_dimensions)
        if self._profiler:
            self._profiler.phase("MODEL_LOAD", started, time.perf_counter_ns())
        # The files checked before each run (see the module's docstring), with the weight cache's.
        self._files = tuple(m.file for m in self._graph.mapped_files if m.file is not None)
        self._closed = False
        anonymous_at = anonymous_bytes()
        self._memory_budget = resolve_budget(self._options.memory_budget)
        self._weight_cache = None
        if self._model_path is not None and self._options.weight_cache_dir is not None:
            compile_options = self._options.compile_options()
            self._weight_cache = WeightCache(self._options.weight_cache_dir,
                                             cache_key(self._graph, compile_options.disabled_passes),
                                             label=os.path.abspath(self._model_path),
                                             origin=model_origin(self._model_path),
                                             write_back_bytes=(min(self._memory_budget // 4, 16 << 20)
                                                               if self._memory_budget else None))
        # Every plan of this session, the main graph's and its control-flow bodies'.
        asked = self._options.memory_budget
        auto = isinstance(asked, str) and asked.strip().lower() == "auto" and self._memory_budget is not None
        self._plans = PlanCache(self._options.compile_options(self._memory_budget, anonymous_at if auto else None,
                                                              self._max_tensor_bytes),
                                self._weight_cache)
        self._plan_lock = threading.Lock()  # one PREPARE at a time, each recorded once
        # signature (name, shape, dtype per input) -> its Executor: a run's lookup without the plan
        # cache's lock and key (a few microseconds, a tenth of a small model's run)
        self._by_signature = {}
        self._feed_rules = _feed_rules(self._graph.inputs)
        self._output_names = tuple(v.name for v in self._graph.outputs)
        self._last = None
        self._last_outputs = {}
        self._run_io = []  # executor.RunIO of each run under a budget
        self._outputs_described = None  # the outputs as get_outputs() reports them, made on first call
        # Outputs that may be sequences (tuples, returned as lists) or empty optionals (None).
        self._outside_outputs = any(v.containers or v.dtype is None for v in self._graph.outputs)
        if all(v.is_static for v in self._graph.inputs):
            self._executor_for(tuple((v.name, tuple(v.dims), np.dtype(v.dtype))
                                     for v in self._graph.inputs))

    # --- onnxruntime's introspection
    def get_inputs(self):
        return [NodeArg(v.name, list(v.dims) if v.dims is not None else None, _type_name(v.dtype, v.containers))
                for v in self._graph.inputs]

    def get_outputs(self):
        if self._outputs_described is None:
            self._outputs_described = _described_outputs(self._graph)
        return [NodeArg(v.name, list(v.dims) if v.dims is not None else None, _type_name(v.dtype, v.containers))
                for v in self._outputs_described]

    def get_modelmeta(self):
        return ModelMetadata(self._graph.meta)

    def get_overridable_initializers(self):
        return []  # initializers are constants of the plan: none can be fed

    def get_providers(self):
        return [CPU]

    def get_provider_options(self):
        return {CPU: {}}

    def set_providers(self, providers=None, provider_options=None):
        requested(providers, provider_options)

    def disable_fallback(self):
        pass  # one provider: nothing to fall back from

    def enable_fallback(self):
        pass

    def get_session_options(self):
        return self._options

    def get_profiling_start_time_ns(self):
        return self._profiler.origin_ns if self._profiler is not None else 0

    # --- running
    def run(self, output_names, input_feed, run_options=None):
        """The outputs named (None: all, in the model's order) for the feeds, as numpy arrays."""
        return self._run(output_names, input_feed, run_options)

    def run_with_ort_values(self, output_names, input_dict_ort_values, run_options=None):
        """`run` with OrtValues in and out."""
        feeds = {name: value.numpy() if isinstance(value, OrtValue) else value
                 for name, value in input_dict_ort_values.items()}
        return [OrtValue(a) for a in self._run(output_names, feeds, run_options)]

    def io_binding(self):
        return IOBinding(self)

    def run_with_iobinding(self, iobinding, run_options=None):
        iobinding.run(run_options)

    def run_async(self, output_names, input_feed, callback, user_data, run_options=None):
        """Run on a new thread; `callback(outputs, user_data, error_message)` gets the result."""
        def work():
            try:
                outputs = self._run(output_names, input_feed, run_options)
            except NnrunError as e:
                callback(None, user_data, str(e))
            else:
                callback(outputs, user_data, "")

        threading.Thread(target=work, daemon=True, name="nnrun-run-async").start()

    def _run(self, output_names, input_feed, run_options, into=None):
        """The run behind run, run_with_ort_values and I/O binding: `into` names the caller's arrays
        for outputs (written in place where the plan allows, copied into otherwise)."""
        self._check_open()
        if getattr(run_options, "terminate", False):
            raise ExecutionError(terminate.MESSAGE)
        self._check_files()
        feeds = self._check_feeds(input_feed)
        # A sequence or an optional has no shape or dtype here: its plan is the same whatever it holds.
        signature = tuple((name, getattr(feeds[name], "shape", None), getattr(feeds[name], "dtype", None))
                          for name in self._feed_rules)
        executor = self._by_signature.get(signature)
        if executor is None:
            executor = self._by_signature[signature] = self._executor_for(signature)
        profile = [] if self._profiler else None
        trace = getattr(run_options, "trace", None)
        stop = _stop_position(executor.plan, getattr(run_options, "stop_after", None))
        # Memory is measured (polled, with enable_mem_poll) on the session's first runs, a plan's
        # first, and every MEMORY_EVERY runs: a run repeats the last one's memory, and polling costs
        # ~75 us a run, a quarter of a small model's.
        runs = self._recorder.runs
        measure = runs < 4 or executor.plan is not self._last or runs % MEMORY_EVERY == 0
        polled = measure and self._recorder.poll
        started = time.perf_counter_ns()
        threads = self._threads.begin(executor.plan.on_team)
        watched = terminate.enter(run_options)
        try:  # what _within_stack does, without a generator's cost on every run
            if polled:
                with self._recorder.phase("EXECUTE"):
                    results = executor.run(feeds, profile, trace, stop, into)
            else:
                results = executor.run(feeds, profile, trace, stop, into)
        except RecursionError as e:
            raise _too_deep(ExecutionError, "EXECUTE", e) from None
        finally:
            terminate.leave(watched)
            self._threads.end(threads)
        if not polled:
            self._recorder.record_run((time.perf_counter_ns() - started) / 1e6, measure)
        if executor.last_io is not None:
            self._run_io.append(executor.last_io)
        if profile is not None:
            self._profiler.run(executor.plan, profile, started, time.perf_counter_ns())
        self._last = executor.plan
        shaped = results if not self._outside_outputs else {
            n: a for n, a in results.items() if isinstance(a, np.ndarray)}
        self._last_outputs = {n: (a.shape, a.dtype) for n, a in shaped.items()}
        outputs = self._output_names
        if output_names is None:
            output_names = outputs
        else:
            missing = [n for n in output_names if n not in outputs]
            if missing:
                raise InputError(f"unknown output names {missing}; the model's outputs are {list(outputs)}")
        if stop is not None:
            not_yet = [n for n in output_names if n not in results]
            if not_yet:
                raise InputError(f"outputs {not_yet} are computed after stop_after "
                                 f"{run_options.stop_after!r}")
        if into:
            for name, target in into.items():
                results[name] = _copied_into(name, results[name], target)
        if self._outside_outputs:  # as onnxruntime: a sequence is a list
            return [list(results[n]) if isinstance(results[n], tuple) else results[n] for n in output_names]
        if len(set(output_names)) < len(output_names):  # each array the caller gets is its own
            return [results[n] if k == output_names.index(n) else results[n].copy()
                    for k, n in enumerate(output_names)]
        return [results[n] for n in output_names]

    def _check_files(self):
        """ModelFileChangedError if a file the session maps was truncated or rewritten in place since.

        A few microseconds (an fstat per file). What it cannot see is a change made after it, while
        the run reads the mapping: rewriting a model file in place during a run is not supported."""
        for file in self._files:
            file.check()
        if self._weight_cache is not None:
            for file in self._weight_cache.files:
                file.check()

    def _check_open(self):
        if self._closed:
            raise SessionClosedError("the session is closed: make a new InferenceSession to run the model")

    # --- closing (nnrun's own: onnxruntime's sessions end with their last reference)
    def close(self):
        """Drop the plans, stop their threads, and unmap the model and its weight cache files (once
        nothing else holds an array of theirs); a later run raises SessionClosedError. The inputs,
        outputs and metadata stay known. Closing twice does nothing."""
        if self._closed:
            return
        self._closed = True
        g = self._graph
        self._graph = Graph(g.name, [], g.inputs, g.outputs, {}, opsets=g.opsets, format=g.format, path=g.path,
                            meta=g.meta)
        self._plans.close()
        self._by_signature = {}
        self._plans = self._last = self._weight_cache = None
        if self._profiler is not None:
            self._profiler.settle()  # end_profiling still writes the runs so far
        self._files = ()

    def __enter__(self):
        return self

    def __exit__(self, kind, error, trace):
        self.close()

    def _executor_for(self, signature):
        feeds = {name: (shape, dtype) for name, shape, dtype in signature}
        found = self._plans.get(self._graph, feeds)
        if found is not None:
            return found
        with self._plan_lock:
            found = self._plans.get(self._graph, feeds)
            if found is None:
                started = time.perf_counter_ns()
                with _within_stack(ModelError, "PREPARE"), _collector_paused(), self._recorder.phase("PREPARE"):
                    found = self._plans.executor(self._graph, feeds)
                    return_free_heap()
                if self._profiler:
                    self._profiler.phase("PREPARE", started, time.perf_counter_ns(),
                                         passes_ms=found.plan.stats.get("passes_ms", {}))
                self._last = found.plan
        return found

    def _check_feeds(self, input_feed):
        if not isinstance(input_feed, dict):
            raise InputError("input_feed must be a dict of input name -> array")
        rules = self._feed_rules
        if input_feed.keys() != rules.keys():
            unknown = [n for n in input_feed if n not in rules]
            if unknown:
                raise InputError(f"unknown input names {unknown}; the model's inputs are {list(rules)}")
            missing = next(n for n in rules if n not in input_feed)
            raise InputError(f"input {missing!r} is missing")
        feeds = {}
        for name, (info, rank, fixed) in rules.items():
            value = input_feed[name]
            if info.containers:
                value = _container_feed(name, info, value)
                if value is None or isinstance(value, tuple):
                    feeds[name] = value
                    continue
            array = _feed_array(name, info, value)
            if rank is not None:
                shape = array.shape
                if len(shape) != rank:
                    raise InputError(f"input {name!r}: expected rank {rank} "
                                     f"(shape {list(info.dims)}), got shape {list(shape)}")
                for axis, want in fixed:
                    if shape[axis] != want:
                        raise InputError(f"input {name!r}: dimension {axis} must be {want}, got "
                                         f"{shape[axis]} (shape {list(shape)})")
            if not array.flags.c_contiguous:
                try:
                    array = np.ascontiguousarray(array)
                except MemoryError:
                    raise InputError(f"input {name!r}: no memory for a contiguous copy of the "
                                     f"{array.nbytes:,} bytes given (give a C-contiguous array)") from None
            feeds[name] = array
        return feeds

    def discard_warmup(self):
        """Forget the EXECUTE timings and profiled runs so far (warm-up runs); memory figures stay."""
        self._recorder.discard_times("EXECUTE")
        self._run_io.clear()
        if self._profiler is not None:
            self._profiler.discard_runs()

    # --- profiling, as onnxruntime
    def end_profiling(self):
        """Write the profile (a Chrome trace) and return its file name; "" when profiling is off."""
        if self._profiler is None:
            return ""
        stamp = datetime.datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
        path = self._profiler.write(f"{self._options.profile_file_prefix}_{stamp}.json")
        self._profiler = Profiler()  # as onnxruntime: a later end_profiling starts afresh
        return path

    # --- reporting
    def report(self):
        """The report of DESIGN.md for what has run so far, as a dict."""
        self._check_open()
        rec = self._recorder
        phases = rec.phases()
        plan = self._last
        stats = plan.stats if plan else {}
        cache = self._weight_cache
        report = {
            "model": self._model_path if self._model_path else "<bytes>",
            "format": self._graph.format,
            "baseline": {"rss_kb": rec.baseline_kb},
            "phases": _with_run_io(phases, self._run_io),
            "peak": {"rss_kb": max(p["rss_kb"] for p in phases.values()),
                     "hwm_kb": max(p["hwm_kb"] for p in phases.values())},
            "plan": {
                "arena_bytes": plan.arena_bytes if plan else 0,
                "lower_bound_bytes": plan.lower_bound_bytes if plan else 0,
                "file_order_peak_bytes": stats.get("file_order_peak_bytes", 0),
                "order_search": stats.get("order_search", {}),
                "weights_mapped_bytes": stats.get("weights_mapped_bytes", 0),
                "weights_packed_bytes": stats.get("weights_packed_bytes", 0) + (cache.cached_bytes if cache else 0),
                "weights_released_bytes": stats.get("weights_released_bytes", 0),
                "weights_cached_bytes": cache.cached_bytes if cache else 0,
                "weights_anonymous_bytes": stats.get("weights_packed_bytes", 0),
                "weight_cache": ({"state": cache.state, "path": cache.path}
                                 if cache else {"state": "off", "path": None}),
                "steps": stats.get("steps", 0),
                "plans": len(self._plans.plans(self._graph)),
                **_budget_figures(plan, self._memory_budget),
            },
            "outputs": {n: {"shape": list(s), "dtype": str(d)} for n, (s, d) in self._last_outputs.items()},
        }
        return report

    # --- for tools and tests
    @property
    def graph(self):
        self._check_open()
        return self._graph

    def plan(self, signature=None):
        """The Plan for a signature (default: the last one prepared or run)."""
        self._check_open()
        if signature is None:
            return self._last
        found = self._plans.get(self._graph, {name: (shape, dtype) for name, shape, dtype in signature})
        if found is None:
            raise KeyError(f"no plan for {signature}")
        return found.plan


__all__ = ["InferenceSession", "SessionOptions", "RunOptions", "NodeArg", "ModelMetadata", "NnrunError"]
