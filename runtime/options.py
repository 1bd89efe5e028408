"""Session and run options: onnxruntime's names, defaults and meaning, and nnrun's memory switches.

What onnxruntime's options mean for nnrun:
- `graph_optimization_level` picks which of PREPARE's optimising passes run, as onnxruntime's
  levels do: DISABLE_ALL none of them, BASIC those that remove work without changing any kernel
  (identities, constant folding, BatchNormalization folded into a convolution), EXTENDED and
  above the fusions too. The memory passes (order, release) are not graph optimisations and stay.
- `intra_op_num_threads` sizes the kernels' pool and BLAS (threads.py).
- Options about onnxruntime's own allocator and scheduler (`enable_cpu_mem_arena`,
  `enable_mem_pattern`, `enable_mem_reuse`, `execution_mode`, `inter_op_num_threads`,
  `use_per_session_threads`) are kept and read back; nnrun always plans one arena and runs one
  step at a time, which is what those options' defaults ask for.
- `optimized_model_filepath`: nnrun writes no optimised model; setting it warns once.
"""

import enum
import warnings

from .compiler.build import CompileOptions
from .compiler.weight_cache import default_directory as default_cache_directory
from .errors import InputError, UnsupportedFeatureError
from .threads import kernel_threads


class GraphOptimizationLevel(enum.IntEnum):
    ORT_DISABLE_ALL = 0
    ORT_ENABLE_BASIC = 1
    ORT_ENABLE_EXTENDED = 2
    ORT_ENABLE_LAYOUT = 3
    ORT_ENABLE_ALL = 99


class ExecutionMode(enum.IntEnum):
    ORT_SEQUENTIAL = 0
    ORT_PARALLEL = 1


class ExecutionOrder(enum.IntEnum):
    DEFAULT = 0
    PRIORITY_BASED = 1
    MEMORY_EFFICIENT = 2


# The optimising passes each level leaves out (compiler/passes.py names them).
_FUSIONS = ("fuse_patterns", "fuse_activations", "fuse_residual")
_BASIC = ("drop_identities", "constants_as_weights", "fold_batchnorm", "fold_conv_bias", "fold_constants",
          "inline_if")
_LEFT_OUT = {
    GraphOptimizationLevel.ORT_DISABLE_ALL: frozenset(_BASIC + _FUSIONS),
    GraphOptimizationLevel.ORT_ENABLE_BASIC: frozenset(_FUSIONS),
    GraphOptimizationLevel.ORT_ENABLE_EXTENDED: frozenset(),
    GraphOptimizationLevel.ORT_ENABLE_LAYOUT: frozenset(),
    GraphOptimizationLevel.ORT_ENABLE_ALL: frozenset(),
}


class _ConfigEntries:
    """onnxruntime's string key/value configuration (`add_session_config_entry` and its run twin)."""

    def __init__(self):
        self._entries = {}

    def add(self, key, value):
        if not isinstance(key, str) or not isinstance(value, str):
            raise InputError(f"a config entry's key and value are strings, got {type(key).__name__} "
                             f"and {type(value).__name__}")
        self._entries[key] = value

    def get(self, key):
        if key not in self._entries:
            raise InputError(f"config entry {key!r} was never set")
        return self._entries[key]


class SessionOptions:
    """Session switches: onnxruntime's names where they exist; nnrun's memory switches besides."""

    def __init__(self):
        # Threads of a run: the kernels' pool and BLAS. 0: the physical cores for the pool, the
        # library's own default for BLAS.
        self.intra_op_num_threads = 0
        self.inter_op_num_threads = 0  # kept for onnxruntime's callers; nnrun runs one step at a time
        self.graph_optimization_level = GraphOptimizationLevel.ORT_ENABLE_ALL
        self.execution_mode = ExecutionMode.ORT_SEQUENTIAL
        self.execution_order = ExecutionOrder.DEFAULT
        self.enable_cpu_mem_arena = True
        self.enable_mem_pattern = True
        self.enable_mem_reuse = True
        self.use_deterministic_compute = False
        self.use_per_session_threads = True
        self.log_severity_level = -1
        self.log_verbosity_level = 0
        self.logid = ""
        self._optimized_model_filepath = ""
        self._config = _ConfigEntries()
        self._free_dimensions = {}  # symbolic dim name -> size (add_free_dimension_override_by_name)
        self.enable_mem_poll = True  # sample RSS on a thread during each phase
        self.mem_poll_interval_ms = 2.0
        self.fold_constants = True
        self.fold_batchnorm = True
        self.fuse_activations = True
        self.memory_aware_order = True
        # PREPARE's time budget for the memory-optimal order (per plan); the best order found
        # within it is kept, and the plan says whether it is proven optimal.
        self.order_search_seconds = 1.0
        # The most memory nnrun may hold beyond the process's baseline: bytes, a size such as
        # "128M", or "auto" (the process's memory cgroup limit, less what is in use). Weights
        # beyond it stream by execution order. None: no budget.
        self.memory_budget = None
        # The largest tensor a model file or its feeds may make nnrun allocate, in bytes: every
        # size they dictate (inputs' dims, shapes computed from values, convolution geometry,
        # densified weights, Loop scan outputs, sequences) is checked against it before
        # anything is allocated, and beyond it a SizeLimitError names the node and the tensor.
        # None: half of the physical memory, or of the memory cgroup's limit when lower, read
        # when the session is made.
        self.max_tensor_bytes = None
        self.release_weights = True  # madvise away the mapped pages of packed weights
        # Kernels compiled by numba (`pip install 'nnrun[jit]'`): depthwise convolution, a
        # convolution's bias and activation, erf and GELU, 2-10x faster, for ~0.35 s and ~115 MB
        # of RSS once per process (nnrun/ops/jit.py). None: as the environment variable NNRUN_JIT
        # says (off unless 1).
        self.compiled_kernels = None
        # Compiler passes to skip, by name (nnrun.compiler.passes.SWITCHABLE); the five
        # switches above are the same as naming their passes here.
        self.disabled_passes = set()
        # onnxruntime's profiling switches: a Chrome trace, one event per step, written by
        # InferenceSession.end_profiling() to <prefix>_<date>_<time>.json.
        self.enable_profiling = False
        self.profile_file_prefix = "nnrun_profile"
        # Where packed weights are cached as a file shared by later sessions and other
        # processes (None: off, packed weights stay in memory). Models given as bytes are
        # never cached: they have no file whose identity could be checked cheaply.
        self.weight_cache_dir = default_cache_directory()

    @property
    def optimized_model_filepath(self):
        return self._optimized_model_filepath

    @optimized_model_filepath.setter
    def optimized_model_filepath(self, path):
        if path:
            warnings.warn("nnrun writes no optimized model: optimized_model_filepath is ignored", stacklevel=2)
        self._optimized_model_filepath = path

    def add_session_config_entry(self, key, value):
        self._config.add(key, value)

    def get_session_config_entry(self, key):
        return self._config.get(key)

    def add_free_dimension_override_by_name(self, name, value):
        """Give the symbolic dimension `name` of the model's inputs the size `value`."""
        if not isinstance(value, int) or value < 0:
            raise InputError(f"free dimension {name!r}: a size is an int >= 0, got {value!r}")
        self._free_dimensions[name] = value

    def add_free_dimension_override_by_denotation(self, denotation, value):
        raise UnsupportedFeatureError("nnrun does not read dimension denotations; "
                                      "use add_free_dimension_override_by_name")

    def register_custom_ops_library(self, library_path):
        raise UnsupportedFeatureError(f"nnrun cannot load custom operator libraries ({library_path!r}): "
                                      f"its kernels are Python")

    def add_initializer(self, name, value):
        raise UnsupportedFeatureError(f"nnrun does not replace initializers from the session options "
                                      f"({name!r})")

    def add_external_initializers(self, names, values):
        raise UnsupportedFeatureError("nnrun does not take initializers from the session options; "
                                      "external data is read from the files the model names")

    @property
    def free_dimensions(self):
        return dict(self._free_dimensions)

    def compile_options(self, memory_budget=None, memory_budget_auto=None, max_tensor_bytes=None):
        level = GraphOptimizationLevel(self.graph_optimization_level)
        return CompileOptions(set(self.disabled_passes) | _LEFT_OUT[level], self.order_search_seconds,
                              memory_budget, memory_budget_auto, max_tensor_bytes=max_tensor_bytes,
                              compiled_kernels=self.compiled_kernels,
                              kernel_threads=kernel_threads(self.intra_op_num_threads),
                              fold_constants=self.fold_constants, fold_batchnorm=self.fold_batchnorm,
                              fuse_activations=self.fuse_activations,
                              memory_aware_order=self.memory_aware_order,
                              release_weights=self.release_weights)


class RunOptions:
    """Per-run switches: onnxruntime's names, and nnrun's debugging knobs.

    `terminate`: set from another thread, the run stops before its next step (or a Loop's or
    Scan's next iteration) with an ExecutionError (onnxruntime: "Exiting due to terminate flag
    being set to true"); a step already running finishes first.
    `trace`: a callable(step, outputs) called after each step with its PlannedStep (name,
    op type, index, shapes, weights) and its output arrays. Those are arena views a later
    step may overwrite: copy what you keep (`nnrun.debug.intermediates` does).
    `stop_after`: a node name or a step position; the run ends after that step and
    returns only graph outputs computed by then (asking for another is an InputError).
    """

    def __init__(self):
        self.log_severity_level = -1
        self.log_verbosity_level = 0
        self.logid = ""
        self.run_tag = ""
        self.terminate = False
        self.only_execute_path_to_fetches = False
        self.trace = None
        self.stop_after = None
        self._config = _ConfigEntries()

    def add_run_config_entry(self, key, value):
        self._config.add(key, value)

    def get_run_config_entry(self, key):
        return self._config.get(key)

    def add_active_adapter(self, adapter):
        raise UnsupportedFeatureError("nnrun does not apply LoRA adapters")
