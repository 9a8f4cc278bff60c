"""A controller: one adapter's watches, workqueue, workers and reconciler.

Employer and employee informer events pass the adapter's predicates, its handlers map them to
employer keys, the workqueue coalesces and rate-limits them, and up to ``max_concurrent``
workers run ``Reconciler.reconcile`` (never two on one key). A failed reconcile is retried with
the rate limiter's backoff, a success forgets the key's failures, ``requeue_after`` is honoured.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Protocol

from resourceconsist import errors, wire
from resourceconsist.adapter import (
    EventHandler,
    Predicate,
    RateLimiter,
    ReconcileAdapter,
    ReconcileContext,
)
from resourceconsist.cluster import kube
from resourceconsist.cluster.cache import CacheNotSynced, CacheReader, InformerFactory, WatchEvent
from resourceconsist.cluster.events import EventRecorder
from resourceconsist.cluster.interfaces import EventSink
from resourceconsist.cluster.kube import EmployerKey, KubeClient, KubeObject, Resource
from resourceconsist.errors import PassCancelled
from resourceconsist.flow.cancellation import Cancellation, running_pass
from resourceconsist.flow.fence import Fence, acting_for
from resourceconsist.hooks.handle import ControllerHandle
from resourceconsist.hooks.orphans import GarbageCollector
from resourceconsist.hooks.subresources import sync_sub_resources
from resourceconsist.hooks.subscribers import LifecycleSubscriber, SubscriberBus
from resourceconsist.options import DEFAULT_FULL_PASS_EVERY, GarbageOptions
from resourceconsist.reconcile import ReconcileError, Reconciler, Result, SyncFailedExist
from resourceconsist.reconcile.profile import AdapterProfile
from resourceconsist.runtime import logs
from resourceconsist.runtime.metrics import Metrics
from resourceconsist.runtime.parking import ParkedEvents
from resourceconsist.runtime.workqueue import (
    LOW_PRIORITY,
    NORMAL_PRIORITY,
    WorkQueue,
    default_controller_rate_limiter,
)

log = logging.getLogger(__name__)


class EmployerScope(Protocol):
    """Which employers a controller may act on, when another piece decides it: with sharding,
    this replica's share (resourceconsist/runtime/sharding/replica.py; docs/scaling.md). A
    controller built with none acts on every employer it watches."""

    def left(self, event: WatchEvent) -> bool:
        """A DELETED event of an employer that was not deleted but left the scope: nothing of it
        is released here."""

    def draining(self, obj: KubeObject | None) -> bool:
        """The employer is in scope and asked to be let go: acted on whatever the predicate says."""

    async def may_act(self, resource: Resource, key: EmployerKey, reader: CacheReader) -> bool:
        """Before each pass: whether a pass of ``key`` may run now (a draining employer is let
        go of here, in the worker that holds its key)."""

    def owns(self, resource: Resource, key: EmployerKey) -> bool:
        """A gone employer's key is in scope (its garbage pass runs here)."""


def queue_priority(event: WatchEvent) -> int:
    """The priority of the keys ``event`` maps to (docs/observability.md, "The workqueue's
    priorities"): low when a cache only listed the object again (its first list, a resync), so
    that such keys wait for every change; but an object being deleted (a pod its guard holds)
    never waits behind them, whatever brought its event."""
    if not event.unchanged or (event.obj.get("metadata") or {}).get("deletionTimestamp"):
        return NORMAL_PRIORITY
    return LOW_PRIORITY


#: Seconds a controller starting to lead waits for its caches before giving up (and stepping down).
CACHE_SYNC_TIMEOUT = 600.0


class Controller:
    """Runs one adapter; started and stopped by the manager without touching other controllers."""

    def __init__(
        self,
        adapter: ReconcileAdapter,
        client: KubeClient,
        informers: InformerFactory,
        *,
        member_clusters: dict[str, tuple[KubeClient, InformerFactory]] | None = None,
        metrics: Metrics | None = None,
        garbage: GarbageOptions | None = None,
        full_pass_every: float = DEFAULT_FULL_PASS_EVERY,
        peers: Callable[[], list[str]] = list,
        scope: EmployerScope | None = None,
        max_concurrent_reconciles: int | None = None,
        reconcile_timeout: float | None = None,
        fence: Fence | None = None,
    ) -> None:
        """``peers``: the names of the other controllers of the same manager that employ the
        same kind (the garbage pass asks; docs/lifecycle-hooks.md, "Gone employers"); ``scope``:
        which employers it may act on (None: every one it watches); ``max_concurrent_reconciles``:
        the manager's number of workers, over the adapter's own (None: the adapter's);
        ``reconcile_timeout``: seconds after which a worker's pass is cancelled (its deadline,
        ``ManagerOptions.reconcile_timeout``; None: never); ``fence``: the Lease it acts for
        (leader election's or the shard's), whose deadline every write it makes is checked
        against (resourceconsist/flow/fence.py; None: it holds none)."""
        #: The adapter as the frame reads it, resolved once (resourceconsist/reconcile/profile.py).
        self.profile = profile = AdapterProfile.of(adapter)
        self.adapter = profile.adapter
        self.name = profile.name
        self.client = client
        self.informers = informers
        self.metrics = metrics or Metrics()
        self.spec = profile.watch
        # The manager's setting (an operator's --max-concurrent-reconciles) wins over the adapter's.
        self.max_concurrent = max(1, max_concurrent_reconciles or profile.max_concurrent)
        self.rate_limiter: RateLimiter = profile.rate_limiter or default_controller_rate_limiter()
        #: controller-runtime's series of this controller and its queue (docs/observability.md).
        self.series = self.metrics.standard.controller(self.name, self.max_concurrent)
        self.queue = WorkQueue(self.rate_limiter, name=self.name, metrics=self.series.queue)
        #: The pod fields the adapter reads beyond the frame's own: every cache it reads keeps them.
        self.pod_fields = profile.pod_fields
        self.member_clusters = member_clusters if member_clusters is not None else {}
        try:
            for factory in (informers, *(f for _, f in self.member_clusters.values())):
                factory.keep_pod_fields(self.pod_fields)
        except ValueError as err:
            raise ValueError(f"adapter {self.name}: get_cached_pod_fields: {err}") from err
        self.reader: CacheReader = informers.reader()
        self._clusters: dict[str, tuple[KubeClient, CacheReader]] = {
            name: (c, f.reader()) for name, (c, f) in self.member_clusters.items()
        }
        self.subscribers = SubscriberBus(
            self.name, on_drop=self.metrics.subscriber_drops.labels(self.name).inc
        )
        retried = self.metrics.retried_failures
        self.reconciler = Reconciler(
            profile,
            client,
            self.reader,
            # Each Event names the pass that recorded it (docs/observability.md, "Logs").
            EventRecorder(client, self.name, annotate=_reconcile_id_annotation),
            self._clusters,
            api_down=lambda: client.reachability.down,
            report_unguarded=self.metrics.unguarded_routing_pods.labels(self.name).set,
            report_retried=lambda reason: retried.labels(self.name, reason).inc(),
            notify=self.subscribers.publish,
            full_pass_every=full_pass_every,
        )
        self.peers = peers
        #: What the garbage pass and the sub-resources step see of this controller.
        self.handle: ControllerHandle = _Handle(self)
        self.garbage = GarbageCollector(self.handle, garbage or GarbageOptions())
        self._garbage_task: asyncio.Task[None] | None = None
        self._workers: list[asyncio.Task[None]] = []
        #: The cancellations of the passes running now; ``stop`` cancels them.
        self._in_flight: set[Cancellation] = set()
        self._unsubscribe: list[Callable[[], None]] = []
        #: The events of each subscription waiting for a cache to sync (``ParkedEvents``).
        self._parked: list[ParkedEvents] = []
        #: The employer subscription's event function, fed every employer when an employee event
        #: could not be mapped; and whether that full pass is already on its way.
        self._employer_events: Callable[[WatchEvent], None] | None = None
        self._requeue_pending = False
        self.reconciles = 0
        self.failures = 0
        #: Which employers it may act on (with sharding, this replica's share); None: all.
        self.scope = scope
        #: Seconds a worker's pass may run before its cancellation's deadline passes; None: no limit.
        self.reconcile_timeout = reconcile_timeout
        #: The Lease its passes, garbage passes and their writes act for (None: no Lease).
        self.fence = fence

    def subscribe(self, subscriber: LifecycleSubscriber) -> None:
        """Tell ``subscriber`` what happens to this controller's pods and employers."""
        self.subscribers.add(subscriber)

    @property
    def employees_in_members(self) -> bool:
        return self.profile.employees_in_members()

    # -- watches ------------------------------------------------------------------------------------

    def _subscribe(
        self,
        informers: InformerFactory,
        resource: Resource,
        predicate: Predicate,
        to_keys: EventHandler,
        *,
        employees_of: str | None = None,
    ) -> None:
        """Queue the keys ``to_keys`` maps each event to. ``employees_of``: these are employee
        events of that cluster ("" for the main one), named to the reconciler so the next pass
        of each key knows what changed; otherwise employer events, which ask for a full pass
        (``ReconcileContext.changed``)."""
        # Handlers map events to employer keys, and employers live in the main cluster, so they
        # look up through the main cache even for events from a member cluster.
        reader = self.reader
        reconciler = self.reconciler
        suffix = f"{wire.MULTI_CLUSTER_SEPARATOR}{employees_of}" if employees_of else ""
        # The cache this side's own writes are checked against (podwriter.RecentWrites): the
        # member cluster's for its pods, else the main one (the employers' too).
        written_in = self._clusters[employees_of][1] if employees_of else self.reader
        side = "employer" if employees_of is None else "employee"

        # This controller's own writes of the objects of this side (podwriter.RecentWrites): an
        # event of an object with a write out waits for the answer, and a write's echo is news
        # to every employer but the one whose pass wrote and went on from the answer.
        own_writes = (
            reconciler.employer_writes.recent
            if employees_of is None
            else reconciler.recent
            if resource == kube.POD
            else None
        )

        def on_event(event: WatchEvent, again: bool = False) -> None:
            if own_writes is None or event.type != "MODIFIED" or again:
                handle(event, "", again)
                return
            meta = event.obj.get("metadata", {})
            own_writes.event(
                written_in,
                meta.get("namespace"),
                str(meta.get("name", "")),
                str(meta.get("resourceVersion", "")),
                lambda echo_of: handle(event, echo_of, again),
            )

        def handle(event: WatchEvent, echo_of: str, again: bool) -> None:
            """The event, ``echo_of`` the employer whose own write it brings back ("": none)."""
            if self.queue.shutting_down:
                return
            accepted = False
            scope = self.scope if employees_of is None else None
            try:
                if scope is not None and scope.left(event):
                    # Moved to another shard, not deleted: nothing of it is released here.
                    reconciler.let_go(kube.object_key(event.obj))
                    return
                # A drain is acted on whatever the adapter's predicate says (docs/scaling.md).
                if not (scope is not None and scope.draining(event.obj)) and not predicate(event):
                    return
                accepted = True
                if employees_of is None and echo_of:
                    return  # its own write coming back: the pass that wrote went on from the answer
                keys = to_keys(event, reader)
            except CacheNotSynced as err:
                # A cache the handler reads has not synced (a pod event before the Service
                # list): the event waits for it, then is mapped again (docs/concepts.md, "Events
                # before the caches sync").
                if not parked.park(event, err, again=again):
                    self._unmapped(side, resource, event, accepted)
                return
            except Exception:
                self._unmapped(side, resource, event, accepted)
                return
            meta = event.obj.get("metadata", {})
            # What changed is noted before the keys are queued: a pass that starts at once sees it.
            if employees_of is None:
                for key in keys:
                    reconciler.employer_changed(key)
            elif keys:
                name = f"{meta.get('name', '')}{suffix}"
                for key in keys:
                    reconciler.employee_changed(key, name)
            priority = queue_priority(event)
            # A pod write's echo is noted in its writer's changes above (its next pass reads the
            # pod), and queues no pass of it.
            for key in keys:
                if key != echo_of:
                    self.queue.add(key, priority)
            if employees_of is not None and resource == kube.POD:
                try:
                    reconciler.recent.settle(
                        written_in, str(meta.get("namespace") or ""), meta.get("name", "")
                    )
                except Exception:  # only a shortcut: the next pass reads the cache regardless
                    log.debug("%s: settling %s failed", self.name, kube.object_key(event.obj), exc_info=True)

        cluster = f" of cluster {employees_of}" if employees_of else ""
        parked = ParkedEvents(
            f"{self.name} ({side} {resource.plural}{cluster})",
            self.informers,
            lambda event: on_event(event, again=True),
        )
        if employees_of is None:
            self._employer_events = on_event
        self._unsubscribe.append(parked.clear)
        self._parked.append(parked)
        self._unsubscribe.append(informers.informer(resource).add_handler(on_event))

    def _unmapped(self, side: str, resource: Resource, event: WatchEvent, accepted: bool) -> None:
        """An event the adapter's predicate or handler failed on (called from the ``except``):
        logged once with the object's key, and made up for, since the employers it meant are
        unknown: an employee event gives every employer a full pass; an employer event that
        passed the predicate gives that employer one. An employer whose predicate failed is not
        queued: whether it is this controller's is unknown, and a pass writes to its pods."""
        key = kube.object_key(event.obj)
        if side == "employee":
            log.error(
                "%s: the employee %s failed on %s %s; queued every %s for a full pass",
                self.name,
                "handler" if accepted else "predicate",
                resource.kind,
                key,
                self.spec.employer.kind,
                exc_info=True,
            )
            self._requeue_every_employer()
        elif accepted:
            log.error(
                "%s: the employer handler failed on %s %s; queued it for a full pass",
                self.name,
                resource.kind,
                key,
                exc_info=True,
            )
            self.reconciler.employer_changed(key)
            self.queue.add(key)
        else:
            log.error(
                "%s: the employer predicate failed on %s %s; not queued (its next event asks again)",
                self.name,
                resource.kind,
                key,
                exc_info=True,
            )

    def _requeue_every_employer(self) -> None:
        """Feed every employer in the cache to the employer subscription (as the informer's
        periodic resync does), once the employer cache has synced; coalesced while pending."""
        if self._requeue_pending:
            return
        self._requeue_pending = True
        informer = self.informers.informer(self.spec.employer)

        def requeue() -> None:
            self._requeue_pending = False
            on_employer = self._employer_events
            if on_employer is None or self.queue.shutting_down:
                return
            for obj in informer.store.list():
                on_employer(WatchEvent("MODIFIED", obj, obj))

        informer.when_synced(requeue)

    def events_waiting(self) -> dict[str, int]:
        """The objects whose events wait for a cache to sync, by cache (for tests and debugging)."""
        waiting: dict[str, int] = {}
        for parked in self._parked:
            for plural, count in parked.waiting_for().items():
                waiting[plural] = waiting.get(plural, 0) + count
        return waiting

    def add_member_cluster(self, name: str, client: KubeClient, informers: InformerFactory) -> None:
        """Start watching employees in a new member cluster (multi-cluster adapters)."""
        informers.keep_pod_fields(self.pod_fields)
        self.member_clusters[name] = (client, informers)
        self._clusters[name] = (client, informers.reader())
        if self.employees_in_members and self._workers:
            self._subscribe(
                informers,
                self.spec.employee,
                self.spec.employee_predicate,
                self.spec.employee_handler,
                employees_of=name,
            )

    def remove_member_cluster(self, name: str) -> None:
        self.member_clusters.pop(name, None)
        self._clusters.pop(name, None)

    # -- life cycle ---------------------------------------------------------------------------------

    def warm_caches(self) -> None:
        """Create (and so start) the informers this controller reads, before it runs."""
        self.informers.informer(self.spec.employer)
        if self.employees_in_members:
            for _, informers in self.member_clusters.values():
                informers.informer(self.spec.employee)
        else:
            self.informers.informer(self.spec.employee)

    async def start(self) -> None:
        """Subscribe to the caches and start the workers (again, after a ``stop``)."""
        if self.queue.shutting_down:
            self.queue = WorkQueue(self.rate_limiter, name=self.name, metrics=self.series.queue)
        self._subscribe(
            self.informers, self.spec.employer, self.spec.employer_predicate, self.spec.employer_handler
        )
        if self.employees_in_members:
            for cluster, (_, informers) in self.member_clusters.items():
                self._subscribe(
                    informers,
                    self.spec.employee,
                    self.spec.employee_predicate,
                    self.spec.employee_handler,
                    employees_of=cluster,
                )
        else:
            self._subscribe(
                self.informers,
                self.spec.employee,
                self.spec.employee_predicate,
                self.spec.employee_handler,
                employees_of="",
            )
        # Long, as controller-runtime's cache sync timeout is for a reason: the Lease is renewed
        # meanwhile, and a first list of 100k pods on a busy API server takes minutes; one that
        # does not come steps this replica down (docs/concepts.md, "Leader election timings").
        await self.informers.wait_synced(CACHE_SYNC_TIMEOUT)
        self.subscribers.start()
        # Every task started here, and every thread they hand work to, acts for the fence's
        # Lease: their writes are refused once it is no longer surely held.
        with acting_for(self.fence):
            if self.garbage.wanted:
                self._garbage_task = asyncio.create_task(self.garbage.run(), name=f"{self.name}-garbage")
            self._workers = [
                asyncio.create_task(self._worker(i), name=f"{self.name}-worker-{i}")
                for i in range(self.max_concurrent)
            ]
        log.info(
            "controller %s started: %d workers, employer %s, employee %s",
            self.name,
            self.max_concurrent,
            self.spec.employer.kind,
            self.spec.employee.kind,
        )

    async def stop(self, timeout: float = 30.0) -> None:
        """Stop taking keys; tell in-flight passes at once that they are cancelled (adapters see
        ``ctx.cancellation``), give them ``timeout`` to end, then cancel their tasks (a blocking
        adapter call still running is abandoned in its daemon thread)."""
        for unsubscribe in self._unsubscribe:
            unsubscribe()
        self._unsubscribe.clear()
        self._parked.clear()
        self._employer_events = None
        self._requeue_pending = False
        if self._garbage_task is not None:
            self._garbage_task.cancel()
            await asyncio.gather(self._garbage_task, return_exceptions=True)
            self._garbage_task = None
        await self.queue.shutdown()
        for cancellation in list(self._in_flight):
            cancellation.cancel()
        if self._workers:
            _, pending = await asyncio.wait(self._workers, timeout=timeout)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            if pending:
                log.warning(
                    "controller %s: %d pass(es) still running after the %.1fs shutdown timeout abandoned",
                    self.name,
                    len(pending),
                    timeout,
                )
        self._workers = []
        await self.subscribers.stop()
        log.info("controller %s stopped", self.name)

    def abandon_passes(self, why: str) -> None:
        """End the passes still running at once, without waiting for them (their tasks are
        cancelled; a blocking adapter call still running is abandoned in its daemon thread), as
        ``stop`` does once its timeout is over."""
        running = self.queue.processing()
        for task in self._workers:
            task.cancel()
        if running:
            log.warning("controller %s: abandoned %d running pass(es): %s", self.name, len(running), why)

    # -- workers --------------------------------------------------------------------------------------

    def pass_fields(self, key: str) -> AbstractContextManager[None]:
        """The log fields of one pass of ``key`` (a fresh ``reconcileID``)."""
        employer = self.spec.employer
        return logs.pass_fields(self.name, employer.kind, employer.group, key)

    async def _worker(self, index: int) -> None:
        while True:
            queued = await self.queue.get()
            if queued is None:
                return
            # Parsed once per pass: every step reads the namespace and name from it.
            key = EmployerKey(queued)
            try:
                # Every line logged for this pass carries the controller, the employer and the
                # pass's reconcileID (docs/observability.md, "Logs").
                with self.pass_fields(key):
                    await self._process(key)
            finally:
                self.queue.done(key)

    async def _process(self, key: EmployerKey) -> None:
        started = time.monotonic()
        outcome = "success"
        # A retry or a requeue keeps the priority the key was handed out with (controller-runtime's).
        priority = self.queue.priority(key)
        # One cancellation per pass, current for everything the pass runs (adapter threads too),
        # with the reconcile timeout as its deadline (controller-runtime's ReconciliationTimeout).
        timeout = self.reconcile_timeout
        cancellation = Cancellation(None if timeout is None else started + timeout)
        self._in_flight.add(cancellation)
        self.series.active.inc()
        try:
            with running_pass(cancellation), self.metrics.bound(self.name):
                if self.scope is not None and not await self.scope.may_act(
                    self.spec.employer, key, self.reader
                ):
                    self.reconciler.let_go(key)
                    self.queue.forget(key)
                    return
                result = await self.reconciler.reconcile(key)
                await sync_sub_resources(self.handle, key)
        except asyncio.CancelledError:
            raise
        except PassCancelled as err:
            outcome = "cancelled"
            self.failures += 1
            delay = self.queue.add_rate_limited(key, priority)
            log.info("%s %s: pass abandoned (%s)", self.name, key, err)
        except Exception as err:
            outcome = "error"
            self.failures += 1
            steer = errors.steering(err)
            bug = errors.programming_error(err)
            if bug is not None:
                # A bug, the frame's or the adapter's, however the pass reported it: what
                # controller-runtime counts, and logs with where it was raised, as a recovered
                # panic (docs/observability.md). A pass's own failure said only its message.
                self.series.panicked()
                if isinstance(err, ReconcileError):
                    message = "%s %s: a bug, in the adapter or the frame: %r"
                    log.error(message, self.name, key, bug, exc_info=bug)
            if isinstance(steer, errors.PermanentError):
                # Retrying cannot help: wait for the employer's next change (docs/concepts.md).
                self.series.terminal()
                self.queue.forget(key)
                log.warning("%s %s: permanent failure, not retried until it changes: %s", self.name, key, err)
            elif isinstance(steer, errors.RetryAfter):
                self.queue.forget(key)
                self.queue.add_after(key, steer.seconds, priority)
                # Asked by the adapter, or by the frame for a conflict (docs/concepts.md).
                log.info("%s %s: retry in %.3gs as asked: %s", self.name, key, steer.seconds, err)
            elif isinstance(err, ReconcileError | SyncFailedExist):
                delay = self.queue.add_rate_limited(key, priority)
                log.debug("%s %s: retry in %.3fs after: %s", self.name, key, delay, err)
            elif kube.is_unreachable(err) or self.client.reachability.down:
                delay = self.queue.add_rate_limited(key, priority)
                # The client logs the outage once (transport.Reachability); a traceback per retry
                # would say nothing more.
                log.debug("%s %s: API server unreachable (%s); retry in %.3fs", self.name, key, err, delay)
            else:
                delay = self.queue.add_rate_limited(key, priority)
                log.exception("%s %s: reconcile crashed; retry in %.3fs", self.name, key, delay)
        else:
            if result.requeue_after is not None:
                outcome = "requeue_after"
                self.queue.forget(key)
                self.queue.add_after(key, result.requeue_after, priority)
            else:
                self.queue.forget(key)
        finally:
            self._in_flight.discard(cancellation)
            self.reconciles += 1
            ended = time.monotonic()
            seconds = ended - started
            if (
                cancellation.deadline is not None
                and ended >= cancellation.deadline
                and not cancellation.stopped
            ):
                # The deadline passed while the pass ran, however it then ended.
                self.series.timed_out()
            self.series.active.dec()
            self.series.reconciled(outcome, seconds)
            self.metrics.observe_reconcile(self.name, outcome, seconds)
            self.metrics.queue_depth.labels(self.name).set(len(self.queue))


def _reconcile_id_annotation() -> dict[str, str]:
    """The Event annotation naming the running pass (none outside a pass)."""
    reconcile_id = logs.current_fields().get(logs.RECONCILE_ID)
    return {wire.RECONCILE_ID_ANNOTATION: reconcile_id} if reconcile_id else {}


class _Handle:
    """``ControllerHandle`` over one controller: what runs beside it reads and does this, no more."""

    def __init__(self, controller: Controller) -> None:
        self._controller = controller

    @property
    def name(self) -> str:
        return self._controller.name

    @property
    def adapter(self) -> ReconcileAdapter:
        return self._controller.adapter

    @property
    def profile(self) -> AdapterProfile:
        return self._controller.profile

    @property
    def employer(self) -> Resource:
        return self._controller.spec.employer

    @property
    def client(self) -> KubeClient:
        return self._controller.client

    @property
    def reader(self) -> CacheReader:
        return self._controller.reader

    @property
    def recorder(self) -> EventSink:
        return self._controller.reconciler.recorder

    @property
    def synced(self) -> bool:
        return self._controller.informers.has_synced

    @property
    def namespaces(self) -> tuple[str, ...] | None:
        return self._controller.informers.namespaces

    @property
    def follows_lifecycle(self) -> bool:
        return self._controller.reconciler.follows_lifecycle

    @property
    def employees_in_members(self) -> bool:
        return self._controller.employees_in_members

    def watches(self, key: str) -> bool:
        key = EmployerKey(key)
        if self.employer.namespaced and not self._controller.informers.watches(key.namespace):
            return False
        # With sharding, a gone employer is the business of the one shard its key hashes to.
        scope = self._controller.scope
        return scope is None or scope.owns(self.employer, key)

    def peers(self) -> list[str]:
        return self._controller.peers()

    def claim(self, key: str) -> bool:
        return self._controller.queue.claim(key)

    def done(self, key: str) -> None:
        self._controller.queue.done(key)

    def context(self, key: str) -> ReconcileContext:
        return self._controller.reconciler.context(key)

    async def run_pass(self, key: str, *, stand_in: KubeObject | None = None) -> Result:
        controller = self._controller
        cancellation = Cancellation()
        # Registered like a worker's pass, so that ``Controller.stop`` cancels it too.
        controller._in_flight.add(cancellation)
        try:
            with (
                controller.pass_fields(key),
                running_pass(cancellation),
                controller.metrics.bound(controller.name),
            ):
                return await controller.reconciler.reconcile(key, stand_in=stand_in)
        finally:
            controller._in_flight.discard(cancellation)

    def count_collected(self) -> None:
        self._controller.metrics.orphans_collected.labels(self.name).inc()

    def report_held(self, pods: int) -> None:
        self._controller.metrics.pods_held_by_gone_employers.labels(self.name).set(pods)
