"""Informer caches: list + watch kept in memory, indexed, shared by every reader.

An ``Informer`` lists a resource once, then watches from the list's resourceVersion with
bookmarks, re-listing on 410 Gone or a broken watch (with backoff). Its ``Store`` is indexed
so "pods with label a=b in namespace n" and "Services whose selector holds a=b" are lookups,
not scans. Handlers run on the event loop after the store has changed, as in client-go.
An ``InformerFactory`` shares one informer per resource among controllers and the webhook;
``CacheReader`` is the read-only face adapters get. ``SnapshotReader`` answers the same lookups
over the same indexed stores, filled once by one LIST per kind and namespace, for the one-off
reads of ``explain`` and the hand-over. A manager that watches a list of namespaces
(docs/security.md, "A namespaced install") has, per namespaced resource, one informer with a
list + watch per namespace into one store: readers and handlers see one cache, and nothing of
another namespace is ever asked for.
"""

from __future__ import annotations

import abc
import asyncio
import builtins
import contextlib
import dataclasses
import functools
import logging
import random
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

from resourceconsist.cluster import diagnosis, kube
from resourceconsist.cluster.kube import (
    ApiError,
    Gone,
    KubeClient,
    KubeObject,
    Resource,
    WatchStream,
    object_key,
)
from resourceconsist.cluster.transform import (
    FRAME_POD_FIELDS,
    Keeping,
    Transform,
    field_tree,
    keeping,
    keeping_selected_or_marked,
    trim,
)
from resourceconsist.cluster.transport import Decode
from resourceconsist.errors import ResourceConsistError
from resourceconsist.rules.labels import label_selector_selects, map_selects, parse_selector

log = logging.getLogger(__name__)

EventType = Literal["ADDED", "MODIFIED", "DELETED"]
Indexer = Callable[[KubeObject], Iterable[str]]

#: Index of every object by ``namespace/label=value`` for each of its labels.
LABEL_INDEX = "label"
#: Index of Services by ``namespace/key=value`` for each pair of their ``spec.selector``.
SERVICE_SELECTOR_INDEX = "service-selector"
#: Index of pods by ``namespace/finalizer`` for each of their finalizers.
FINALIZER_INDEX = "finalizer"
#: Index of pods by ``namespace/conditionType`` for each of their ``spec.readinessGates``.
READINESS_GATE_INDEX = "readiness-gate"


@dataclass(frozen=True)
class WatchEvent:
    """One change seen by an informer; ``old`` is set for MODIFIED and DELETED. ``at`` is the
    ``time.monotonic()`` at which the event was made, no earlier than the store change it reports
    (for a replay to a new handler, the replay's moment). ``initial``: an ADDED of the informer's
    first list, or of the replay to a new handler (controller-runtime's ``IsInInitialList``)."""

    type: EventType
    obj: KubeObject
    old: KubeObject | None = None
    at: float = field(default_factory=time.monotonic, compare=False)
    initial: bool = field(default=False, compare=False)

    @property
    def unchanged(self) -> bool:
        """Nothing changed: an object of a cache's first list or replay, or a resync's
        MODIFIED whose old and new are one version (controller-runtime gives both low priority)."""
        if self.initial:
            return True
        return (
            self.type == "MODIFIED"
            and self.old is not None
            and (self.old is self.obj or _rv(self.old) == _rv(self.obj) != "")
        )


def _ns(obj: KubeObject) -> str:
    return str(obj.get("metadata", {}).get("namespace") or "")


def index_by_label(obj: KubeObject) -> list[str]:
    ns = _ns(obj)
    return [f"{ns}/{k}={v}" for k, v in (obj.get("metadata", {}).get("labels") or {}).items()]


def index_by_finalizer(obj: KubeObject) -> list[str]:
    """An object under each of its finalizers, so "pods carrying this employer's finalizer" is
    a lookup (the release of pods whatever the provider did, docs/concepts.md)."""
    ns = _ns(obj)
    return [f"{ns}/{f}" for f in obj.get("metadata", {}).get("finalizers") or []]


def index_by_readiness_gate(obj: KubeObject) -> list[str]:
    """A pod under each of its readiness gates' condition types, so "the pods waiting on this
    employer's gate" is a lookup whose cost is those pods, not the namespace's (a pod the
    employer stopped selecting keeps its gate, so no selector lookup finds it;
    docs/zero-downtime.md)."""
    ns = _ns(obj)
    gates = (obj.get("spec") or {}).get("readinessGates") or []
    return [f"{ns}/{g.get('conditionType', '')}" for g in gates]


def index_by_service_selector(obj: KubeObject) -> list[str]:
    """A Service under its selector's smallest pair only: a Service selects a pod only if the
    pod holds every pair, so holding this one is necessary, and a pair shared by many Services
    (``tier=web``) does not make every one of them a candidate for every pod."""
    selector = obj.get("spec", {}).get("selector") or {}
    if not selector:
        return []
    key, value = min(selector.items())
    return [f"{_ns(obj)}/{key}={value}"]


def indexers_for(resource: Resource) -> dict[str, Indexer]:
    """The indexes a store of ``resource`` keeps, whatever fills it: labels for every kind, the
    selector's pair for Services, finalizers and readiness gates for pods (the lookups of ``StoreReader``)."""
    indexers: dict[str, Indexer] = {LABEL_INDEX: index_by_label}
    if resource == kube.SERVICE:
        indexers[SERVICE_SELECTOR_INDEX] = index_by_service_selector
    if resource == kube.POD:
        indexers[FINALIZER_INDEX] = index_by_finalizer
        indexers[READINESS_GATE_INDEX] = index_by_readiness_gate
    return indexers


def _as_stored(obj: KubeObject, resource: Resource, transform: Transform = trim) -> KubeObject:
    """A listed object as a store keeps it: with the kind and apiVersion that LIST items lack
    (handlers and adapters expect them), then what ``transform`` keeps of it."""
    obj.setdefault("kind", resource.kind)
    obj.setdefault("apiVersion", resource.api_version)
    return transform(obj)


class _Decoding(NamedTuple):
    """How an informer reads its answers under one transform: a ``Keeping`` transform's own
    decoders, after which nothing is left to do; else the client's decoder (None), then the
    transform."""

    page: Decode | None
    event: Decode | None
    after: Transform


def _decoding(transform: Transform) -> _Decoding:
    if isinstance(transform, Keeping):
        return _Decoding(transform.decode_list, transform.decode_event, _as_decoded)
    return _Decoding(None, None, transform)


def _as_decoded(obj: KubeObject) -> KubeObject:
    return obj


class Store:
    """A thread-safe map of ``namespace/name`` to object with secondary indexes."""

    def __init__(self, indexers: Mapping[str, Indexer] | None = None) -> None:
        self._lock = threading.RLock()
        self._items: dict[str, KubeObject] = {}
        self._indexers: dict[str, Indexer] = dict(indexers or {})
        self._indices: dict[str, dict[str, set[str]]] = {name: {} for name in self._indexers}

    def add_indexer(self, name: str, indexer: Indexer) -> None:
        with self._lock:
            if name in self._indexers:
                return
            self._indexers[name] = indexer
            self._indices[name] = {}
            for key, obj in self._items.items():
                self._index(name, key, obj)

    def _index(self, name: str, key: str, obj: KubeObject) -> None:
        index = self._indices[name]
        for value in self._indexers[name](obj):
            index.setdefault(value, set()).add(key)

    def _unindex(self, key: str, obj: KubeObject) -> None:
        for name, indexer in self._indexers.items():
            index = self._indices[name]
            for value in indexer(obj):
                keys = index.get(value)
                if keys is not None:
                    keys.discard(key)
                    if not keys:
                        del index[value]

    def upsert(self, obj: KubeObject) -> KubeObject | None:
        key = object_key(obj)
        with self._lock:
            old = self._items.get(key)
            if old is not None:
                self._unindex(key, old)
            self._items[key] = obj
            for name in self._indexers:
                self._index(name, key, obj)
            return old

    def delete(self, obj: KubeObject) -> KubeObject | None:
        key = object_key(obj)
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._unindex(key, old)
            return old

    def replace(self, objs: Iterable[KubeObject], namespace: str | None = None) -> list[WatchEvent]:
        """Make the store hold exactly ``objs`` (in ``namespace``, when given: the objects of
        other namespaces stay); return the events that turn the old into the new."""
        events: list[WatchEvent] = []
        prefix = f"{namespace}/" if namespace is not None else ""
        with self._lock:
            fresh = {object_key(o): o for o in objs}
            for key, old in builtins.list(self._items.items()):
                if key.startswith(prefix) and key not in fresh:
                    self.delete(old)
                    events.append(WatchEvent("DELETED", old, old))
            for obj in fresh.values():
                previous = self.upsert(obj)
                if previous is None:
                    events.append(WatchEvent("ADDED", obj))
                elif _rv(previous) != _rv(obj):
                    events.append(WatchEvent("MODIFIED", obj, previous))
        return events

    def get(self, key: str) -> KubeObject | None:
        # No lock: one dict read is atomic, and a writer replaces an object, never edits it.
        return self._items.get(key)

    def list(self, namespace: str | None = None) -> builtins.list[KubeObject]:
        with self._lock:
            if namespace is None:
                return list(self._items.values())
            prefix = f"{namespace}/"
            return [o for k, o in self._items.items() if k.startswith(prefix)]

    def by_index(self, name: str, value: str) -> builtins.list[KubeObject]:
        with self._lock:
            return [self._items[k] for k in self._indices[name].get(value, ())]

    def keys_by_index(self, name: str, value: str) -> set[str]:
        with self._lock:
            return set(self._indices[name].get(value, ()))

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)


def _rv(obj: KubeObject) -> str:
    return str(obj.get("metadata", {}).get("resourceVersion", ""))


class Informer:
    """List + watch of one resource (all namespaces, one, or each of ``namespaces``) into a
    ``Store``: one informer thread per namespace watched, all into the same store."""

    def __init__(
        self,
        client: KubeClient,
        resource: Resource,
        *,
        namespace: str | None = None,
        namespaces: Sequence[str] = (),
        indexers: Mapping[str, Indexer] | None = None,
        resync_period: float | None = None,
        page_size: int = 500,
        label_selector: str | None = None,
        transform: Transform = trim,
        keep: Callable[[KubeObject], bool] | None = None,
    ) -> None:
        self.client = client
        self.resource = resource
        self.namespace = namespace
        #: What each informer thread lists and watches: a namespace, or None for all.
        self.scopes: tuple[str | None, ...] = tuple(namespaces) if namespaces else (namespace,)
        #: List and watch only the objects this selector selects (a shard's share; docs/scaling.md).
        #: May change: each list takes the selector of its moment, and the watch after it goes on
        #: with the same one (``relist`` after a change).
        self.label_selector = label_selector
        #: The selector each scope's latest list was made with (its watch's).
        self._listed_selector: dict[str | None, str | None] = {}
        #: Objects a DELETED event (its object) or a list that no longer shows them (the stored
        #: copy) would take out of the store, which this keeps there instead (docs/scaling.md,
        #: "Pods selected by the API server": a pod that left a shard's label-selected watch while
        #: the shard still needs it, brought back into it). Called in the informer thread, and
        #: may block briefly (it asks the API server). None: nothing is held.
        self.hold: Callable[[KubeObject], bool] | None = None
        #: Called in the informer thread before each list (after ``before_first_list``), e.g. to
        #: set the selector the list is made with.
        self.before_list: Callable[[], None] | None = None
        #: Which listed or watched objects the store holds (after the transform); None: all. An
        #: object that stops being kept leaves the store with a DELETED event, as one that leaves
        #: a label-selected watch does (docs/concepts.md, "Pods the caches keep").
        self.keep = keep
        self.store = Store({LABEL_INDEX: index_by_label, **(indexers or {})})
        self.resync_period = resync_period
        self.page_size = page_size
        self._handlers: list[Callable[[WatchEvent], None]] = []
        #: Held while the store changes and the change is sent, and while a handler is added.
        self._emit_lock = threading.Lock()
        #: Events sent and not yet dispatched on the loop, with their handlers (``_send``).
        self._pending: list[tuple[WatchEvent, tuple[Callable[[WatchEvent], None], ...]]] = []
        self._pending_lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()
        self._synced = threading.Event()
        #: The scopes whose first list is in the store: synced once it holds every scope.
        self._listed: set[str | None] = set()
        #: Callbacks waiting for the first list (``when_synced``), and the lock that makes a
        #: callback registered as the list completes run once, not never.
        self._sync_waiters: list[Callable[[], None]] = []
        self._sync_lock = threading.Lock()
        self._watches: dict[str | None, WatchStream] = {}
        self._resync_handle: asyncio.TimerHandle | None = None
        #: Full lists so far: the first one, then one per re-list (broken watch, 410 Gone) of
        #: any scope.
        self.relists = 0
        #: Watches that ended in 410 Gone (the version they resumed from was too old: the watch
        #: fell behind or was away too long), each followed by a full list.
        self.expired = 0
        #: What is kept of each object (resourceconsist.cluster.transform); ``set_transform`` changes it.
        self.transform = transform
        #: Set while the store holds what the current transform keeps (cleared by a wider one
        #: until the re-list of every scope it asks for is in), the scopes listed with it, and
        #: each scope's re-list asked for by ``set_transform``.
        self._kept = threading.Event()
        self._kept.set()
        self._kept_scopes: set[str | None] = set(self.scopes)
        self._transform_version = 0
        self._relist = {scope: threading.Event() for scope in self.scopes}
        #: The first ``relist`` call waiting for quiet (``time.monotonic()``), and its timer.
        self._quiet_since: float | None = None
        self._quiet_handle: asyncio.TimerHandle | None = None
        #: When each scope's latest list started that is in, or that readers wait for: the first
        #: one (``wait_synced``), one asked for by ``relist`` (``current``). A re-list after a
        #: broken watch counts once in. (``time.monotonic()``; ``listed_since``.)
        self._list_started: dict[str | None, float] = {}
        #: Called in each informer thread before its first list, with the informer's stop event;
        #: it may wait for what ``keep`` reads (a shard's Service cache; docs/scaling.md).
        self.before_first_list: Callable[[threading.Event], None] | None = None
        #: Futures of ``wait_synced`` callers on the loop, woken when a list makes the store
        #: synced or current again (they look again: it may have changed since).
        self._loop_waiters: list[asyncio.Future[None]] = []
        #: The error each scope's first list last failed with, until that list is in.
        self._list_errors: dict[str | None, BaseException] = {}
        #: The last failure logged as a WARNING: the same one again is logged at DEBUG only.
        self._last_warned = ""

    @property
    def has_synced(self) -> bool:
        return self._synced.is_set()

    @property
    def list_error(self) -> BaseException | None:
        """Why the first list is not in yet: the error its latest attempt failed with (of the
        first scope still failing); None when it has no error (in, or still under way)."""
        with self._sync_lock:
            return next(iter(self._list_errors.values()), None)

    def not_synced_because(self) -> str:
        """Why the first list is not in, in one line that says what to do
        (resourceconsist.cluster.diagnosis)."""
        err = self.list_error
        if err is None:
            return (
                "its first list has not completed (no request failed: a large list, or a slow API "
                "server); give it more time (--cache-sync-timeout)"
            )
        return diagnosis.explain(err, self.client.url)

    def add_handler(self, handler: Callable[[WatchEvent], None]) -> Callable[[], None]:
        """Call ``handler`` on the event loop for every change, after the store's current content
        as ADDED events. Returns a function that removes the handler.

        Each event goes to the handlers registered when the store changed; a handler registered
        later gets the object from this replay instead. So an object is delivered to a new handler
        whether its event was dispatched just before the handler came (the replay) or is still on
        its way (the event): never neither, which a check of "synced" could not promise, since the
        initial list's events can be dispatched before the informer thread marks itself synced.
        """
        with self._emit_lock:
            self._handlers.append(handler)
            for obj in self.store.list():
                self._send(WatchEvent("ADDED", obj, initial=True), (handler,))

        def remove() -> None:
            with self._emit_lock:
                if handler in self._handlers:
                    self._handlers.remove(handler)

        return remove

    def when_synced(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` on the event loop once the first list is in the store (soon, if it
        already is), after the handlers have been sent that list's events. Returns a function
        that withdraws a callback not yet called. Nothing waits: this is how code on the loop
        waits for a cache (``CacheNotSynced``, docs/concepts.md "Events before the caches sync")."""
        with self._sync_lock:
            if not self._synced.is_set():
                self._sync_waiters.append(callback)

                def withdraw() -> None:
                    with self._sync_lock:
                        if callback in self._sync_waiters:
                            self._sync_waiters.remove(callback)

                return withdraw
        self._call_on_loop(callback)
        return lambda: None

    def _call_on_loop(self, callback: Callable[[], None]) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            loop.call_soon_threadsafe(callback)
        except RuntimeError:  # loop closed between the check and the call
            return

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._threads:
            return
        self._loop = loop
        for scope in self.scopes:
            name = f"informer-{self.resource.plural}" + (f"-{scope}" if len(self.scopes) > 1 else "")
            thread = threading.Thread(target=self._run, args=(scope,), name=name, daemon=True)
            self._threads.append(thread)
            thread.start()
        if self.resync_period:
            self._resync_handle = loop.call_later(self.resync_period, self._resync)

    async def wait_synced(self, timeout: float = 60.0) -> None:
        """Wait until the first list is in the store, and what the current transform keeps.

        On the loop, holding no thread: many passes waiting for a pod list at a cold start must
        not fill the executor that everything else's blocking calls share."""
        deadline = time.monotonic() + timeout
        while True:
            with self._sync_lock:
                if self._synced.is_set() and self._kept.is_set():
                    return
                waiter = asyncio.get_running_loop().create_future()
                self._loop_waiters.append(waiter)
            left = deadline - time.monotonic()
            try:
                if left <= 0:
                    raise TimeoutError
                await asyncio.wait_for(waiter, left)
            except TimeoutError:
                raise CacheSyncTimeout(self, timeout) from None
            finally:
                with self._sync_lock:
                    if waiter in self._loop_waiters:
                        self._loop_waiters.remove(waiter)

    def _wake_loop_waiters(self) -> None:
        """Under ``_sync_lock``, once a list made the store synced or current: wake the loop's
        ``wait_synced`` callers (after the list's events, which were sent before)."""
        waiters, self._loop_waiters = self._loop_waiters, []
        for waiter in waiters:
            with contextlib.suppress(RuntimeError):  # its loop closed: nobody waits any more
                waiter.get_loop().call_soon_threadsafe(_wake, waiter)

    def synced_within(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds, blocking, for the first list; whether it is in. Not on
        the event loop (``wait_synced`` is the loop's way)."""
        return self._synced.wait(timeout)

    def listed_since(self, moment: float) -> bool:
        """Every scope's latest list started at or after ``moment`` (``time.monotonic()``), and is
        in or waited for by readers (``wait_synced``, ``current``): what ``keep`` decides of every
        object a reader sees is decided after ``moment``, by that list or by a watch event after it
        (docs/scaling.md, "What a shard's employers need of pods")."""
        with self._sync_lock:
            started = [self._list_started.get(scope) for scope in self.scopes]
        return all(t is not None and t >= moment for t in started)

    @property
    def current(self) -> bool:
        """The store holds what the current transform and ``keep`` keep: no re-list asked for by
        ``set_transform`` or ``relist`` is still under way."""
        return self._kept.is_set()

    def relist(self, *, quiet: float = 0.0, at_most: float = 0.0) -> None:
        """List again, keeping what ``keep`` keeps now (it reads state that changed, e.g. a
        shard's employers; docs/scaling.md); ``wait_synced`` waits for the list. Calls made while
        a list runs ask for one more list, not one each.

        With ``quiet`` (on the event loop only), the list starts once no call has come for
        ``quiet`` seconds, and at most ``at_most`` seconds after the first call, the watch going
        on meanwhile: a burst of calls costs one list. The store is not ``current`` from the
        first call on, so whoever waits for it waits for that list."""
        loop = self._loop
        if quiet <= 0 or loop is None or not self._threads:
            self.set_transform(self.transform)
            return
        with self._sync_lock:
            # A list under way no longer makes the store current: it may miss what changed.
            self._transform_version += 1
            self._kept.clear()
            self._kept_scopes.clear()
        now = time.monotonic()
        if self._quiet_since is None:
            self._quiet_since = now
        if self._quiet_handle is not None:
            self._quiet_handle.cancel()
        delay = min(quiet, self._quiet_since + max(at_most, quiet) - now)
        self._quiet_handle = loop.call_later(max(0.0, delay), self._quiet_over)

    def _quiet_over(self) -> None:
        """The calls to ``relist`` have gone quiet: list now."""
        self._quiet_since, self._quiet_handle = None, None
        if not self._stop.is_set():
            self.set_transform(self.transform)

    def set_transform(self, transform: Transform) -> None:
        """Keep what ``transform`` keeps from now on. Objects already stored were kept by the old
        one, so a started informer lists again (an unchanged object sends no event);
        ``wait_synced`` waits for that list."""
        with self._sync_lock:
            self.transform = transform
            self._transform_version += 1
            if not self._threads:
                return
            self._kept.clear()
            self._kept_scopes.clear()
        for relist in self._relist.values():
            relist.set()
        for watch in builtins.list(self._watches.values()):
            watch.close()

    def stop(self, timeout: float = 5.0) -> None:
        self.signal_stop()
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def signal_stop(self) -> None:
        """Tell the informer threads to end (daemons: nothing waits for them unless joined)."""
        self._stop.set()
        if self._resync_handle is not None:
            self._resync_handle.cancel()
        if self._quiet_handle is not None:
            self._quiet_handle.cancel()
        for watch in builtins.list(self._watches.values()):
            watch.close()

    # -- the informer thread -----------------------------------------------------------------

    def _emit(self, event: WatchEvent) -> None:
        """Send ``event`` to the handlers registered now; called under ``_emit_lock`` together
        with the store change it reports (see ``add_handler``)."""
        self._send(event, tuple(self._handlers))

    def _send(self, event: WatchEvent, handlers: tuple[Callable[[WatchEvent], None], ...]) -> None:
        """Queue ``event`` for ``handlers`` on the loop, in the order sent (under ``_emit_lock``).
        The loop is woken once per batch, not once per event: a burst of changes (a rollout, a
        re-list) costs one wake-up and one cross-thread call while the loop is busy."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        with self._pending_lock:
            self._pending.append((event, handlers))
            if len(self._pending) > 1:
                return  # the batch's call is on its way
        try:
            loop.call_soon_threadsafe(self._dispatch_pending)
        except RuntimeError:  # loop closed between the check and the call: nothing will run
            with self._pending_lock:
                self._pending.clear()

    def _dispatch_pending(self) -> None:
        with self._pending_lock:
            batch, self._pending = self._pending, []
        for event, handlers in batch:
            self._dispatch(event, handlers)

    def _dispatch(self, event: WatchEvent, handlers: tuple[Callable[[WatchEvent], None], ...]) -> None:
        for handler in handlers:
            if handler not in self._handlers:
                continue  # removed since the event was sent
            try:
                handler(event)
            except Exception:
                log.exception("event handler failed for %s %s", event.type, object_key(event.obj))

    def _resync(self) -> None:
        """Re-deliver every object as MODIFIED with old == new: a periodic reconcile of all."""
        handlers = tuple(self._handlers)
        for obj in self.store.list():
            self._dispatch(WatchEvent("MODIFIED", obj, obj), handlers)
        if self._loop is not None and self.resync_period and not self._stop.is_set():
            self._resync_handle = self._loop.call_later(self.resync_period, self._resync)

    def _where(self, scope: str | None) -> str:
        """The resource, and the namespace when this informer watches several (for logs)."""
        plural = self.resource.plural
        return plural if len(self.scopes) == 1 else f"{plural} in {scope}"

    def _list(self, scope: str | None) -> str:
        self._relist[scope].clear()
        with self._sync_lock:
            transform, version = self.transform, self._transform_version
            started = time.monotonic()
            if scope not in self._listed or not self._kept.is_set():
                self._list_started[scope] = started
        if self.before_list is not None:
            # After the moment the list counts from (``listed_since``): what changes while it
            # runs asks for another list.
            self.before_list()
        selector = self.label_selector
        decoding = _decoding(transform)
        items: list[KubeObject] = []
        token: str | None = None
        while True:
            page = self.client.list(
                self.resource,
                scope,
                limit=self.page_size,
                continue_token=token,
                label_selector=selector,
                decode=decoding.page,
            )
            # Page by page: only one page is ever held whole.
            listed = page.get("items") or []
            # A pod the cache does not keep is let go before the transform's work.
            kept = listed if self.keep is None else (o for o in listed if self.keep(o))
            items.extend(_as_stored(item, self.resource, decoding.after) for item in kept)
            token = page.get("metadata", {}).get("continue") or None
            if not token:
                break
        first = scope not in self._listed
        self._listed_selector[scope] = selector
        if self.hold is not None:
            listed_keys = {object_key(o) for o in items}
            stored = self.store.list(scope if len(self.scopes) > 1 else None)
            items.extend(o for o in stored if object_key(o) not in listed_keys and self.hold(o))
        with self._emit_lock:
            for event in self.store.replace(items, scope if len(self.scopes) > 1 else None):
                self._emit(
                    dataclasses.replace(event, initial=True) if first and event.type == "ADDED" else event
                )
        with self._sync_lock:
            self._list_started[scope] = started
            self._list_errors.pop(scope, None)
            # A scope's first list counts once for the informer, not once per namespace.
            if scope in self._listed or not self._listed:
                self.relists += 1
            self._listed.add(scope)
            if version == self._transform_version:
                self._kept_scopes.add(scope)
                if len(self._kept_scopes) == len(self.scopes):
                    self._kept.set()
                    self._wake_loop_waiters()
            if len(self._listed) < len(self.scopes):
                return str(page.get("metadata", {}).get("resourceVersion", ""))
            self._synced.set()
            self._wake_loop_waiters()
            waiters, self._sync_waiters = self._sync_waiters, []
        for callback in waiters:
            # Scheduled after the list's events (sent above): the cache a waiter needs is full.
            self._call_on_loop(callback)
        return str(page.get("metadata", {}).get("resourceVersion", ""))

    def _run(self, scope: str | None) -> None:
        if self.before_first_list is not None:
            self.before_first_list(self._stop)
        backoff = 0.2
        while not self._stop.is_set():
            try:
                rv = self._list(scope)
                backoff = 0.2
                while not self._stop.is_set() and not self._relist[scope].is_set():
                    rv = self._watch_from(scope, rv)
            except ApiError as err:
                if self._stop.is_set():
                    return
                if self._relist[scope].is_set():
                    continue
                self._failed(scope, err)
                if isinstance(err, Gone):
                    self.expired += 1
                else:
                    self._warn_once(f"informer {self._where(scope)}: {err}; re-listing")
                    self._stop.wait(backoff)
                    backoff = min(backoff * 2, 30.0)
            except Exception as err:
                if self._stop.is_set():
                    return
                if self._relist[scope].is_set():
                    continue  # the watch was closed for a re-list (set_transform)
                self._failed(scope, err)
                # An unreachable API server is logged once per outage by the client
                # (transport.Reachability), not once per informer and retry.
                quiet = kube.is_unreachable(err) or self.client.reachability.down
                message = f"informer {self._where(scope)}: watch broke ({err}); re-listing"
                if quiet:
                    log.debug("%s", message)
                else:
                    self._warn_once(message)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 30.0)

    def _failed(self, scope: str | None, err: BaseException) -> None:
        """A list or watch of ``scope`` failed with ``err``: kept as the reason the cache is not
        synced while that scope's first list is not in."""
        with self._sync_lock:
            if scope not in self._listed:
                self._list_errors[scope] = err

    def _warn_once(self, message: str) -> None:
        """Log ``message`` as a WARNING, or at DEBUG when it repeats the last warning: a list
        refused again and again (a missing grant) is one line, not one per retry."""
        if message == self._last_warned:
            log.debug("%s", message)
            return
        self._last_warned = message
        log.warning("%s", message)

    def _watch_from(self, scope: str | None, rv: str) -> str:
        # One transform for the stream's life: a lean decoder (resourceconsist.cluster.transform) builds
        # only what it keeps, and set_transform closes the stream for a re-list.
        decoding = _decoding(self.transform)
        stream = self.client.watch(
            self.resource,
            scope,
            rv,
            timeout_seconds=random.randint(240, 480),
            label_selector=self._listed_selector.get(scope, self.label_selector),
            decode=decoding.event,
        )
        self._watches[scope] = stream
        if self._relist[scope].is_set():
            stream.close()  # set_transform asked for a re-list before this watch was seen
        try:
            for event in stream:
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "BOOKMARK":
                    rv = _rv(obj) or rv
                    continue
                if kind == "ERROR":
                    # The subclass by status: a 410 here is the usual way a watch expires (Gone).
                    raise ApiError.of(
                        int(obj.get("code", 500)), str(obj.get("reason", "")), str(obj.get("message", ""))
                    )
                rv = _rv(obj) or rv
                if (
                    kind == "DELETED"
                    and self.hold is not None
                    and self.store.get(object_key(obj)) is not None
                    and self.hold(obj)
                ):
                    continue  # it left the watch, not the API server (``hold``)
                let_go = self.keep is not None and kind != "DELETED" and not self.keep(obj)
                if let_go and self.store.get(object_key(obj)) is None:
                    continue  # neither kept nor held: not even the transform's work
                obj = decoding.after(obj)
                with self._emit_lock:
                    if kind == "DELETED":
                        old = self.store.delete(obj)
                        self._emit(WatchEvent("DELETED", obj, old))
                    elif let_go:
                        # No longer kept (docs/concepts.md, "Pods the caches keep"): it leaves the
                        # store as from a label-selected watch, a DELETED that is not a deletion.
                        old = self.store.delete(obj)
                        if old is not None:
                            self._emit(WatchEvent("DELETED", obj, old))
                    elif kind in ("ADDED", "MODIFIED"):
                        old = self.store.upsert(obj)
                        self._emit(WatchEvent("ADDED" if old is None else "MODIFIED", obj, old))
        finally:
            self._watches.pop(scope, None)
        return rv


class InformerFactory:
    """One shared informer per (client, resource); started on first use."""

    def __init__(
        self,
        client: KubeClient,
        *,
        resync_period: float | None = None,
        namespace: str | None = None,
        namespaces: Sequence[str] = (),
    ) -> None:
        self.client = client
        self.resync_period = resync_period
        #: The namespaces watched (namespaced kinds); None: all. ``namespace`` is one of them.
        self.namespaces: tuple[str, ...] | None = (
            tuple(sorted({*namespaces, *([namespace] if namespace else [])}))
            if namespace or namespaces
            else None
        )
        self._informers: dict[Resource, Informer] = {}
        #: Label selectors of the kinds this factory watches only in part (``select``).
        self._selectors: dict[Resource, str] = {}
        #: The pods the pod informers keep, when not all (``keep_pods``), and the selector it came from.
        self._pod_keep: tuple[str, Callable[[KubeObject], bool]] | None = None
        #: Further rules every kept pod must pass (``restrict_pods``: a shard's share).
        self._pod_rules: list[Callable[[KubeObject], bool]] = []
        #: What the pod informers wait for before their first list (``restrict_pods``).
        self._pod_waits: list[Callable[[threading.Event], None]] = []
        #: The pod informers' ``before_list`` and ``hold`` (``restrict_pods``).
        self._pod_before_list: Callable[[Informer], None] | None = None
        self._pod_hold: Callable[[KubeObject], bool] | None = None
        #: The fields the pod informers keep: the frame's, and those the adapters declared.
        self._pod_fields: frozenset[str] = frozenset(FRAME_POD_FIELDS)
        #: Counts ``stop`` calls: a reader's shortcut to a store holds only within one generation.
        self.generation = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()

    @property
    def namespace(self) -> str | None:
        """The one namespace watched; None: all, or several (``namespaces``)."""
        return self.namespaces[0] if self.namespaces is not None and len(self.namespaces) == 1 else None

    def watches(self, namespace: str | None) -> bool:
        """Objects of ``namespace`` are in the caches (None: a cluster-scoped object)."""
        return self.namespaces is None or namespace is None or namespace in self.namespaces

    def informer(self, resource: Resource) -> Informer:
        namespaces = self.namespaces if resource.namespaced and self.namespaces is not None else ()
        with self._lock:
            key = resource
            found = self._informers.get(key)
            if found is None:
                found = Informer(
                    self.client,
                    resource,
                    namespace=namespaces[0] if len(namespaces) == 1 else None,
                    namespaces=namespaces if len(namespaces) > 1 else (),
                    indexers=indexers_for(resource),
                    resync_period=self.resync_period,
                    label_selector=self._selectors.get(resource),
                    transform=keeping(self._pod_fields) if resource == kube.POD else trim,
                    keep=self._pod_keeper() if resource == kube.POD else None,
                )
                if resource == kube.POD and self._pod_waits:
                    waits = tuple(self._pod_waits)

                    def before_first_list(stop: threading.Event) -> None:
                        for wait in waits:
                            wait(stop)

                    found.before_first_list = before_first_list
                if resource == kube.POD and self._pod_before_list is not None:
                    found.before_list = functools.partial(self._pod_before_list, found)
                if resource == kube.POD:
                    found.hold = self._pod_hold
                self._informers[key] = found
                if self._loop is not None:
                    found.start(self._loop)
            return found

    def select(self, resource: Resource, label_selector: str) -> None:
        """Watch ``resource`` only where ``label_selector`` selects (a shard caches its share of
        the employers; docs/scaling.md). Said before its informer is made: a cache never changes
        what it holds under its readers."""
        with self._lock:
            if self._selectors.get(resource, label_selector) != label_selector:
                raise ValueError(
                    f"{resource.plural} are already selected by {self._selectors[resource]!r}, "
                    f"not {label_selector!r}"
                )
            made = resource in self._informers
            if made and resource not in self._selectors:
                raise ValueError(
                    f"the cache of {resource.plural} is already watching every object; select "
                    "it before the first reader asks for it"
                )
            self._selectors[resource] = label_selector

    def keep_pods(self, label_selector: str) -> None:
        """Keep only the pods ``label_selector`` selects, and those carrying the frame's marks
        (``transform.carries_marks``): the controlled pods, and any pod an employer may still hold
        (docs/concepts.md, "Pods the caches keep"). Said before the pod informer is made.

        The pods are filtered as they arrive, not selected by the API server: a pod that lost the
        label while an employer holds it must stay in sight, and finalizers cannot be selected on.
        Raises ``InvalidSelector`` on a selector the API server would refuse, ``ValueError`` when
        pods are already cached or kept otherwise."""
        keeps = keeping_selected_or_marked(parse_selector(label_selector))
        with self._lock:
            if self._pod_keep is not None and self._pod_keep[0] != label_selector:
                raise ValueError(f"pods are already kept by {self._pod_keep[0]!r}, not {label_selector!r}")
            if self._pod_keep is None and kube.POD in self._informers:
                raise ValueError(
                    "the cache of pods is already keeping every pod; say which to keep before the "
                    "first reader asks for it"
                )
            self._pod_keep = (label_selector, keeps)

    def restrict_pods(
        self,
        rule: Callable[[KubeObject], bool],
        *,
        wait: Callable[[threading.Event], None] | None = None,
        before_list: Callable[[Informer], None] | None = None,
        hold: Callable[[KubeObject], bool] | None = None,
    ) -> None:
        """Keep only the pods ``rule`` keeps too (a shard's share, resourceconsist/runtime/sharding/pods.py).
        ``rule`` runs in the informer threads on every listed and watched pod, and may read other
        caches; ``wait``, called in each pod informer thread before its first list with the
        informer's stop event, may wait (bounded) for those caches, so that the first list is
        judged by the rule rather than kept whole; ``before_list`` and ``hold`` become the pod
        informer's (``Informer.before_list``, ``Informer.hold``: a shard's label-selected pods,
        resourceconsist/runtime/sharding/podlabels.py). Said before the pod informer is made."""
        with self._lock:
            if kube.POD in self._informers:
                raise ValueError(
                    "the cache of pods is already made; restrict it before the first reader asks for it"
                )
            self._pod_rules.append(rule)
            if wait is not None:
                self._pod_waits.append(wait)
            if before_list is not None:
                self._pod_before_list = before_list
            if hold is not None:
                self._pod_hold = hold

    def _pod_keeper(self) -> Callable[[KubeObject], bool] | None:
        """Which pods the pod informer keeps (``keep_pods``, ``restrict_pods``); None: all."""
        rules = [*([self._pod_keep[1]] if self._pod_keep else []), *self._pod_rules]
        if not rules:
            return None
        if len(rules) == 1:
            return rules[0]
        return lambda pod: all(rule(pod) for rule in rules)

    def keep_pod_fields(self, paths: Iterable[str]) -> None:
        """Keep these fields of pods too (an adapter's ``CachedPodFieldsOptions``); a pod informer
        already running lists again to fill them in (``Informer.set_transform``).

        Raises ``ValueError`` on a path that is not a dotted path of field names."""
        with self._lock:
            wider = self._pod_fields.union(paths)
            if field_tree(wider) == field_tree(self._pod_fields):
                return
            self._pod_fields = wider
            transform = keeping(wider)
            pods = [i for resource, i in self._informers.items() if resource == kube.POD]
        for informer in pods:
            informer.set_transform(transform)

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        with self._lock:
            self._loop = loop
            informers = list(self._informers.values())
        for informer in informers:
            informer.start(loop)

    async def wait_synced(self, timeout: float = 60.0) -> None:
        await asyncio.gather(*(i.wait_synced(timeout) for i in list(self._informers.values())))

    @property
    def has_synced(self) -> bool:
        """Every informer created so far has its first list in the store."""
        with self._lock:
            return all(i.has_synced for i in self._informers.values())

    def stop(self, timeout: float = 2.0) -> None:
        """Stop every informer, waiting up to ``timeout`` in all (not each) for their threads."""
        with self._lock:
            informers = list(self._informers.values())
            self._informers.clear()
            self.generation += 1
        for informer in informers:
            informer.signal_stop()
        deadline = time.monotonic() + timeout
        for informer in informers:
            informer.stop(max(0.0, deadline - time.monotonic()))

    def reader(self) -> CacheReader:
        return CacheReader(self)

    def informers(self) -> builtins.list[Informer]:
        """The informers created so far (for metrics)."""
        with self._lock:
            return builtins.list(self._informers.values())


class CacheNotSynced(ResourceConsistError, TimeoutError):
    """A read of a cache whose first list is not in yet, made where it cannot wait for it.

    ``resource`` names the kind whose cache it is, so that whoever catches it can wait for that
    cache (``Informer.when_synced``): the controller keeps an event whose handler raised it and
    maps it again once that cache has synced (docs/concepts.md, "Events before the caches sync").
    """

    def __init__(self, message: str, resource: Resource | None = None) -> None:
        super().__init__(message)
        self.resource = resource


class CacheSyncTimeout(ResourceConsistError, TimeoutError):
    """A cache whose first list did not come within a deadline (``Informer.wait_synced``); its
    message names the resource and says why, in one line (``Informer.not_synced_because``)."""

    def __init__(self, informer: Informer, seconds: float, others: int = 0) -> None:
        #: The resource whose cache did not sync.
        self.resource = informer.resource
        #: The seconds it was given.
        self.seconds = seconds
        #: Why, and what to do (resourceconsist.cluster.diagnosis).
        self.because = informer.not_synced_because()
        #: How many other caches did not sync either.
        self.others = others
        also = f" (and {others} other{'s' if others > 1 else ''})" if others else ""
        super().__init__(
            f"the cache of {self.resource.plural}{also} did not sync within {seconds:g}s: {self.because}"
        )

    @classmethod
    def of(cls, unsynced: Sequence[Informer], seconds: float) -> CacheSyncTimeout:
        """The timeout of several caches, told by the first one whose list met an error (the
        likeliest to say why), else the first."""
        told = next((i for i in unsynced if i.list_error is not None), unsynced[0])
        return cls(told, seconds, len(unsynced) - 1)


def _on_event_loop() -> bool:
    """Whether the calling thread runs an asyncio event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


class StoreReader(abc.ABC):
    """The reads adapters and handlers make (``interfaces.ObjectReader``), as lookups in indexed
    stores (``indexers_for``); the subclass says where a kind's store comes from."""

    @abc.abstractmethod
    def _store(self, resource: Resource, namespace: str | None) -> Store:
        """The store holding ``resource`` in ``namespace`` (None: every namespace, or a
        cluster-scoped kind); it may hold other namespaces too."""

    def get(self, resource: Resource, namespace: str | None, name: str) -> KubeObject | None:
        key = f"{namespace}/{name}" if namespace and resource.namespaced else name
        return self._store(resource, namespace).get(key)

    def list(
        self,
        resource: Resource,
        namespace: str | None = None,
        label_selector: Mapping[str, Any] | None = None,
    ) -> builtins.list[KubeObject]:
        """Objects of a kind, optionally in one namespace and matching a ``metav1.LabelSelector``."""
        store = self._store(resource, namespace)
        if label_selector is not None and namespace is not None and (label_selector.get("matchLabels")):
            first_key, first_value = next(iter(label_selector["matchLabels"].items()))
            candidates = store.by_index(LABEL_INDEX, f"{namespace}/{first_key}={first_value}")
        else:
            candidates = store.list(namespace)
        if label_selector is None:
            return candidates
        return [o for o in candidates if label_selector_selects(label_selector, _labels(o))]

    def selected_by_map(
        self, resource: Resource, namespace: str, selector: Mapping[str, str] | None
    ) -> builtins.list[KubeObject]:
        """Objects in ``namespace`` selected by a Service-style selector map (empty selects none)."""
        if not selector:
            return []
        store = self._store(resource, namespace)
        # Intersect starting from the rarest pair, so the work is bounded by the smallest set.
        sets = sorted(
            (store.keys_by_index(LABEL_INDEX, f"{namespace}/{k}={v}") for k, v in selector.items()), key=len
        )
        keys = set(sets[0]).intersection(*sets[1:]) if sets else set()
        return [o for o in (store.get(k) for k in sorted(keys)) if o is not None]

    def pods_selected_by(self, service: KubeObject) -> builtins.list[KubeObject]:
        """The pods a Service's ``spec.selector`` selects."""
        return self.selected_by_map(kube.POD, _ns(service), service.get("spec", {}).get("selector"))

    def pods_with_finalizer(self, namespace: str, finalizer: str) -> builtins.list[KubeObject]:
        """The pods in ``namespace`` whose ``metadata.finalizers`` hold ``finalizer``."""
        return self._store(kube.POD, namespace).by_index(FINALIZER_INDEX, f"{namespace}/{finalizer}")

    def pods_with_readiness_gate(self, namespace: str, condition_type: str) -> builtins.list[KubeObject]:
        """The pods in ``namespace`` whose ``spec.readinessGates`` hold ``condition_type``, by name."""
        store = self._store(kube.POD, namespace)
        keys = sorted(store.keys_by_index(READINESS_GATE_INDEX, f"{namespace}/{condition_type}"))
        return [o for o in (store.get(k) for k in keys) if o is not None]

    def services_selecting(self, pod: KubeObject) -> builtins.list[KubeObject]:
        """The Services in the pod's namespace whose ``spec.selector`` selects it."""
        ns, labels = _ns(pod), _labels(pod)
        store = self._store(kube.SERVICE, ns)
        candidates: set[str] = set()
        for k, v in labels.items():
            candidates |= store.keys_by_index(SERVICE_SELECTOR_INDEX, f"{ns}/{k}={v}")
        found = [store.get(key) for key in sorted(candidates)]
        return [s for s in found if s is not None and map_selects(s.get("spec", {}).get("selector"), labels)]


class CacheReader(StoreReader):
    """Read-only, cache-backed lookups for adapters and handlers (never a LIST per call)."""

    def __init__(self, factory: InformerFactory) -> None:
        self._factory = factory
        self._synced: dict[Resource, tuple[int, Store]] = {}

    @property
    def client(self) -> KubeClient:
        return self._factory.client

    def _store(self, resource: Resource, namespace: str | None) -> Store:
        del namespace  # an informer holds every namespace it watches
        synced = self._synced.get(resource)
        if synced is not None and synced[0] == self._factory.generation:
            return synced[1]
        informer = self._factory.informer(resource)
        if informer.has_synced:
            # Every read of a pass goes through here: after the first sync, one dict lookup
            # (until the factory stops its informers).
            self._synced[resource] = (self._factory.generation, informer.store)
            return informer.store
        if _on_event_loop():
            # Waiting here would block the loop (resourceconsist.flow.cancellation: nothing on the loop
            # waits on a threading primitive). The controller and the webhook start their workers
            # only after wait_synced, so this is a read of a kind nobody waited for.
            raise CacheNotSynced(
                f"the cache of {resource.plural} has not synced yet and this read runs on the event "
                f"loop, where it must not wait: await the informer's wait_synced() first (a "
                f"controller does so for the kinds its watch options name), or read from a plain "
                f"adapter method, which runs in a worker thread and may wait",
                resource,
            )
        if not informer._synced.wait(60):
            raise CacheNotSynced(f"the cache of {resource.plural} did not sync within 60s", resource)
        return informer.store


class SnapshotReader(StoreReader):
    """The same reads straight from the API server, for one-off reads (``explain``, the
    hand-over): each kind of a namespace is listed once into an indexed store, so every answer
    of one run sees the same moment."""

    def __init__(self, client: KubeClient) -> None:
        self.client = client
        self._stores: dict[tuple[Resource, str | None], Store] = {}

    def _store(self, resource: Resource, namespace: str | None) -> Store:
        key = (resource, namespace if resource.namespaced else None)
        store = self._stores.get(key)
        if store is None:
            store = Store(indexers_for(resource))
            for item in self.client.list(resource, key[1]).get("items") or []:
                store.upsert(_as_stored(item, resource))
            self._stores[key] = store
        return store


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _labels(obj: KubeObject) -> dict[str, str]:
    return dict(obj.get("metadata", {}).get("labels") or {})
