"""The memory timeline of a Plan: step by step, the arena bytes live, the weight bytes resident,
and the order's lower bound, with the largest tensors named. The picture to look at before
choosing a memory budget.

`memory_timeline(plan)` computes the rows from the Plan alone; `draw(plan, path)` plots them
with matplotlib (the `plot` extra), which is imported only there.

Weights: what PREPARE made (packed layouts, folded values, aligned copies) is resident from the
first step; a mapped weight's pages come in at the first step that reads it and stay, as in a
first run with no memory budget. Under a budget the rows follow the budget's plan instead, as its
predicted peak counts: the weights it keeps resident throughout, the streamed ones from the step
their read begins to their last reader, and the activations spilled out of the arena meanwhile.
"""

from .compiler.plan import CACHED, MAPPED


def memory_timeline(plan):
    """One row per step: step, node, op, arena_live_bytes, weights_resident_bytes, and under a
    memory budget streamed_weights_bytes (the part of the resident bytes that streams) and
    spilled_bytes (activations in the spill file, not in the arena)."""
    if getattr(plan, "streaming", None) is not None:
        return _budget_timeline(plan, plan.streaming)
    made = {}  # weight name -> bytes, for weights resident from the start
    for step in plan.steps:
        for w in step.weights:
            if w.where not in (MAPPED, CACHED):  # file pages are resident once first read
                made[w.name] = w.nbytes
    resident = sum(made.values())
    touched = set(made)
    rows = []
    for position, step in enumerate(plan.steps):
        for w in step.weights:
            if w.name not in touched:
                touched.add(w.name)
                resident += w.nbytes
        rows.append({"step": position, "node": step.name, "op": step.op_type,
                     "arena_live_bytes": plan.live_bytes[position] if plan.live_bytes else 0,
                     "weights_resident_bytes": resident})
    return rows


def _budget_timeline(plan, streaming):
    kept = streaming.fixed_bytes - plan.arena_bytes + streaming.resident_weights_bytes
    rows = []
    for position, (step, streamed, spilled) in enumerate(zip(plan.steps, streaming.streamed_in_memory(),
                                                            streaming.spilled_out())):
        rows.append({"step": position, "node": step.name, "op": step.op_type,
                     "arena_live_bytes": plan.live_bytes[position] if plan.live_bytes else 0,
                     "weights_resident_bytes": kept + streamed, "streamed_weights_bytes": streamed,
                     "spilled_bytes": spilled})
    return rows


def largest_live(plan, position, count=3):
    """The `count` largest arena buffers live at step `position`, largest first."""
    live = [b for b in plan.buffers if b.first <= position <= b.last]
    return sorted(live, key=lambda b: -b.nbytes)[:count]


def draw(plan, path, title=""):
    """Plot the timeline to `path` (PNG); raises ImportError naming the extra without matplotlib."""
    try:
        import matplotlib
    except ImportError as e:
        raise ImportError("the memory timeline needs matplotlib: pip install 'nnrun[plot]'") from e
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = memory_timeline(plan)
    mib = 1 / (1 << 20)
    steps = [r["step"] for r in rows]
    arena = [r["arena_live_bytes"] * mib for r in rows]
    weights = [r["weights_resident_bytes"] * mib for r in rows]
    fig, ax = plt.subplots(figsize=(11, 5))
    streaming = getattr(plan, "streaming", None)
    if streaming is None:
        ax.stackplot(steps, weights, arena, labels=["weights resident", "arena live"],
                     colors=["#9ecae1", "#fd8d3c"], step="mid")
    else:
        streamed = [r["streamed_weights_bytes"] * mib for r in rows]
        kept = [w - s for w, s in zip(weights, streamed)]
        ax.stackplot(steps, kept, streamed, arena, step="mid", colors=["#9ecae1", "#6baed6", "#fd8d3c"],
                     labels=["weights kept resident", "weights streamed (read ahead, dropped after)", "arena live"])
        spilled = [r["spilled_bytes"] * mib for r in rows]
        if any(spilled):
            ax.plot(steps, spilled, color="#756bb1", lw=1, label="activations spilled to the file")
        ax.axhline(streaming.budget_bytes * mib, color="#000000", lw=1,
                   label=f"memory budget ({streaming.budget_bytes * mib:.1f} MiB)")
    top = [w + a for w, a in zip(weights, arena)]
    if streaming is None:
        ax.plot(steps, [w + plan.lower_bound_bytes * mib for w in weights], color="#d62728", lw=1,
                ls="--", label=f"weights + lower bound ({plan.lower_bound_bytes * mib:.2f} MiB)")
    if rows:
        peak = max(range(len(rows)), key=lambda i: arena[i])
        named = "\n".join(f"{b.name}: {b.nbytes * mib:.2f} MiB" for b in largest_live(plan, peak))
        ax.annotate(f"step {peak} ({rows[peak]['op']} {rows[peak]['node']})\n{named}", xy=(peak, top[peak]),
                    xytext=(0.02, 0.97), textcoords="axes fraction", va="top", fontsize=8,
                    arrowprops={"arrowstyle": "->", "lw": 0.8})
    ax.set_xlabel("step of the plan's order")
    ax.set_ylabel("MiB")
    ax.set_title(title or "memory timeline")
    ax.legend(loc="upper right", fontsize=8)
    ax.margins(x=0)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
