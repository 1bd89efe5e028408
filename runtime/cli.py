"""`nnrun --model FILE`: load, prepare and run a model, then print where time and memory went."""

import argparse
import json
import os
import sys

import numpy as np


def random_feed(name, dims, dtype, dim_values, rng):
    """A random input: N(0,1) floats, small non-negative integers, random bools."""
    shape = []
    for d in dims or ():
        if isinstance(d, int) and d >= 0:
            shape.append(d)
        elif isinstance(d, str) and d in dim_values:
            shape.append(dim_values[d])
        else:
            shape.append(dim_values.get(name + ":" + str(len(shape)), 1))
    dtype = np.dtype(dtype or np.float32)
    if dtype.kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    if dtype.kind in "iu":
        return rng.integers(0, 16, size=shape).astype(dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, size=shape).astype(bool)
    raise SystemExit(f"nnrun: cannot make a random value for input {name!r} of type {dtype}; "
                     f"give it with --input {name}=FILE.npy")


def parse_pairs(items, what):
    pairs = {}
    for item in items or ():
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise SystemExit(f"nnrun: {what} must look like NAME=VALUE, got {item!r}")
        pairs[name] = value
    return pairs


def save_arrays(directory, arrays):
    """Each array as DIRECTORY/NAME.npy, the name made safe for a file system."""
    os.makedirs(directory, exist_ok=True)
    for name, value in arrays.items():
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
        np.save(os.path.join(directory, safe + ".npy"), value)


def build_parser():
    p = argparse.ArgumentParser(prog="nnrun", description=__doc__)
    p.add_argument("--model", required=True, help="an .onnx or .tflite file")
    p.add_argument("--input", action="append", metavar="NAME=FILE.npy",
                   help="an input from a .npy file (default: random with a fixed seed)")
    p.add_argument("--dim", action="append", metavar="NAME=VALUE",
                   help="the value of a symbolic dimension (default 1)")
    p.add_argument("--repeat", type=int, default=5, help="timed runs (default 5)")
    p.add_argument("--warmup", type=int, default=1, help="untimed runs first (default 1)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    p.add_argument("--save-outputs", metavar="DIR", help="write each output as DIR/NAME.npy")
    p.add_argument("--report", choices=("table", "json"), default="table")
    p.add_argument("--threads", type=int, default=0, help="threads of BLAS and of the kernels' pool "
                   "(default: BLAS's own count, one per physical core for the pool)")
    p.add_argument("--no-mem-poll", action="store_true", help="do not sample RSS during phases")
    p.add_argument("--jit", action="store_true", help="kernels compiled by numba: depthwise convolution, a "
                   "convolution's bias and activation, erf and GELU (needs nnrun[jit]; ~0.35 s and ~115 MB "
                   "once per process)")
    for switch in ("fold-constants", "fold-batchnorm", "fuse-activations", "memory-aware-order",
                   "release-weights"):
        p.add_argument(f"--no-{switch}", action="store_true", help=f"turn off {switch.replace('-', ' ')}")
    from .compiler.passes import SWITCHABLE

    p.add_argument("--disable-pass", action="append", metavar="NAME", default=[],
                   help=f"skip a compiler pass (repeatable): {', '.join(SWITCHABLE)}")
    p.add_argument("--profile", metavar="OUT.json",
                   help="write a Chrome trace of the timed runs (one event per step) and print the top ops")
    p.add_argument("--memory-timeline", metavar="OUT.png",
                   help="draw live arena and resident weight bytes per step (needs matplotlib)")
    p.add_argument("--weight-cache", metavar="DIR",
                   help="where packed weights are cached (default: $NNRUN_WEIGHT_CACHE, $XDG_CACHE_HOME/nnrun/weights)")
    p.add_argument("--no-weight-cache", action="store_true", help="keep packed weights in memory only")
    p.add_argument("--memory-budget", metavar="SIZE",
                   help="the most memory nnrun may hold beyond the baseline (e.g. 128M), or 'auto' (the "
                        "memory cgroup's limit less what is in use): weights beyond it stream from disk")
    p.add_argument("--dump-intermediates", metavar="DIR",
                   help="after the timed runs, run once more and write every step's outputs as DIR/NAME.npy")
    p.add_argument("--stop-after", metavar="NODE",
                   help="with --dump-intermediates: end that run after this node (a name or a step position)")
    return p


def cache_command(argv):
    """`nnrun cache [list|clear] [--dir DIR]`: the weight cache's files, their sizes, ages and models."""
    from .cache_file import STAMP_SUFFIX
    from .compiler.weight_cache import default_directory, list_directory

    p = argparse.ArgumentParser(prog="nnrun cache", description=cache_command.__doc__)
    p.add_argument("action", nargs="?", choices=("list", "clear"), default="list")
    p.add_argument("--dir", default=default_directory(), help="the cache directory (default: %(default)s)")
    args = p.parse_args(argv)
    files = list_directory(args.dir)
    if args.action == "clear":
        freed = 0
        for path, size, _, _ in files:
            try:
                os.remove(path)
                freed += size
                if os.path.exists(path + STAMP_SUFFIX):
                    os.remove(path + STAMP_SUFFIX)
            except OSError as e:
                print(f"nnrun cache: cannot remove {path}: {e.strerror or e}", file=sys.stderr)
        print(f"removed {len(files)} cache files, {freed / 2**20:.1f} MiB, from {args.dir}")
        return 0
    print(f"{args.dir}: {len(files)} cache files, {sum(f[1] for f in files) / 2**20:.1f} MiB")
    for path, size, age, label in files:
        print(f"  {os.path.basename(path)}  {size / 2**20:9.1f} MiB  {age / 3600:8.1f} h old  {label}")
    return 0


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["cache"]:
        return cache_command(argv[1:])
    args = build_parser().parse_args(argv)
    import nnrun

    options = nnrun.SessionOptions()
    options.intra_op_num_threads = args.threads
    options.enable_mem_poll = not args.no_mem_poll
    if args.jit:
        options.compiled_kernels = True
    for switch in ("fold_constants", "fold_batchnorm", "fuse_activations", "memory_aware_order",
                   "release_weights"):
        if getattr(args, "no_" + switch):
            setattr(options, switch, False)
    options.disabled_passes = set(args.disable_pass)
    options.enable_profiling = bool(args.profile)
    if args.weight_cache:
        options.weight_cache_dir = args.weight_cache
    if args.no_weight_cache:
        options.weight_cache_dir = None
    options.memory_budget = args.memory_budget
    dims = {k: int(v) for k, v in parse_pairs(args.dim, "--dim").items()}
    files = parse_pairs(args.input, "--input")
    try:
        sess = nnrun.InferenceSession(args.model, sess_options=options)
        rng = np.random.default_rng(args.seed)
        feeds = {}
        for arg in sess.graph.inputs:
            if arg.name in files:
                feeds[arg.name] = np.load(files[arg.name])
            else:
                feeds[arg.name] = random_feed(arg.name, arg.dims, arg.dtype, dims, rng)
        unknown = set(files) - set(feeds)
        if unknown:
            raise nnrun.InputError(f"--input names {sorted(unknown)} are not inputs of the model")
        for _ in range(args.warmup):
            sess.run(None, feeds)
        sess.discard_warmup()
        outputs = None
        for _ in range(max(args.repeat, 1)):
            outputs = sess.run(None, feeds)
        report = sess.report()
    except nnrun.NnrunError as e:
        print(f"nnrun: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    if args.save_outputs:
        save_arrays(args.save_outputs, {arg.name: value for arg, value in zip(sess.get_outputs(), outputs)})
    report["model"] = args.model
    if args.report == "json":
        print(json.dumps(report, indent=2))
    else:
        from .report import format_table

        print(format_table(report))
    if args.profile:
        from .executor.profile import format_top_ops

        os.replace(sess.end_profiling(), args.profile)
        with open(args.profile) as f:
            trace = json.load(f)
        print(f"\nprofile: {args.profile}", file=sys.stderr if args.report == "json" else sys.stdout)
        if args.report == "table":
            print(format_top_ops(trace))
    if args.memory_timeline:
        from .timeline import draw

        try:
            draw(sess.plan(), args.memory_timeline, title=os.path.basename(args.model))
        except ImportError as e:
            print(f"nnrun: {e}", file=sys.stderr)
            return 2
        print(f"memory timeline: {args.memory_timeline}",
              file=sys.stderr if args.report == "json" else sys.stdout)
    if args.dump_intermediates:  # a run of its own, after the timed and profiled ones
        stop = args.stop_after
        try:
            values = nnrun.debug.intermediates(sess, feeds, stop_after=int(stop) if stop and stop.isdigit()
                                               else stop)
        except nnrun.NnrunError as e:
            print(f"nnrun: {type(e).__name__}: {e}", file=sys.stderr)
            return 2
        save_arrays(args.dump_intermediates, values)
        print(f"intermediates: {len(values)} values in {args.dump_intermediates}",
              file=sys.stderr if args.report == "json" else sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
