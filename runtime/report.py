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
from contextlib import contextmanager

_PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024 if hasattr(os, "sysconf") else 4


def rss_kb():
    """Current resident set size in kB."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * _PAGE_KB
    except OSError:
        import psutil

        return psutil.Process().memory_info().rss // 1024


def hwm_kb():
    """Peak resident set size (VmHWM) in kB."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


class MemoryPoller:
    """Samples RSS on a thread until stopped; `peak_kb` is the largest sample."""

    def __init__(self, interval_s=0.002):
        self.interval_s = interval_s
        self.peak_kb = rss_kb()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="nnrun-mem-poll", daemon=True)

    def _poll(self):
        while not self._stop.wait(self.interval_s):
            self.peak_kb = max(self.peak_kb, rss_kb())

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak_kb = max(self.peak_kb, rss_kb())


class PhaseRecorder:
    """Accumulates the figures of the three phases for one session."""

    PHASES = ("MODEL_LOAD", "PREPARE", "EXECUTE")

    def __init__(self, poll=True, interval_s=0.002):
        self.poll = poll
        self.interval_s = interval_s
        self.baseline_kb = rss_kb()
        self.times = {p: [] for p in self.PHASES}
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
            self.rss[name] = max(self.rss[name], peak)
            self.hwm[name] = hwm_kb()

    def discard_times(self, name):
        """Forget the timings of a phase (warm-up runs); its memory figures stay."""
        self.times[name].clear()

    def phases(self):
        out = {}
        for name in ("MODEL_LOAD", "PREPARE"):
            out[name] = {"time_ms": round(sum(self.times[name]), 3),
                         "rss_kb": self.rss[name], "hwm_kb": self.hwm[name]}
        out["EXECUTE"] = {"time_ms": summarize(self.times["EXECUTE"]),
                          "runs": len(self.times["EXECUTE"]),
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
    return "\n".join(lines)
