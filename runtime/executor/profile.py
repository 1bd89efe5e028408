"""The per-step profiler: a Chrome trace (Perfetto, chrome://tracing) and the top ops by time.

With `SessionOptions.enable_profiling`, each run hands the executor a list to
append `(position, start_ns, duration_ns)` to for every step; the Profiler turns
those into trace events in onnxruntime's shape (`cat: "Node"`, `args.op_name`,
`input_type_shape`, `output_type_shape`), with what nnrun knows besides: the
weight bytes a step reads and the arena bytes live while it runs. Phases
(MODEL_LOAD, PREPARE, EXECUTE) are events of their own. With profiling off the
executor is handed nothing and records nothing.
"""

import json
import os
import threading
import time


class Profiler:
    def __init__(self):
        self.origin_ns = time.perf_counter_ns()
        self.pid = os.getpid()
        self.events = []  # the phases' events
        self._runs = []  # (plan, records, start_ns, end_ns, thread): made into events by trace()
        self._lock = threading.Lock()

    def _us(self, ns):
        return (ns - self.origin_ns) / 1e3

    def phase(self, name, start_ns, end_ns, **args):
        """One phase of the session (cat "Session"), as onnxruntime records model_loading and model_run."""
        with self._lock:
            self.events.append({"cat": "Session", "name": name, "ph": "X", "pid": self.pid,
                                "tid": threading.get_ident(), "ts": self._us(start_ns),
                                "dur": (end_ns - start_ns) / 1e3, "args": args})

    def run(self, plan, records, start_ns, end_ns):
        """A run of `plan`, kept as it is: its events are made only when the trace is asked for."""
        with self._lock:
            self._runs.append((plan, records, start_ns, end_ns, threading.get_ident()))

    def _run_events(self, plan, records, start_ns, end_ns, tid):
        """A run's EXECUTE event and one event per step of `records`."""
        events = [{"cat": "Session", "name": "EXECUTE", "ph": "X", "pid": self.pid, "tid": tid,
                   "ts": self._us(start_ns), "dur": (end_ns - start_ns) / 1e3, "args": {}}]
        for position, step_start, step_ns in records:
            step = plan.steps[position]
            events.append({
                "cat": "Node", "name": step.name or f"{step.op_type}_{step.index}", "ph": "X",
                "pid": self.pid, "tid": tid, "ts": self._us(step_start), "dur": step_ns / 1e3,
                "args": {"op_name": step.op_type, "node_index": step.index, "step": position,
                         "input_type_shape": _type_shapes(step.input_values),
                         "output_type_shape": _type_shapes(step.output_values),
                         "weight_bytes": step.weight_bytes,
                         "weights": [{"name": w.name, "bytes": w.nbytes, "where": w.where}
                                     for w in step.weights],
                         "scratch_bytes": step.scratch_bytes,
                         "arena_live_bytes": plan.live_bytes[position] if plan.live_bytes else 0,
                         "eager": step.eager}})
        return events

    def settle(self):
        """Make the events of the runs so far now, so that no plan is held for them (a session being
        closed: its plans hold the model's mapping)."""
        with self._lock:
            runs, self._runs = self._runs, []
            self.events.extend(e for run in runs for e in self._run_events(*run))

    def discard_runs(self):
        """Forget the runs recorded so far (warm-up runs); the phases stay."""
        with self._lock:
            self._runs.clear()

    def trace(self):
        with self._lock:
            events = list(self.events)
            runs = list(self._runs)
        for run in runs:
            events.extend(self._run_events(*run))
        events.sort(key=lambda e: e["ts"])
        return {"traceEvents": events, "displayTimeUnit": "ms"}

    def write(self, path):
        with open(path, "w") as f:
            json.dump(self.trace(), f)
        return path


def _type_shapes(values):
    out = []
    for v in values:
        if v is None:
            continue
        dtype = v.dtype.name if v.dtype is not None else "unknown"
        out.append({dtype: list(v.shape) if v.shape is not None else None})
    return out


def top_ops(trace):
    """Per op type and per node over every profiled run: count, total and mean ms, share of EXECUTE."""
    events = trace["traceEvents"]
    execute_us = sum(e["dur"] for e in events if e["cat"] == "Session" and e["name"] == "EXECUTE")
    runs = sum(1 for e in events if e["cat"] == "Session" and e["name"] == "EXECUTE")
    by_type, by_node = {}, {}
    for e in events:
        if e["cat"] != "Node":
            continue
        for table, key in ((by_type, e["args"]["op_name"]), (by_node, (e["name"], e["args"]["op_name"]))):
            count, total = table.get(key, (0, 0.0))
            table[key] = (count + 1, total + e["dur"])
    return runs, execute_us, by_type, by_node


def format_top_ops(trace, limit=10):
    """The top op types and nodes by time, as TFLite's benchmark_model prints them."""
    runs, execute_us, by_type, by_node = top_ops(trace)
    if not runs:
        return "no profiled run"
    share = (lambda us: 100.0 * us / execute_us) if execute_us else (lambda us: 0.0)
    lines = [f"Op types by total time over {runs} run{'s' if runs != 1 else ''} "
             f"(EXECUTE {execute_us / 1e3 / runs:.2f} ms per run):",
             f"  {'op type':<24}{'steps':>7}{'ms per run':>12}{'% EXECUTE':>11}{'cumulative':>12}"]
    cumulative = 0.0
    for op, (count, total) in sorted(by_type.items(), key=lambda kv: -kv[1][1])[:limit]:
        cumulative += share(total)
        lines.append(f"  {op:<24}{count // runs:>7}{total / 1e3 / runs:>12.3f}{share(total):>10.1f}%"
                     f"{cumulative:>11.1f}%")
    lines.append(f"Top {min(limit, len(by_node))} nodes by time:")
    lines.append(f"  {'node':<40}{'op type':<20}{'ms per run':>12}{'% EXECUTE':>11}")
    for (name, op), (count, total) in sorted(by_node.items(), key=lambda kv: -kv[1][1])[:limit]:
        shown = name if len(name) <= 38 else name[:17] + "..." + name[-18:]
        lines.append(f"  {shown:<40}{op:<20}{total / 1e3 / runs:>12.3f}{share(total):>10.1f}%")
    return "\n".join(lines)
