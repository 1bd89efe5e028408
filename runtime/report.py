"""Phase timing and memory: MODEL_LOAD, PREPARE, EXECUTE, like onert's `nnpackage_run --mem_poll`.

A `PhaseRecorder` times each phase and, while it runs, a `MemoryPoller` thread
samples the process RSS; a phase's `rss_kb` is the largest RSS seen during it
and its `hwm_kb` the kernel's VmHWM when it ends.
"""

import math
import os
import statistics
import threading
import time
from collections import deque
from contextlib import contextmanager

_PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024 if hasattr(os, "sysconf") else 4


class _ProcFile:
    """A /proc/self file kept open and re-read with pread: a sample costs one syscall."""

    def __init__(self, name):
        self.name = name
        self.fd = None

    def read(self):
        try:
            if self.fd is None:
                self.fd = os.open(f"/proc/self/{self.name}", os.O_RDONLY)
            return os.pread(self.fd, 4096, 0)
        except OSError:
            return None


_statm = _ProcFile("statm")
_status = _ProcFile("status")


def rss_kb():
    """Current resident set size in kB."""
    data = _statm.read()
    if data is not None:
        return int(data.split()[1]) * _PAGE_KB
    import psutil

    return psutil.Process().memory_info().rss // 1024


def hwm_kb():
    """Peak resident set size (VmHWM) in kB."""
    data = _status.read()
    if data is not None:
        start = data.find(b"VmHWM:")
        if start >= 0:
            return int(data[start + 6:data.index(b"kB", start)])
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


class _Sampler:
    """One process-wide thread that samples RSS while any phase is open.

    Starting a thread per phase cost a run about 0.2 ms; this one is started
    once and sleeps on an event while no phase is open.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._peaks = {}  # open phase token -> largest RSS seen in it
        self._active = threading.Event()
        self._thread = None
        self.interval_s = 0.002

    def begin(self, interval_s):
        token = object()
        now = rss_kb()
        with self._lock:
            self.interval_s = min(interval_s, self.interval_s) if self._peaks else interval_s
            self._peaks[token] = now
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="nnrun-mem-poll", daemon=True)
                self._thread.start()
            self._active.set()
        return token

    def end(self, token):
        now = rss_kb()
        with self._lock:
            peak = self._peaks.pop(token, now)
            if not self._peaks:
                self._active.clear()
        return max(peak, now)

    def _loop(self):
        while True:
            self._active.wait()
            time.sleep(self.interval_s)
            now = rss_kb()
            with self._lock:
                for token, peak in self._peaks.items():
                    if now > peak:
                        self._peaks[token] = now


_sampler = _Sampler()


class MemoryPoller:
    """Samples RSS until closed; `peak_kb` is the largest sample (the process-wide sampler does it)."""

    def __init__(self, interval_s=0.002):
        self.interval_s = interval_s
        self.peak_kb = 0
        self._token = None

    def __enter__(self):
        self._token = _sampler.begin(self.interval_s)
        return self

    def __exit__(self, *exc):
        self.peak_kb = _sampler.end(self._token)


RECENT_RUNS = 1000  # EXECUTE's figures are over the last this many runs


class PhaseRecorder:
    """Accumulates the figures of the three phases for one session."""

    PHASES = ("MODEL_LOAD", "PREPARE", "EXECUTE")

    def __init__(self, poll=True, interval_s=0.002):
        self.poll = poll
        self.interval_s = interval_s
        self.baseline_kb = rss_kb()
        # EXECUTE keeps the times of its last RECENT_RUNS runs only: a session run a million times
        # (a voice detector, per audio chunk) stays the size it was.
        self.times = {p: [] for p in self.PHASES}
        self.times["EXECUTE"] = deque(maxlen=RECENT_RUNS)
        self.runs = 0
        self.rss = {p: 0 for p in self.PHASES}
        self.hwm = {p: 0 for p in self.PHASES}

    @contextmanager
    def phase(self, name):
        poller = MemoryPoller(self.interval_s) if self.poll else None
        if poller:
            poller.__enter__()
        start = time.perf_counter()
        try:
            yield
        finally:
            elapsed = (time.perf_counter() - start) * 1e3
            if poller:
                poller.__exit__(None, None, None)
                peak = poller.peak_kb
            else:
                peak = rss_kb()
            self.times[name].append(elapsed)
            self.runs += name == "EXECUTE"
            self.rss[name] = max(self.rss[name], peak)
            self.hwm[name] = hwm_kb()

    def record_run(self, elapsed_ms, measure):
        """A run timed by the caller, without a poller: its time, and when `measure` the process's
        RSS and HWM after it (two reads of /proc, ~10 us: a caller reads them on the first runs of
        a plan and now and then, not on every run of a model that takes 0.3 ms)."""
        self.times["EXECUTE"].append(elapsed_ms)
        self.runs += 1
        if measure:
            self.rss["EXECUTE"] = max(self.rss["EXECUTE"], rss_kb())
            self.hwm["EXECUTE"] = hwm_kb()

    def rebase(self):
        """Take the baseline again (after imports that belong to it)."""
        self.baseline_kb = rss_kb()

    def discard_times(self, name):
        """Forget the timings of a phase (warm-up runs); its memory figures stay."""
        self.times[name].clear()
        if name == "EXECUTE":
            self.runs = 0

    def phases(self):
        out = {}
        for name in ("MODEL_LOAD", "PREPARE"):
            out[name] = {"time_ms": round(sum(self.times[name]), 3),
                         "rss_kb": self.rss[name], "hwm_kb": self.hwm[name]}
        out["EXECUTE"] = {"time_ms": summarize(self.times["EXECUTE"]),
                          "runs": self.runs,
                          "rss_kb": self.rss["EXECUTE"], "hwm_kb": self.hwm["EXECUTE"]}
        return out


def summarize(times):
    if not times:
        return {"min": 0, "max": 0, "mean": 0, "median": 0, "geomean": 0}
    positive = [max(t, 1e-9) for t in times]
    return {"min": round(min(times), 3), "max": round(max(times), 3),
            "mean": round(statistics.fmean(times), 3), "median": round(statistics.median(times), 3),
            "geomean": round(math.exp(statistics.fmean(math.log(t) for t in positive)), 3)}


def format_table(report):
    """The phase table of DESIGN.md, as text."""
    p = report["phases"]
    load, prep, ex = p["MODEL_LOAD"], p["PREPARE"], p["EXECUTE"]
    t = ex["time_ms"]
    peak = report["peak"]
    lines = [
        f"MODEL_LOAD takes {load['time_ms']:7.1f} ms   RSS {load['rss_kb']:>10,} kB   HWM {load['hwm_kb']:>10,} kB",
        f"PREPARE    takes {prep['time_ms']:7.1f} ms   RSS {prep['rss_kb']:>10,} kB   HWM {prep['hwm_kb']:>10,} kB",
        f"EXECUTE    takes  min {t['min']:.1f}  max {t['max']:.1f}  mean {t['mean']:.1f}  "
        f"median {t['median']:.1f}  geomean {t['geomean']:.1f} ms",
        f"                            RSS {ex['rss_kb']:>10,} kB   HWM {ex['hwm_kb']:>10,} kB",
        f"PEAK                        RSS {peak['rss_kb']:>10,} kB   HWM {peak['hwm_kb']:>10,} kB",
    ]
    plan = report.get("plan", {})
    if plan.get("memory_budget_bytes"):
        lines.append(f"BUDGET     {plan['memory_budget_bytes'] // 1024:>10,} kB   predicted peak "
                     f"{plan['predicted_peak_bytes'] // 1024:>10,} kB   streamed weights "
                     f"{plan['streamed_weights_bytes'] // 1024:>10,} kB   resident "
                     f"{plan['resident_weights_bytes'] // 1024:,} kB   spilled activations "
                     f"{plan.get('spilled_activation_bytes', 0) // 1024:,} kB")
        if "read_bytes_per_run" in ex:
            lines.append(f"PER RUN    read {ex['read_bytes_per_run'] // 1024:>10,} kB   stalled "
                         f"{ex['stalled_ms_per_run']:.1f} ms   spilled "
                         f"{ex['spill_written_bytes_per_run'] // 1024:,} kB out, "
                         f"{ex['spill_read_bytes_per_run'] // 1024:,} kB back")
    return "\n".join(lines)
