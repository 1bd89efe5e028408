"""N processes serving one model at once, as a pre-forked server or N containers would: their total
proportional set size (PSS), for each N asked for (`nnrun-bench --share 1,2,4`).

Each process is a bench worker (import, load, prepare, warm-up and timed runs, as in the main
table) that, once measured, holds on until the parent has read every process's
`/proc/PID/smaps_rollup`. PSS counts a page shared by k processes as 1/k in each, so the total is
what the N processes cost the machine. It is split into anonymous pages (each process's heap: the
interpreter, numpy, the arena, anonymous weights) and file-backed ones (shared libraries, mapped
model files and the weight cache file), which N processes share.

nnrun's processes share one weight cache directory, written by a first process beforehand (not
counted) and settled, as on a machine that has served the model before.
"""

import json
import os
import subprocess
import sys
import time

from .bench import THREAD_ENV, _safe, wait_until_settled

SHARE_NOTES = [
    "PSS (proportional set size) counts a page shared by k processes as 1/k in each: the total is what "
    "the N processes cost the machine together, read from /proc/PID/smaps_rollup while all N hold their "
    "session after their runs. Anon: pages no file backs (each process's interpreter, numpy, arena and "
    "any anonymous weight copies), which processes cannot share; file: libraries, the model file and "
    "nnrun's weight cache file, which they share. `xN=1` divides the total by one process's. "
    "Interpreter anon: the processes' RssAnon after importing their runtime, before the model (Python, "
    "numpy, the runtime's modules); what lies beyond it is what serving the model costs.",
]
FIELDS = ("Pss", "Pss_Anon", "Pss_File", "Pss_Shmem")


def smaps_rollup_kb(pid):
    """{field: kB} of /proc/PID/smaps_rollup's PSS lines."""
    found = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in FIELDS:
                found[key] = int(rest.split()[0])
    return found


def serve_together(model, rt, n, args, workdir, make_job, cache_dir=None, tag="share"):
    """Start n workers on `model`, wait until each has run and holds; returns their PSS figures."""
    env = dict(os.environ, **{name: str(args.threads) for name in THREAD_ENV})
    release = workdir / f"{_safe(model.name)}.{_safe(rt.label)}.{tag}{n}.release"
    procs, jobs = [], []
    for k in range(n):
        job = make_job(model, rt, k, args, workdir, tag=f".{tag}{n}")
        job["hold"] = {"ready": job["result_file"] + ".ready", "release": str(release),
                       "timeout_s": args.timeout}
        if cache_dir is not None:
            job["weight_cache_dir"] = str(cache_dir)
        path = workdir / f"{job['id']}.job.json"
        path.write_text(json.dumps(job))
        procs.append(subprocess.Popen([sys.executable, "-m", "nnrun_tools.bench_worker", str(path)], env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
        jobs.append(job)
    out = {"model": model.name, "runtime": rt.label, "n": n}
    try:
        deadline = time.monotonic() + args.timeout
        while not all(os.path.exists(j["hold"]["ready"]) for j in jobs):
            dead = [p for p in procs if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                why = "timed out" if not dead else f"a worker exited with {dead[0].returncode}"
                out["error"] = why
                return out
            time.sleep(0.05)
        per_process = [smaps_rollup_kb(p.pid) for p in procs]
        out["per_process_kb"] = per_process
        for key in FIELDS:
            out[key] = sum(p.get(key, 0) for p in per_process)
        return out
    finally:
        release.touch()
        for p in procs:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        if "Pss" in out:
            out["baseline_anon_kb"] = sum(_baseline_anon_kb(j) for j in jobs)


def _baseline_anon_kb(job):
    """The worker's RssAnon after its imports, before the model: the interpreter's own share."""
    try:
        with open(job["result_file"]) as f:
            return json.load(f)["baseline"].get("rss_anon_kb") or 0
    except (OSError, ValueError, KeyError):
        return 0


def measure_sharing(models, runtimes, counts, args, workdir, make_job):
    """[{model, runtime, n, Pss, Pss_Anon, Pss_File, ...}] for every model, runtime and n."""
    from .bench import FORMAT_RUNTIMES, RUNTIMES

    rows = []
    for model in models:
        if model.input_error:
            continue
        for rt in runtimes:
            if rt.kind not in RUNTIMES or rt.kind not in FORMAT_RUNTIMES[model.format]:
                continue
            cache_dir = None
            if rt.kind == "nnrun":
                cache_dir = workdir / f"share-cache.{model.name}.{rt.label}".replace("/", "_")
                first = serve_together(model, rt, 1, args, workdir, make_job, cache_dir, tag="prime")
                if "error" in first:
                    rows.append({**first, "n": None})
                    continue
                wait_until_settled(cache_dir)
            for n in counts:
                print(f"[share] {model.name} {rt.label} x{n} ...", end="", file=sys.stderr, flush=True)
                row = serve_together(model, rt, n, args, workdir, make_job, cache_dir)
                print(f" {row['error']}" if "error" in row else f" PSS {row['Pss'] / 1024:,.0f} MB",
                      file=sys.stderr, flush=True)
                rows.append(row)
    return rows


def share_table(rows):
    lines = ["| model | runtime | N | total PSS MB | xN=1 | anon MB | file MB | per process MB | "
             "interpreter anon MB | beyond the interpreter MB | xN=1 |", "|" + " --- |" * 11]
    single = {(r["model"], r["runtime"]): r for r in rows if r.get("n") == 1 and "Pss" in r}
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['runtime']} | {r['n'] or ''} | FAILED: {r['error']} |" + " |" * 7)
            continue
        one = single.get((r["model"], r["runtime"]))
        beyond = r["Pss"] - r["baseline_anon_kb"]
        lines.append(" | ".join([
            f"| {r['model']}", r["runtime"], str(r["n"]), f"{r['Pss'] / 1024:,.1f}",
            f"{r['Pss'] / one['Pss']:.2f}" if one else "—", f"{r['Pss_Anon'] / 1024:,.1f}",
            f"{r['Pss_File'] / 1024:,.1f}", f"{r['Pss'] / 1024 / r['n']:,.1f}",
            f"{r['baseline_anon_kb'] / 1024:,.1f}", f"{beyond / 1024:,.1f}",
            f"{beyond / (one['Pss'] - one['baseline_anon_kb']):.2f}" if one else "—"]) + " |")
    return "\n".join(lines)
