"""Streaming weights during a run: read ahead of the steps by execution order, dropped after use.

The plan's `Streaming` says, per step position, which weight regions to start reading when that
step begins (they are first read `lookahead` steps later), which the step is the first to read,
and which to hand back once it ends. A thread of its own reads ahead: madvise(MADV_WILLNEED) asks
the kernel to read the whole region in large requests, then a read of one byte per page waits
until every page is in memory, and the region is marked ready. A step waits for the regions it is
the first to read; the time it waits is the run's stall, the time reading did not overlap
computing. Dropping is done in line (MADV_PAGEOUT: the pages leave this process and the page
cache at once).

The thread holds no reference to the executor: it ends when the executor is collected, or on
`close()`.
"""

import queue
import threading
import time
import weakref

from ..paging import PAGER


class Prefetcher:
    """The streaming side of one Executor (its runs under a budget take turns)."""

    def __init__(self, streaming, pager=PAGER):
        self.streaming = streaming
        self._pager = pager
        self.position = -1  # the step running now: a request for a region already past it is dropped
        self.run = 0  # runs so far: readiness is per run
        self.stalled_ns = 0  # this run's time waiting for reads
        self._last = {r: position for position, regions in enumerate(streaming.drop) for r in regions}
        self._ready = {}  # region -> the run it was last read in for
        self._read = threading.Condition()
        self._requests = queue.SimpleQueue()
        self._thread = threading.Thread(target=_read_ahead, args=(self._requests, pager, self._read, self._ready),
                                        name="nnrun-prefetch", daemon=True)
        self._thread.start()
        self._closer = weakref.finalize(self, self._requests.put, None)

    def start(self):
        """A run begins (its first `before` requests what its first steps read)."""
        self.run += 1
        self.stalled_ns = 0

    def before(self, position):
        """Step `position` is about to run: request what is read ahead from here, and wait for what
        it reads first."""
        self.position = position
        regions = self.streaming.prefetch[position] if position < len(self.streaming.prefetch) else ()
        if regions:
            self._requests.put((regions, self._wanted, self.run))
        needed = self.streaming.needed[position] if position < len(self.streaming.needed) else ()
        if needed:
            self.wait(needed)

    def wait(self, regions):
        run = self.run
        with self._read:
            if all(self._ready.get(r) == run for r in regions):
                return
            started = time.perf_counter_ns()
            self._read.wait_for(lambda: all(self._ready.get(r) == run for r in regions))
            self.stalled_ns += time.perf_counter_ns() - started

    def _wanted(self, region, run):
        """Whether the run has not yet passed the region's last reader (else it was dropped already,
        and reading it again would only hold its pages to the next run)."""
        return run == self.run and self.position <= self._last[region]

    def blocks(self, position):
        """The BlockStream a step reads its blocked weight through, or None."""
        blocks = self.streaming.blocks[position]
        return BlockStream(blocks, self) if blocks is not None else None

    def after(self, position):
        regions = self.streaming.drop[position]
        if regions:
            with self._pager.lock:
                for region in regions:
                    self._pager.drop(region)

    def close(self):
        """Stop the thread (it finishes the request in hand first)."""
        self._closer()
        self._thread.join(timeout=5)

    @property
    def alive(self):
        return self._thread.is_alive()


class BlockStream:
    """A weight read in blocks of rows by one step (the kernel calls enter and leave per block):
    entering block k waits for it and asks for block k + 1; leaving it drops it."""

    def __init__(self, blocks, prefetcher):
        self.rows = blocks.rows
        self.left = 0  # blocks left so far
        self._regions = blocks.regions
        self._whole = blocks.whole
        self._prefetcher = prefetcher
        self._pager = prefetcher._pager
        prefetcher._requests.put((self._regions[:1], lambda region, run: self.left == 0, prefetcher.run))

    def enter(self, k):
        if k + 1 < len(self._regions):
            # Wanted until block k + 1 is left (a read that comes too late is marked ready unread).
            self._prefetcher._requests.put((self._regions[k + 1:k + 2], lambda region, run, j=k + 1: self.left <= j,
                                            self._prefetcher.run))
        self._prefetcher.wait(self._regions[k:k + 1])

    def leave(self, k):
        with self._pager.lock:
            self.left = k + 1
            self._pager.drop(self._regions[k])
            if self.left == len(self._regions):
                # The page cache holds a file in folios of up to 2 MiB, dropped only whole: one
                # that straddles two blocks goes only when a drop covers both.
                self._pager.drop(self._whole)


def _read_ahead(requests, pager, read, ready):
    while True:
        request = requests.get()
        if request is None:
            return
        regions, wanted, run = request
        for region in regions:
            # The check and the request under the pager's lock, so that the run cannot drop the
            # region in between: read in after its drop, it would stay in memory to the next run.
            with pager.lock:
                going = wanted(region, run)
                if going:
                    pager.willneed(region)
            if going:
                pager.touch(region)
                with pager.lock:
                    if not wanted(region, run):  # passed while it was read: hand it back again
                        pager.drop(region)
            with read:
                ready[region] = run
                read.notify_all()
        del request, regions, wanted  # hold nothing of the executor while waiting
