"""What the cyclic garbage collector finds: ``collector_finds`` counts, by type, the objects that
became unreachable inside a block but that reference counting could not free, each part of (or
held by) a reference cycle. A pass of the frame is freed by reference counting when it ends; one
that is a cycle waits for the collector, which at thousands of pods costs seconds of CPU and
holds megabytes meanwhile (docs/benchmarks.md, "Garbage a pass leaves"). The frame's tests, the
conformance suite and the SLB client's tests check with it that nothing of a pass is left so.
"""

from __future__ import annotations

import gc
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field


@dataclass
class CollectorFinds:
    """What the collector found at the end of a ``collector_finds`` block, by type."""

    by_type: Counter[type] = field(default_factory=Counter)

    def count(self, *types: type) -> int:
        """How many of the objects found are instances of ``types`` (subclasses included)."""
        return sum(n for found, n in self.by_type.items() if issubclass(found, types))

    def __str__(self) -> str:
        common = ", ".join(f"{t.__name__} {n}" for t, n in self.by_type.most_common(8))
        return f"{sum(self.by_type.values())} objects ({common or 'none'})"


@contextmanager
def collector_finds() -> Iterator[CollectorFinds]:
    """Collect once, then count what a collection at the block's end finds (filled in then).
    The collector's debug flag ``DEBUG_SAVEALL`` is set meanwhile (process-wide), so what it
    finds is counted instead of freed; the objects are let go at the end."""
    gc.collect()
    was = gc.get_debug()
    finds = CollectorFinds()
    gc.set_debug(was | gc.DEBUG_SAVEALL)
    try:
        yield finds
        gc.collect()
        finds.by_type.update(type(found) for found in gc.garbage)
    finally:
        gc.set_debug(was)
        gc.garbage.clear()
