"""The manager: one process running several controllers, the webhook, health and metrics.

Controllers share the informer caches of the main cluster; each has its own queue and
workers, so a failing or slow adapter never stalls another. Adapters can be added and stopped
at runtime. Extra runnables (the webhook server) start and stop with the manager. Shutdown
stops taking work and waits for in-flight reconciles up to a timeout.
(Go: ``AddToMgr`` is ``add_to_manager`` here.)

With sharding (``ShardingOptions``; docs/scaling.md) every replica runs its controllers on its
share of the employers, held by its own shard Lease, and one of them runs the sharder.

Its settings are one frozen ``ManagerOptions`` (controller-runtime's ``manager.Options``), with
``LeaderElectionOptions`` and ``GarbageOptions`` inside, all in ``resourceconsist.options``;
``resourceconsist run`` builds it from its flags (docs/reference/options.md).
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import logging
import threading
import time
import warnings
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Unpack

from resourceconsist import wire
from resourceconsist.adapter import ReconcileAdapter
from resourceconsist.cluster import kube
from resourceconsist.cluster.cache import Informer, InformerFactory, WatchEvent
from resourceconsist.cluster.kube import KubeClient, Resource
from resourceconsist.errors import ResourceConsistError
from resourceconsist.flow import budget
from resourceconsist.flow.cancellation import DaemonThreadExecutor
from resourceconsist.hooks.subscribers import LifecycleSubscriber
from resourceconsist.options import ManagerKeywords, ManagerOptions, ProviderBudgetOptions
from resourceconsist.runtime.controller import Controller
from resourceconsist.runtime.leaderelection import LeaderElector
from resourceconsist.runtime.metrics import Metrics, health_app
from resourceconsist.runtime.multicluster import ClusterRegistry, MemberCluster
from resourceconsist.runtime.sharding.pods import ShardPods, changes_share
from resourceconsist.runtime.sharding.ring import ShardState, budget_share, shard_of_lease
from resourceconsist.runtime.sharding.shard import ShardGate
from resourceconsist.runtime.sharding.sharder import Sharder, SharderRound

if TYPE_CHECKING:
    # Imported where the health endpoints start: a run without them never loads aiohttp.
    from aiohttp import web

log = logging.getLogger(__name__)

#: Seconds a shard's pod cache waits for its Service cache before its first list
#: (``Manager._wait_for_services``).
SERVICES_WAIT = 60.0
#: A shard's pods are listed again once its Services have stopped arriving for this many
#: seconds, and at most ``RELIST_AT_MOST`` seconds after the first: a wave of Services moving
#: to it costs one list of every pod, not one per Service (``Manager._relist_pods_on_new_share``).
RELIST_QUIET = 1.0
RELIST_AT_MOST = 5.0


@dataclass
class Runnable:
    """Something started and stopped with the manager (e.g. the webhook server)."""

    name: str
    start: Callable[[], Awaitable[None]]
    stop: Callable[[], Awaitable[None]]


class DuplicateControllerError(ResourceConsistError, ValueError):
    """Two adapters with the same controller name."""


class Manager:
    """Runs controllers and runnables against one main cluster.

    Its settings are ``options``: ``Manager(client, ManagerOptions(namespace="shop"))``. The
    fields as keywords (``Manager(client, namespace="shop")``, ``ManagerKeywords``) are
    deprecated: they still override the options' fields, with a ``DeprecationWarning``
    (docs/reference/options.md, "Manager").
    """

    def __init__(
        self,
        client: KubeClient,
        options: ManagerOptions | None = None,
        **keywords: Unpack[ManagerKeywords],
    ) -> None:
        options = options if options is not None else ManagerOptions()
        if keywords:
            fields = ", ".join(f"{name}=..." for name in keywords)
            warnings.warn(
                f"Manager(client, {fields}) is deprecated: pass the settings as one options object, "
                f"Manager(client, ManagerOptions({fields}))",
                DeprecationWarning,
                stacklevel=2,
            )
            options = dataclasses.replace(options, **keywords)
        #: The settings this manager runs with.
        self.options = options
        self.client = client
        # One API budget per provider account, process-wide: this manager's settings apply to
        # every adapter it runs (docs/concepts.md, "The provider budget").
        before = dataclasses.replace(budget.settings(), share=1.0)
        if before not in (ProviderBudgetOptions(), self.options.provider_budget):
            log.warning(
                "provider budget: this manager's settings (%s) replace another manager's (%s) for "
                "every provider account of the process (one budget per account per process); give "
                "the managers of one process the same settings",
                self.options.provider_budget,
                before,
            )
        budget.configure(self.options.provider_budget)
        self.subscribers: list[LifecycleSubscriber] = []
        self.informers = InformerFactory(
            client,
            resync_period=self.options.resync_period,
            namespaces=self.options.watched_namespaces or (),
        )
        if self.options.pod_label_selector is not None:
            # The controlled pods and those an employer may still hold (docs/concepts.md, "Pods
            # the caches keep"); a selector the API server would refuse is refused here.
            self.informers.keep_pods(self.options.pod_label_selector)
        self.metrics = Metrics()
        self.metrics.watch_cluster(client, self.informers)
        self.clusters = ClusterRegistry()
        self.clusters.subscribe(self._on_cluster)
        self.controllers: dict[str, Controller] = {}
        self.runnables: list[Runnable] = []
        self._stop_timeout = self.options.shutdown_timeout
        self._started = False
        election = self.options.leader_election
        self._elector = LeaderElector(client, election) if election is not None else None
        sharding = self.options.sharding
        #: With sharding: the ring's shard Leases, this replica's shard, the sharder's election
        #: and, while this replica runs it, the sharder (docs/scaling.md).
        self.shard: ShardGate | None = None
        self.sharder: Sharder | None = None
        self._shard_leases: InformerFactory | None = None
        self._sharder_elector: LeaderElector | None = None
        self._sharder_task: asyncio.Task[None] | None = None
        self._unsubscribe_share: Callable[[], None] | None = None
        self._shard_pods: ShardPods | None = None
        if sharding is not None:
            election = sharding.lease_options()
            self._elector = LeaderElector(
                client,
                election,
                labels={wire.SHARD_RING_LABEL: sharding.controller_ring},
                release_on_cancel=sharding.release_on_cancel,
            )
            self._shard_leases = InformerFactory(client, namespace=self._elector.namespace)
            self._shard_leases.select(kube.LEASE, f"{wire.SHARD_RING_LABEL}={sharding.controller_ring}")
            self.shard = ShardGate(
                client,
                sharding.controller_ring,
                sharding.shard_name,
                self._leases_informer(),
                on_drained=self.metrics.shard_drains.inc,
            )
            # The pods of this shard's Services only (docs/scaling.md, "What a shard's employers
            # need of pods"); every pod while a controller of another kind runs.
            shard_pods = ShardPods(self.shard, self.informers.reader(), self._services_synced)
            self._shard_pods = shard_pods
            self.informers.restrict_pods(
                lambda pod: not self._pods_divide() or shard_pods.keeps(pod), wait=self._wait_for_services
            )
            if sharding.sharder:
                self._sharder_elector = LeaderElector(
                    client, sharding.sharder_options(), release_on_cancel=sharding.release_on_cancel
                )
        #: Ends the pod re-lists on this shard's Service changes (``_relist_pods_on_new_share``).
        self._unrelist: Callable[[], None] = lambda: None
        #: The Services whose pods a pod list was asked for since they came to this shard.
        self._pods_listed_for: set[str] = set()
        self._elector_stop = asyncio.Event()
        self._elector_task: asyncio.Task[None] | None = None
        #: Controllers run only while this is True: always without leader election.
        self.leading = election is None
        #: client-go's ``leader_election_master_status{name}`` of the Lease, with leader election.
        self._lease_status = (
            self.metrics.standard.leader_status.labels(election.name) if election is not None else None
        )
        self._report_leading()
        self._servers: list[web.AppRunner] = []
        #: The port ``/healthz`` and ``/readyz`` are served on, once started (None: not served).
        self.health_port: int | None = None
        #: The port ``/metrics`` is served on, once started (None: not served).
        self.metrics_port: int | None = None

    @property
    def started(self) -> bool:
        """``start`` ran and ``stop`` has not."""
        return self._started

    def ready(self) -> bool:
        """Started and every informer cache synced (what ``/readyz`` answers)."""
        return self._started and self.informers.has_synced

    # -- controllers --------------------------------------------------------------------------------

    async def add(self, adapter: ReconcileAdapter) -> Controller:
        """Add an adapter's controller; it starts now when the manager runs, else with it."""
        name = adapter.get_controller_name()
        if name in self.controllers:
            raise DuplicateControllerError(f"a controller named {name!r} is already in this manager")
        members = {n: (m.client, m.informers) for n, m in self.clusters.members().items()}

        def peers() -> list[str]:
            # A gone employer found only from its pods' marks may be any of these controllers'
            # (docs/lifecycle-hooks.md, "Gone employers").
            return [
                n
                for n, c in self.controllers.items()
                if c is not controller and c.spec.employer == controller.spec.employer
            ]

        controller = Controller(
            adapter,
            self.client,
            self.informers,
            member_clusters=members,
            metrics=self.metrics,
            garbage=self.options.garbage,
            full_pass_every=self.options.full_pass_every,
            peers=peers,
        )
        for subscriber in self.subscribers:
            controller.subscribe(subscriber)
        if self.shard is not None:
            # This replica caches and acts on its share of the employers only (docs/scaling.md).
            self.informers.select(controller.spec.employer, self.shard.selector)
            controller.shard = self.shard
            controller.shard_pods_ready = self._shard_pods_ready
        self.controllers[name] = controller
        if self.shard is not None and self._started:
            # What this shard's pod cache keeps may have changed with the controllers' kinds.
            self.informers.informer(kube.POD).relist()
        if self._started and self.leading:
            await controller.start()
        sharder = self.sharder
        if sharder is not None and controller.spec.employer not in {r for r, _ in sharder.employers}:
            # The running sharder watches the kinds of the controllers it started with.
            await self._stop_sharder()
            await self._start_sharder()
        return controller

    def subscribe(self, subscriber: LifecycleSubscriber) -> None:
        """Tell ``subscriber`` what happens in every controller, present and added later
        (``Controller.subscribe`` for one controller; docs/lifecycle-hooks.md)."""
        self.subscribers.append(subscriber)
        for controller in self.controllers.values():
            controller.subscribe(subscriber)

    async def stop_controller(self, name: str, timeout: float | None = None) -> None:
        """Stop and remove one controller; the others keep running."""
        controller = self.controllers.pop(name, None)
        if controller is None:
            raise LookupError(
                f"no controller named {name!r} (running: {', '.join(sorted(self.controllers)) or 'none'})"
            )
        await controller.stop(self.options.shutdown_timeout if timeout is None else timeout)

    def add_runnable(self, runnable: Runnable) -> None:
        """Start ``runnable`` with the manager and stop it after the controllers (in reverse order)."""
        self.runnables.append(runnable)

    def _on_cluster(self, name: str, member: MemberCluster | None) -> None:
        if member is None:
            self.metrics.unwatch_cluster(name)
        else:
            self.metrics.watch_cluster(member.client, member.informers, name)
        for controller in self.controllers.values():
            if member is None:
                controller.remove_member_cluster(name)
            else:
                controller.add_member_cluster(name, member.client, member.informers)

    # -- life cycle -------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Start informers, health endpoints and runnables, then the controllers (at once, or
        when this replica wins the leader election)."""
        loop = asyncio.get_running_loop()
        # asyncio.to_thread (adapters' own blocking calls, the kube client's) runs in daemon
        # threads: one stuck in a hung provider is abandoned on stop instead of keeping the
        # process alive (docs/concepts.md, "Stopping within the shutdown timeout").
        loop.set_default_executor(DaemonThreadExecutor(name="resourceconsist-io"))
        if self.shard is not None:
            self.shard.open = True
        if self.shard is not None and self._pods_divide():
            # Subscribed before the caches start, so the Services' events are the list's, made
            # before the pods' list started: a replay to a later subscriber carries the replay's
            # moment and would ask for a needless second list of every pod.
            self._unrelist = self._relist_pods_on_new_share()
        self.informers.start(loop)
        self.clusters.bind(loop)
        await self._serve_endpoints()
        for runnable in self.runnables:
            await runnable.start()
        self._started = True
        # Every replica fills its caches now, so a new leader starts from warm caches (and a
        # standby's webhook can answer from them).
        for controller in self.controllers.values():
            controller.warm_caches()
        if self._elector is None:
            await self._start_controllers()
        else:
            self._elector_stop.clear()
            self._elector_task = asyncio.create_task(
                self._elector.run(self._start_controllers, self._stop_controllers, self._elector_stop)
            )
        if self._shard_leases is not None:
            # Made again after a stop (stopping a factory drops its informers).
            assert self.shard is not None
            self.shard.leases = self._leases_informer()
            self._unsubscribe_share = self.shard.leases.add_handler(self._share_budget)
            self._shard_leases.start(loop)
        if self._sharder_elector is not None:
            self._sharder_task = asyncio.create_task(
                self._sharder_elector.run(self._start_sharder, self._stop_sharder, self._elector_stop)
            )
        log.info("manager started: %s", ", ".join(sorted(self.controllers)) or "no controllers")

    def _report_leading(self) -> None:
        self.metrics.leader.set(1 if self.leading else 0)
        if self._lease_status is not None:
            self._lease_status.set(1 if self.leading else 0)

    async def _serve_endpoints(self) -> None:
        """``/healthz`` and ``/readyz`` on the health probe address, ``/metrics`` on the metrics
        address: one server when both name the same port (or the deprecated ``health_address``)."""
        options = self.options
        endpoints: list[tuple[tuple[str, int], bool, bool]] = []  # (address, probes, metrics)
        if options.health_address is not None:
            endpoints.append((options.health_address, True, True))
        elif options.metrics_address is not None and _one_port(
            options.metrics_address, options.health_probe_address
        ):
            endpoints.append((options.metrics_address, True, True))
        else:
            if options.health_probe_address is not None:
                endpoints.append((options.health_probe_address, True, False))
            if options.metrics_address is not None:
                endpoints.append((options.metrics_address, False, True))
        if not endpoints:
            return
        from aiohttp import web

        try:
            for address, probes, exposition in endpoints:
                runner = web.AppRunner(
                    health_app(self.metrics, self.ready, probes=probes, exposition=exposition),
                    access_log=None,
                )
                await runner.setup()
                self._servers.append(runner)
                await web.TCPSite(runner, *address).start()
                port = _bound_port(runner, address[1])
                if probes:
                    self.health_port = port
                if exposition:
                    self.metrics_port = port
        except BaseException:
            # A port in use: nothing stays bound for a start that failed.
            for server in self._servers:
                await server.cleanup()
            self._servers.clear()
            raise

    def _share_budget(self, event: WatchEvent) -> None:
        """Take this replica's share of the provider budget: the configured share over the ring's
        ready shards, looked at again on every Lease event (each renewal is one, so a shard gone
        silent is noticed within a retry period of the others'; docs/scaling.md)."""
        assert self.shard is not None and self.shard.leases is not None
        now = datetime.datetime.now(datetime.UTC)
        ring_share = budget_share(shard_of_lease(lease, now) for lease in self.shard.leases.store.list())
        configured = self.options.provider_budget
        wanted = dataclasses.replace(configured, share=configured.share * ring_share)
        if budget.settings() != wanted:
            budget.configure(wanted)
            if configured.rate is None:
                return  # no rate to divide: nothing an operator needs to hear
            log.info(
                "shard %s takes 1/%d of the provider budget (ready shards of the ring %s)",
                self.shard.shard,
                round(1 / ring_share),
                self.shard.ring,
            )

    def _pods_divide(self) -> bool:
        """Every controller employs pods for Services: a shard's pods are its Services' (with
        sharding; resourceconsist/runtime/sharding/pods.py)."""
        specs = [c.spec for c in list(self.controllers.values())]
        return bool(specs) and all(s.employer == kube.SERVICE and s.employee == kube.POD for s in specs)

    def _services_synced(self) -> bool:
        """This shard's Service cache is made and has its first list."""
        return any(i.resource == kube.SERVICE and i.has_synced for i in self.informers.informers())

    def _wait_for_services(self, stop: threading.Event) -> None:
        """Before the pod cache's first list (in its informer thread): this shard's Service
        cache, so that the list keeps the shard's share, not every pod of the watched namespaces
        to be listed again (docs/scaling.md, "What a shard's employers need of pods"). At most
        ``SERVICES_WAIT`` seconds: then the pods are listed, kept whole until it has synced."""
        deadline = time.monotonic() + SERVICES_WAIT
        while not stop.is_set() and time.monotonic() < deadline:
            if not self._pods_divide():
                return
            services = next((i for i in self.informers.informers() if i.resource == kube.SERVICE), None)
            if services is None:
                stop.wait(0.05)  # the controller's caches are being made
            elif services.synced_within(0.5):
                return

    def _relist_pods_on_new_share(self) -> Callable[[], None]:
        """List the pods again whenever this shard's Services change what it must keep (one
        arrived, a selector changed), once such changes have gone quiet for ``RELIST_QUIET``
        seconds (at most ``RELIST_AT_MOST`` after the first): the pod cache is not current from
        the first change on, so the pass such an event queues waits for the list (``Controller``).
        Re-lists asked for while one runs make one more, not one each (``Informer.relist``); none
        is asked for when a list that started after the change is in (``Informer.listed_since``:
        the Services a shard starts with). Returns the unsubscribe."""
        pods = self.informers.informer(kube.POD)
        services = self.informers.informer(kube.SERVICE)
        shard_pods = self._shard_pods

        def on_service(event: WatchEvent) -> None:
            key = kube.object_key(event.obj)
            if event.type == "DELETED":
                self._pods_listed_for.discard(key)
            elif changes_share(event):
                self._pods_listed_for.add(key)
                if not pods.listed_since(event.at):
                    pods.relist(quiet=RELIST_QUIET, at_most=RELIST_AT_MOST)

        def on_services_synced() -> None:
            # Pods kept before the Service cache was in (every one) are let go by a new list.
            if shard_pods is None or shard_pods.kept_unjudged():
                pods.relist()

        withdraw = services.when_synced(on_services_synced)
        remove = services.add_handler(on_service)

        def unsubscribe() -> None:
            withdraw()
            remove()

        return unsubscribe

    async def _shard_pods_ready(self, key: str) -> None:
        """Before a pass of the Service ``key`` on this shard: its pods are in the pod cache. A
        Service the cache already holds but whose ADDED event has not been handed out yet (a pod
        event found it first) asks for the list here."""
        if not self._pods_divide():
            return
        pods = self.informers.informer(kube.POD)
        if key not in self._pods_listed_for:
            self._pods_listed_for.add(key)
            pods.relist()
        if not pods.current:
            await pods.wait_synced()

    def _leases_informer(self) -> Informer:
        assert self._shard_leases is not None
        return self._shard_leases.informer(kube.LEASE)

    async def _start_sharder(self) -> None:
        sharding = self.options.sharding
        assert sharding is not None
        by_kind: dict[Resource, list[Controller]] = {}
        for controller in self.controllers.values():
            by_kind.setdefault(controller.spec.employer, []).append(controller)
        self.sharder = Sharder(
            self.client,
            sharding.controller_ring,
            self._leases_informer(),
            [(resource, _any_accepts(controllers)) for resource, controllers in by_kind.items()],
            namespaces=self.options.watched_namespaces or (),
            resync=sharding.sharder_resync,
            report=self._report_round,
        )
        await self.sharder.start()

    def _report_round(self, done: SharderRound) -> None:
        metrics = self.metrics
        metrics.sharder_moves.labels("assign").inc(done.assigned)
        metrics.sharder_moves.labels("drain").inc(done.drained)
        for state in (ShardState.READY, ShardState.EXPIRED, ShardState.UNCERTAIN, ShardState.DEAD):
            metrics.sharder_shards.labels(str(state)).set(sum(1 for s in done.shards.values() if s == state))

    async def _stop_sharder(self) -> None:
        if self.sharder is not None:
            await self.sharder.stop()
            self.sharder = None
            # Only the replica running the sharder reports the ring: a replica that stopped
            # running it (stepped down, stopping) would show a ring no one watches any more
            # (docs/observability.md, "A sample dashboard": "Shards by state").
            self.metrics.sharder_shards.clear()

    async def _start_controllers(self) -> None:
        self.leading = True
        self._report_leading()
        await asyncio.gather(*(c.start() for c in self.controllers.values()))

    async def _stop_controllers(self) -> None:
        self.leading = self._elector is None
        self._report_leading()
        stopping = asyncio.gather(*(c.stop(self._stop_timeout) for c in self.controllers.values()))
        if self._elector is None:
            await stopping
            return
        # Passes may take the shutdown timeout to end only while the Lease is still this
        # replica's: one that outlives it is abandoned first (docs/scaling.md, "Stopping").
        watch = asyncio.create_task(self._abandon_passes_before_lease_ends(self._elector))
        try:
            await stopping
        finally:
            watch.cancel()
            await asyncio.gather(watch, return_exceptions=True)

    async def _abandon_passes_before_lease_ends(self, elector: LeaderElector) -> None:
        """Abandon the passes still running one retry period before another replica could take
        the Lease over (a Lease still being renewed, while a graceful stop waits, moves that
        moment on)."""
        margin = elector.options.retry_period
        # A deadline that renewals move on, not an event: sleeping until it is the wait.
        while (left := elector.lease_left() - margin) > 0:  # noqa: ASYNC110
            await asyncio.sleep(left)
        for controller in self.controllers.values():
            controller.abandon_passes(f"the Lease {elector.options.name} is no longer renewed")

    async def stop(self, timeout: float | None = None) -> None:
        """Graceful shutdown: controllers finish in-flight work within ``timeout``, then all stops."""
        timeout = self.options.shutdown_timeout if timeout is None else timeout
        self._stop_timeout = timeout
        if self.shard is not None:
            # No pass starts from now on, even while the elector finishes a renewal in flight
            # (docs/scaling.md, "Stopping").
            self.shard.open = False
        if self._elector_task is not None:
            # The elector stops the controllers and releases the lease on its way out.
            self._elector_stop.set()
            await self._elector_task
            self._elector_task = None
        if self._sharder_task is not None:
            await self._sharder_task
            self._sharder_task = None
        if self._unsubscribe_share is not None:
            self._unsubscribe_share()
            self._unsubscribe_share = None
        if self._shard_leases is not None:
            await asyncio.to_thread(self._shard_leases.stop)
        await asyncio.gather(*(c.stop(timeout) for c in self.controllers.values()))
        for runnable in reversed(self.runnables):
            try:
                await runnable.stop()
            except Exception:
                log.exception("stopping %s failed", runnable.name)
        for server in self._servers:
            await server.cleanup()
        self._servers.clear()
        self.clusters.stop_all()
        self._unrelist()
        self._pods_listed_for.clear()
        await asyncio.to_thread(self.informers.stop)
        self._started = False
        log.info("manager stopped")

    async def run(self, stop: asyncio.Event) -> None:
        """Start, run until ``stop`` is set, then shut down gracefully."""
        await self.start()
        try:
            await stop.wait()
        finally:
            await self.stop()


async def add_to_manager(manager: Manager, adapter: ReconcileAdapter) -> Controller:
    """Go's ``AddToMgr``: a controller for ``adapter`` with the default or its own options."""
    return await manager.add(adapter)


def _any_accepts(controllers: list[Controller]) -> Callable[[WatchEvent], bool]:
    """An employer is the ring's when a controller of its kind would reconcile it."""
    predicates = [c.spec.employer_predicate for c in controllers]
    return lambda event: any(predicate(event) for predicate in predicates)


def _one_port(metrics: tuple[str, int], probes: tuple[str, int] | None) -> bool:
    """Metrics and probes name the same port (port 0 asks each server for a free one of its own)."""
    return metrics == probes and metrics[1] != 0


def _bound_port(runner: web.AppRunner, fallback: int) -> int:
    """The port a site really bound (the requested one may be 0: any free port)."""
    for address in runner.addresses:
        if isinstance(address, tuple) and len(address) >= 2:
            return int(address[1])
    return fallback
