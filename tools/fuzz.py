"""nnrun-fuzz: mutate model files and classify what nnrun does with each mutant.

    nnrun-fuzz --cases 20000 --jobs 2 --out /tmp/fuzz-findings    # mutate, run, classify, summarize
    nnrun-fuzz --cases 3000 --formats onnx --parity                # also load each mutant in onnxruntime
    nnrun-fuzz drift --runs 10000                                  # RSS drift over many runs
    nnrun-fuzz replay FINDINGS/foreign/000123-onnx_conv-onnx_dims.onnx
    nnrun-fuzz list                                                # seeds and mutators

A case is (seed, mutator, case index, base seed): the index and the base seed pick the seed and the
mutator, and seed the mutator's random numbers, so the same command makes the same mutants
(fuzz_seeds.py builds the seeds, fuzz_mutators.py mutates them).

Each case runs in a forked child of this process (which imported nnrun once), under an address-
space limit (RLIMIT_AS: the child's size plus a margin) and a timeout. The child creates an
`InferenceSession` from the mutant's bytes (a quarter of the cases, and every model with external
data, from a file), feeds every input with small random values (symbolic dims 2) and runs twice.
The outcome, sent back through a pipe:

    ok          it ran
    rejected    an NnrunError at session creation (its class is recorded)
    run-error   an NnrunError at a run
    stopped     a run still going at half the timeout, ended by RunOptions.terminate as a caller's
                watchdog would end it (a Loop the file sets to 2^62 iterations): a typed error
    unfed       the fuzzer could not make feeds for the inputs the session describes
  and the bug classes, whose models are saved with a text file saying what happened:
    foreign     any other exception escaped the public API
    memory      a MemoryError (also inside a typed error), or the child's RSS grew past --rss-limit
    signal      the child died (SIGSEGV, SIGBUS, SIGABRT, an exit without an outcome)
    hang        no outcome within --timeout (the child dumps its stack on SIGUSR1, then is killed)
    slow-error  a typed error that took more than --slow CPU seconds to arrive (CPU time: on a busy
                machine a quick refusal may wait for a core)

Bugs are deduplicated by signature: class, exception type and the innermost frame inside nnrun
(for a hang, the outermost frame in ops/: the op whose loop did not end). With --parity, an ONNX
mutant is also loaded by onnxruntime in the same child after nnrun's outcome is sent (so a crash
there is not nnrun's), and run when it loads; the disagreements at load are reported: what nnrun
loads and onnxruntime refuses (a validation gap), and what nnrun refuses and onnxruntime loads,
split by whether onnxruntime then runs it (nnrun, which prepares at session creation, refuses at
load what onnxruntime refuses at its first run).
"""

import argparse
import collections
import faulthandler
import gc
import json
import math
import os
import random
import re
import resource
import select
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, field, replace

import numpy as np
from onnx import TensorProto, helper

import nnrun
from nnrun import NnrunError, terminate

from .fuzz_mutators import MUTATORS, Mutant
from .fuzz_seeds import Seed, all_seeds

OUTCOMES = ("ok", "rejected", "run-error", "stopped", "unfed", "foreign", "memory", "signal", "hang", "slow-error")
BUGS = ("foreign", "memory", "signal", "hang", "slow-error")
NNRUN_DIR = os.path.dirname(os.path.abspath(nnrun.__file__))
# Frames are shown relative to the package's parent: runtime/ops/shape.py in a checkout.
_FRAME_ROOT = os.path.dirname(NNRUN_DIR)
# A run still going after this share of --timeout is asked to stop (RunOptions.terminate), as a
# caller's watchdog would: a Loop a file sets to 2^62 iterations ends at its next iteration with a
# typed error ('stopped'); a step that never ends is still a hang.
WATCHDOG_SHARE = 0.5
FROM_PATH_SHARE = 0.25  # of the cases without external data, loaded from a file rather than bytes
MiB = 1 << 20


@dataclass(frozen=True)
class Settings:
    timeout: float = 10.0  # seconds a case may take
    slow: float = 1.0  # CPU seconds after which a typed error is a slow-error
    memory_margin: int = 2 << 30  # address space a child may add to what it inherits
    rss_limit: int = 1 << 30  # RSS growth of a child that counts as a memory bug
    max_tensor_bytes: int = 256 * MiB  # SessionOptions.max_tensor_bytes, where nnrun has it
    runs: int = 2
    parity: bool = False
    quiet_child: bool = True  # send the child's stdout and stderr to /dev/null


@dataclass(frozen=True)
class Case:
    """One mutant and where it came from; `path` set: a file to load as it lies (replay)."""

    index: int
    base: int
    seed: Seed
    mutator: str
    mutant: Mutant
    from_path: bool
    path: str = None

    @property
    def name(self):
        return f"{self.index:06d}-{self.seed.name}-{self.mutator}"

    @property
    def format(self):
        return self.seed.format


# -- cases ------------------------------------------------------------------------------------------

def mutate(seed, mutator, index, base, seeds):
    """The mutant of case (seed, mutator, index, base): the same arguments, the same bytes."""
    rng = random.Random(f"nnrun-fuzz {base} {seed.name} {mutator.name} {index}")
    for _ in range(8):
        found = mutator.mutate(seed, rng, seeds)
        if found is not None:
            return replace(found, files=seed.files)
    return Mutant(seed.data, "nothing to mutate", files=seed.files)


class CasePlan:
    """Which seed and mutator each case index gets, for a base seed and the chosen seeds and mutators."""

    def __init__(self, seeds, mutators, base=0, partners=None):
        self.seeds, self.base = list(seeds), base
        # The seeds a splice may take its tail from: every seed, whichever the cases start from, so
        # `nnrun-fuzz mutant` makes a case's bytes again without knowing the run's filters.
        self.partners = list(partners) if partners is not None else all_seeds()
        self.usable = {s.name: [m for m in mutators if m.applies(s)] for s in self.seeds}
        self.seeds = [s for s in self.seeds if self.usable[s.name]]
        if not self.seeds:
            raise ValueError("no mutator applies to any chosen seed")

    def case(self, index):
        pick = random.Random(f"nnrun-fuzz case {self.base} {index}")
        seed = pick.choice(self.seeds)
        usable = self.usable[seed.name]
        mutator = pick.choices(usable, weights=[m.weight for m in usable])[0]
        from_path = bool(seed.files) or pick.random() < FROM_PATH_SHARE
        return Case(index, self.base, seed, mutator.name, mutate(seed, mutator, index, self.base, self.partners),
                    from_path)

    def cases(self, count, start=0):
        return (self.case(i) for i in range(start, start + count))


# -- the nnrun target, run in the child --------------------------------------------------------------

class Progress:
    """How far a target got: "load" until the session exists and describes its inputs, then "feeds",
    then "run"."""

    phase = "load"
    stopped = False  # the watchdog set RunOptions.terminate


class Unfed(Exception):
    """The fuzzer cannot make feeds for the inputs a session describes."""


MAX_FEED_ELEMENTS = 1 << 20


def _element_dtype(element):
    """The numpy dtype of an element type as onnxruntime names it ('float', 'bfloat16', ...)."""
    if element == "string":
        return np.dtype(object)
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(TensorProto.DataType.Value(element.upper())))
    except (ValueError, KeyError, TypeError):
        raise Unfed(f"no feed for element type {element!r}") from None


def _feed_array(element, shape, rng):
    dtype = _element_dtype(element)
    dims = []
    for d in shape if shape is not None else [2]:
        dims.append(d if isinstance(d, int) and d >= 0 else 2)
    # numpy refuses a shape whose dims multiply past its limit even when one of them is 0.
    if len(dims) > 32 or math.prod(d for d in dims if d) > MAX_FEED_ELEMENTS:
        raise Unfed(f"an input of shape {dims} is too large to feed")
    if dtype == object:
        return np.full(dims, "a", dtype=object)
    if dtype == np.bool_:
        return np.asarray(rng.random(dims) < 0.5)
    if dtype.kind in "iu" or "int" in dtype.name:  # ml_dtypes' int4 and uint4 are kind "V"
        return np.asarray(rng.integers(0, 3, dims)).astype(dtype)
    if dtype.kind == "c":
        return np.asarray(rng.standard_normal(dims) + 1j * rng.standard_normal(dims)).astype(dtype)
    return np.asarray(rng.standard_normal(dims)).astype(dtype)


def make_feeds(inputs, rng):
    """Small random feeds for the NodeArgs `inputs`: symbolic dims 2, ints in [0, 3)."""
    feeds = {}
    for arg in inputs:
        kind = arg.type or ""
        match = re.fullmatch(r"(seq|optional)\((.*)\)", kind)
        if match and match.group(1) == "optional":
            feeds[arg.name] = None
            continue
        inner = match.group(2) if match else kind
        element = re.fullmatch(r"tensor\((\w+)\)", inner)
        if element is None:
            raise Unfed(f"input {arg.name!r}: no feed for type {kind!r}")
        array = _feed_array(element.group(1), None if match else arg.shape, rng)
        feeds[arg.name] = [array] if match else array
    return feeds


def session_options(settings):
    options = nnrun.SessionOptions()
    options.weight_cache_dir = None
    options.enable_mem_poll = False
    options.intra_op_num_threads = 1
    if hasattr(options, "max_tensor_bytes"):
        options.max_tensor_bytes = settings.max_tensor_bytes
    return options


def model_source(case, workdir):
    """What InferenceSession gets: the bytes, or a file (with its external data beside it)."""
    if case.path is not None:
        return case.path
    if not case.from_path:
        return case.mutant.data
    folder = os.path.join(workdir, f"case-{case.index}-{os.getpid()}")
    os.makedirs(folder, exist_ok=True)
    for name, data in case.mutant.files:
        with open(os.path.join(folder, name), "wb") as f:
            f.write(data)
    path = os.path.join(folder, "model" + case.seed.suffix)
    with open(path, "wb") as f:
        f.write(case.mutant.data)
    return path


def nnrun_target(case, progress, settings, workdir):
    """Create a session from the mutant, make feeds from its inputs, run it `settings.runs` times."""
    session = nnrun.InferenceSession(model_source(case, workdir), sess_options=session_options(settings))
    inputs = session.get_inputs()
    progress.phase = "feeds"
    try:
        feeds = make_feeds(inputs, np.random.default_rng(max(case.index, 0)))
    except Unfed:
        raise
    except Exception as e:  # noqa: BLE001 - the fuzzer's own failure, not nnrun's
        raise Unfed(f"the fuzzer could not make feeds: {type(e).__name__}: {e}") from e
    progress.phase = "run"
    run_options = nnrun.RunOptions()

    def stop():
        progress.stopped = True
        run_options.terminate = True

    watchdog = threading.Timer(settings.timeout * WATCHDOG_SHARE, stop)
    watchdog.daemon = True
    watchdog.start()
    try:
        for _ in range(settings.runs):
            session.run(None, feeds, run_options)
    finally:
        watchdog.cancel()


def onnxruntime_load(case, workdir):
    """Whether onnxruntime loads the mutant, and when it does whether it runs it on feeds made as
    nnrun's are, as a parity record."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.log_severity_level = 4
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        session = onnxruntime.InferenceSession(model_source(case, workdir), options,
                                               providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001 - any refusal is a refusal
        return {"ort": "rejected", "ort_error": type(e).__name__, "ort_message": _short(str(e))}
    try:
        session.run(None, make_feeds(session.get_inputs(), np.random.default_rng(max(case.index, 0))))
    except Exception as e:  # noqa: BLE001 - as above
        return {"ort": "accepted", "ort_run": "failed", "ort_message": _short(str(e))}
    return {"ort": "accepted", "ort_run": "ok"}


# -- classification, in the child --------------------------------------------------------------------

def _short(text, limit=400):
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit] + "..."


def _frame_text(filename, lineno, function):
    where = os.path.relpath(filename, _FRAME_ROOT)
    return f"{where}:{lineno} {function}" if lineno is not None else f"{where} {function}"


def innermost_frame(tb):
    """The innermost frame of a traceback inside nnrun, as 'runtime/ops/shape.py:12 Reshape.infer'."""
    found = None
    while tb is not None:
        code = tb.tb_frame.f_code
        if os.path.abspath(code.co_filename).startswith(NNRUN_DIR + os.sep):
            found = _frame_text(code.co_filename, tb.tb_lineno, getattr(code, "co_qualname", code.co_name))
        tb = tb.tb_next
    return found or "outside nnrun"


def _chain(error, deliberate=True):
    """The error and its causes, outermost first. An error re-raised `from` itself (errors.located
    returns an error already located as it is) is its own __cause__: its __context__ goes on.
    `deliberate=False` stops at a `raise ... from None`: a conversion the code meant to make."""
    seen = []
    while error is not None and error not in seen:
        seen.append(error)
        cause = error.__cause__
        if cause is error:
            error = error.__context__
        elif cause is not None:
            error = cause
        else:
            error = None if error.__suppress_context__ and not deliberate else error.__context__
    return seen


def classify(target, case, settings):
    """Run `target(case, progress)` and describe what happened as a record (a dict)."""
    progress = Progress()
    started, cpu_started = time.monotonic(), time.process_time()
    try:
        target(case, progress)
    except Unfed as e:
        return {"outcome": "unfed", "message": _short(e), "seconds": time.monotonic() - started}
    except BaseException as e:  # noqa: BLE001 - everything that escapes is classified
        seconds, cpu = time.monotonic() - started, time.process_time() - cpu_started
        chain = _chain(e, deliberate=False)
        # A MemoryError counts wherever it is, even under a conversion made on purpose.
        memory = next((c for c in _chain(e) if isinstance(c, MemoryError)), None)
        # Where it went wrong: the MemoryError, else the innermost nnrun frame of the first cause
        # that has one (a typed error raised from a kernel's ValueError points at the kernel).
        frames = [innermost_frame(c.__traceback__) for c in ([memory] if memory else reversed(chain))]
        frame = next((f for f in frames if f != "outside nnrun"), frames[0])
        record = {"error": type(e).__name__, "message": _short(e), "seconds": seconds, "cpu_seconds": cpu,
                  "frame": frame, "phase": progress.phase,
                  "traceback": "".join(traceback.format_exception(e))[-6000:]}
        if memory is not None:
            record.update(outcome="memory", error=type(memory).__name__ if memory is e
                          else f"{type(e).__name__}<-MemoryError")
        elif isinstance(e, NnrunError):
            record["outcome"] = "rejected" if progress.phase == "load" else "run-error"
            if progress.stopped and terminate.MESSAGE in str(e):
                record["outcome"] = "stopped"
            foreign = next((c for c in chain[1:] if not isinstance(c, NnrunError)), None)
            if foreign is not None:
                record["cause"] = type(foreign).__name__
                record["cause_frame"] = innermost_frame(foreign.__traceback__)
            # CPU time, not wall time: on a busy machine a quick refusal can wait a second for a core.
            if cpu > settings.slow and record["outcome"] != "stopped":
                record.update(outcome="slow-error", slow_class=record["outcome"])
        else:
            record["outcome"] = "foreign"
        return record
    return {"outcome": "ok", "seconds": time.monotonic() - started}


def _address_space():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * resource.getpagesize()


def _send(fd, record):
    data = (json.dumps(record, default=str) + "\n").encode()
    while data:
        data = data[os.write(fd, data):]


def _child(case, target, settings, result_fd, trace_fd, parity=None):
    """The forked child: limits, faulthandler, the target, the outcome down the pipe, then with
    `parity` its record (onnxruntime's load) too; never returns."""
    try:
        # The inherited heap is left out of this child's collections: a full collection would walk
        # every object of the parent, and copy the pages it touches.
        gc.freeze()
        if settings.quiet_child:
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, 1)
            os.dup2(null, 2)
        trace = os.fdopen(trace_fd, "w")
        faulthandler.enable(file=trace, all_threads=True)
        # At the timeout the parent asks for the stack with SIGUSR1, then kills: a dump made in the
        # interrupted thread is whole, where faulthandler's watchdog reads frames as they change.
        faulthandler.register(signal.SIGUSR1, file=trace, all_threads=True, chain=False)
        limit = _address_space() + settings.memory_margin
        resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))
        record = classify(target, case, settings)
        # The high-water mark now, before onnxruntime's parity run can add to it: nnrun's own.
        record["maxrss_kb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        _send(result_fd, record)
        if parity is not None and case.format == "onnx":
            _send(result_fd, parity(case))
    except BaseException:  # noqa: BLE001 - the harness's own failure, said where the parent sees it
        try:
            os.write(trace_fd, f"fuzz harness error:\n{traceback.format_exc()}".encode())
        except OSError:
            pass
    finally:
        os._exit(0)


# -- the parent: forking, timing out, collecting -----------------------------------------------------

def _rss_kb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() // 1024


_FAULT_FRAME = re.compile(r'File "([^"]+)", line (\d+) in (\S+)')


def _dump_frame(text, prefer=None):
    """The innermost nnrun frame of a faulthandler dump (most recent call first, current thread
    first); with `prefer` (a folder of nnrun), the outermost frame inside it but for the registry's
    (which calls every kernel), where there is one."""
    frames = []
    for match in _FAULT_FRAME.finditer(text):
        filename = os.path.abspath(match.group(1))
        if filename.startswith(NNRUN_DIR + os.sep):
            frames.append((filename, match.group(2), match.group(3)))
        elif frames:
            break  # the end of the innermost thread's nnrun frames
    folder = os.path.join(NNRUN_DIR, prefer or "") + os.sep
    preferred = [f for f in frames if prefer and f[0].startswith(folder) and not f[0].endswith("registry.py")]
    if preferred:  # the op's function, not the line it was on when asked: one signature per op
        filename, _, function = preferred[-1]
        return _frame_text(filename, None, function)
    return _frame_text(*frames[0]) if frames else "outside nnrun"


DUMP_GRACE = 1.0  # seconds between asking a timed-out child for its stack and killing it


@dataclass
class _Running:
    pid: int
    case: Case
    fds: dict  # fd -> "result" | "trace"
    started: float
    rss_kb: int
    chunks: dict = field(default_factory=lambda: {"result": [], "trace": []})
    asked: float = None  # when the parent sent SIGUSR1 for the stack, at the timeout
    killed: bool = False

    def deadline(self, timeout):
        return self.started + timeout if self.asked is None else self.asked + DUMP_GRACE


def _finish(running, status, rusage, settings):
    """The record of a child that has exited."""
    text = b"".join(running.chunks["result"]).decode(errors="replace")
    trace = b"".join(running.chunks["trace"]).decode(errors="replace")
    records = [json.loads(line) for line in text.splitlines() if line.strip()]
    elapsed = time.monotonic() - running.started
    record = records[0] if records else None
    abnormal = None
    if os.WIFSIGNALED(status):
        abnormal = signal.Signals(os.WTERMSIG(status)).name
    elif os.WEXITSTATUS(status):
        abnormal = f"exit {os.WEXITSTATUS(status)}"
    if record is None:
        hung = running.killed
        if "fuzz harness error" in trace:
            record = {"outcome": "lost", "error": "harness", "message": _short(trace, 2000)}
        else:
            record = {"outcome": "hang" if hung else "signal",
                      "error": "timeout" if hung else (abnormal or "no outcome"),
                      # A hang's innermost frame is wherever the loop happened to be: the op that
                      # runs it (the outermost frame in ops/) is the better signature.
                      "message": f"no outcome in {settings.timeout:g} s" if hung else
                      _short(trace.splitlines()[0] if trace else "", 200),
                      "frame": _dump_frame(trace, "ops" if hung else None),
                      "traceback": trace[-6000:]}
        record["seconds"] = elapsed
    growth = record.pop("maxrss_kb", rusage.ru_maxrss) - running.rss_kb
    record["rss_growth_kb"] = growth
    if record["outcome"] not in BUGS and growth * 1024 > settings.rss_limit:
        record.update(outcome="memory", error="RSS growth", frame="", was=record["outcome"],
                      message=f"RSS grew by {growth // 1024} MiB in a case that ended {record['outcome']}"
                              f"{': ' + record['message'] if record.get('message') else ''}")
    if settings.parity and running.case.format == "onnx":
        if len(records) > 1:
            record.update(records[1])
        elif records:
            record["ort"] = f"died ({abnormal or 'timeout'})"
    return record


def run_cases(cases, target=None, settings=Settings(), jobs=None, workdir=None, on_record=None):
    """Run each case in a forked child, `jobs` at a time; yield (case, record) as they finish.

    `target(case, progress)` is what a child runs (default: nnrun on the mutant); tests inject one.
    """
    jobs = jobs or os.cpu_count() or 1
    own_workdir = workdir is None
    workdir = workdir or tempfile.mkdtemp(prefix="nnrun-fuzz-work-")
    if target is None:
        def target(case, progress):
            nnrun_target(case, progress, settings, workdir)
    parity = None
    if settings.parity:
        def parity(case):
            return onnxruntime_load(case, workdir)
    cases = iter(cases)
    running = {}
    poller = select.poll()
    by_fd = {}
    more = True
    try:
        while more or running:
            while more and len(running) < jobs:
                case = next(cases, None)
                if case is None:
                    more = False
                    break
                child = _start(case, target, settings, parity)
                running[child.pid] = child
                for fd in child.fds:
                    poller.register(fd, select.POLLIN)
                    by_fd[fd] = child
            if not running:
                break
            now = time.monotonic()
            deadline = min(c.deadline(settings.timeout) for c in running.values())
            for fd, _ in poller.poll(max(0, deadline - now) * 1000):
                child = by_fd[fd]
                chunk = os.read(fd, 65536)
                if chunk:
                    child.chunks[child.fds[fd]].append(chunk)
                    continue
                poller.unregister(fd)
                os.close(fd)
                del by_fd[fd]
                del child.fds[fd]
                if not child.fds:
                    _, status, rusage = os.wait4(child.pid, 0)
                    del running[child.pid]
                    _remove_case_dir(workdir, child)
                    yield child.case, _finish(child, status, rusage, settings)
            now = time.monotonic()
            for child in running.values():
                if child.killed or now < child.deadline(settings.timeout):
                    continue
                if child.asked is None:
                    os.kill(child.pid, signal.SIGUSR1)  # the stack, to the trace pipe
                    child.asked = now
                else:
                    os.kill(child.pid, signal.SIGKILL)
                    child.killed = True
    finally:
        for child in running.values():
            try:
                os.kill(child.pid, signal.SIGKILL)
                os.waitpid(child.pid, 0)
            except OSError:
                pass
            for fd in child.fds:
                os.close(fd)
        if own_workdir:
            shutil.rmtree(workdir, ignore_errors=True)


def _remove_case_dir(workdir, child):
    if child.case.from_path and child.case.path is None:
        shutil.rmtree(os.path.join(workdir, f"case-{child.case.index}-{child.pid}"), ignore_errors=True)


def _start(case, target, settings, parity):
    result_read, result_write = os.pipe()
    trace_read, trace_write = os.pipe()
    rss = _rss_kb()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        os.close(result_read)
        os.close(trace_read)
        _child(case, target, settings, result_write, trace_write, parity)
    os.close(result_write)
    os.close(trace_write)
    return _Running(pid, case, {result_read: "result", trace_read: "trace"}, time.monotonic(), rss)


# -- results ----------------------------------------------------------------------------------------

def signature(record):
    return (record["outcome"], record.get("error", ""), record.get("frame", ""))


class Results:
    """Counts per outcome, the distinct bug signatures with a reproducer each, parity disagreements."""

    def __init__(self, out=None):
        self.out = out
        self.counts = collections.Counter()
        self.by_format = collections.Counter()
        self.errors = collections.defaultdict(collections.Counter)  # outcome -> error class -> count
        self.causes = collections.Counter()  # typed errors wrapping a foreign exception: (type, frame)
        self.bugs = {}  # signature -> {"count", "path", "case", "record"}
        self.parity = collections.defaultdict(list)  # kind -> [disagreement (a small dict)]
        self.parity_checked = 0
        self.ort_died = 0
        self.by_mutator = collections.defaultdict(collections.Counter)  # mutator -> outcome -> count

    def add(self, case, record):
        outcome = record["outcome"]
        self.counts[outcome] += 1
        self.by_format[case.format] += 1
        self.by_mutator[case.mutator][outcome] += 1
        if record.get("error"):
            self.errors[outcome][record["error"]] += 1
        if record.get("cause"):
            self.causes[(record["cause"], record.get("cause_frame", ""))] += 1
        if outcome in BUGS or outcome == "lost":
            key = signature(record)
            found = self.bugs.get(key)
            if found is None:
                path = self._save(case, record) if self.out else None
                self.bugs[key] = {"count": 1, "path": path, "case": case, "record": record}
            else:
                found["count"] += 1
                if self.out:
                    self._save(case, record)
        self._parity(case, record)

    def _parity(self, case, record):
        ort = record.get("ort")
        if ort is None:
            return
        self.parity_checked += 1
        if ort.startswith("died"):
            self.ort_died += 1
            return
        kind = None
        if record["outcome"] == "rejected" and ort == "accepted":
            kind = ("nnrun rejects, onnxruntime loads and runs" if record.get("ort_run") == "ok"
                    else "nnrun rejects, onnxruntime loads but fails to run")
        elif record["outcome"] in ("ok", "run-error", "unfed") and ort == "rejected":
            kind = "nnrun loads, onnxruntime rejects"
        if kind is not None:
            self.parity[kind].append({"case": case.name, "mutator": case.mutator, "op": case.mutant.op or "-",
                                      "what": case.mutant.what, "nnrun": record.get("error") or record["outcome"],
                                      "nnrun_message": record.get("message", ""),
                                      "ort_message": record.get("ort_message", "")})

    def _save(self, case, record):
        folder = os.path.join(self.out, record["outcome"])
        os.makedirs(folder, exist_ok=True)
        if case.mutant.files:  # the model beside its external data, as it was loaded
            folder = os.path.join(folder, case.name)
            os.makedirs(folder, exist_ok=True)
            for name, data in case.mutant.files:
                with open(os.path.join(folder, name), "wb") as f:
                    f.write(data)
            path = os.path.join(folder, "model" + case.seed.suffix)
        else:
            path = os.path.join(folder, case.name + case.seed.suffix)
        with open(path, "wb") as f:
            f.write(case.mutant.data)
        with open(os.path.splitext(path)[0] + ".txt", "w") as f:
            f.write(case_report(case, record, path))
        return path

    @property
    def bug_count(self):
        return sum(self.counts[c] for c in BUGS)

    def summary(self, elapsed=None):
        lines = []
        formats = ", ".join(f"{k} {v}" for k, v in sorted(self.by_format.items()))
        took = f" in {elapsed:.0f} s ({sum(self.counts.values()) / max(elapsed, 1e-9):.1f}/s)" if elapsed else ""
        lines.append(f"cases run   {sum(self.counts.values()):>7}   ({formats}){took}")
        for outcome in OUTCOMES + ("lost",):
            if outcome == "lost" and not self.counts[outcome]:
                continue
            errors = self.errors.get(outcome)
            detail = ""
            if errors and outcome in ("rejected", "run-error", "slow-error"):
                detail = "   " + ", ".join(f"{k} {v}" for k, v in errors.most_common(6))
            lines.append(f"{outcome:<11} {self.counts[outcome]:>7}{detail}")
        if self.causes:
            # By design (a kernel's ValueError becomes a ModelError naming the node), but each is a
            # path the code did not foresee: where they come from is worth a look.
            lines.append(f"typed errors wrapping a foreign exception: {sum(self.causes.values())}")
            for (cause, frame), n in self.causes.most_common(12):
                lines.append(f"  {n:>6}  {cause:<20} {frame}")
        lines.append("")
        shown = ("ok", "rejected", "run-error", "stopped", "unfed")
        lines.append(f"{'by mutator':<22}" + "".join(f"{c:>10}" for c in shown) + f"{'bugs':>10}")
        for mutator, counts in sorted(self.by_mutator.items()):
            lines.append(f"  {mutator:<20}" + "".join(f"{counts[c]:>10}" for c in shown)
                         + f"{sum(counts[c] for c in BUGS):>10}")
        lines.append("")
        lines.append(f"distinct bug signatures: {len(self.bugs)}")
        for (outcome, error, frame), bug in sorted(self.bugs.items(), key=lambda kv: (kv[0][0], -kv[1]["count"])):
            lines.append(f"  {outcome:<10} {error:<28} {frame}   x{bug['count']}")
            lines.append(f"             {bug['path'] or bug['case'].name}")
        if self.parity or self.ort_died:
            lines.append("")
            lines += self.parity_summary()
        return "\n".join(lines)

    def parity_summary(self, examples=3):
        lines = [f"parity with onnxruntime at load: {self.parity_checked} ONNX mutants; "
                 f"onnxruntime died on {self.ort_died}"]
        for kind in ("nnrun loads, onnxruntime rejects", "nnrun rejects, onnxruntime loads and runs",
                     "nnrun rejects, onnxruntime loads but fails to run"):
            found = self.parity.get(kind, [])
            lines.append(f"  {kind}: {len(found)}")
            groups = collections.Counter((d["op"], _pattern(d["what"])) for d in found)
            for (op, pattern), n in groups.most_common(15):
                lines.append(f"      {n:>5}  {op:<18} {_short(pattern, 90)}")
            for d in found[:examples]:
                lines.append(f"    e.g. {d['case']}: {_short(d['what'], 200)}")
                if d["ort_message"]:
                    lines.append(f"         onnxruntime: {_short(d['ort_message'], 160)}")
                if d["nnrun_message"]:
                    lines.append(f"         nnrun: {_short(d['nnrun_message'], 160)}")
        return lines

    def as_json(self):
        return {"counts": dict(self.counts), "by_format": dict(self.by_format),
                "errors": {k: dict(v) for k, v in self.errors.items()},
                "causes": [{"cause": c, "frame": f, "count": n} for (c, f), n in self.causes.most_common()],
                "bugs": [{"outcome": o, "error": e, "frame": f, "count": b["count"], "path": b["path"],
                          "case": b["case"].name, "what": b["case"].mutant.what,
                          "message": b["record"].get("message", "")}
                         for (o, e, f), b in self.bugs.items()],
                "parity": dict(self.parity), "parity_checked": self.parity_checked,
                "ort_died": self.ort_died}


def _pattern(what):
    """What a mutation did with its names and numbers blanked: mutations of one kind group together."""
    what = re.sub(r"(node|initializer|graph input|graph output|tensor) '[^']*'", r"\1 _", what.split("; ")[0])
    what = re.sub(r"b?'[^']*'", "'_'", what)
    what = re.sub(r" in main/\S+", " in a body", what)
    return re.sub(r"-?\b\d+(\.\d+)?(e[+-]?\d+)?\b", "N", what)


def case_report(case, record, path):
    """The text file saved beside a bug's model."""
    lines = [f"case        {case.name}",
             f"seed        {case.seed.name} ({case.format})",
             f"mutator     {case.mutator}",
             f"index       {case.index}",
             f"base seed   {case.base}",
             f"mutated     {case.mutant.what}",
             f"loaded from {'a file' if case.from_path else 'bytes'}",
             f"outcome     {record['outcome']}",
             f"error       {record.get('error', '')}",
             f"frame       {record.get('frame', '')}",
             f"seconds     {record.get('seconds', 0):.3f} ({record.get('cpu_seconds', 0):.3f} of CPU)",
             f"message     {record.get('message', '')}",
             "",
             f"reproduce   nnrun-fuzz replay {os.path.basename(path)}",
             f"regenerate  nnrun-fuzz mutant {case.seed.name} {case.mutator} {case.index} --base-seed {case.base}",
             "",
             record.get("traceback", "")]
    return "\n".join(lines) + "\n"


# -- commands ---------------------------------------------------------------------------------------

def _select(items, names, what):
    if not names:
        return list(items)
    wanted = set(names.split(","))
    unknown = wanted - {i.name for i in items}
    if unknown:
        raise SystemExit(f"unknown {what}: {', '.join(sorted(unknown))}")
    return [i for i in items if i.name in wanted]


def _settings(args):
    return Settings(timeout=args.timeout, slow=args.slow, memory_margin=int(args.memory_margin * MiB),
                    rss_limit=int(args.rss_limit * MiB), max_tensor_bytes=int(args.max_tensor_mib * MiB),
                    parity=getattr(args, "parity", False))


def warm_up(seeds):
    """Run each seed once here, before any fork: every lazy import happens once, in the parent, and a
    seed that does not run is an error of the fuzzer."""
    settings = Settings()
    with tempfile.TemporaryDirectory() as workdir:
        for seed in seeds:
            case = Case(-1, 0, seed, "none", Mutant(seed.data, "the seed", files=seed.files), bool(seed.files))
            nnrun_target(case, Progress(), settings, workdir)
    gc.collect()


def fuzz(count, seeds, mutators, settings, jobs=None, base=0, out=None, start=0, progress_every=10.0):
    """Run `count` cases; return Results (bugs saved under `out`)."""
    warm_up(seeds)
    if settings.parity:
        import onnxruntime  # noqa: F401 - imported once here, not in each child
    plan = CasePlan(seeds, mutators, base)
    results = Results(out)
    started = last = time.monotonic()
    for case, record in run_cases(plan.cases(count, start), settings=settings, jobs=jobs):
        record.setdefault("op", case.mutant.op)
        results.add(case, record)
        now = time.monotonic()
        if progress_every and now - last > progress_every:
            last = now
            done = sum(results.counts.values())
            print(f"[nnrun-fuzz] {done}/{count} cases, {done / (now - started):.1f}/s, "
                  f"{results.bug_count} bug outcomes, {len(results.bugs)} signatures", file=sys.stderr, flush=True)
    results.elapsed = time.monotonic() - started
    return results


def _cmd_run(args):
    seeds = [s for s in _select(all_seeds(), args.seeds, "seeds") if s.format in args.formats.split(",")]
    mutators = _select(MUTATORS.values(), args.mutators, "mutators")
    out = args.out or tempfile.mkdtemp(prefix="nnrun-fuzz-")
    os.makedirs(out, exist_ok=True)
    settings = _settings(args)
    print(f"nnrun-fuzz: {args.cases} cases from {len(seeds)} seeds, {len(mutators)} mutators, base seed "
          f"{args.base_seed}, {args.jobs or os.cpu_count()} jobs; findings in {out}", file=sys.stderr)
    results = fuzz(args.cases, seeds, mutators, settings, args.jobs, args.base_seed, out, args.start)
    text = results.summary(results.elapsed)
    print(text)
    with open(os.path.join(out, "summary.txt"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(results.as_json(), f, indent=1, default=str)
    return 1 if results.bug_count else 0


def _cmd_replay(args):
    settings = replace(_settings(args), quiet_child=False)
    cases = []
    for k, path in enumerate(args.paths):
        with open(path, "rb") as f:
            data = f.read()
        fmt = "tflite" if data[4:8] == b"TFL3" or path.endswith(".tflite") else "onnx"
        seed = Seed(os.path.basename(path), fmt, data)
        # The case index seeds the feeds: a saved case's name starts with it.
        index = re.search(r"(\d{6})-[^/]*$", os.path.abspath(path))
        cases.append(Case(int(index.group(1)) if index else k, 0, seed, "replay", Mutant(data, "replayed"), True,
                          os.path.abspath(path)))
    status = 0
    for case, record in run_cases(cases, settings=settings, jobs=1):
        status |= record["outcome"] in BUGS
        print(f"{case.path}: {record['outcome']}  {record.get('error', '')}  {record.get('frame', '')}")
        if record.get("message"):
            print(f"  {record['message']}")
        if args.verbose and record.get("traceback"):
            print(record["traceback"])
    return status


def _cmd_mutant(args):
    seed = next((s for s in all_seeds() if s.name == args.seed), None)
    if seed is None or args.mutator not in MUTATORS:
        raise SystemExit("unknown seed or mutator (nnrun-fuzz list)")
    mutant = mutate(seed, MUTATORS[args.mutator], args.index, args.base_seed, all_seeds())
    output = args.output or f"{args.index:06d}-{seed.name}-{args.mutator}{seed.suffix}"
    with open(output, "wb") as f:
        f.write(mutant.data)
    for name, data in mutant.files:
        with open(os.path.join(os.path.dirname(output) or ".", name), "wb") as f:
            f.write(data)
    print(f"{output}: {mutant.what}")
    return 0


def _cmd_list(args):
    for seed in all_seeds():
        extra = f", with {', '.join(n for n, _ in seed.files)}" if seed.files else ""
        print(f"seed     {seed.name:<20} {seed.format:<7} {len(seed.data):>6} bytes{extra}")
    for mutator in MUTATORS.values():
        print(f"mutator  {mutator.name:<20} {', '.join(mutator.formats)}")
    return 0


def _heap_growth(session, feeds, runs):
    """Where the Python heap grows over `runs` more runs (tracemalloc): RSS moves by pages and
    arenas, this finds the objects a run leaves behind."""
    import tracemalloc

    tracemalloc.start()
    gc.collect()
    first = tracemalloc.take_snapshot()
    for _ in range(runs):
        session.run(None, feeds)
    gc.collect()
    second = tracemalloc.take_snapshot()
    tracemalloc.stop()
    diffs = [d for d in second.compare_to(first, "lineno") if d.size_diff > 0]
    total = sum(d.size_diff for d in diffs)
    lines = [f"Python heap over {runs} more runs (tracemalloc): {total / 1024:+,.1f} kB "
             f"({total / runs:+.1f} B/run)"]
    for d in sorted(diffs, key=lambda d: -d.size_diff)[:3]:
        frame = d.traceback[0]
        where = os.path.relpath(frame.filename, _FRAME_ROOT) if frame.filename.startswith(NNRUN_DIR) \
            else os.path.basename(frame.filename)
        lines.append(f"  {d.size_diff / 1024:+8.1f} kB in {d.count_diff:+} blocks at {where}:{frame.lineno}")
    return lines


def drift(runs, warmup=200, seed_names=("tiny_cnn", "tflite_conv"), samples=10, out=print, heap_runs=None):
    """RSS (psutil) of this process around `runs` runs of each model, after `warmup` runs, and where
    the Python heap grows over `heap_runs` more (default runs // 10); returns {model: (rss after
    warm-up, rss after the runs)} in bytes."""
    heap_runs = max(1, runs // 10) if heap_runs is None else heap_runs
    import psutil

    process = psutil.Process()
    seeds = {s.name: s for s in all_seeds()}
    figures = {}
    with tempfile.TemporaryDirectory() as folder:
        for name in seed_names:
            seed = seeds[name]
            path = os.path.join(folder, name + seed.suffix)
            with open(path, "wb") as f:
                f.write(seed.data)
            options = nnrun.SessionOptions()
            options.weight_cache_dir = os.path.join(folder, "cache")
            session = nnrun.InferenceSession(path, sess_options=options)
            feeds = make_feeds(session.get_inputs(), np.random.default_rng(0))
            for _ in range(warmup):
                session.run(None, feeds)
            gc.collect()
            before = process.memory_info().rss
            trail = []
            for k in range(runs):
                session.run(None, feeds)
                if samples and (k + 1) % max(1, runs // samples) == 0:
                    trail.append((process.memory_info().rss - before) // 1024)
            gc.collect()
            after = process.memory_info().rss
            figures[name] = (before, after)
            out(f"{name:<12} {seed.format:<6} RSS after {warmup} warm-up runs {before // 1024:>8,} kB, "
                f"after {runs} more {after // 1024:>8,} kB: drift {(after - before) // 1024:+,} kB "
                f"({(after - before) / runs:+.1f} B/run)")
            out(f"{'':<20}drift along the way (kB): {', '.join(f'{v:+}' for v in trail)}")
            if heap_runs:
                for line in _heap_growth(session, feeds, heap_runs):
                    out(f"{'':<20}{line}")
            del session
    total = sum(after - before for before, after in figures.values())
    out(f"{'total':<12} drift {total // 1024:+,} kB over {runs} runs of each model")
    return figures


def _cmd_drift(args):
    figures = drift(args.runs, args.warmup)
    worst = max(after - before for before, after in figures.values())
    return 1 if worst > args.limit_kb * 1024 else 0


def parser():
    p = argparse.ArgumentParser(prog="nnrun-fuzz", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command")

    def limits(q):
        q.add_argument("--timeout", type=float, default=10.0, help="seconds a case may take (default 10)")
        q.add_argument("--slow", type=float, default=1.0, help="CPU seconds after which a typed error is slow (1)")
        q.add_argument("--memory-margin", type=float, default=2048, metavar="MIB",
                       help="address space a case may add, MiB (2048)")
        q.add_argument("--rss-limit", type=float, default=1024, metavar="MIB",
                       help="RSS growth of a case that counts as a memory bug, MiB (1024)")
        q.add_argument("--max-tensor-mib", type=float, default=256,
                       help="SessionOptions.max_tensor_bytes, where nnrun has it, MiB (256)")

    run = sub.add_parser("run", help="mutate, run and classify (the default command)")
    run.add_argument("--cases", type=int, default=1000)
    run.add_argument("--start", type=int, default=0, help="first case index (default 0)")
    run.add_argument("--jobs", type=int, default=None, help="children at a time (default: the CPU count)")
    run.add_argument("--base-seed", type=int, default=0)
    run.add_argument("--out", help="findings directory (default: a new temporary directory)")
    run.add_argument("--formats", default="onnx,tflite")
    run.add_argument("--seeds", help="comma-separated seed names (default: all; nnrun-fuzz list)")
    run.add_argument("--mutators", help="comma-separated mutator names (default: all)")
    run.add_argument("--parity", action="store_true", help="also load ONNX mutants in onnxruntime")
    limits(run)
    run.set_defaults(func=_cmd_run)

    replay = sub.add_parser("replay", help="run saved mutants through the same harness")
    replay.add_argument("paths", nargs="+")
    replay.add_argument("-v", "--verbose", action="store_true", help="print tracebacks")
    limits(replay)
    replay.set_defaults(func=_cmd_replay)

    mutant = sub.add_parser("mutant", help="write the mutant of one case")
    mutant.add_argument("seed")
    mutant.add_argument("mutator")
    mutant.add_argument("index", type=int)
    mutant.add_argument("--base-seed", type=int, default=0)
    mutant.add_argument("-o", "--output")
    mutant.set_defaults(func=_cmd_mutant)

    listing = sub.add_parser("list", help="the seeds and mutators")
    listing.set_defaults(func=_cmd_list)

    drift_cmd = sub.add_parser("drift", help="RSS drift over many runs of one ONNX and one TFLite model")
    drift_cmd.add_argument("--runs", type=int, default=10000)
    drift_cmd.add_argument("--warmup", type=int, default=200)
    drift_cmd.add_argument("--limit-kb", type=float, default=100, help="exit 1 when a model drifts more (100)")
    drift_cmd.set_defaults(func=_cmd_drift)
    return p


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in ("run", "replay", "mutant", "list", "drift", "-h", "--help"):
        argv.insert(0, "run")
    args = parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
