"""One measurement of the benchmark: one runtime, one model, in a process of its own.

`nnrun-bench` starts `python -m nnrun_tools.bench_worker JOB.json` once per (runtime, model, repeat),
so that no runtime inherits another's heap, caches or thread pools. The worker imports its runtime,
reads the inputs the parent made, takes the baseline RSS, then times MODEL_LOAD, PREPARE and EXECUTE
(warm-up runs, then timed runs) with nnrun's own `PhaseRecorder`, which polls RSS on a thread during
each phase and reads VmHWM at its end. It writes the figures to the job's result file and the outputs
of the last run to the job's output file; on an error it writes the error instead and exits 1.

What each runtime counts as a phase:

| runtime | MODEL_LOAD | PREPARE | EXECUTE |
| --- | --- | --- | --- |
| nnrun | its own report's MODEL_LOAD | its own report's PREPARE | `sess.run` |
| onnxruntime | `InferenceSession(...)`: load and prepare together | 0 (inside MODEL_LOAD) | `sess.run` |
| reference | `onnx.load` | `ReferenceEvaluator(model)` | `evaluator.run` |
| litert | `Interpreter(model_path=...)` | `resize_tensor_input` + `allocate_tensors` | set_tensor, invoke, get_tensor |

The nnrun constructor does MODEL_LOAD and PREPARE; the worker times the constructor as a whole (kept
as `create`) and takes the split from `InferenceSession.report()`, whose RSS and HWM figures are of
the same process and so compare with the worker's baseline.
"""

import atexit
import json
import os
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

RUNTIMES = ("nnrun", "onnxruntime", "reference", "litert")


def _reset_hwm():
    """Bring VmHWM down to the current RSS, so that the peak of the imports does not count as the model's.

    Linux does this on writing 5 to clear_refs; elsewhere the HWM keeps the imports' peak (reported).
    """
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


class ForeignCpu:
    """How much of the machine's CPU other processes used while a block ran, in percent.

    On a shared machine a neighbour's burst inflates a run's time; this says which repeats to distrust.
    None where /proc/stat is missing.
    """

    def __enter__(self):
        self.start = (self._busy_s(), sum(os.times()[:2]), time.perf_counter())
        return self

    def __exit__(self, *exc):
        busy, own, wall = self._busy_s(), sum(os.times()[:2]), time.perf_counter()
        if busy is None or self.start[0] is None or wall <= self.start[2]:
            self.percent = None
        else:
            # /proc/stat counts every CPU of the machine, so the share is of all of them.
            foreign = (busy - self.start[0]) - (own - self.start[1])
            self.percent = round(max(0.0, 100 * foreign / ((wall - self.start[2]) * os.cpu_count())), 1)

    @staticmethod
    def _busy_s():
        try:
            with open("/proc/stat") as f:
                fields = [int(x) for x in f.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
        guest = sum(fields[8:10])  # already counted in user and nice
        return (sum(fields) - idle - guest) / os.sysconf("SC_CLK_TCK")


def rss_anon_kb():
    """Anonymous resident memory (RssAnon) in kB: what no file backs, so what the kernel can neither
    drop nor share. None where /proc is missing."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def _major_faults():
    """Page faults of this process that waited for the disk, so far."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_majflt


def hold(job):
    """For a job measured while others run (PSS): say so, then wait until the parent releases it."""
    Path(job["hold"]["ready"]).touch()
    release = Path(job["hold"]["release"])
    deadline = time.monotonic() + job["hold"].get("timeout_s", 600)
    while not release.exists() and time.monotonic() < deadline:
        time.sleep(0.02)


def load_arrays(path):
    """The arrays of an .npz written by the parent or a worker, in order, with their names."""
    import numpy as np

    with np.load(path, allow_pickle=False) as data:
        names = [str(n) for n in data["names"]]
        return names, [data[f"a{i}"] for i in range(len(names))]


def save_arrays(path, names, arrays):
    """Arrays under positional keys, names alongside: tensor names need not be valid zip member names."""
    import numpy as np

    np.savez(path, names=np.array(list(names), dtype=str),
             **{f"a{i}": np.asarray(a) for i, a in enumerate(arrays)})


# -- the runtimes: each returns (names of the outputs, a function running the model once) -----------
# Each takes the recorder, the job and the feeds {name: array}, and records MODEL_LOAD and PREPARE.

def _nnrun(rec, job, feeds):
    import nnrun

    options = nnrun.SessionOptions()
    options.intra_op_num_threads = job["threads"]
    if job.get("weight_cache_dir"):
        # The parent's: empty for a first start, filled by one for a warm start.
        options.weight_cache_dir = job["weight_cache_dir"]
    else:
        # A weight cache of this process's own, empty: every repeat measures a first start (the
        # cache written, not read).
        options.weight_cache_dir = tempfile.mkdtemp(prefix="nnrun-bench-cache-")
        atexit.register(shutil.rmtree, options.weight_cache_dir, True)
    for name, value in job.get("nnrun_options", {}).items():
        if not hasattr(options, name):
            raise ValueError(f"nnrun SessionOptions has no switch {name!r}")
        setattr(options, name, value)
    with rec.phase("MODEL_LOAD"):
        sess = nnrun.InferenceSession(job["model"], sess_options=options)
    names = [o.name for o in sess.get_outputs()]
    return names, lambda: sess.run(None, feeds), sess


def _onnxruntime(rec, job, feeds):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = job["threads"]
    with rec.phase("MODEL_LOAD"):
        sess = ort.InferenceSession(job["model"], sess_options=options,
                                    providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return names, lambda: sess.run(None, feeds), None


def _reference(rec, job, feeds):
    import onnx
    from onnx.reference import ReferenceEvaluator

    with rec.phase("MODEL_LOAD"):
        model = onnx.load(job["model"])
    with rec.phase("PREPARE"):
        evaluator = ReferenceEvaluator(model)
    names = list(evaluator.output_names)
    return names, lambda: evaluator.run(None, feeds), None


def _litert(rec, job, feeds):
    from ai_edge_litert.interpreter import Interpreter

    with rec.phase("MODEL_LOAD"):
        interpreter = Interpreter(model_path=job["model"], num_threads=job["threads"])
    with rec.phase("PREPARE"):
        inputs = {d["name"]: d for d in interpreter.get_input_details()}
        for name, value in feeds.items():
            if list(inputs[name]["shape"]) != list(value.shape):
                interpreter.resize_tensor_input(inputs[name]["index"], list(value.shape))
        interpreter.allocate_tensors()
    outputs = interpreter.get_output_details()

    def run():
        for name, value in feeds.items():
            interpreter.set_tensor(inputs[name]["index"], value)
        interpreter.invoke()
        return [interpreter.get_tensor(d["index"]) for d in outputs]

    return [d["name"] for d in outputs], run, None


def _import(runtime):
    """Import everything the runtime will use, so that imports stay out of the baseline's growth."""
    if runtime == "nnrun":
        import importlib
        import pkgutil

        import nnrun
        from nnrun import loader, ops, session  # noqa: F401  (the session module pulls in the compiler)

        ops.load_all()
        # The format readers are imported on first load (the ONNX one brings in onnx, ~50 ms): a cost
        # of the first session in a process, which the other runtimes pay at import too.
        for info in pkgutil.iter_modules(loader.__path__):
            importlib.import_module(f"{loader.__name__}.{info.name}")
        return {"nnrun": nnrun.__version__}
    if runtime == "onnxruntime":
        import onnxruntime

        return {"onnxruntime": onnxruntime.__version__}
    if runtime == "reference":
        import onnx
        import onnx.reference  # noqa: F401

        return {"onnx": onnx.__version__}
    if runtime == "litert":
        import ai_edge_litert
        from ai_edge_litert import interpreter  # noqa: F401

        return {"ai_edge_litert": getattr(ai_edge_litert, "__version__", "?")}
    raise ValueError(f"unknown runtime {runtime!r}; known: {', '.join(RUNTIMES)}")


_START = {"nnrun": _nnrun, "onnxruntime": _onnxruntime, "reference": _reference, "litert": _litert}


def measure(job):
    """Run one job; returns the result dict (the outputs go to job['outputs_file'])."""
    from nnrun.report import PhaseRecorder, hwm_kb, rss_kb

    runtime = job["runtime"]
    started = time.perf_counter()
    versions = _import(runtime)
    imported = {"time_ms": round((time.perf_counter() - started) * 1e3, 3), "rss_kb": rss_kb()}
    input_names, input_arrays = load_arrays(job["inputs_file"])
    feeds = dict(zip(input_names, input_arrays))

    hwm_reset = _reset_hwm()
    rec = PhaseRecorder(poll=True, interval_s=job.get("poll_interval_ms", 2.0) / 1e3)
    baseline = {"rss_kb": rec.baseline_kb, "hwm_kb": hwm_kb(), "rss_anon_kb": rss_anon_kb()}

    output_names, run_once, nnrun_session = _START[runtime](rec, job, feeds)
    outputs = None
    # As TFLite's benchmark_model: at least this many runs, and on until at least this long, so that
    # a model of a fraction of a millisecond is timed over many runs rather than ten.
    warmup_until = time.perf_counter() + job.get("warmup_min_secs", 0.0)
    done = 0
    while done < job["warmup"] or (done and time.perf_counter() < warmup_until):
        with rec.phase("EXECUTE"):
            outputs = run_once()
        done += 1
    warmup_ms = list(rec.times["EXECUTE"])
    rec.discard_times("EXECUTE")
    if nnrun_session is not None:
        nnrun_session.discard_warmup()  # its per-run read and stall figures: the timed runs'
    faults_before = _major_faults()
    runs = 0
    with ForeignCpu() as foreign:
        timed_until = time.perf_counter() + job.get("min_secs", 0.0)
        while runs < max(job["runs"], 1) or time.perf_counter() < timed_until:
            with rec.phase("EXECUTE"):
                outputs = run_once()
            runs += 1
    faults = {"major_before_runs": faults_before, "major_per_run": (_major_faults() - faults_before) / runs}

    phases = rec.phases()
    phases["EXECUTE"]["times_ms"] = [round(t, 3) for t in rec.times["EXECUTE"]]
    phases["EXECUTE"]["warmup_ms"] = [round(t, 3) for t in warmup_ms[:100]]
    phases["EXECUTE"]["warmup_runs"] = done
    phases["EXECUTE"]["foreign_cpu_pct"] = foreign.percent
    result = {"runtime": runtime, "model": job["model"], "ok": True, "versions": versions,
              "pid": os.getpid(), "hwm_reset": hwm_reset, "import": imported, "baseline": baseline,
              "load_prepare_combined": runtime == "onnxruntime", "faults": faults}
    if runtime == "onnxruntime":
        phases["PREPARE"] = {"time_ms": 0.0, "rss_kb": None, "hwm_kb": None, "in": "MODEL_LOAD"}
    if nnrun_session is not None:
        # The constructor did both phases; nnrun's own report splits them.
        report = nnrun_session.report()
        result["create"] = phases["MODEL_LOAD"]
        for name in ("MODEL_LOAD", "PREPARE"):
            phases[name] = {k: report["phases"][name][k] for k in ("time_ms", "rss_kb", "hwm_kb")}
        result["nnrun_report"] = report
        from nnrun.ops import blas

        library = blas.library()
        result["nnrun_blas"] = {"library": library.name, "kernels": library.core, "own": library.own}
    result["phases"] = phases
    result["peak"] = {"rss_kb": max(p["rss_kb"] or 0 for p in phases.values()),
                      "hwm_kb": max([p["hwm_kb"] or 0 for p in phases.values()] + [hwm_kb()])}
    result["end_rss_kb"] = rss_kb()
    result["end_rss_anon_kb"] = rss_anon_kb()
    save_arrays(job["outputs_file"], output_names, outputs)
    result["outputs"] = output_names
    if job.get("hold"):
        hold(job)  # the session still alive: the parent measures the process as it serves
    return result


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m nnrun_tools.bench_worker JOB.json", file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        job = json.load(f)
    started = time.time()
    try:
        result = measure(job)
        code = 0
    except BaseException as e:  # noqa: BLE001 - every failure becomes a cell of the table
        if isinstance(e, KeyboardInterrupt):
            raise
        text = "".join(traceback.format_exception_only(type(e), e)).strip()
        last = [line for line in str(e).splitlines() if line.strip()]
        result = {"runtime": job.get("runtime"), "model": job.get("model"), "ok": False,
                  "error": f"{type(e).__name__}: {last[-1].strip() if last else ''}".rstrip(": "),
                  "traceback": traceback.format_exc(), "exception": text}
        traceback.print_exc()
        code = 1
    result["wall_s"] = round(time.time() - started, 3)
    with open(job["result_file"], "w") as f:
        json.dump(result, f, indent=1, default=str)
    return code


if __name__ == "__main__":
    sys.exit(main())
