"""`nnrun-bench`: nnrun against onnxruntime, onnx's reference evaluator and LiteRT, phase by phase.

    nnrun-bench resnet50 vgg16 --runtimes nnrun,onnxruntime --runs 5 --repeat 3
    nnrun-bench --set small                      # the models committed in models/
    nnrun-bench path/to/model.onnx other.tflite --threads 1 --dim seq=128

For every model and runtime, each repeat is a fresh process (`nnrun_tools.bench_worker`), so that no
runtime inherits another's heap or thread pools: it imports its runtime, takes the baseline RSS, then
times MODEL_LOAD, PREPARE and EXECUTE (warm-up runs, then timed runs) with RSS polled during each
phase. Every runtime reads the same random inputs (fixed seed) and saves its outputs; each runtime's
outputs are checked against the model's peer (onnxruntime for ONNX, LiteRT for TFLite, else the
reference evaluator), so a fast wrong answer shows as a MISMATCH rather than a win.

Writes OUT/results.md (tables), OUT/results.json (every raw figure and the machine), and PNG charts
when matplotlib is installed. A runtime that fails or times out on a model gets a cell saying why.

Models are names known to `nnrun_tools.build_models` (built into its cache on first use), names
known to `nnrun_tools.fetch_models` once it exists (it plugs in through `MODELS` and `ensure(name)`,
optionally `INT_RANGES = {name: {input: (low, high)}}`), or .onnx / .tflite files.
"""

import argparse
import ast
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from nnrun.report import RECENT_RUNS

from .bench_worker import RUNTIMES, load_arrays, save_arrays

PHASES = ("MODEL_LOAD", "PREPARE", "EXECUTE")
FORMAT_RUNTIMES = {"onnx": ("nnrun", "onnxruntime", "reference"), "tflite": ("nnrun", "litert")}
# The runtime whose outputs a model's others are checked against, in order of preference.
PEERS = {"onnx": ("onnxruntime", "reference"), "tflite": ("litert",)}
THREAD_ENV = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS",
              "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")
INT_RANGE = (0, 1000)
# Integer inputs whose name says they are masks or segment ids take 0 or 1: a token-type id of 999
# would index past the embedding and fail every runtime.
BINARY_INT_INPUTS = ("mask", "token_type", "segment")
_MB = 1024.0  # kB per MB


@dataclass
class Model:
    name: str
    path: Path
    format: str
    size_bytes: int = 0
    int_ranges: dict = field(default_factory=dict)
    input_shapes: dict = field(default_factory=dict)
    inputs_file: Path = None
    input_error: str = None


@dataclass
class Runtime:
    """A runtime to measure; nnrun may carry SessionOptions switches (`nnrun:release_weights=False`).
    A warm nnrun row starts on the weight cache its `base` row's repeat wrote."""
    label: str
    kind: str
    options: dict = field(default_factory=dict)
    warm: bool = False
    base: str = None
    cap: int = None  # bytes: the worker runs inside a memory cgroup of this limit (--memory-cap)
    env: dict = field(default_factory=dict)  # the worker's environment beyond the harness's own


def with_capped_rows(runtimes, caps):
    """After each runtime, the same runtime inside each memory cgroup limit of `caps` (bytes)."""
    out = []
    for rt in runtimes:
        out.append(rt)
        for cap in caps:
            out.append(Runtime(f"{rt.label} @{_size_label(cap)}", rt.kind, dict(rt.options), base=rt.label,
                               cap=cap, env=dict(rt.env)))
    return out


def _size_label(nbytes):
    return f"{nbytes / 2 ** 30:g}G" if nbytes >= 2 ** 30 else f"{nbytes / 2 ** 20:g}M"


def with_warm_rows(runtimes):
    """After each nnrun runtime, its warm start: the same switches, on the cache the first wrote."""
    out = []
    for rt in runtimes:
        out.append(rt)
        if rt.kind == "nnrun":
            out.append(Runtime(f"{rt.label} warm", rt.kind, dict(rt.options), warm=True, base=rt.label,
                               env=dict(rt.env)))
    return out


def wait_until_settled(directory):
    """Sleep until the newest file of `directory` is older than the cache's settling time: a warm
    start is a later process, not one racing the first's last write (see nnrun.cache_file)."""
    from nnrun.cache_file import SETTLED_S

    try:
        newest = max((f.stat().st_ctime for f in Path(directory).iterdir()), default=0)
    except OSError:
        return
    time.sleep(max(0.0, newest + SETTLED_S + 0.1 - time.time()))


# -- models -----------------------------------------------------------------------------------------

def _fetcher():
    """The real-model fetcher, when it exists."""
    try:
        from . import fetch_models
    except ImportError:
        return None
    return fetch_models if hasattr(fetch_models, "ensure") else None


def model_set(name):
    """The model names of a --set."""
    from . import build_models

    small = [n for n, p in build_models.MODELS.items() if p.small]
    built = [n for n, p in build_models.MODELS.items() if not p.small]
    fetcher = _fetcher()
    real = list(getattr(fetcher, "MODELS", ())) if fetcher else None
    if name == "real" and real is None:
        raise SystemExit("nnrun-bench: --set real needs nnrun_tools.fetch_models, which is not there yet")
    return {"small": small, "built": built, "real": real or [], "all": small + built + (real or [])}[name]


def resolve_model(spec):
    """A Model from a file path, a builder name (NAME or NAME:knob=value,...) or a fetcher name."""
    from . import build_models

    path = Path(spec)
    if path.suffix in (".onnx", ".tflite") or path.exists():
        if not path.exists():
            raise SystemExit(f"nnrun-bench: no model file {spec}")
        return Model(path.stem, path, "tflite" if path.suffix == ".tflite" else "onnx")
    name, knobs = build_models._parse_spec(spec)
    if name in build_models.MODELS:
        print(f"nnrun-bench: building {spec} (cached after the first time) ...", file=sys.stderr, flush=True)
        return Model(spec, Path(build_models.ensure(name, **knobs)), "onnx")
    fetcher = _fetcher()
    if fetcher and name in getattr(fetcher, "MODELS", ()):
        found = Path(fetcher.ensure(name))
        ranges = getattr(fetcher, "INT_RANGES", {}).get(name, {})
        shapes = getattr(fetcher, "INPUT_SHAPES", {}).get(name, {})
        return Model(name, found, "tflite" if found.suffix == ".tflite" else "onnx", int_ranges=dict(ranges),
                     input_shapes=dict(shapes))
    known = ", ".join(build_models.MODELS)
    raise SystemExit(f"nnrun-bench: {spec!r} is neither a model file nor a model name (known: {known}"
                     f"{', and the fetcher' if fetcher else ''})")


def _onnx_inputs(path):
    """[(name, dims, dtype)] of a model's graph inputs, and its size with external data, weights unread."""
    import onnx
    from onnx import helper

    model = onnx.load(str(path), load_external_data=False)
    graph = model.graph
    weights = {t.name for t in graph.initializer}
    inputs = []
    for value in graph.input:
        if value.name in weights:
            continue  # IR < 4 lists initializers among the inputs
        if not value.type.HasField("tensor_type"):
            raise ValueError(f"input {value.name!r} is not a tensor")
        tensor = value.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tensor.shape.dim]
        inputs.append((value.name, dims, helper.tensor_dtype_to_np_dtype(tensor.elem_type)))
    locations = {entry.value for t in graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL
                 for entry in t.external_data if entry.key == "location"}
    size = path.stat().st_size + sum((path.parent / loc).stat().st_size for loc in locations
                                     if (path.parent / loc).exists())
    return inputs, size


def _tflite_inputs(path):
    from ai_edge_litert.interpreter import Interpreter

    details = Interpreter(model_path=str(path)).get_input_details()
    inputs = [(d["name"], [int(s) if s >= 0 else None for s in d["shape_signature"]], d["dtype"])
              for d in details]
    return inputs, path.stat().st_size


def random_inputs(inputs, dims, int_ranges, seed, input_shapes=None):
    """One array per input: N(0,1) floats, integers in their range, random bools.

    Open dimensions come from `dims` (by symbolic name), else 1; `input_shapes` gives whole
    shapes by input name (a model's usual image size or audio chunk).
    """
    rng = np.random.default_rng(seed)
    arrays = []
    for name, shape_spec, dtype in inputs:
        shape = [dims.get(d, 1) if isinstance(d, str) else d if isinstance(d, int) and d > 0 else 1
                 for d in shape_spec]
        shape = list((input_shapes or {}).get(name, shape))
        dtype = np.dtype(dtype)
        if dtype.kind == "f":
            arrays.append(rng.standard_normal(shape).astype(dtype))
        elif dtype.kind in "iu":
            low, high = int_ranges.get(name) or ((0, 2) if any(w in name.lower() for w in BINARY_INT_INPUTS)
                                                 else INT_RANGE)
            arrays.append(rng.integers(low, high, size=shape).astype(dtype))
        elif dtype.kind == "b":
            arrays.append(rng.integers(0, 2, size=shape).astype(bool))
        else:
            raise ValueError(f"cannot make a random value for input {name!r} of type {dtype}")
    return arrays


def prepare_inputs(model, workdir, dims, int_ranges, seed):
    """Write the model's inputs to an .npz every worker reads; record the model's size."""
    try:
        inputs, model.size_bytes = (_tflite_inputs if model.format == "tflite" else _onnx_inputs)(model.path)
        arrays = random_inputs(inputs, dims, {**model.int_ranges, **int_ranges}, seed, model.input_shapes)
        model.inputs_file = workdir / f"{_safe(model.name)}.inputs.npz"
        save_arrays(model.inputs_file, [i[0] for i in inputs], arrays)
    except Exception as e:  # noqa: BLE001 - a model that cannot be read fails its rows, not the run
        model.input_error = f"cannot make inputs: {type(e).__name__}: {_last_line(str(e))}"
        if model.size_bytes == 0 and model.path.exists():
            model.size_bytes = model.path.stat().st_size


# -- runtimes and workers ---------------------------------------------------------------------------

def parse_runtimes(text):
    """`nnrun,onnxruntime,nnrun:release_weights=False+fold_constants=False` -> [Runtime]. A switch
    named in capitals is an environment variable of the runtime's workers, not a session option
    (`nnrun:NNRUN_BLAS=numpy`): rows that differ only in it run interleaved, as any two rows do."""
    runtimes = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        kind, _, switches = item.partition(":")
        options, env = {}, {}
        for switch in filter(None, switches.split("+")):
            key, _, value = switch.partition("=")
            if re.fullmatch(r"[A-Z][A-Z0-9_]*", key):
                env[key] = value
                continue
            try:
                options[key] = ast.literal_eval(value)
            except (ValueError, SyntaxError):
                options[key] = value
        runtimes.append(Runtime(item, kind, options, env=env))
    return runtimes


def run_worker(job, workdir, timeout, threads, cap=None, env=None):
    """Run one job in a fresh process (inside a memory cgroup of `cap` bytes when given, with `env`
    added to its environment); returns the worker's result, or a failure with the reason."""
    job_file = workdir / f"{job['id']}.job.json"
    job_file.write_text(json.dumps(job))
    env = dict(os.environ, **{name: str(threads) for name in THREAD_ENV}, **(env or {}))
    command = [sys.executable, "-m", "nnrun_tools.bench_worker", str(job_file)]
    started = time.perf_counter()
    load = _loadavg()
    group = None
    if cap:
        from .cgroup import MemoryCgroup, drop_page_cache

        # The model's pages are read (and charged) inside the cgroup, not found in the page cache
        # already, charged to whoever read them first.
        model = Path(job["model"])
        drop_page_cache([f for f in model.parent.glob(model.name + "*") if f.is_file()])
        group = MemoryCgroup(cap)
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout,
                              preexec_fn=group.enter if group else None)
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"TIMEOUT after {timeout:g} s", "timeout": True}
    finally:
        cgroup = None
        if group:
            cgroup = {"limit_bytes": cap, "peak_bytes": group.peak_bytes(), "oom_kills": group.oom_kills(),
                      "version": group.version}
            group.remove()
    result_file = Path(job["result_file"])
    if result_file.exists():
        result = json.loads(result_file.read_text())
    else:
        if done.returncode < 0:
            import signal

            reason = f"killed by {signal.Signals(-done.returncode).name}"
            if cgroup and cgroup["oom_kills"]:
                reason = f"killed: out of memory in a {_size_label(cap)} cgroup"
            elif done.returncode == -signal.SIGKILL:
                reason += " (out of memory?)"
        else:
            reason = _last_line(done.stderr) or f"exit code {done.returncode}"
        result = {"ok": False, "error": reason}
    result["returncode"] = done.returncode
    if cgroup:
        result["cgroup"] = cgroup
    result["loadavg_before"] = load
    result["process_s"] = round(time.perf_counter() - started, 3)
    if not result.get("ok"):
        result["stderr_tail"] = done.stderr[-4000:]
    return result


# -- figures ----------------------------------------------------------------------------------------

def _growth_mb(kb, baseline_kb):
    return None if kb is None else round((kb - baseline_kb) / _MB, 2)


def figures(result):
    """The figures of one successful repeat: times in ms, growths over the baseline in MB."""
    base = result["baseline"]["rss_kb"]
    phases = result["phases"]
    out = {}
    for name in PHASES:
        p = phases[name]
        time_ms = p["time_ms"]["median"] if name == "EXECUTE" else p["time_ms"]
        out[name] = {"time_ms": time_ms, "rss_growth_mb": _growth_mb(p.get("rss_kb"), base),
                     "hwm_growth_mb": _growth_mb(p.get("hwm_kb"), base)}
    execute = phases["EXECUTE"]["time_ms"]
    out["EXECUTE"].update(min_ms=execute["min"], max_ms=execute["max"],
                          foreign_cpu_pct=phases["EXECUTE"].get("foreign_cpu_pct"))
    out["peak_hwm_growth_mb"] = _growth_mb(result["peak"]["hwm_kb"], base)
    out["peak_rss_growth_mb"] = _growth_mb(result["peak"]["rss_kb"], base)
    anon = result["baseline"].get("rss_anon_kb")
    out["anon_growth_mb"] = _growth_mb(result.get("end_rss_anon_kb"), anon) if anon is not None else None
    out["create_ms"] = result["create"]["time_ms"] if "create" in result else None
    return out


def _median(values):
    values = [v for v in values if v is not None]
    return round(statistics.median(values), 3) if values else None


def aggregate(per_repeat):
    """Medians across repeats; the EXECUTE range spans every timed run of every repeat."""
    if not per_repeat:
        return None
    out = {}
    for name in PHASES:
        out[name] = {key: _median(f[name][key] for f in per_repeat)
                     for key in ("time_ms", "rss_growth_mb", "hwm_growth_mb")}
    out["EXECUTE"]["min_ms"] = min(f["EXECUTE"]["min_ms"] for f in per_repeat)
    out["EXECUTE"]["max_ms"] = max(f["EXECUTE"]["max_ms"] for f in per_repeat)
    # The quietest repeat: on a shared machine, the figure least disturbed by other work.
    out["EXECUTE"]["best_median_ms"] = min(f["EXECUTE"]["time_ms"] for f in per_repeat)
    for key in ("peak_hwm_growth_mb", "peak_rss_growth_mb", "anon_growth_mb", "create_ms"):
        out[key] = _median(f.get(key) for f in per_repeat)
    return out


def compare_outputs(peer, candidate, rtol):
    """Check candidate outputs against the peer's: floats within rtol of each output's largest magnitude
    (NaN and inf where the peer has them), everything else equal. Returns {"ok", "max_rel_err", "detail"}."""
    peer_names, peer_arrays = peer
    names, arrays = candidate
    if sorted(names) == sorted(peer_names):
        pairs = [(n, peer_arrays[peer_names.index(n)], arrays[names.index(n)]) for n in peer_names]
    elif len(names) == len(peer_arrays):
        pairs = [(n, p, a) for n, p, a in zip(peer_names, peer_arrays, arrays)]
    else:
        return {"ok": False, "max_rel_err": None,
                "detail": f"MISMATCH {len(names)} outputs, peer has {len(peer_names)}"}
    worst, worst_name = 0.0, None
    for name, want, got in pairs:
        if tuple(want.shape) != tuple(got.shape):
            return {"ok": False, "max_rel_err": None,
                    "detail": f"MISMATCH shape {list(got.shape)} vs {list(want.shape)} ({name})"}
        if want.dtype.kind in "fc" or got.dtype.kind in "fc":
            want64, got64 = want.astype(np.float64), got.astype(np.float64)
            finite = np.isfinite(want64)
            # NaN and inf must sit where the peer has them; finite values are compared in scale.
            if not np.array_equal(want64[~finite], got64[~finite], equal_nan=True) or \
                    not np.isfinite(got64[finite]).all():
                return {"ok": False, "max_rel_err": None, "detail": f"MISMATCH nan/inf differ ({name})"}
            if not finite.any():
                continue
            scale = float(np.max(np.abs(want64[finite]))) or 1.0
            err = float(np.max(np.abs(got64[finite] - want64[finite]))) / scale
        else:
            differ = int(np.count_nonzero(want != got))
            if differ:
                return {"ok": False, "max_rel_err": None,
                        "detail": f"MISMATCH {differ} of {want.size} values differ ({name})"}
            err = 0.0
        if err > worst:
            worst, worst_name = err, name
    ok = worst <= rtol
    detail = f"OK {worst:.0e}" if ok else f"MISMATCH max err {worst:.1e} ({worst_name})"
    return {"ok": ok, "max_rel_err": worst, "detail": detail}


# -- the run ----------------------------------------------------------------------------------------

def plan_rows(models, runtimes):
    """(model, runtime) pairs in table order; runtimes that do not read a model's format are left out."""
    rows = []
    for model in models:
        for rt in runtimes:
            if rt.kind in RUNTIMES and rt.kind not in FORMAT_RUNTIMES[model.format]:
                continue
            rows.append((model, rt))
    return rows


def not_run_reason(model, rt, args):
    """Why a row gets no worker, or None."""
    if rt.kind not in RUNTIMES:
        return f"FAILED: unknown runtime {rt.kind!r} (known: {', '.join(RUNTIMES)})"
    if model.input_error:
        return f"FAILED: {model.input_error}"
    if rt.kind == "reference" and model.size_bytes > args.reference_max_mb * 2 ** 20:
        return (f"skipped: {model.size_bytes / 2 ** 20:.0f} MB > --reference-max-mb "
                f"{args.reference_max_mb:g}")
    return None


def make_job(model, rt, rep, args, workdir, tag=""):
    """The job file's content for one worker process."""
    reference = rt.kind == "reference"
    job = {"id": f"{_safe(model.name)}.{_safe(rt.label)}.{rep}{tag}", "runtime": rt.kind,
           "model": str(model.path), "inputs_file": str(model.inputs_file),
           "threads": args.threads,
           "runs": args.reference_runs if reference else args.runs,
           "warmup": 0 if reference else args.warmup,
           "min_secs": 0.0 if reference else args.min_secs,
           "warmup_min_secs": 0.0 if reference else args.warmup_min_secs,
           "nnrun_options": rt.options, "poll_interval_ms": args.poll_ms}
    if rt.kind == "nnrun" and args.warm_start:
        # A first start writes the cache its warm partner then reads.
        job["weight_cache_dir"] = str(workdir / f"cache.{_safe(model.name)}.{_safe(rt.base or rt.label)}.{rep}")
    job["outputs_file"] = str(workdir / f"{job['id']}.outputs.npz")
    job["result_file"] = str(workdir / f"{job['id']}.result.json")
    return job


def run_all(models, runtimes, args, workdir):
    rows = plan_rows(models, runtimes)
    records = []
    for model, rt in rows:
        records.append({"model": model.name, "path": str(model.path), "format": model.format,
                        "size_bytes": model.size_bytes, "runtime": rt.label, "kind": rt.kind,
                        "options": rt.options, "env": rt.env, "not_run": not_run_reason(model, rt, args),
                        "repeats": []})
    # Model by model, each repeat going round the runtimes, so that a drift of the machine (heat, a
    # neighbour's load) spreads over every runtime rather than landing on one.
    todo = []
    for model in models:
        pairs = [i for i, (m, _) in enumerate(rows) if m is model and not records[i]["not_run"]]
        todo += [(i, rep) for rep in range(args.repeat) for i in pairs]
    for step, (i, rep) in enumerate(todo, 1):
        model, rt = rows[i]
        rec = records[i]
        job = make_job(model, rt, rep, args, workdir)
        if rt.warm:
            wait_until_settled(job["weight_cache_dir"])
        print(f"[{step}/{len(todo)}] {model.name} {rt.label} repeat {rep + 1}/{args.repeat} ...",
              end="", file=sys.stderr, flush=True)
        result = run_worker(job, workdir, args.timeout, args.threads, rt.cap, rt.env)
        result["repeat"] = rep
        result["outputs_file"] = job["outputs_file"]
        rec["repeats"].append(result)
        if result.get("ok"):
            f = figures(result)
            busy = f["EXECUTE"]["foreign_cpu_pct"]
            print(f" execute median {f['EXECUTE']['time_ms']:.1f} ms, peak HWM +{f['peak_hwm_growth_mb']:.0f} MB"
                  + (f" (other processes used {busy:.0f}% of the CPUs meanwhile)" if busy and busy >= 10 else ""),
                  file=sys.stderr, flush=True)
        else:
            print(f" FAILED: {result['error']}", file=sys.stderr, flush=True)
    for rec in records:
        good = [r for r in rec["repeats"] if r.get("ok")]
        rec["summary"] = aggregate([figures(r) for r in good])
        failed = [r for r in rec["repeats"] if not r.get("ok")]
        rec["failures"] = [r["error"] for r in failed]
        rec["nnrun_plan"] = good[-1]["nnrun_report"]["plan"] if good and "nnrun_report" in good[-1] else None
        rec["load_prepare_combined"] = bool(good and good[-1].get("load_prepare_combined"))
    check_all(records, args.rtol)
    return records


def _check(peer_outputs, outputs_file, rtol):
    try:
        return compare_outputs(peer_outputs, load_arrays(outputs_file), rtol)
    except Exception as e:  # noqa: BLE001 - an output the check cannot read is a cell, not a crash
        return {"ok": False, "max_rel_err": None, "detail": f"check failed: {type(e).__name__}: {e}"}


def check_all(records, rtol):
    """Compare every runtime's outputs with its model's peer; fills rec['check'] and rec['peer']."""
    by_model = {}
    for rec in records:
        by_model.setdefault(rec["model"], []).append(rec)
    for model, recs in by_model.items():
        peer = None
        for kind in PEERS[recs[0]["format"]]:
            peer = next((r for r in recs if r["kind"] == kind and not r["options"] and not r.get("env")
                         and any(x.get("ok") for x in r["repeats"])), None)
            if peer:
                break
        peer_outputs = load_arrays(next(x for x in peer["repeats"] if x.get("ok"))["outputs_file"]) \
            if peer else None
        for rec in recs:
            rec["peer"] = peer["runtime"] if peer else None
            good = [r for r in rec["repeats"] if r.get("ok")]
            if not good:
                rec["check"] = None
            elif rec is peer:
                rec["check"] = {"ok": True, "max_rel_err": 0.0, "detail": "peer"}
            elif peer is None:
                rec["check"] = {"ok": None, "max_rel_err": None, "detail": "unchecked (no peer ran)"}
            else:
                checks = [_check(peer_outputs, r["outputs_file"], rtol) for r in good]
                bad = [c for c in checks if not c["ok"]]
                rec["check"] = bad[0] if bad else max(checks, key=lambda c: c["max_rel_err"])


# -- reporting --------------------------------------------------------------------------------------

def describe_machine():
    """Cores, CPU, memory, BLAS and the version of every runtime."""
    from importlib import metadata

    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    versions = {}
    for dist in ("nnrun", "numpy", "scipy", "onnx", "onnxruntime", "ai-edge-litert", "threadpoolctl",
                 "matplotlib"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = None
    machine = {"cpu": cpu, "logical_cores": os.cpu_count(),
               "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
               "platform": platform.platform(), "python": platform.python_version(), "versions": versions}
    try:
        import psutil

        machine["physical_cores"] = psutil.cpu_count(logical=False)
        machine["memory_mb"] = psutil.virtual_memory().total // 2 ** 20
    except ImportError:
        pass
    try:
        deps = np.show_config(mode="dicts").get("Build Dependencies", {})
        machine["numpy_blas"] = {k: {"name": v.get("name"), "version": v.get("version")} for k, v in deps.items()}
    except Exception:  # noqa: BLE001 - older numpy: show_config prints only
        machine["numpy_blas"] = None
    try:
        from nnrun.ops import blas

        library = blas.library()  # as a worker's sessions load it (the same environment)
        machine["nnrun_blas"] = {"library": library.name, "kernels": library.core, "own": library.own}
    except Exception:  # noqa: BLE001 - the figures do not depend on describing it
        machine["nnrun_blas"] = None
    try:
        from threadpoolctl import threadpool_info

        machine["threadpools"] = [{k: v for k, v in pool.items() if k != "filepath"} for pool in threadpool_info()]
    except ImportError:
        machine["threadpools"] = None
    return machine


def _loadavg():
    """The 1-minute load average: other work on the machine shows here and makes timings noisy."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def _git_state():
    repo = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True,
                                text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=repo, capture_output=True, text=True,
                               timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": commit.stdout.strip() or None, "dirty": bool(dirty.stdout.strip())}


def _fmt(value):
    """One decimal, two below 10, three below 1: sub-millisecond runs keep their figures."""
    if value is None:
        return "—"
    digits = 1 if abs(value) >= 10 else 2 if abs(value) >= 1 else 3
    return f"{value:,.{digits}f}"


def _startup(summary):
    """MODEL_LOAD + PREPARE: the one start-up figure every runtime has (onnxruntime does not split it)."""
    return (summary["MODEL_LOAD"]["time_ms"] or 0) + (summary["PREPARE"]["time_ms"] or 0)


def _ratio(value, peer_value, floor=0.0):
    if value is None or peer_value is None or peer_value <= floor:
        return "—"
    ratio = value / peer_value
    return f"{ratio:.2f}" if ratio >= 0.1 else f"{ratio:.1g}"


def _cell(text, width=160):
    text = text.replace("|", "\\|").replace("\n", " ")
    return text if len(text) <= width else text[:width - 1] + "…"


def markdown_table(records):
    header = ("| model | runtime | MODEL_LOAD ms | PREPARE ms | EXECUTE median ms (min–max) | "
              "load RSS growth MB | peak HWM growth MB | output check | EXECUTE nnrun/peer | "
              "peak HWM nnrun/peer | LOAD+PREPARE nnrun/peer |")
    lines = [header, "|" + " --- |" * 11]
    by_key = {(r["model"], r["runtime"]): r for r in records}
    for rec in records:
        s = rec["summary"]
        cells = [rec["model"], rec["runtime"]]
        if rec["not_run"] or s is None:
            why = rec["not_run"] or "FAILED: " + rec["failures"][-1]
            why = why.replace(rec["path"], Path(rec["path"]).name)  # the row names the model already
            lines.append("| " + " | ".join(cells + [_cell(why)] + [""] * 8) + " |")
            continue
        combined = rec["load_prepare_combined"]
        ex = s["EXECUTE"]
        check = rec["check"]["detail"] if rec["check"] else ""
        if rec["failures"]:
            check += f"; {len(rec['failures'])}/{len(rec['repeats'])} repeats failed: {rec['failures'][-1]}"
        ratios = ["—"] * 3
        peer = by_key.get((rec["model"], rec["peer"])) if rec["peer"] else None
        if rec["kind"] == "nnrun" and peer and peer["summary"]:
            p = peer["summary"]
            ratios = [_ratio(ex["time_ms"], p["EXECUTE"]["time_ms"]),
                      _ratio(s["peak_hwm_growth_mb"], p["peak_hwm_growth_mb"], floor=0.1),
                      _ratio(_startup(s), _startup(p))]
            if rec["peer"] != "onnxruntime" and rec["format"] == "onnx":
                ratios = [f"{r} (vs {rec['peer']})" for r in ratios]
        cells += [_fmt(s["MODEL_LOAD"]["time_ms"]) + ("†" if combined else ""),
                  "incl.†" if combined else _fmt(s["PREPARE"]["time_ms"]),
                  f"{_fmt(ex['time_ms'])} ({_fmt(ex['min_ms'])}–{_fmt(ex['max_ms'])})",
                  _fmt(s["MODEL_LOAD"]["rss_growth_mb"]), _fmt(s["peak_hwm_growth_mb"]),
                  _cell(check), *ratios]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


START_NOTES = [
    "First: a process on an empty weight cache, which packs and writes it. Warm: a later process on the "
    "cache the first wrote (started once the file settled, so it checks every checksum once and stamps "
    "the file; starts after it skip even that). Create: the whole `InferenceSession(...)` call, import "
    "excluded; onnxruntime's is its session creation.",
    "Anon growth: RssAnon (memory no file backs: the interpreter's heap, the arena, anonymous copies of "
    "weights) at the end of the last run, less at the baseline (after the runtime and its op families "
    "are imported). The issue's bound for nnrun is the arena + 8 MB.",
]


CAP_NOTES = [
    "Each capped worker runs inside a memory cgroup of its own with that limit, swap limited too, as a "
    "container's memory limit does: the kernel charges every page the process touches (the page cache of "
    "the files it reads included), reclaims clean file pages when the charge nears the limit and kills "
    "the process when it cannot. `vs unlimited` divides the median EXECUTE by the same runtime's "
    "unlimited row. Major faults: page faults that waited for the disk, per timed run. Read and stalled "
    "(nnrun under a budget, from its report): bytes read from storage per run, and the time its steps "
    "waited for streamed weights and spilled activations. Peak: the cgroup's own high-water mark "
    "(interpreter and imports included).",
]


def cap_table(records):
    """Completion, EXECUTE against unlimited, major faults and cgroup peak of every capped row."""
    by_key = {(r["model"], r["runtime"]): r for r in records}
    lines = []
    for rec in records:
        runs = [r for r in rec["repeats"] if r.get("cgroup")]
        if not runs:
            continue
        cg = runs[-1]["cgroup"]
        free = by_key.get((rec["model"], rec["runtime"].rsplit(" @", 1)[0]))
        s = rec["summary"]
        if s is None:
            outcome = rec["failures"][-1] if rec["failures"] else (rec["not_run"] or "not run")
            lines.append(f"| {rec['model']} | {rec['runtime']} | {_cell(outcome)} | — | — | — | — | — | "
                         f"{_fmt((cg['peak_bytes'] or 0) / 2 ** 20)} |")
            continue
        good = [r for r in runs if r.get("ok")]
        faults = [r["faults"]["major_per_run"] for r in good if r.get("faults")]
        ratio = _ratio(s["EXECUTE"]["time_ms"], free["summary"]["EXECUTE"]["time_ms"]) \
            if free and free["summary"] else "—"
        io = [r["nnrun_report"]["phases"]["EXECUTE"] for r in good
              if "read_bytes_per_run" in r.get("nnrun_report", {}).get("phases", {}).get("EXECUTE", {})]
        read = _fmt(_median([e["read_bytes_per_run"] / 2 ** 20 for e in io])) if io else "—"
        stalled = _fmt(_median([e["stalled_ms_per_run"] for e in io])) if io else "—"
        lines.append(f"| {rec['model']} | {rec['runtime']} | completed {len(good)}/{len(rec['repeats'])} | "
                     f"{_fmt(s['EXECUTE']['time_ms'])} | {ratio} | {_fmt(_median(faults))} | {read} | {stalled} | "
                     f"{_fmt(_median([r['cgroup']['peak_bytes'] / 2 ** 20 for r in good]))} |")
    if not lines:
        return ""
    return "\n".join(["| model | runtime | outcome | EXECUTE median ms | vs unlimited | major faults per run | "
                      "read MB per run | stalled ms per run | cgroup peak MB |", "|" + " --- |" * 9] + lines)


def start_table(records):
    """nnrun's first and warm starts beside onnxruntime's session creation, and RssAnon growth."""
    by_key = {(r["model"], r["runtime"]): r for r in records}
    lines = []
    mb = 2 ** 20
    for warm in (r for r in records if r["kind"] == "nnrun" and r["runtime"].endswith(" warm") and r["summary"]):
        first = by_key.get((warm["model"], warm["runtime"][:-len(" warm")]))
        if not first or not first["summary"]:
            continue
        f, w = first["summary"], warm["summary"]
        peer = by_key.get((warm["model"], "onnxruntime"))
        p = peer["summary"] if peer and peer["summary"] else None
        arena = (warm["nnrun_plan"] or {}).get("arena_bytes")
        lines.append(" | ".join([
            f"| {warm['model']}", first["runtime"], _fmt(f["PREPARE"]["time_ms"]), _fmt(w["PREPARE"]["time_ms"]),
            _ratio(w["PREPARE"]["time_ms"], f["PREPARE"]["time_ms"]), _fmt(w.get("create_ms")),
            _fmt(p["MODEL_LOAD"]["time_ms"]) if p else "—",
            _ratio(w.get("create_ms"), p["MODEL_LOAD"]["time_ms"]) if p else "—",
            _fmt(f.get("anon_growth_mb")), _fmt(w.get("anon_growth_mb")),
            _fmt(p.get("anon_growth_mb")) if p else "—",
            _fmt(arena / mb) if arena is not None else "—"]) + " |")
    if not lines:
        return ""
    return "\n".join(["| model | runtime | PREPARE first ms | PREPARE warm ms | warm / first | create warm ms | "
                      "onnxruntime create ms | create warm / onnxruntime | anon growth first MB | "
                      "anon growth warm MB | onnxruntime anon growth MB | arena MB |", "|" + " --- |" * 12] + lines)


def _order_cell(search):
    """How the plan's order was found: `proven, 12 ms` or `gap 1.2 MB, 1000 ms`."""
    if not search:
        return "—"
    how = "proven" if search.get("proven_optimal") else f"gap {search.get('gap_bytes', 0) / 2 ** 20:.2f} MB"
    return f"{how}, {search.get('ms', 0):.0f} ms"


def plan_table(records):
    rows = [r for r in records if r["nnrun_plan"]]
    if not rows:
        return ""
    lines = ["| model | runtime | arena MB | lower bound MB | arena / bound | file order peak MB | order | "
             "weights mapped MB | packed MB | released MB | steps |", "|" + " --- |" * 11]
    mb = 2 ** 20
    for rec in rows:
        p = rec["nnrun_plan"]
        bound = p.get("lower_bound_bytes") or 0
        lines.append(f"| {rec['model']} | {rec['runtime']} | {p['arena_bytes'] / mb:,.2f} | {bound / mb:,.2f} | "
                     f"{(p['arena_bytes'] / bound) if bound else float('nan'):.2f} | "
                     f"{p.get('file_order_peak_bytes', 0) / mb:,.2f} | {_order_cell(p.get('order_search') or {})} | "
                     f"{p['weights_mapped_bytes'] / mb:,.1f} | {p['weights_packed_bytes'] / mb:,.1f} | "
                     f"{p['weights_released_bytes'] / mb:,.1f} | {p.get('steps', 0)} |")
    return "\n".join(lines)


def _foreign_cpu(records):
    return [r["phases"]["EXECUTE"].get("foreign_cpu_pct") for rec in records for r in rec["repeats"]
            if r.get("ok") and r["phases"]["EXECUTE"].get("foreign_cpu_pct") is not None]


def _worker_loads(records):
    return [r["loadavg_before"] for rec in records for r in rec["repeats"] if r.get("loadavg_before") is not None]


def _fmt_range(values, unit=""):
    return f"{min(values):.1f}–{max(values):.1f}{unit}" if values else "unknown"


def _nnrun_blas_text(found):
    if not found or not found.get("library"):
        return "numpy's matmul (no BLAS nnrun can call)"
    whose = "nnrun's own" if found.get("own") else "numpy's"
    return f"{whose} {found['library']} ({found.get('kernels') or 'kernels unknown'})"


def machine_lines(machine, args, records):
    v = machine["versions"]
    blas = machine.get("numpy_blas") or {}
    pools = machine.get("threadpools") or []
    blas_text = ", ".join(f"{p.get('internal_api')} {p.get('version')} ({p.get('architecture')}, "
                          f"{p.get('threading_layer')})" for p in pools) or \
        ", ".join(f"{b['name']} {b['version']}" for b in blas.values())
    return [
        f"- CPU: {machine['cpu']}, {machine.get('usable_cores')} usable cores of {machine['logical_cores']} "
        f"logical ({machine.get('physical_cores')} physical), {machine.get('memory_mb', 0):,} MB RAM",
        f"- {machine['platform']}, Python {machine['python']}",
        f"- numpy {v['numpy']} with {blas_text or 'unknown BLAS'}; scipy {v['scipy']}",
        f"- nnrun's GEMMs: {_nnrun_blas_text(machine.get('nnrun_blas'))}",
        f"- nnrun {v['nnrun']}, onnxruntime {v['onnxruntime']}, onnx {v['onnx']} (reference evaluator), "
        f"ai-edge-litert {v['ai-edge-litert']}",
        f"- 1-minute load average before the workers: {_fmt_range(_worker_loads(records))} "
        f"(on {machine.get('usable_cores')} cores; the benchmark itself adds up to {args.threads}); "
        f"other processes' share of the CPUs during the timed runs: {_fmt_range(_foreign_cpu(records), '%')}",
        f"- threads per runtime: {args.threads} (nnrun intra_op_num_threads, onnxruntime "
        f"intra_op_num_threads, LiteRT num_threads, and {'/'.join(THREAD_ENV[:3])} in each worker)",
    ]


def footnotes(args):
    return [
        f"Each figure is the median over {args.repeat} fresh process(es) per model and runtime; "
        f"EXECUTE is the median of at least {args.runs} timed runs and {args.min_secs:g} s of them (of the last "
        f"{RECENT_RUNS:,} when more), after at least {args.warmup} warm-up run(s) and {args.warmup_min_secs:g} s "
        f"(reference evaluator: {args.reference_runs} run, no warm-up); its range spans those runs.",
        "Memory growths are over the worker's baseline RSS, taken after the runtime is imported and the "
        "inputs are read, just before MODEL_LOAD (VmHWM is reset to the RSS there). "
        "`load RSS growth` is the largest RSS polled during MODEL_LOAD; `peak HWM growth` is VmHWM at the "
        "end of the last phase.",
        "† onnxruntime: session creation (reading the model, graph optimisations, kernel preparation) is "
        "reported as MODEL_LOAD; its PREPARE is included there. nnrun: MODEL_LOAD and PREPARE are the "
        "split of its constructor from its own report. reference: onnx.load, then ReferenceEvaluator(model). "
        "LiteRT: Interpreter(model_path), then allocate_tensors.",
        f"Output check: every output within {args.rtol:g} × the output's largest magnitude of the peer's "
        "(onnxruntime for ONNX, LiteRT for TFLite, else the reference evaluator), from the last run of "
        "each repeat; `nnrun/peer` ratios are against the same peer (below 1 is better for nnrun); "
        "LOAD+PREPARE compares the sums, since onnxruntime does not split them.",
    ]


def write_markdown(path, records, machine, args, command, charts_note, sharing=None):
    text = ["# nnrun benchmark", "", "```", command, "```", "", *machine_lines(machine, args, records), "",
            markdown_table(records), ""]
    text += [f"{i}. {note}" for i, note in enumerate(footnotes(args), 1)] + [""]
    plans = plan_table(records)
    if plans:
        text += ["## nnrun plans", "", plans, ""]
    capped = cap_table(records)
    if capped:
        text += ["## Under a memory limit", "", capped, "", *CAP_NOTES, ""]
    starts = start_table(records)
    if starts:
        text += ["## Start-up and anonymous memory", "", starts, "", *START_NOTES, ""]
    if sharing:
        from .bench_share import SHARE_NOTES, share_table

        text += ["## Processes serving one model", "", share_table(sharing), "", *SHARE_NOTES, ""]
    if charts_note:
        text += [charts_note, ""]
    Path(path).write_text("\n".join(text))
    return "\n".join(text)


def write_charts(out, records):
    """time_per_phase.png and peak_memory.png; returns a note for the markdown."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "Charts skipped: matplotlib is not installed (pip install matplotlib, or nnrun[bench])."
    ok = [r for r in records if r["summary"]]
    if not ok:
        return "No charts: no runtime completed."
    models = list(dict.fromkeys(r["model"] for r in ok))
    runtimes = list(dict.fromkeys(r["runtime"] for r in ok))
    width = 0.8 / len(runtimes)

    fig, axes = plt.subplots(1, len(models), figsize=(max(5, 4 * len(models)), 4), squeeze=False)
    for ax, model in zip(axes[0], models):
        for j, rt in enumerate(runtimes):
            rec = next((r for r in ok if r["model"] == model and r["runtime"] == rt), None)
            if rec is None:
                continue
            values = [rec["summary"][p]["time_ms"] or 0 for p in PHASES]
            ax.bar([k + j * width for k in range(3)], values, width, label=rt)
        ax.set_xticks([k + width * (len(runtimes) - 1) / 2 for k in range(3)], PHASES, fontsize=8)
        ax.set_yscale("log")
        ax.set_title(model)
        ax.set_ylabel("ms (log)")
    axes[0][0].legend(fontsize=8)
    fig.suptitle("Time per phase (EXECUTE: median run)")
    fig.tight_layout()
    fig.savefig(out / "time_per_phase.png", dpi=100)
    plt.close(fig)

    fig, axes = plt.subplots(1, 2, figsize=(max(8, 2.5 * len(models) * 2), 4), squeeze=False)
    for ax, (key, title) in zip(axes[0], (("load", "RSS growth during MODEL_LOAD"),
                                          ("peak", "Peak HWM growth"))):
        for j, rt in enumerate(runtimes):
            xs, values = [], []
            for k, model in enumerate(models):
                rec = next((r for r in ok if r["model"] == model and r["runtime"] == rt), None)
                if rec:
                    s = rec["summary"]
                    xs.append(k + j * width)
                    values.append((s["MODEL_LOAD"]["rss_growth_mb"] if key == "load"
                                   else s["peak_hwm_growth_mb"]) or 0)
            ax.bar(xs, values, width, label=rt)
        ax.set_xticks([k + width * (len(runtimes) - 1) / 2 for k in range(len(models))], models, fontsize=8)
        ax.set_ylabel("MB over baseline")
        ax.set_title(title)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "peak_memory.png", dpi=100)
    plt.close(fig)
    return "Charts: ![time per phase](time_per_phase.png) ![peak memory](peak_memory.png)"


# -- command line -----------------------------------------------------------------------------------

def _safe(name):
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def _last_line(text):
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _pairs(items, what, convert):
    out = {}
    for item in items or ():
        name, sep, value = item.rpartition("=")
        if not sep or not name:
            raise SystemExit(f"nnrun-bench: {what} must look like NAME=VALUE, got {item!r}")
        out[name] = convert(value)
    return out


def _int_range(text):
    low, sep, high = text.partition(":")
    if not sep:
        raise SystemExit(f"nnrun-bench: --int-range wants NAME=LOW:HIGH, got {text!r}")
    return int(low), int(high)


def build_parser():
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    p = argparse.ArgumentParser(prog="nnrun-bench", description=__doc__.split("\n")[0])
    p.add_argument("models", nargs="*", metavar="MODEL",
                   help="model names (nnrun_tools.build_models, NAME[:knob=value,...]) or .onnx/.tflite files")
    p.add_argument("--set", choices=("small", "built", "real", "all"),
                   help="add a set of models: small (committed), built (large builder presets), "
                        "real (the fetcher's), all")
    p.add_argument("--runtimes", default="nnrun,onnxruntime,reference,litert",
                   help="comma list (default %(default)s); nnrun may carry SessionOptions switches: "
                        "nnrun:release_weights=False+fold_constants=False")
    p.add_argument("--runs", type=int, default=5, help="timed runs per process (default %(default)s)")
    p.add_argument("--warmup", type=int, default=1, help="untimed runs before them (default %(default)s)")
    p.add_argument("--min-secs", type=float, default=1.0,
                   help="timed runs go on until they took this long, as TFLite's benchmark_model "
                        "--min_secs (default %(default)g)")
    p.add_argument("--warmup-min-secs", type=float, default=0.5,
                   help="untimed runs go on until they took this long (default %(default)g)")
    p.add_argument("--repeat", type=int, default=1,
                   help="fresh processes per model and runtime; figures are medians over them (default 1)")
    p.add_argument("--threads", type=int, default=cores,
                   help="threads for every runtime (default: every usable core, here %(default)s)")
    p.add_argument("--dim", action="append", metavar="NAME=VALUE", help="a symbolic dimension (default 1)")
    p.add_argument("--int-range", action="append", metavar="INPUT=LOW:HIGH",
                   help=f"range of an integer input (default [{INT_RANGE[0]}, {INT_RANGE[1]}); "
                        f"[0, 2) for masks and segment ids)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    p.add_argument("--rtol", type=float, default=1e-3,
                   help="output check tolerance, relative to each output's largest magnitude (default %(default)g)")
    p.add_argument("--reference-runs", type=int, default=1,
                   help="timed runs of the (slow) reference evaluator, which gets no warm-up (default 1)")
    p.add_argument("--reference-max-mb", type=float, default=50.0,
                   help="skip the reference evaluator on models larger than this (default %(default)g)")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per worker process (default %(default)g)")
    p.add_argument("--poll-ms", type=float, default=2.0, help="RSS polling interval in ms (default %(default)g)")
    p.add_argument("--out", type=Path, default=Path("bench-results"), help="output directory (default bench-results/)")
    p.add_argument("--keep-work", action="store_true",
                   help="keep inputs, outputs and worker results in OUT/work")
    p.add_argument("--no-charts", action="store_true", help="do not draw PNG charts")
    p.add_argument("--warm-start", action="store_true",
                   help="after each nnrun repeat (a first start, which writes the weight cache), a second "
                        "process on the same cache: rows 'nnrun warm', and a table of start-up and memory")
    p.add_argument("--memory-cap", metavar="SIZE,...",
                   help="also run every runtime inside a memory cgroup of each limit (e.g. 128M,96M; swap "
                        "limited too): rows 'RUNTIME @128M' and a table of completion, EXECUTE against "
                        "unlimited, major faults and the cgroup's peak. Needs root")
    p.add_argument("--share", metavar="N,N,...",
                   help="also measure N processes serving each model at once (e.g. 1,2,4): their total PSS")
    return p


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    specs = list(args.models) + (model_set(args.set) if args.set else [])
    if not specs:
        raise SystemExit("nnrun-bench: name models or files, or give --set (see --help)")
    if args.threads < 1:
        raise SystemExit("nnrun-bench: --threads must be at least 1")
    dims = _pairs(args.dim, "--dim", int)
    int_ranges = _pairs(args.int_range, "--int-range", _int_range)
    runtimes = parse_runtimes(args.runtimes)
    if args.warm_start:
        runtimes = with_warm_rows(runtimes)
    if args.memory_cap:
        from .cgroup import available, parse_size

        why = available()
        if why:
            raise SystemExit(f"nnrun-bench: --memory-cap needs a memory cgroup: {why}")
        runtimes = with_capped_rows(runtimes, [parse_size(c) for c in args.memory_cap.split(",") if c.strip()])
    models = [resolve_model(s) for s in dict.fromkeys(specs)]
    seen = {}
    for model in models:  # two files called model.onnx get rows of their own
        seen[model.name] = seen.get(model.name, 0) + 1
        if seen[model.name] > 1:
            model.name = f"{model.name}#{seen[model.name]}"
    args.out.mkdir(parents=True, exist_ok=True)
    if args.keep_work:
        workdir = args.out / "work"
        workdir.mkdir(exist_ok=True)
        holder = None
    else:
        holder = tempfile.TemporaryDirectory(prefix="nnrun-bench-")
        workdir = Path(holder.name)
    try:
        for model in models:
            prepare_inputs(model, workdir, dims, int_ranges, args.seed)
        started = time.time()
        records = run_all(models, runtimes, args, workdir)
        sharing = None
        if args.share:
            from .bench_share import measure_sharing

            counts = sorted({int(n) for n in args.share.split(",") if n.strip()})
            sharing = measure_sharing(models, [rt for rt in runtimes if not rt.warm], counts, args, workdir,
                                      make_job)
    finally:
        if holder:
            holder.cleanup()
    machine = describe_machine()
    command = "nnrun-bench " + " ".join(argv)
    charts_note = None if args.no_charts else write_charts(args.out, records)
    text = write_markdown(args.out / "results.md", records, machine, args, command, charts_note, sharing)
    for rec in records:
        for r in rec["repeats"]:
            r.pop("outputs_file", None)
    raw = {"command": command, "started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)),
           "wall_s": round(time.time() - started, 1), "machine": machine, "git": _git_state(),
           "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
           "thread_env": list(THREAD_ENV), "results": records, "sharing": sharing}
    (args.out / "results.json").write_text(json.dumps(raw, indent=1, default=str))
    print(text)
    print(f"nnrun-bench: wrote {args.out / 'results.md'} and {args.out / 'results.json'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
