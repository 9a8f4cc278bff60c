"""Batched, conflict-safe writes of the PodOpsLifecycle fields of pods.

During one reconcile the steps only *plan* pod changes (expected-finalizer entries in the
shared ``available-conditions`` annotation, lifecycle finalizers); ``flush`` then writes each
pod at most once, annotation and finalizers in one merge patch carrying the pod's
resourceVersion as a precondition (``KubeClient.patch_optimistic``). On 409 Conflict the pod is
read again and the same intent re-applied to the fresh copy, so another employer's entry or
finalizer is never lost; an unchanged pod is never written.

One rule holds for every write (docs/concepts.md, "The guard"): a pod never ends up carrying the
employer's lifecycle finalizer without the employer's ``expectedFinalizers`` entry. Adding the
finalizer adds the entry if it is missing; removing the entry waits (``deferred``) while the
finalizer stays.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable, Iterable, Iterator, KeysView
from dataclasses import dataclass, field
from typing import Any

from resourceconsist import wire
from resourceconsist.cluster import aiokube, kube
from resourceconsist.cluster.interfaces import ObjectReader, ObjectWriter
from resourceconsist.cluster.kube import KubeObject, Resource
from resourceconsist.cluster.transform import trim
from resourceconsist.rules import lifecycle

log = logging.getLogger(__name__)

#: Pod writes in flight per flush: about what one API server takes before more concurrency stops
#: adding throughput (docs/concepts.md, "Work proportional to change").
PARALLEL_WRITES = 32
#: Written pods ``RecentWrites`` keeps at most (an entry goes once the cache catches up).
_RECENT_LIMIT = 50_000


@dataclass
class PodIntent:
    """What this reconcile wants changed on one pod."""

    add_entries: dict[str, str] = field(default_factory=dict)
    remove_entries: set[str] = field(default_factory=set)
    add_finalizers: list[str] = field(default_factory=list)
    remove_finalizers: set[str] = field(default_factory=set)
    #: A swap between guard and lifecycle finalizer: never end with neither of them.
    keep_guarded: bool = False


@dataclass
class PodWriteResult:
    """Per pod name: done (written, already so, or pod gone) or the error that stopped it.

    ``deferred``: pods whose entry removal waits because they keep the lifecycle finalizer.
    ``finalizers``: each done pod's finalizers as written or found (absent: the pod is gone).
    """

    done: set[str] = field(default_factory=set)
    failed: dict[str, BaseException] = field(default_factory=dict)
    deferred: set[str] = field(default_factory=set)
    finalizers: dict[str, list[str]] = field(default_factory=dict)
    writes: int = 0

    def merge(self, other: PodWriteResult) -> None:
        """Fold a later flush's result into this one (a later outcome wins for a pod)."""
        for name in other.done | set(other.failed):
            self.done.discard(name)
            self.failed.pop(name, None)
            self.deferred.discard(name)
        self.done |= other.done
        self.failed.update(other.failed)
        self.deferred |= other.deferred
        self.finalizers.update(other.finalizers)
        self.writes += other.writes


@dataclass(frozen=True)
class PodLocation:
    """Where an employee pod lives: the client and cache of its cluster, and its real name."""

    client: ObjectWriter
    reader: ObjectReader
    name: str


#: An object in one cache: (the cache's id, namespace or "", name).
_Key = tuple[int, str, str]
#: Handed an event once what this controller's writes make of it is known: the employer whose
#: pass wrote the very copy the event carries, or "" (``RecentWrites.event``).
EchoHandler = Callable[[str], None]

#: Resolves an employee name (``pod`` or ``pod#cluster``) to where the pod lives.
PodResolver = Callable[[str], PodLocation]


@dataclass(frozen=True)
class EmployerEntry:
    """The employer's entry in ``expectedFinalizers`` and the lifecycle finalizer it names."""

    key: str
    lifecycle_finalizer: str
    guard_finalizer: str


class RecentWrites:
    """The pods (or, with another ``resource``, the employers: Services) this controller wrote, as
    the API server answered, until the cache catches up.

    A pass that starts before the watch event of the last pass's write reached the cache would
    decide from the copy before that write: plan the same write again, meet a 409 Conflict,
    re-read and find nothing to do (a wasted PATCH and GET per pod in a readiness ramp), and
    count a guarded pod as unguarded. While the cached copy still carries a resourceVersion
    known to be older than the answer (the one the write started from, or the answer of an
    earlier write of this controller that the cache only now shows), the answer is the fresher
    copy; once the cache moves on to any other version (this write's event or a later one),
    the cache is used again and the entry goes.

    The earlier answers count because a pass writes a pod twice (guard, then lifecycle
    finalizer): a lagging watch delivers the first write's event while the second's answer is
    already known, and taking that event's copy for current wrote every pod a third time, into
    a 409 (docs/scaling.md, "Conflicts at a cold start").

    It also knows each write's echo, the watch event that brings the write's own answer back, so
    that the event queues no pass of the employer whose pass wrote and went on from that answer
    (``writing``, ``event``; docs/concepts.md, "A write's echo").
    """

    def __init__(self, resource: Resource = kube.POD) -> None:
        #: What the objects are (pods; an employer resource for the employers' own writes).
        self.resource = resource
        #: Per object: the resourceVersions known to be older than the answer, and the answer.
        self._after: dict[_Key, tuple[frozenset[str], KubeObject]] = {}
        #: Per object: the resourceVersions of this controller's writes of it since its last
        #: event, in the order answered, each with the employer whose pass wrote it (``event``).
        self._by: dict[_Key, dict[str, str]] = {}
        #: Per object with writes out: how many, and the events of it that came meanwhile.
        self._out: dict[_Key, int] = {}
        self._waiting: dict[_Key, list[tuple[str, EchoHandler]]] = {}
        self._lock = threading.Lock()

    def note(
        self, reader: ObjectReader, namespace: str | None, name: str, before: Iterable[str], after: KubeObject
    ) -> None:
        """``after``: the pod as the API server last answered this controller (its write, or
        the re-read after a conflict); ``before``: resourceVersions the pod had before, as this
        controller saw them (the cached copy's, the copy's the write started from)."""
        key = _key(reader, namespace, name)
        older = set(before)
        with self._lock:
            if len(self._after) >= _RECENT_LIMIT:
                # Entries of pods nobody looks up any more: dropping them only costs a conflict.
                self._after.clear()
            hit = self._after.get(key)
            if hit is not None and _version(hit[1]) in older:
                # The write started from the last answer: what was older than that answer is
                # older than this one. (Another pass's answer to a concurrent write is not
                # chained: which of the two is the newer, nothing here can tell.)
                older |= hit[0]
            older.discard(_version(after))
            self._after[key] = (frozenset(older), trim(after))

    def __bool__(self) -> bool:
        """Whether any answer is held (most of the time none: the cache keeps up)."""
        return bool(self._after)

    def wrote(
        self,
        reader: ObjectReader,
        namespace: str | None,
        name: str,
        cached: KubeObject | None,
        used: KubeObject | None,
        answer: KubeObject,
        *,
        by: str = "",
    ) -> None:
        """A write of this controller was answered: ``cached``, the cache's copy when it went
        out, and ``used``, the copy it started from, are older than ``answer`` (the pod writes'
        and the readiness gates' writes alike). ``by``: the employer whose pass wrote and went
        on from the answer, so the write's own event is no news to it (``event``); "" when the
        event must reach that employer as any other."""
        if by:
            with self._lock:
                if len(self._by) >= _RECENT_LIMIT:
                    self._by.clear()  # writes whose events never came: only a pass more
                self._by.setdefault(_key(reader, namespace, name), {})[_version(answer)] = by
        if cached is None:
            return  # not cached yet: its first event brings the cache past any answer
        before = {_version(cached)} | ({_version(used)} if used is not None else set())
        self.note(reader, namespace, name, before, answer)

    @contextlib.contextmanager
    def writing(self, reader: ObjectReader, namespace: str | None, name: str) -> Iterator[None]:
        """A write of the object is out inside: its events wait (``event``) until the answers of
        all its writes out are in (the watch may bring a write's echo before its answer), then
        are handed on, in the order they came."""
        key = _key(reader, namespace, name)
        with self._lock:
            self._out[key] = self._out.get(key, 0) + 1
        try:
            yield
        finally:
            with self._lock:
                left = self._out.pop(key) - 1
                if left:
                    self._out[key] = left
                waiting = [] if left else self._waiting.pop(key, [])
            for version, handle in waiting:
                try:
                    handle(self._echo_of(key, version))
                except Exception:  # a handler's failure is its own, never the write's
                    log.exception(
                        "handling an event of %s/%s that waited for a write failed", namespace, name
                    )

    def event(
        self, reader: ObjectReader, namespace: str | None, name: str, version: str, handle: EchoHandler
    ) -> None:
        """Hand an event of the object, its copy at ``version``, to ``handle`` with the employer
        whose pass wrote that very copy and went on from the answer (the write coming back: no
        news to that employer), or "" (news to all): at once, or once the answers of the writes
        of the object that are out are in. Only the very version a write was answered with is
        its echo: any other copy, one that carries a change of someone else after the write
        included, is news (a watch delivers an object's versions in order, and a re-list gives
        only the latest; a write whose echo never comes is forgotten with the others at the
        limit)."""
        key = _key(reader, namespace, name)
        with self._lock:
            if key in self._out:
                self._waiting.setdefault(key, []).append((version, handle))
                return
        handle(self._echo_of(key, version))

    def _echo_of(self, key: _Key, version: str) -> str:
        if not self._by:
            return ""
        with self._lock:
            writes = self._by.get(key)
            if writes is None or version not in writes:
                return ""
            answered = list(writes)
            # Its echo came: the writes answered before it are past; those after it are not.
            kept = {v: writes[v] for v in answered[answered.index(version) + 1 :]}
            if kept:
                self._by[key] = kept
            else:
                del self._by[key]
            return writes[version]

    def settle(self, reader: ObjectReader, namespace: str | None, name: str) -> None:
        """The pod's watch event reached the cache: drop its entry once the cache moved on."""
        if self._after:
            self.get(reader, namespace, name)

    def get(self, reader: ObjectReader, namespace: str | None, name: str) -> KubeObject | None:
        """The freshest known copy of the object: the cache's, or this controller's last answer."""
        return self.fresher(reader, namespace, name, reader.get(self.resource, namespace, name))

    def fresher(
        self, reader: ObjectReader, namespace: str | None, name: str, cached: KubeObject | None
    ) -> KubeObject | None:
        """``get`` for a pod whose cached copy the caller read already (an index lookup)."""
        key = _key(reader, namespace, name)
        # Without the lock first: most pods have no entry, and one dict read is atomic.
        if key not in self._after:
            return cached
        with self._lock:
            hit = self._after.get(key)
            if hit is None:
                return cached
            if cached is not None and _version(cached) in hit[0]:
                return hit[1]
            del self._after[key]
        return cached


def _key(reader: ObjectReader, namespace: str | None, name: str) -> _Key:
    return (id(reader), namespace or "", name)


def _version(obj: KubeObject) -> str:
    return str(obj.get("metadata", {}).get("resourceVersion", ""))


class PodWriter:
    """Collects pod intents for one employer's namespace and writes them once each per flush."""

    def __init__(
        self,
        namespace: str,
        resolve: PodResolver,
        entry: EmployerEntry | None = None,
        recent: RecentWrites | None = None,
        by: str = "",
    ) -> None:
        self.namespace = namespace
        self._resolve = resolve
        self.entry = entry
        self.recent = recent if recent is not None else RecentWrites()
        #: The employer whose pass writes (its queue key): a write that did all it meant to is
        #: no news to it when its event comes back (``RecentWrites.event``).
        self.by = by
        self._intents: dict[str, PodIntent] = {}

    def _intent(self, name: str) -> PodIntent:
        return self._intents.setdefault(name, PodIntent())

    def add_entry(self, name: str, key: str, value: str) -> None:
        intent = self._intent(name)
        intent.remove_entries.discard(key)
        intent.add_entries[key] = value

    def remove_entry(self, name: str, key: str) -> None:
        intent = self._intent(name)
        intent.add_entries.pop(key, None)
        intent.remove_entries.add(key)

    def add_finalizer(self, name: str, finalizer: str) -> None:
        intent = self._intent(name)
        intent.remove_finalizers.discard(finalizer)
        if finalizer not in intent.add_finalizers:
            intent.add_finalizers.append(finalizer)

    def remove_finalizer(self, name: str, finalizer: str) -> None:
        intent = self._intent(name)
        if finalizer in intent.add_finalizers:
            intent.add_finalizers.remove(finalizer)
        intent.remove_finalizers.add(finalizer)

    def swap(self, name: str, *, to_lifecycle: bool) -> None:
        """Trade the employer's guard for its lifecycle finalizer (served) or back (held, not
        served). On a deleting pod, where no finalizer can be added, the one it has stays."""
        if self.entry is None:
            raise ValueError("a swap needs the employer's entry")
        on, off = self.entry.lifecycle_finalizer, self.entry.guard_finalizer
        if not to_lifecycle:
            on, off = off, on
        self.add_finalizer(name, on)
        self.remove_finalizer(name, off)
        self._intent(name).keep_guarded = True

    def planned(self, name: str) -> bool:
        """Whether anything is planned for the pod."""
        return name in self._intents

    def planned_names(self) -> KeysView[str]:
        """The pods anything is planned for (a live view)."""
        return self._intents.keys()

    @property
    def pending(self) -> bool:
        return bool(self._intents)

    def adding(self) -> set[str]:
        """Pods whose plan adds an entry or a finalizer."""
        return {n for n, i in self._intents.items() if i.add_entries or i.add_finalizers}

    async def flush(self, only: set[str] | None = None) -> PodWriteResult:
        """Write every planned pod (or those in ``only``) once, in parallel, bounded; forget
        the plans written, keep the others for a later flush."""
        if only is None:
            intents, self._intents = self._intents, {}
        else:
            intents = {n: i for n, i in self._intents.items() if n in only}
            self._intents = {n: i for n, i in self._intents.items() if n not in only}
        result = PodWriteResult()
        # A pod whose cached copy already matches its plan needs no write: settle it here, on
        # the loop, instead of a thread hop per pod (a steady-state pass plans every selected
        # pod). A lagging cache only means the write below re-reads on conflict, as before.
        located: dict[str, tuple[PodLocation, KubeObject | None]] = {}
        for name, intent in list(intents.items()):
            try:
                where = self._resolve(name)
                cached = self.recent.get(where.reader, self.namespace, where.name)
                located[name] = (where, cached)
                if cached is None:
                    continue
                body, deferred = self._patch_for(cached, intent, self.entry)
            except Exception:
                continue  # an unknown cluster, a malformed annotation: the write path reports it
            if body is None:
                del intents[name]
                result.done.add(name)
                result.finalizers[name] = lifecycle.get_finalizers(cached)
                if deferred:
                    result.deferred.add(name)
        await self._write_all(intents, located, result)
        return result

    async def _write_all(
        self,
        intents: dict[str, PodIntent],
        located: dict[str, tuple[PodLocation, KubeObject | None]],
        result: PodWriteResult,
    ) -> None:
        """Write ``intents`` from at most PARALLEL_WRITES writer coroutines that take the next pod
        as they finish one: no task per write (a task's creation and scheduling cost as much as a
        tenth of a write's CPU: docs/benchmarks.md), and none at all for a single pod."""
        todo = iter(list(intents.items()))

        async def writer() -> None:
            for name, intent in todo:  # one iterator: each pod is taken by one writer
                try:
                    pod, wrote, deferred = await self._apply(name, intent, located.get(name))
                except Exception as err:
                    result.failed[name] = err
                    continue
                result.writes += wrote
                result.done.add(name)
                if deferred:
                    result.deferred.add(name)
                if pod is not None:
                    result.finalizers[name] = lifecycle.get_finalizers(pod)

        writers = min(PARALLEL_WRITES, len(intents))
        if writers == 1:
            await writer()
        elif writers > 1:
            await asyncio.gather(*(writer() for _ in range(writers)))

    async def _apply(
        self, name: str, intent: PodIntent, located: tuple[PodLocation, KubeObject | None] | None
    ) -> tuple[KubeObject | None, bool, bool]:
        """Bring one pod to the intent: (the pod as it now is, or None when gone; written;
        an entry removal deferred). ``located``: where it lives and its cached copy, when
        ``flush`` already looked them up. The write goes out on the event loop's transport
        (resourceconsist.cluster.aiokube), in the frame's threads where that cannot serve the client."""
        # Start from the cache as it is now, not as it was when the flush began: a writer takes a
        # pod up to seconds later in a large flush, and a copy that meanwhile changed (a kubelet's
        # status patch) would cost a 409, a GET and a second PATCH. It may lag behind a pod
        # created a moment ago, so fall back to a GET.
        where = located[0] if located is not None else self._resolve(name)
        pod = self.recent.get(where.reader, self.namespace, where.name)
        deferred = False

        def change(fresh: KubeObject) -> dict[str, Any] | None:
            nonlocal deferred
            body, deferred = self._patch_for(fresh, intent, self.entry)
            return body

        # What the cache holds now, before the write: a copy with this resourceVersion is older
        # than whatever the write leaves.
        cached = where.reader.get(kube.POD, self.namespace, where.name)
        with self.recent.writing(where.reader, self.namespace, where.name):
            after, wrote = await aiokube.patch_optimistic(
                where.client, kube.POD, self.namespace, where.name, change, current=pod
            )
            # A copy read again after a conflict is as fresh as a write's answer: the next pass
            # starts from it, not from the cache that conflicted (docs/scaling.md).
            read_again = after is not None and (pod is None or _version(after) != _version(pod))
            if (wrote or read_again) and after is not None:
                # A deferred entry removal is done by the pass its own event brings: that echo
                # is news to the writer too.
                echo_is_news = not wrote or deferred
                self.recent.wrote(
                    where.reader,
                    self.namespace,
                    where.name,
                    cached,
                    pod,
                    after,
                    by="" if echo_is_news else self.by,
                )
        return after, wrote, deferred

    @staticmethod
    def _patch_for(
        pod: KubeObject, intent: PodIntent, entry: EmployerEntry | None = None
    ) -> tuple[dict[str, Any] | None, bool]:
        """The merge patch that brings ``pod`` to ``intent`` (None: nothing to write), and
        whether an entry removal was held back because the lifecycle finalizer stays."""
        deleting = lifecycle.is_deleting(pod)
        current = lifecycle.get_finalizers(pod)
        # A deleting pod gets no new entry (Go does the same), and the API server forbids
        # new finalizers on it.
        adds = {} if deleting else dict(intent.add_entries)
        removes = set(intent.remove_entries)
        remove_finalizers = set(intent.remove_finalizers)
        add_finalizers = () if deleting else intent.add_finalizers
        if entry is not None and intent.keep_guarded and deleting:
            # Nothing can be added to a deleting pod: the guarding finalizer it has stays.
            remove_finalizers -= {entry.guard_finalizer, entry.lifecycle_finalizer}
        finalizers = lifecycle.updated_finalizers(pod, add=add_finalizers, remove=remove_finalizers)
        deferred = False
        if entry is not None and entry.lifecycle_finalizer in (current if finalizers is None else finalizers):
            # Never leave the lifecycle finalizer without its entry: Operating reads the pair.
            if entry.key in removes:
                removes.discard(entry.key)
                deferred = True
            if entry.key not in lifecycle.expected_finalizers(pod):
                adds[entry.key] = entry.lifecycle_finalizer
        annotation = lifecycle.updated_available_conditions(pod, add=adds, remove=removes)
        if annotation is None and finalizers is None:
            return None, deferred
        meta: dict[str, Any] = {}
        if annotation is not None:
            meta["annotations"] = {wire.AVAILABLE_CONDITIONS_ANNOTATION: annotation}
        if finalizers is not None:
            meta["finalizers"] = finalizers
        return {"metadata": meta}, deferred
