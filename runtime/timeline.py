"""The memory timeline of a Plan: step by step, the arena bytes live, the weight bytes resident,
and the order's lower bound, with the largest tensors named. The picture to look at before
choosing a memory budget.

`memory_timeline(plan)` computes the rows from the Plan alone; `draw(plan, path)` plots them
with matplotlib (the `plot` extra), which is imported only there.

Weights: what PREPARE made (packed layouts, folded values, aligned copies) is resident from the
first step; a mapped weight's pages come in at the first step that reads it and stay, as in a
first run with no memory budget.
"""

from .compiler.plan import CACHED, MAPPED


def memory_timeline(plan):
    """One row per step: step, node, op, arena_live_bytes, weights_resident_bytes."""
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
    ax.stackplot(steps, weights, arena, labels=["weights resident", "arena live"],
                 colors=["#9ecae1", "#fd8d3c"], step="mid")
    top = [w + a for w, a in zip(weights, arena)]
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
