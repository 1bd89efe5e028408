"""Running a banded step (compiler/band.py): its output a band of rows at a time, from bands of its
inputs' rows, with the activations that live in the spill file read and written band by band.

The bands of every image are worked through in order. The file's rows of band i + 1 are read into
one staging buffer while band i is computed from the other (direct I/O on the spill file's
thread); each band's output is copied to a staging buffer and written while the next is computed.
The kernels take contiguous (1, C, rows, W) arrays, which the band area holds: a band of an input
in memory is copied there from its tensor, one in the file from its staging buffer (there a row
holds the (C, W) plane of that row), and the output back the same ways.
"""

import time

import numpy as np


def _held(area, part, rows, dtype):
    """The contiguous (1, C, rows, W) array of a part."""
    c, w = part.shape
    n = c * rows * w * dtype.itemsize
    return area[part.held:part.held + n].view(dtype).reshape(1, c, rows, w)


def _staging(area, part, which, rows, disk):
    """Staging buffer `which` of a part for `rows` rows: its bytes (whole pages) and its values
    as (rows, C, W)."""
    start = part.staging[which]
    raw = area[start:start + rows * disk.row_stride]
    c, w = part.shape
    values = raw.reshape(rows, disk.row_stride)[:, :disk.row_bytes].view(disk.dtype).reshape(rows, c, w)
    return raw, values


def run_banded(step, banded, env, area, spill_file, io):
    """Run `step` in the bands of `banded`; the time spent waiting for the file goes to io.stalled_ns."""
    clock = time.perf_counter_ns
    out_value = step.output_values[0]
    work = [(image, band) for image in range(out_value.shape[0]) for band in banded.bands]
    reading, writing = {}, [None, None]

    def wait(job):
        started = clock()
        job.result()
        io.stalled_ns += clock() - started

    def start_reads(i):
        image, band = work[i]
        jobs = []
        for k, source in enumerate(banded.sources):
            if source is not None and band.reads[k] is not None:
                a, b = band.reads[k]
                raw, _ = _staging(area, banded.inputs[k], i % 2, b - a, source)
                jobs.append(spill_file.read_back(raw, source.offset(image, a)))
        reading[i] = jobs

    try:
        start_reads(0)
        for i, (image, band) in enumerate(work):
            for job in reading.pop(i):
                wait(job)
            if i + 1 < len(work):
                start_reads(i + 1)
            args = [env[slot] if slot >= 0 else None for slot in step.inputs]
            for k, reads in enumerate(band.reads):
                if reads is None:
                    continue
                a, b = reads
                value = step.input_values[k]
                held = _held(area, banded.inputs[k], b - a, value.dtype)
                source = banded.sources[k]
                if source is not None:
                    np.copyto(held[0], _staging(area, banded.inputs[k], i % 2, b - a, source)[1].transpose(1, 0, 2))
                else:
                    np.copyto(held, env[step.inputs[k]][image:image + 1, :, a:b])
                args[k] = held
            r0, r1 = band.rows
            out = _held(area, banded.output, r1 - r0, out_value.dtype)
            elems = band.scratch_elems
            scratch = area[banded.scratch:banded.scratch + elems * out_value.dtype.itemsize].view(out_value.dtype) \
                if elems else None
            band.run(args, out, scratch)
            target = banded.target
            if target is None:
                np.copyto(env[step.outputs[0]][image:image + 1, :, r0:r1], out)
                continue
            which = i % 2
            if writing[which] is not None:
                wait(writing[which])
            raw, values = _staging(area, banded.output, which, r1 - r0, target)
            np.copyto(values, out[0].transpose(1, 0, 2))
            writing[which] = spill_file.write(raw, target.offset(image, r0))
        for job in writing:  # the next step reads what was written
            if job is not None:
                wait(job)
    finally:
        # Nothing may still move bytes in or out of the band area once the step is over.
        for jobs in reading.values():
            for job in jobs:
                job.exception()
        for job in writing:
            if job is not None:
                job.exception()
