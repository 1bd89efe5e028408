"""The memory budget a session runs in: bytes, a size written for people ("128M"), or "auto" (what the
process's own memory cgroup still allows: a container's limit, less what the process holds already).

`auto` reads /proc/self/cgroup, then the limit of that cgroup and of each parent up to the root
(the tightest wins): cgroup v2 `memory.max` and `memory.current`, or v1 `memory.limit_in_bytes`
and `memory.usage_in_bytes`. With no limit anywhere there is no budget.
"""

import os

from .errors import InputError

UNLIMITED = 1 << 60  # v1 writes "no limit" as a number near 2**63
# What `auto` leaves aside for memory no plan accounts for: numpy's and BLAS's working memory,
# a kernel's temporaries, the interpreter's own growth.
AUTO_MARGIN = 16 << 20
AUTO_MARGIN_SHARE = 1 / 16


def parse_size(text):
    """'128M', '1.5G', '96MiB', '4096' -> bytes."""
    raw = str(text).strip()
    upper = raw.upper().removesuffix("B").removesuffix("I")
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    try:
        if upper and upper[-1] in units:
            value = int(float(upper[:-1]) * units[upper[-1]])
        else:
            value = int(upper)
    except ValueError:
        raise InputError(f"memory size {raw!r} is not a number of bytes or a size like 128M") from None
    if value <= 0:
        raise InputError(f"memory size {raw!r} must be positive")
    return value


def cgroup_memory(proc_cgroup="/proc/self/cgroup", root="/sys/fs/cgroup"):
    """(limit, usage) in bytes of the tightest memory cgroup limit over this process, or None."""
    try:
        with open(proc_cgroup) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    found = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2: one unified hierarchy
            found += _walk(os.path.join(root, path.lstrip("/")), root, "memory.max", "memory.current")
            found += _walk(os.path.join(root, "unified", path.lstrip("/")), os.path.join(root, "unified"),
                           "memory.max", "memory.current")
        elif "memory" in controllers.split(","):
            base = os.path.join(root, "memory")
            found += _walk(os.path.join(base, path.lstrip("/")), base, "memory.limit_in_bytes",
                           "memory.usage_in_bytes")
    return min(found) if found else None


def _walk(directory, root, limit_file, usage_file):
    """(limit, usage) of each cgroup from `directory` up to `root` that sets a limit."""
    found = []
    directory, root = os.path.normpath(directory), os.path.normpath(root)
    while True:
        limit, usage = _read_int(os.path.join(directory, limit_file)), _read_int(os.path.join(directory, usage_file))
        if limit is not None and limit < UNLIMITED and usage is not None:
            found.append((limit, usage))
        if directory == root or len(directory) <= len(root):
            return found
        directory = os.path.dirname(directory)


def _read_int(path):
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def anonymous_bytes():
    """The process's anonymous resident memory (RssAnon): what no reclaim can take back."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def resolve_budget(value, cgroup=cgroup_memory):
    """The budget in bytes for SessionOptions.memory_budget `value` (None: no budget)."""
    if value is None:
        return None
    if isinstance(value, str) and value.strip().lower() == "auto":
        found = cgroup()
        if found is None:
            return None  # no limit anywhere: nothing to stay within
        limit, usage = found
        budget = limit - usage - max(AUTO_MARGIN, int(limit * AUTO_MARGIN_SHARE))
        if budget <= 0:
            raise InputError(f"memory_budget 'auto': the cgroup limit of {limit / 2 ** 20:,.1f} MiB leaves "
                             f"nothing beyond the {usage / 2 ** 20:,.1f} MiB in use already")
        return budget
    if isinstance(value, bool):
        raise InputError(f"memory_budget must be bytes, a size like '128M' or 'auto', not {value!r}")
    if isinstance(value, int):
        if value <= 0:
            raise InputError(f"memory_budget must be positive, not {value}")
        return value
    return parse_size(value)
