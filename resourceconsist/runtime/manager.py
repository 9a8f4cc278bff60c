"""The manager: one process running several controllers, the webhook, health and metrics.

Controllers share the informer caches of the main cluster; each has its own queue and
workers, so a failing or slow adapter never stalls another. Adapters can be added and stopped
at runtime. Extra runnables (the webhook server) start and stop with the manager. Shutdown
stops taking work and waits for in-flight reconciles up to a timeout.
(Go: ``AddToMgr`` is ``add_to_manager`` here.)

With sharding (``ShardingOptions``; docs/scaling.md) every replica runs its controllers on its
share of the employers, held by its own shard Lease, and one of them runs the sharder: all of it
is one runnable (resourceconsist/runtime/sharding/replica.py) that the manager wires in, never
logic of the manager's own.

Its settings are one frozen ``ManagerOptions`` (controller-runtime's ``manager.Options``), with
``LeaderElectionOptions`` and ``GarbageOptions`` inside, all in ``resourceconsist.options``;
``resourceconsist run`` builds it from its flags (docs/reference/options.md).

A start that cannot finish fails cleanly: a stop asked for while it is under way (caches filling,
a Lease awaited, the webhook's certificate bootstrapped) ends it at once, and caches that do not
fill within ``cache_sync_timeout`` fail it with ``CacheSyncTimeout``, one line naming the
resource, why and what to do; ``/readyz`` says why meanwhile (docs/observability.md, "When the
start fails").
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from resourceconsist.adapter import ReconcileAdapter
from resourceconsist.cluster.cache import CacheSyncTimeout, InformerFactory
from resourceconsist.cluster.kube import KubeClient
from resourceconsist.errors import ResourceConsistError
from resourceconsist.flow import budget
from resourceconsist.flow.cancellation import DaemonThreadExecutor
from resourceconsist.hooks.subscribers import LifecycleSubscriber
from resourceconsist.options import ManagerOptions, ProviderBudgetOptions, SecureMetricsOptions
from resourceconsist.runtime.controller import Controller
from resourceconsist.runtime.drain import DrainEndpoint
from resourceconsist.runtime.endpoints import EndpointServer, Guard
from resourceconsist.runtime.leaderelection import LeaderElector
from resourceconsist.runtime.metrics import Metrics, probe_routes
from resourceconsist.runtime.multicluster import ClusterRegistry, MemberCluster
from resourceconsist.runtime.sharding.replica import ShardedReplica

if TYPE_CHECKING:
    from resourceconsist.cluster.certwatcher import CertificateReloader
    from resourceconsist.runtime.metricsauth import MetricsAuthorizer

log = logging.getLogger(__name__)


@dataclass
class Runnable:
    """Something started and stopped with the manager (e.g. the webhook server): started after
    the caches, stopped after the controllers, in reverse order. ``stopping``, when given, is
    called at once when the manager begins to stop, before anything stops (e.g. to let no new
    work begin)."""

    name: str
    start: Callable[[], Awaitable[None]]
    stop: Callable[[], Awaitable[None]]
    stopping: Callable[[], None] | None = None


class DuplicateControllerError(ResourceConsistError, ValueError):
    """Two adapters with the same controller name."""


class CannotServe(ResourceConsistError):
    """An endpoint of the manager could not listen on its address (in use, or not one of this
    host's); ``fields`` name the ``ManagerOptions`` fields that set it."""

    def __init__(self, paths: str, address: tuple[str, int], fields: tuple[str, ...], err: OSError) -> None:
        host, port = address
        why = (os.strerror(err.errno) if err.errno else str(err)).lower()
        super().__init__(f"cannot serve {paths} on {host or '*'}:{port}: {why}")
        self.fields = fields


class Manager:
    """Runs controllers and runnables against one main cluster.

    Its settings are one options object: ``Manager(client, ManagerOptions(namespace="shop"))``
    (docs/reference/options.md, "Manager").
    """

    def __init__(self, client: KubeClient, options: ManagerOptions | None = None) -> None:
        #: The settings this manager runs with.
        self.options = options if options is not None else ManagerOptions()
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
        self._elector = (
            LeaderElector(client, election, on_slowpath=self.metrics.standard.lease_slowpath(election.name))
            if election is not None
            else None
        )
        #: With sharding, this replica's part in it (docs/scaling.md): its controllers run under
        #: its shard Lease and act on its share of the employers.
        self.sharding: ShardedReplica | None = None
        if self.options.sharding is not None:
            self.sharding = ShardedReplica(client, self.options, self.informers, self.metrics)
            self._elector = self.sharding.elector
            sharding = self.sharding
            self.add_runnable(Runnable("sharding", sharding.start, sharding.stop, stopping=sharding.stopping))
        self._elector_stop = asyncio.Event()
        self._elector_task: asyncio.Task[None] | None = None
        #: Controllers run only while this is True: always without a Lease to hold.
        self.leading = self._elector is None
        #: client-go's ``leader_election_master_status{name}`` of the Lease, with one.
        self._lease_status = (
            self.metrics.standard.leader_status.labels(self._elector.options.name)
            if self._elector is not None
            else None
        )
        self._report_leading()
        #: When the caches must have filled (``cache_sync_timeout`` after ``start`` began), and
        #: what waits for that (``start`` without a Lease to win; ``run`` beside the stop).
        self._sync_deadline = float("inf")
        self._caches_filled: asyncio.Task[None] | None = None
        #: Set when a start was abandoned for a stop: nothing waits for the informers then.
        self._abandoned = False
        #: ``run`` runs: it raises a start's failure, nothing else need tell it.
        self._running = False
        self._servers: list[EndpointServer] = []
        #: The metrics endpoint's certificate watcher, with a cert dir (``secure_metrics``).
        self._reloaders: list[CertificateReloader] = []
        #: Who may read ``/metrics`` with ``secure_metrics``, once served.
        self.metrics_authorizer: MetricsAuthorizer | None = None
        #: The port ``/healthz`` and ``/readyz`` are served on, once started (None: not served).
        self.health_port: int | None = None
        #: The port ``/metrics`` is served on, once started (None: not served).
        self.metrics_port: int | None = None
        #: The port of the drain endpoint, once started (None: not served).
        self.drain_port: int | None = None

    @property
    def started(self) -> bool:
        """``start`` ran and ``stop`` has not."""
        return self._started

    def ready(self) -> bool:
        """Started and every informer cache synced (what ``/readyz`` answers)."""
        return not self.not_ready_reasons()

    def not_ready_reasons(self) -> list[str]:
        """Why the manager is not ready, one line each (``/readyz``'s body); empty when it is."""
        if not self._started:
            return ["starting"]
        return [
            f"cache of {informer.resource.plural} not synced: {informer.not_synced_because()}"
            for informer in self.informers.informers()
            if not informer.has_synced
        ]

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
            scope=self.sharding.scope if self.sharding is not None else None,
            fence=self._elector.fence if self._elector is not None else None,
            max_concurrent_reconciles=self.options.max_concurrent_reconciles,
            reconcile_timeout=self.options.reconcile_timeout,
        )
        for subscriber in self.subscribers:
            controller.subscribe(subscriber)
        self.controllers[name] = controller
        if self.sharding is not None:
            # This replica caches and acts on its share of the employers only (docs/scaling.md).
            await self.sharding.add(controller.handle)
        if self._started and self.leading:
            await controller.start()
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
        if self.sharding is not None:
            self.sharding.remove(controller.handle)
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
        self._sync_deadline = time.monotonic() + self.options.cache_sync_timeout
        if self.sharding is not None:
            # Before the caches start (ShardedReplica.prepare says why).
            self.sharding.prepare()
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
        self._caches_filled = asyncio.create_task(self._fill_caches(), name="manager-caches")
        if self._elector is None:
            # The controllers subscribe now (events before a cache syncs wait for it) and wait for
            # their caches; the deadline ends their start if those never fill.
            controllers = asyncio.ensure_future(self._start_controllers())
            try:
                await asyncio.wait({controllers, self._caches_filled}, return_when=asyncio.FIRST_COMPLETED)
                if self._caches_filled.done() and not self._caches_filled.cancelled():
                    self._caches_filled.result()  # raises CacheSyncTimeout
                await controllers
            finally:
                if not controllers.done():
                    controllers.cancel()
                    await asyncio.gather(controllers, return_exceptions=True)
        else:
            # Nobody may wait for it (a manager started without ``run``): its failure is told.
            self._caches_filled.add_done_callback(self._tell_failure)
            self._elector_stop.clear()
            self._elector_task = asyncio.create_task(
                self._elector.run(self._start_controllers, self._stop_controllers, self._elector_stop)
            )
        log.info("manager started: %s", ", ".join(sorted(self.controllers)) or "no controllers")

    async def _fill_caches(self) -> None:
        """Wait for every cache made so far to have its first list, until ``cache_sync_timeout``
        after the start (controller-runtime's ``CacheSyncTimeout``); ``CacheSyncTimeout`` names
        the first one that did not, and why."""
        try:
            await self.informers.wait_synced(max(0.0, self._sync_deadline - time.monotonic()))
        except CacheSyncTimeout:
            unsynced = [i for i in self.informers.informers() if not i.has_synced]
            if unsynced:  # else they only wait for a re-list, after their first list
                raise CacheSyncTimeout.of(unsynced, self.options.cache_sync_timeout) from None

    def _tell_failure(self, filled: asyncio.Task[None]) -> None:
        """Log why the caches did not fill, for a manager started without ``run`` (which raises it)."""
        if not filled.cancelled() and (err := filled.exception()) is not None and not self._running:
            log.error("%s", err)

    def _report_leading(self) -> None:
        self.metrics.leader.set(1 if self.leading else 0)
        if self._lease_status is not None:
            self._lease_status.set(1 if self.leading else 0)

    async def _serve_endpoints(self) -> None:
        """``/healthz`` and ``/readyz`` on the health probe address, ``/metrics`` on the metrics
        address: one server when both name the same port; with ``secure_metrics``, ``/metrics``
        over HTTPS for the callers the API server vouches for (resourceconsist/runtime/metricsauth.py)."""
        options = self.options
        endpoints: list[tuple[tuple[str, int], bool, bool]] = []  # (address, probes, metrics)
        if options.metrics_address is not None and options.serves_metrics_and_probes_together:
            endpoints.append((options.metrics_address, True, True))
        else:
            if options.health_probe_address is not None:
                endpoints.append((options.health_probe_address, True, False))
            if options.metrics_address is not None:
                endpoints.append((options.metrics_address, False, True))
        if not endpoints and options.drain_address is None:
            return
        try:
            for address, probes, exposition in endpoints:
                secure = self.options.secure_metrics if exposition else None
                ssl_context: ssl.SSLContext | None = None
                guard: Guard | None = None
                if secure is not None:
                    ssl_context, guard = await self._secure_metrics(secure)
                routes = probe_routes(
                    self.metrics, self.not_ready_reasons, probes=probes, exposition=exposition
                )
                server = EndpointServer(routes, guard)
                try:
                    await server.start(*address, ssl_context=ssl_context)
                except OSError as err:
                    paths = {
                        (True, True): "/healthz, /readyz and /metrics",
                        (True, False): "/healthz and /readyz",
                    }
                    fields = ("health_probe_address",) * probes + ("metrics_address",) * exposition
                    raise CannotServe(
                        paths.get((probes, exposition), "/metrics"), address, fields, err
                    ) from err
                self._servers.append(server)
                if probes:
                    self.health_port = server.port
                if exposition:
                    self.metrics_port = server.port
            if options.drain_address is not None:
                await self._serve_drain(options.drain_address)
        except BaseException:
            # A port in use: nothing stays bound for a start that failed.
            await self._stop_endpoints()
            raise

    async def _serve_drain(self, address: tuple[str, int]) -> None:
        """The drain endpoint the drain waiters ask (resourceconsist/runtime/drain.py)."""
        server = EndpointServer(DrainEndpoint(self.informers, self.client).routes())
        try:
            await server.start(*address)
        except OSError as err:
            raise CannotServe("the drain endpoint", address, ("drain_address",), err) from err
        self._servers.append(server)
        self.drain_port = server.port

    async def _secure_metrics(self, secure: SecureMetricsOptions) -> tuple[ssl.SSLContext, Guard]:
        """The TLS context and the authentication and authorization guard of ``/metrics``."""
        from resourceconsist.runtime.metricsauth import MetricsAuthorizer, serving_context

        context, reloader = await asyncio.to_thread(
            serving_context, secure, self.metrics.standard.certificate_read
        )
        if reloader is not None:
            reloader.start()
            self._reloaders.append(reloader)
        #: Who may read /metrics (kept for tests: its reviews).
        self.metrics_authorizer = MetricsAuthorizer(self.client, secure)
        files = secure.files()
        log.info(
            "serving /metrics over HTTPS with %s, to callers whose token the API server reviews",
            f"the certificate in {files[0]}" if files else "a self-signed certificate made at start",
        )
        return context, self.metrics_authorizer.decide

    async def _stop_endpoints(self) -> None:
        for server in self._servers:
            await server.close()
        self._servers.clear()
        for reloader in self._reloaders:
            await reloader.stop()
        self._reloaders.clear()

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
        for runnable in self.runnables:
            if runnable.stopping is not None:
                runnable.stopping()
        filling, self._caches_filled = self._caches_filled, None
        if filling is not None and not filling.done():
            filling.cancel()
            await asyncio.gather(filling, return_exceptions=True)
        if self._elector_task is not None:
            # The elector stops the controllers and releases the lease on its way out; one still
            # waiting for it has nothing to hand back, and its request in flight is abandoned.
            self._elector_stop.set()
            task, self._elector_task = self._elector_task, None
            if self._elector is not None and not self._elector.leading:
                task.cancel()
            (ended,) = await asyncio.gather(task, return_exceptions=True)
            if isinstance(ended, Exception):
                raise ended
        await asyncio.gather(*(c.stop(timeout) for c in self.controllers.values()))
        for runnable in reversed(self.runnables):
            try:
                await runnable.stop()
            except Exception:
                log.exception("stopping %s failed", runnable.name)
        await self._stop_endpoints()
        self.clusters.stop_all()
        # Informer threads still in a first list (an API server that does not answer) are
        # daemons: a stop does not wait for them.
        join = 2.0 if self.informers.has_synced and not self._abandoned else 0.1
        await asyncio.to_thread(self.informers.stop, join)
        self._started = False
        log.info("manager stopped")

    async def run(self, stop: asyncio.Event) -> None:
        """Start, run until ``stop`` is set, then shut down gracefully. A stop while the start is
        under way ends it at once; caches that do not fill within ``cache_sync_timeout`` raise
        ``CacheSyncTimeout`` (after the manager stopped)."""
        self._running = True
        stopped = asyncio.create_task(stop.wait(), name="manager-stop")
        starting = asyncio.create_task(self.start(), name="manager-start")
        try:
            await asyncio.wait({starting, stopped}, return_when=asyncio.FIRST_COMPLETED)
            if not starting.done():
                self._abandoned = True
                log.info("stop asked for while starting: stopping")
                starting.cancel()
                await asyncio.gather(starting, return_exceptions=True)
                return
            starting.result()
            filling = self._caches_filled
            if filling is not None and not filling.done():
                # Started, the caches still filling (a standby, or a shard): a stop, or the
                # deadline that fails the run.
                await asyncio.wait({stopped, filling}, return_when=asyncio.FIRST_COMPLETED)
                if filling.done() and not filling.cancelled():
                    filling.result()
            await stopped
        finally:
            stopped.cancel()
            try:
                await self.stop()
            finally:
                self._running = False


async def add_to_manager(manager: Manager, adapter: ReconcileAdapter) -> Controller:
    """Go's ``AddToMgr``: a controller for ``adapter`` with the default or its own options."""
    return await manager.add(adapter)
