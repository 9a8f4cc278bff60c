"""What the reconciler keeps of one employer between its passes: one ``EmployerMemory`` record."""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Streak:
    """How long one failure left to retries has lasted: since when, over how many passes."""

    since: float
    passes: int = 0


@dataclass
class GuardMemo:
    """What the guard found of an employer's pods on its last pass that ran to its end
    (``guard.GuardRecall`` reads it): the pods that carried its guard or lifecycle finalizer, and
    those whose finalizers already matched their verdict (nothing was planned), with that
    verdict (a ``guard.Verdict``)."""

    guarded: set[str] = field(default_factory=set)
    settled: dict[str, int] = field(default_factory=dict)


@dataclass
class EmployerMemory:
    """What the reconciler keeps of one employer between its passes, in one record, so that
    forgetting an employer is one operation (``Memories.forget``)."""

    #: The adapter's ``ReconcileContext.memo``.
    memo: dict[str, Any] = field(default_factory=dict)
    #: Employee names whose events arrived since its last pass began; None: the next pass is a
    #: full one (docs/concepts.md, "Work proportional to change").
    changes: set[str] | None = field(default_factory=set)
    #: When its last completed full pass began (monotonic seconds).
    full_pass_at: float | None = None
    #: Registrations the provider held without their pod's guard, as the last pass found them
    #: (the invariant, live: it should read 0; docs/concepts.md); None: not counted yet.
    unguarded: int | None = None
    #: What the guard found of its pods on its last pass that ran to its end (None: nothing
    #: known; ``guard.GuardRecall``).
    guard: GuardMemo | None = None
    #: What its subscribers were last told, by pod ("": the employer itself).
    told: dict[str, str] = field(default_factory=dict)
    #: The failures left to retries its consecutive passes met.
    streaks: dict[tuple[str, ...], Streak] = field(default_factory=dict)


class Memories:
    """The ``EmployerMemory`` of every employer a reconciler has met, by employer key;
    ``report_unguarded`` gets the sum of the unguarded counts whenever it may have changed."""

    def __init__(self, report_unguarded: Callable[[int], None] = lambda total: None) -> None:
        self._by_key: dict[str, EmployerMemory] = {}
        self._report_unguarded = report_unguarded
        #: The sum of the employers' unguarded counts, kept as they change: summing them at
        #: each change made every employer's first pass walk all the others.
        self._unguarded_total = 0

    def of(self, key: str) -> EmployerMemory:
        """The employer's record (a new one the first time)."""
        found = self._by_key.get(key)
        if found is None:
            found = self._by_key[key] = EmployerMemory()
        return found

    def told(self, key: str) -> dict[str, str]:
        """What subscribers were last told about the employer ``key``, by pod (read only)."""
        found = self._by_key.get(key)
        return {} if found is None else found.told

    def unguarded(self) -> dict[str, int]:
        """Per employer key: the unguarded registrations its last pass found."""
        return {key: m.unguarded for key, m in self._by_key.items() if m.unguarded is not None}

    def employee_changed(self, key: str, name: str) -> None:
        """An event of employee ``name`` (``pod`` or ``pod#cluster``) woke employer ``key``."""
        pending = self.of(key).changes
        if pending is not None:
            pending.add(name)

    def employer_changed(self, key: str) -> None:
        """The employer itself changed (or anything the frame cannot name): a full pass next."""
        self.of(key).changes = None

    def take_changes(self, key: str, full_pass_every: float) -> frozenset[str] | None:
        """The employee names changed since the employer's last pass (and forget them); None
        when the pass must be a full one: the employer changed, it never had a full pass, or
        its last one began ``full_pass_every`` seconds ago or more."""
        memory = self.of(key)
        pending, memory.changes = memory.changes, set()
        last_full = memory.full_pass_at
        if pending is None or last_full is None or time.monotonic() - last_full >= full_pass_every:
            return None
        return frozenset(pending)

    def changes_so_far(self, key: str) -> frozenset[str] | None:
        """The employee names changed since the employer's pass began, kept for its next pass;
        None when the employer itself changed meanwhile."""
        pending = self.of(key).changes
        return None if pending is None else frozenset(pending)

    def changed_since_last_pass(self, key: str, taken: frozenset[str] | None) -> Collection[str] | None:
        """The employee names with an event since the employer's last pass began, as of now:
        those its current pass took (``taken``, from ``take_changes``) and those since; None
        when the current pass is a full one or the employer changed meanwhile."""
        pending = self.of(key).changes
        if taken is None or pending is None:
            return None
        return taken | pending

    def pass_ended(self, key: str, *, began: float, completed: bool, full: bool) -> None:
        """A pass of the employer that ``began`` (monotonic seconds) ended: a ``full`` one that
        ``completed`` is its last full pass; one that did not complete leaves a full pass next,
        since whatever the adapter kept from it may be wrong."""
        if not completed:
            self.employer_changed(key)
            self.of(key).guard = None
        elif full:
            self.of(key).full_pass_at = began

    def count_unguarded(self, key: str, count: int) -> None:
        """A pass of the employer found ``count`` registrations without their pod's guard."""
        memory = self.of(key)
        if memory.unguarded != count:
            self._unguarded_total += count - (memory.unguarded or 0)
            memory.unguarded = count
            self._report_unguarded(self._unguarded_total)

    def forget(self, key: str) -> None:
        """Drop the employer's record, in one piece, and its count in the unguarded gauge (it is
        gone, or another replica's now: docs/scaling.md); what its subscribers were told stays
        until they are told it is deleted (``told_deleted``)."""
        memory = self._by_key.pop(key, None)
        if memory is None:
            return
        if memory.told:
            self._by_key[key] = EmployerMemory(told=memory.told)
        if memory.unguarded:
            self._unguarded_total -= memory.unguarded
            self._report_unguarded(self._unguarded_total)

    def told_deleted(self, key: str) -> None:
        """Its subscribers were told the employer is deleted: nothing is left to tell them."""
        memory = self._by_key.get(key)
        if memory is None:
            return
        memory.told.clear()
        if memory == EmployerMemory():
            del self._by_key[key]  # forgotten before: what it was told was all that was left
