"""Banding: activations too large for the budget live in the spill file, and the steps around them
run a band of rows at a time.

Spilling (spill.py) frees an activation's bytes only while nothing uses it; at a U-Net's full
resolution a single step's input and output together can exceed the budget (a 1024x1024 image of
16 channels is 64 MiB), and no choice of gaps helps. Then the activation leaves the arena for its
whole life: its writer makes it a band of rows at a time into the file, and each reader reads the
band of rows it needs (a window's halo included) back, so only bands are in memory. A step runs
in bands when the kernel can (ops/bands.py: convolutions, pools, the U-Net's upsampling, a Concat
of channels); an activation goes to the file only when its writer and every reader can.

The choice is greedy, as spilling's: while the arena (without the activations in the file and
without the scratch of the steps now banded, whose bands have scratch of their own) and the least
band area do not fit the room, the largest candidate live at the arena's peak step goes to the
file. The band area is one buffer all banded steps share (they run one after another): what the
room leaves beside the arena, at most BAND_AREA_MAX; each banded step takes as many rows per band
as fit in it.

In the file an activation lies row by row: for each image, for each row h, the (C, W) plane of
that row, each row padded to whole pages. A band of rows is then one contiguous run of whole
pages, read and written with direct I/O, into a staging buffer in the band area (two per tensor:
the band in use and the next, read ahead or written behind), and copied to or from the contiguous
(1, C, rows, W) arrays the kernels take.
"""

from dataclasses import dataclass, replace

from ..ops.conv_core import SCRATCH_LIMIT
from ..paging import DIRECT_IO_ALIGNMENT, round_up
from .arena import align, assign_offsets, placed_again
from .lifetimes import live_bytes, lower_bound

BAND_AREA_MAX = 32 << 20
MIN_BAND_SCRATCH = 256 * 1024
STAGING = 2  # staging buffers per tensor in the file: the band in use and the next


@dataclass(frozen=True)
class OnDisk:
    """An activation that lives in the spill file, row by row."""
    slot: int
    name: str
    shape: tuple  # (N, C, H, W)
    dtype: object
    row_stride: int  # bytes of one (image, row) in the file: C * W values, padded to whole pages
    file_offset: int

    @property
    def row_bytes(self):
        return self.shape[1] * self.shape[3] * self.dtype.itemsize

    @property
    def nbytes(self):
        return self.shape[0] * self.shape[2] * self.row_stride

    def offset(self, image, row):
        return self.file_offset + (image * self.shape[2] + row) * self.row_stride


@dataclass(frozen=True)
class Part:
    """Where one band-sized array lies in the band area: the contiguous (1, C, rows, W) array the
    kernel takes, and for a tensor in the file its staging buffers."""
    shape: tuple  # (C, W): the band is (1, C, rows, W)
    held: int  # offset of the contiguous array
    staging: tuple = ()  # offsets of the staging buffers (a tensor in the file)


@dataclass(frozen=True)
class BandedStep:
    """A step run in bands of its output's rows."""
    bands: tuple  # ops.bands.Band, in order of rows
    sources: tuple  # per input: OnDisk, or None (in memory: the arena, a feed, a weight)
    target: object  # OnDisk, or None (the output is in the arena)
    inputs: tuple  # per input: Part, or None (read whole: a weight)
    output: Part
    scratch: int  # offset of the bands' scratch in the band area
    area_bytes: int  # of the band area it uses


def _granules(plan):
    """Per step: the row multiple it can run in bands in, or 0."""
    out = []
    for step in plan.steps:
        ok = (not step.eager and step.alias_of < 0 and len(step.outputs) == 1
              and step.output_values and step.output_values[0] is not None
              and step.output_values[0].shape is not None and len(step.output_values[0].shape) == 4)
        out.append(step.kernel.band_granule() if ok else 0)
    return out


def _banded_inputs(step, granule):
    """The input positions a step reads in bands (a probe band tells)."""
    probe = step.kernel.band(0, granule, MIN_BAND_SCRATCH)
    return {k for k, reads in enumerate(probe.reads) if reads is not None}


def candidates(plan, granules):
    """Arena slots that may live in the file: 4-D activations whose writer and readers all run in
    bands (reading it in bands), no graph output, not viewed by an alias."""
    arena = {a.slot: a for a in plan.arena}
    outputs = {slot for _, slot in plan.outputs}
    aliased = {step.alias_of for step in plan.steps if step.alias_of >= 0}
    writer, readers = {}, {}
    for position, step in enumerate(plan.steps):
        for slot in step.outputs:
            writer[slot] = position
        for k, slot in enumerate(step.inputs):
            readers.setdefault(slot, []).append((position, k))
    banded_inputs = {}
    found = {}
    for slot, a in arena.items():
        if slot in outputs or slot in aliased or len(a.shape) != 4 or slot not in writer:
            continue
        if not granules[writer[slot]] or not readers.get(slot):
            continue
        fine = True
        for position, k in readers[slot]:
            if not granules[position]:
                fine = False
                break
            if position not in banded_inputs:
                banded_inputs[position] = _banded_inputs(plan.steps[position], granules[position])
            if k not in banded_inputs[position]:
                fine = False
                break
        if fine:
            found[slot] = (writer[slot], tuple(sorted({p for p, _ in readers[slot]})))
    return found


def choose(plan, room):
    """The slots to put in the file so that the arena and the least band area fit `room`: returns
    (slots or None when even every candidate is not enough, touched steps, granules, placement,
    the least bytes banding can reach)."""
    granules = _granules(plan)
    found = candidates(plan, granules)
    names = plan.slot_names
    n = len(plan.steps)
    spans = {b.name: (b.first, b.last) for b in plan.buffers}
    sizes = {b.name: b.nbytes for b in plan.buffers}
    scratch_of = {position: {names[s] for s in step.scratch} for position, step in enumerate(plan.steps)}
    disk = set()

    def arena_without(disk):
        touched = {p for slot in disk for p in (found[slot][0],) + found[slot][1]}
        gone = {names[slot] for slot in disk} | {b for p in touched for b in scratch_of[p]}
        kept = {b: spans[b] for b in spans if b not in gone}
        return touched, kept

    least_bands = {}  # position -> its band of one granule of rows, made once

    def least_area(touched, disk):
        for p in touched - least_bands.keys():
            least_bands[p] = _probe(plan.steps[p], granules[p], granules[p], MIN_BAND_SCRATCH)
        return max((_band_bytes(plan.steps[p], least_bands[p], disk) for p in touched), default=0)

    every_touched, every_kept = arena_without(set(found))
    least = lower_bound(every_kept, {b: align(sizes[b]) for b in every_kept}) + least_area(every_touched, set(found))
    while True:
        touched, kept = arena_without(disk)
        live = list(live_bytes(kept, sizes, n))
        area = least_area(touched, disk)
        if max(live, default=0) + area <= room:
            offsets, top = assign_offsets(kept, {b: sizes[b] for b in kept})
            if top + area <= room:
                return disk, touched, granules, (kept, offsets, top, area), least
        peak = max(range(n), key=lambda p: live[p]) if n else 0
        covering = [slot for slot in found
                    if slot not in disk and spans[names[slot]][0] <= peak <= spans[names[slot]][1]]
        if not covering:
            return None, touched, granules, None, least
        disk.add(max(covering, key=lambda slot: (sizes[names[slot]], -slot)))


def _probe(step, rows, granule, scratch_limit):
    """A band of `rows` rows in the middle of the output, where it reads the most input rows."""
    height = step.output_values[0].shape[2]
    start = min(height - rows, (height // 2) // granule * granule) if rows < height else 0
    return step.kernel.band(start, start + rows, scratch_limit)


def _band_bytes(step, band, disk):
    """The band area one band of `step` needs: its inputs' and output's arrays, staging for those in
    the file, and its scratch."""
    total = 0
    for k, reads in enumerate(band.reads):
        if reads is not None:
            held, staging = _part_bytes(step.input_values[k], reads[1] - reads[0], step.inputs[k] in disk)
            total += held + staging
    out = step.output_values[0]
    held, staging = _part_bytes(out, band.rows[1] - band.rows[0], step.outputs[0] in disk)
    return total + held + staging + round_up(band.scratch_elems * out.dtype.itemsize, DIRECT_IO_ALIGNMENT)


def _part_bytes(value, rows, in_file):
    """(bytes of the contiguous band array, bytes of its staging buffers) for `rows` rows of `value`."""
    _, c, _, w = value.shape
    plane = c * w * value.dtype.itemsize
    held = round_up(plane * rows, DIRECT_IO_ALIGNMENT)
    return held, (STAGING * rows * round_up(plane, DIRECT_IO_ALIGNMENT) if in_file else 0)


def band_plan(plan, room, weights_wish=0):
    """(plan with the chosen activations in the file and their steps banded, (banded per position,
    the OnDisk activations, band area bytes), the least room banding can reach); the plan is None
    when banding cannot bring it within `room`. The band area leaves `weights_wish` bytes of the
    room to the weights where it can (so that no step has to read its weights in blocks)."""
    disk, touched, granules, placement, least_room = choose(plan, room)
    if disk is None:
        return None, None, least_room
    kept, offsets, top, least = placement
    names = plan.slot_names
    values = {}
    for step in plan.steps:
        for slot, value in zip(step.outputs, step.output_values):
            values[slot] = value
    on_disk, file_offset = {}, 0
    for slot in sorted(disk):
        value = values[slot]
        n, c, h, w = value.shape
        stride = round_up(c * w * value.dtype.itemsize, DIRECT_IO_ALIGNMENT)
        on_disk[slot] = OnDisk(slot, names[slot], tuple(value.shape), value.dtype, stride, file_offset)
        file_offset += n * h * stride
    area = max(least, min(BAND_AREA_MAX, room - top - weights_wish))
    banded = [None] * len(plan.steps)
    for position in sorted(touched):
        banded[position] = _banded_step(plan.steps[position], granules[position], on_disk, area)
    area = max(b.area_bytes for b in banded if b is not None)

    gone = set(disk) | {s for p in touched for s in plan.steps[p].scratch}
    arena = tuple(replace(a, offset=offsets[names[a.slot]]) for a in plan.arena if a.slot not in gone)
    sizes = {b.name: b.nbytes for b in plan.buffers}
    plan = placed_again(plan, arena, kept, {b: sizes[b] for b in kept}, offsets, top)
    return plan, (tuple(banded), tuple(on_disk.values()), area), least_room


def _banded_step(step, granule, on_disk, area):
    """The bands of `step`: as many rows each as fit in `area` bytes."""
    out = step.output_values[0]
    height = out.shape[2]
    scratch_limit = max(MIN_BAND_SCRATCH, min(SCRATCH_LIMIT, area // 8))
    disk = set(on_disk)
    # The most rows (a multiple of the granule) whose band, in the middle of the tensor, fits.
    low, high = 1, max(1, height // granule)
    while low < high:
        middle = (low + high + 1) // 2
        if _band_bytes(step, _probe(step, min(height, middle * granule), granule, scratch_limit), disk) <= area:
            low = middle
        else:
            high = middle - 1
    rows = low * granule
    plans = {}
    bands = tuple(step.kernel.band(r0, min(height, r0 + rows), scratch_limit, plans) for r0 in range(0, height, rows))
    most = {}
    for band in bands:
        for k, reads in enumerate(band.reads):
            if reads is not None:
                most[k] = max(most.get(k, 0), reads[1] - reads[0])
    offset = 0

    def place(value, rows, in_file):
        nonlocal offset
        held_bytes, staging_bytes = _part_bytes(value, rows, in_file)
        held, offset = offset, offset + held_bytes
        staging = tuple(offset + i * staging_bytes // STAGING for i in range(STAGING)) if in_file else ()
        offset += staging_bytes
        return Part((value.shape[1], value.shape[3]), held, staging)

    inputs = tuple(place(step.input_values[k], most[k], step.inputs[k] in disk) if k in most else None
                   for k in range(len(step.inputs)))
    output = place(out, rows, step.outputs[0] in disk)
    scratch = offset
    offset += round_up(max(b.scratch_elems for b in bands) * out.dtype.itemsize, DIRECT_IO_ALIGNMENT)
    return BandedStep(bands, tuple(on_disk.get(slot) for slot in step.inputs), on_disk.get(step.outputs[0]),
                      inputs, output, scratch, offset)
