"""A bounded, seeded random sample of a stream of lines, drawn in one pass (reservoir
sampling, Vitter's algorithm R).

nmt-preprocess offers every training line to a `LineReservoir` while it scans the files,
so SentencePiece trains on at most `spm.input_sentence_size` lines whatever the corpus
size. Line t of the stream (0-based) replaces slot j = uniform(0..t) when j < capacity:
every line ends up in the sample with the same probability. The draws are a function of
the seed and the line numbers only (not of how the stream is cut into blocks), so the same
corpus gives the same sample, and with no more lines than the capacity the sample is every
line, in order.
"""

from __future__ import annotations

import numpy as np


class LineReservoir:
    """At most `capacity` lines (raw bytes, without their "\\n") of everything offered."""

    def __init__(self, capacity: int, seed: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity={capacity}: must be 1 or more")
        self.capacity = capacity
        self.lines: list[bytes] = []
        self.seen = 0  # lines offered so far
        self._rng = np.random.default_rng([seed, 0x5EED])

    def offer(self, data: bytes, ends: np.ndarray, skip_first: int = 0) -> None:
        """Offer the lines of `data`: line i ends at byte ends[i] (its "\\n", or len(data)
        for a last line without one); `skip_first` bytes (a byte-order mark) are not part of
        the first line."""
        m = len(ends)
        if m == 0:
            return
        starts = np.empty(m, dtype=np.int64)
        starts[0] = skip_first
        starts[1:] = ends[:-1] + 1
        fill = min(max(self.capacity - self.seen, 0), m)
        for i in range(fill):  # the reservoir is not full yet: keep every line
            self.lines.append(data[starts[i] : ends[i]])
        if fill < m:
            t = self.seen + np.arange(fill, m, dtype=np.int64)  # stream positions
            slots = self._rng.integers(0, t + 1)  # uniform in 0..t, one draw per line
            hit = np.flatnonzero(slots < self.capacity)
            for i, slot in zip((hit + fill).tolist(), slots[hit].tolist()):
                self.lines[slot] = data[starts[i] : ends[i]]
        self.seen += m
