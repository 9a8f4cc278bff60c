"""What the reconciler keeps of its employers between passes (resourceconsist/reconcile/memory.py):
here, the unguarded-registrations gauge's total, kept as each employer's count changes."""

from __future__ import annotations

from resourceconsist.reconcile.memory import Memories


def test_the_unguarded_total_follows_each_employers_count_and_its_forgetting() -> None:
    reported: list[int] = []
    memories = Memories(report_unguarded=reported.append)
    memories.count_unguarded("ns/a", 0)
    memories.count_unguarded("ns/b", 3)
    memories.count_unguarded("ns/a", 2)
    memories.count_unguarded("ns/a", 2)  # unchanged: not reported again
    memories.count_unguarded("ns/b", 1)
    assert reported == [0, 3, 5, 3]  # a first count is reported, 0 too
    memories.forget("ns/b")
    memories.forget("ns/b")  # forgotten already: nothing to report
    memories.count_unguarded("ns/a", 0)
    assert reported == [0, 3, 5, 3, 2, 0]
    assert sum(memories.unguarded().values()) == 0
