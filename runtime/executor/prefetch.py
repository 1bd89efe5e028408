"""Streaming weights during a run: read ahead of the steps by execution order, dropped after use.

The plan's `Streaming` says, per step position, which weight regions to start reading when that
step begins (they are first read `lookahead` steps later) and which to hand back once it ends.
Reading ahead is a madvise(MADV_WILLNEED) on a thread of its own, so the step that runs does not
wait for the request to be queued; the kernel reads the pages in the background and a step that
gets there first simply waits for its page faults, correct either way. Dropping is done in line
(MADV_PAGEOUT: the pages leave this process and the page cache at once).

The thread holds no reference to the executor: it ends when the executor is collected, or on
`close()`.
"""

import queue
import threading
import weakref

from ..paging import PAGER


class Prefetcher:
    """The streaming side of one Executor."""

    def __init__(self, streaming, pager=PAGER):
        self.streaming = streaming
        self._pager = pager
        self.position = -1  # the step running now: a request for a region already past it is dropped
        self._last = {r: position for position, regions in enumerate(streaming.drop) for r in regions}
        self._requests = queue.SimpleQueue()
        self._thread = threading.Thread(target=_read_ahead, args=(self._requests, pager), name="nnrun-prefetch",
                                        daemon=True)
        self._thread.start()
        self._closer = weakref.finalize(self, self._requests.put, None)

    def start(self):
        """A run begins: what its first steps read is requested now."""
        self.before(0)

    def before(self, position):
        self.position = position
        regions = self.streaming.prefetch[position] if position < len(self.streaming.prefetch) else ()
        if regions:
            self._requests.put((regions, self._wanted))

    def _wanted(self, region):
        """Whether the run has not yet passed the region's last reader (else it was dropped already,
        and reading it again would only hold its pages to the next run)."""
        return self.position <= self._last[region]

    def blocks(self, position):
        """The BlockStream a step reads its blocked weight through, or None."""
        blocks = self.streaming.blocks[position]
        return BlockStream(blocks, self._requests, self._pager) if blocks is not None else None

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
    entering block k asks for block k + 1, leaving it drops it."""

    def __init__(self, blocks, requests, pager):
        self.rows = blocks.rows
        self.left = 0  # blocks left so far
        self._regions = blocks.regions
        self._whole = blocks.whole
        self._requests = requests
        self._pager = pager
        requests.put((self._regions[:1], lambda region: self.left == 0))

    def enter(self, k):
        if k + 1 < len(self._regions):
            self._requests.put((self._regions[k + 1:k + 2], lambda region, k=k: self.left <= k))

    def leave(self, k):
        with self._pager.lock:
            self.left = k + 1
            self._pager.drop(self._regions[k])
            if self.left == len(self._regions):
                # The page cache holds a file in folios of up to 2 MiB, dropped only whole: one
                # that straddles two blocks goes only when a drop covers both.
                self._pager.drop(self._whole)


def _read_ahead(requests, pager):
    while True:
        request = requests.get()
        if request is None:
            return
        regions, wanted = request
        for region in regions:
            # Under the pager's lock, so that the run cannot drop the region between the check and
            # the request: read in after its drop, it would stay in memory to the next run.
            with pager.lock:
                if wanted(region):
                    pager.willneed(region)
        del request, regions, wanted  # hold nothing of the executor while waiting
