"""What sharding runs in one replica (docs/scaling.md): its shard Lease, its share of the employers
and of the pods, the provider budget's share, and, while this replica is elected for it, the
sharder. ``ShardedReplica`` is one runnable the manager wires: the manager runs its controllers
under the shard Lease (``elector``), builds each controller with the replica's ``scope`` (which
employers it may act on), and hands it each controller's handle (``add``); nothing is written into
a controller after it is built.

The pieces it stands on are the ring's rules (``ring``), the shard's gate and drain (``shard``),
the shard's pods (``pods``; with the employer label, ``podlabels``) and the sharder (``sharder``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import logging
import threading
import time
from collections.abc import Callable

from resourceconsist import wire
from resourceconsist.cluster import kube
from resourceconsist.cluster.cache import CacheReader, Informer, InformerFactory, WatchEvent
from resourceconsist.cluster.kube import EmployerKey, KubeClient, Resource
from resourceconsist.flow import budget
from resourceconsist.flow.fence import acting_for
from resourceconsist.hooks.handle import ControllerHandle
from resourceconsist.options import ManagerOptions, ShardingOptions
from resourceconsist.runtime.leaderelection import LeaderElector
from resourceconsist.runtime.metrics import Metrics
from resourceconsist.runtime.sharding import podlabels
from resourceconsist.runtime.sharding.podlabels import LabellingFailed, ShardPodLabels
from resourceconsist.runtime.sharding.pods import ShardPods, changes_share
from resourceconsist.runtime.sharding.ring import ShardState, budget_share, shard_of_lease
from resourceconsist.runtime.sharding.shard import ShardGate
from resourceconsist.runtime.sharding.sharder import Sharder, SharderRound

log = logging.getLogger(__name__)

#: Seconds a shard's pod cache waits for its Service cache before its first list
#: (``ShardedReplica._wait_for_services``).
SERVICES_WAIT = 60.0
#: A shard's pods are listed again once its Services have stopped arriving for this many
#: seconds, and at most ``RELIST_AT_MOST`` seconds after the first: a wave of Services moving
#: to it costs one list of every pod, not one per Service (``ShardedReplica._relist_on_new_share``).
RELIST_QUIET = 1.0
RELIST_AT_MOST = 5.0


class ShardScope:
    """Which employers a controller of this replica may act on: the ``EmployerScope`` the
    controller is built with (resourceconsist/runtime/controller.py)."""

    def __init__(self, replica: ShardedReplica) -> None:
        self._replica = replica
        self._gate = replica.gate

    def left(self, event: WatchEvent) -> bool:
        return self._gate.left(event)

    def draining(self, obj: kube.KubeObject | None) -> bool:
        return self._gate.draining(obj)

    def owns(self, resource: Resource, key: EmployerKey) -> bool:
        return self._gate.ring_owns(resource, key)

    async def may_act(self, resource: Resource, key: EmployerKey, reader: CacheReader) -> bool:
        """The employer is this shard's (a draining one is let go of here, in the worker that
        holds its key, so no pass of it runs meanwhile), and the shard's pod cache holds its pods."""
        cached = reader.get(resource, key.namespace_or_none, key.name)
        if not await self._gate.may_act(resource, key, cached):
            return False
        await self._replica.pods_ready(key)
        if cached is None:
            return True  # gone, as the API server said: nothing can have moved it meanwhile
        # A drain that arrived during the wait is acknowledged now, not after one more pass.
        return await self._gate.may_act(resource, key, reader.get(resource, key.namespace_or_none, key.name))


class ShardedReplica:
    """One replica's part in sharding, built from the manager's options, client, caches and
    metrics; started, stopped and told of each controller by the manager."""

    def __init__(
        self, client: KubeClient, options: ManagerOptions, informers: InformerFactory, metrics: Metrics
    ) -> None:
        sharding = options.sharding
        if sharding is None:
            raise ValueError("ShardedReplica needs ManagerOptions.sharding")
        self.options: ShardingOptions = sharding
        self.client = client
        self.informers = informers
        self.metrics = metrics
        self._provider_budget = options.provider_budget
        self._namespaces = options.watched_namespaces or ()
        #: The shard Lease the manager runs its controllers under (labeled with the ring).
        self.elector = LeaderElector(
            client,
            sharding.lease_options(),
            labels={wire.SHARD_RING_LABEL: sharding.controller_ring},
            release_on_cancel=sharding.release_on_cancel,
            on_slowpath=metrics.standard.lease_slowpath(sharding.shard_name),
        )
        self._leases = InformerFactory(client, namespace=self.elector.namespace)
        self._leases.select(kube.LEASE, f"{wire.SHARD_RING_LABEL}={sharding.controller_ring}")
        #: This shard's gate: which employers it may act on, and the drain.
        self.gate = ShardGate(
            client,
            sharding.controller_ring,
            sharding.shard_name,
            self._leases.informer(kube.LEASE),
            on_drained=metrics.shard_drains.inc,
        )
        #: What each controller of this replica is built with.
        self.scope = ShardScope(self)
        #: The informers' generation whose Service cache was seen synced (``_services_synced``).
        self._services_synced_in = -1
        # The pods of this shard's Services only (docs/scaling.md, "What a shard's employers
        # need of pods"); every pod while a controller of another kind runs.
        self._pods = ShardPods(self.gate, informers.reader(), self._services_synced)
        #: With ``pod_employer_label``: the pods the API server selects for this shard, and the
        #: labels it writes (resourceconsist/runtime/sharding/podlabels.py).
        self._labels = (
            ShardPodLabels(
                client,
                self._pods,
                self._services_informer,
                self._namespaces,
                self.elector.fence,
                active=self._labels_apply,
            )
            if sharding.pod_employer_label
            else None
        )
        informers.restrict_pods(
            lambda pod: not self._pods_divide() or self._pods.keeps(pod),
            wait=self._wait_for_services,
            before_list=self._before_pod_list if self._labels is not None else None,
            hold=self._hold_pod if self._labels is not None else None,
        )
        self._sweep_task: asyncio.Task[None] | None = None
        #: With ``pod_employer_label``: the pods whose label falls short, labelled as they come.
        self.labeller = self._labels.labeller if self._labels is not None else None
        self._sharder_elector = (
            LeaderElector(
                client,
                sharding.sharder_options(),
                release_on_cancel=sharding.release_on_cancel,
                on_slowpath=metrics.standard.lease_slowpath(sharding.sharder_lease),
            )
            if sharding.sharder
            else None
        )
        #: While this replica runs it, the sharder (docs/scaling.md, "The sharder").
        self.sharder: Sharder | None = None
        self._sharder_task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        #: The controllers of this replica, as their handles show them.
        self._controllers: list[ControllerHandle] = []
        self._started = False
        self._unsubscribe_share: Callable[[], None] | None = None
        #: Ends the pod re-lists on this shard's Service changes (``_relist_on_new_share``).
        self._unrelist: Callable[[], None] = lambda: None
        #: The Services whose pods a pod list was asked for since they came to this shard.
        self._pods_listed_for: set[str] = set()

    @property
    def shard(self) -> str:
        return self.gate.shard

    # -- controllers -----------------------------------------------------------------------------

    async def add(self, controller: ControllerHandle) -> None:
        """A controller of this replica: its employer cache keeps this shard's share, and the
        sharder (when it runs here) places employers of its kind too."""
        self._controllers.append(controller)
        self.informers.select(controller.employer, self.gate.selector)
        if self._started:
            # What this shard's pod cache keeps may have changed with the controllers' kinds.
            self.informers.informer(kube.POD).relist()
        sharder = self.sharder
        if sharder is not None and controller.employer not in {r for r, _ in sharder.employers}:
            # The running sharder watches the kinds of the controllers it started with.
            await self._stop_sharder()
            await self._start_sharder()

    def remove(self, controller: ControllerHandle) -> None:
        self._controllers = [c for c in self._controllers if c.name != controller.name]

    def _pods_divide(self) -> bool:
        """Every controller employs pods for Services: a shard's pods are its Services'
        (resourceconsist/runtime/sharding/pods.py)."""
        profiles = [c.profile for c in list(self._controllers)]
        return bool(profiles) and all(p.employer == kube.SERVICE and p.employee == kube.POD for p in profiles)

    # -- life cycle ----------------------------------------------------------------------------------

    def prepare(self) -> None:
        """Before the manager's caches start: the gate opens, and the pod re-lists on this
        shard's Service changes are subscribed, so the Services' events are the list's, made
        before the pods' list started (a replay to a later subscriber carries the replay's moment
        and would ask for a needless second list of every pod)."""
        self.gate.open = True
        if self._pods_divide():
            self._unrelist = self._relist_on_new_share()

    async def start(self) -> None:
        """The ring's Leases (made again after a stop: stopping a factory drops its informers),
        the budget's share, and the sharder's election."""
        loop = asyncio.get_running_loop()
        self._started = True
        self._stop.clear()
        self.gate.leases = self._leases.informer(kube.LEASE)
        self._unsubscribe_share = self.gate.leases.add_handler(self._share_budget)
        self._leases.start(loop)
        if self._sharder_elector is not None:
            self._sharder_task = asyncio.create_task(
                self._sharder_elector.run(self._start_sharder, self._stop_sharder, self._stop)
            )
        if self._labels is not None:
            self._sweep_task = asyncio.create_task(self._sweep_labels())
        if self.labeller is not None:
            self.labeller.start(self.informers.informer(kube.POD))

    def stopping(self) -> None:
        """At once when the manager begins to stop: no pass starts here from now on, even while
        the elector finishes a renewal in flight (docs/scaling.md, "Stopping"); the sharder's
        election ends beside the shard's."""
        self.gate.open = False
        self._stop.set()

    async def stop(self) -> None:
        self.gate.open = False
        self._stop.set()
        task, self._sharder_task = self._sharder_task, None
        if task is not None:
            # Still campaigning, it has nothing to hand back: its request in flight is abandoned
            # rather than waited for (an API server that does not answer must not hold a stop).
            if self._sharder_elector is not None and not self._sharder_elector.leading:
                task.cancel()
            (ended,) = await asyncio.gather(task, return_exceptions=True)
            if isinstance(ended, Exception):
                raise ended
        sweep, self._sweep_task = self._sweep_task, None
        if sweep is not None:
            sweep.cancel()
            await asyncio.gather(sweep, return_exceptions=True)
        if self.labeller is not None:
            await self.labeller.stop()
        if self._labels is not None:
            self._labels.reset()
        if self._unsubscribe_share is not None:
            self._unsubscribe_share()
            self._unsubscribe_share = None
        await asyncio.to_thread(self._leases.stop)
        self._unrelist()
        self._unrelist = lambda: None
        self._pods_listed_for.clear()
        self._started = False

    # -- the provider budget's share -----------------------------------------------------------------

    def _share_budget(self, event: WatchEvent) -> None:
        """Take this replica's share of the provider budget: the configured share over the ring's
        ready shards, looked at again on every Lease event (each renewal is one, so a shard gone
        silent is noticed within a retry period of the others'; docs/scaling.md)."""
        leases = self.gate.leases
        assert leases is not None
        now = datetime.datetime.now(datetime.UTC)
        ring_share = budget_share(shard_of_lease(lease, now) for lease in leases.store.list())
        configured = self._provider_budget
        wanted = dataclasses.replace(configured, share=configured.share * ring_share)
        if budget.settings() != wanted:
            budget.configure(wanted)
            if configured.rate is None:
                return  # no rate to divide: nothing an operator needs to hear
            log.info(
                "shard %s takes 1/%d of the provider budget (ready shards of the ring %s)",
                self.gate.shard,
                round(1 / ring_share),
                self.gate.ring,
            )

    # -- the shard's pods ------------------------------------------------------------------------

    def _services_synced(self) -> bool:
        """This shard's Service cache is made and has its first list. Asked on every pod event
        (``ShardPods.keeps``), so a yes is kept: an informer that has synced stays so for its
        life, which ends only with the factory's ``stop`` (a new generation of informers)."""
        generation = self.informers.generation
        if self._services_synced_in != generation:
            services = self._services_informer()
            if services is None or not services.has_synced:
                return False
            self._services_synced_in = generation
        return True

    def _wait_for_services(self, stop: threading.Event) -> None:
        """Before the pod cache's first list (in its informer thread): this shard's Service
        cache, so that the list keeps the shard's share, not every pod of the watched namespaces
        to be listed again (docs/scaling.md, "What a shard's employers need of pods"). At most
        ``SERVICES_WAIT`` seconds: then the pods are listed, kept whole until it has synced."""
        deadline = time.monotonic() + SERVICES_WAIT
        while not stop.is_set() and time.monotonic() < deadline:
            if not self._pods_divide():
                return
            services = self._services_informer()
            if services is None:
                stop.wait(0.05)  # the controller's caches are being made
            elif services.synced_within(0.5):
                return

    def _services_informer(self) -> Informer | None:
        """This shard's Service cache, once a controller has made it."""
        return next((i for i in self.informers.informers() if i.resource == kube.SERVICE), None)

    def _before_pod_list(self, informer: Informer) -> None:
        """Before each list of the pod cache (informer thread), with ``pod_employer_label``: the
        pods of the Services new to the shard labelled, then listed by the share's selector; every
        pod while a controller of another kind runs (docs/scaling.md)."""
        assert self._labels is not None
        if not self._pods_divide():
            informer.label_selector = None
            return
        self._labels.before_list(informer)

    def _labels_apply(self) -> bool:
        """The shard labels unlabelled pods now: its pods divide and its Services are in."""
        return self._pods_divide() and self._services_synced()

    def _hold_pod(self, pod: kube.KubeObject) -> bool:
        assert self._labels is not None
        return self._pods_divide() and self._labels.holds(pod)

    async def _sweep_labels(self) -> None:
        """Every ``podlabels.SWEEP_INTERVAL`` seconds: pods newly selected by this shard's Services (their
        labels changed) are labelled for them, and so come into its watch."""
        assert self._labels is not None
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), podlabels.SWEEP_INTERVAL)
                return
            if not self._pods_divide() or not self._services_synced():
                continue
            try:
                await asyncio.to_thread(self._labels.sweep)
            except LabellingFailed as err:
                log.warning("shard %s: %s; trying again in %.0f s", self.shard, err, podlabels.SWEEP_INTERVAL)

    def _relist_on_new_share(self) -> Callable[[], None]:
        """List the pods again whenever this shard's Services change what it must keep (one
        arrived, a selector changed), once such changes have gone quiet for ``RELIST_QUIET``
        seconds (at most ``RELIST_AT_MOST`` after the first): the pod cache is not current from
        the first change on, so the pass such an event queues waits for the list
        (``ShardScope.may_act``). Re-lists asked for while one runs make one more, not one each
        (``Informer.relist``); none is asked for when a list that started after the change is in
        (``Informer.listed_since``: the Services a shard starts with). Returns the unsubscribe."""
        pods = self.informers.informer(kube.POD)
        services = self.informers.informer(kube.SERVICE)
        shard_pods = self._pods

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
            if shard_pods.kept_unjudged():
                pods.relist()

        withdraw = services.when_synced(on_services_synced)
        remove = services.add_handler(on_service)

        def unsubscribe() -> None:
            withdraw()
            remove()

        return unsubscribe

    async def pods_ready(self, key: EmployerKey) -> None:
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

    # -- the sharder -------------------------------------------------------------------------------

    def _leases_informer(self) -> Informer:
        return self._leases.informer(kube.LEASE)

    async def _start_sharder(self) -> None:
        predicates: dict[Resource, list[Callable[[WatchEvent], bool]]] = {}
        for controller in self._controllers:
            predicates.setdefault(controller.employer, []).append(controller.profile.watch.employer_predicate)
        self.sharder = Sharder(
            self.client,
            self.options.controller_ring,
            self._leases_informer(),
            [(resource, _any_accepts(accept)) for resource, accept in predicates.items()],
            namespaces=self._namespaces,
            resync=self.options.sharder_resync,
            report=self._report_round,
            balanced=self.options.placement == "balanced",
            settle=self.options.sharder_settle,
            # The labeller watches every Service of the same namespaces: the sharder reads that
            # cache rather than keep a second copy of each Service (docs/scaling.md).
            shared={kube.SERVICE: self.labeller.services}
            if self.labeller is not None and self.labeller.services is not None
            else None,
        )
        assert self._sharder_elector is not None
        # The sharder's rounds and writes act for its own Lease (resourceconsist/flow/fence.py).
        with acting_for(self._sharder_elector.fence):
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


def _any_accepts(predicates: list[Callable[[WatchEvent], bool]]) -> Callable[[WatchEvent], bool]:
    """An employer is the ring's when a controller of its kind would reconcile it."""
    return lambda event: any(predicate(event) for predicate in predicates)
