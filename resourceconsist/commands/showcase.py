"""``resourceconsist demo``: a walkthrough a person can follow, on an embedded control plane,
then a rolling update on an embedded working cluster.

It starts a ``LocalControlPlane``, runs the experimental demo adapter in a manager, creates a
controlled Service and three readiness-gated pods, and drives them like a kubelet and a user
would: pods become ready, one loses ``service-ready`` and gets it back, one is deleted, then
the Service is deleted. Then it starts a ``LocalCluster`` (controllers, scheduler, kwok nodes)
and rolls a Deployment behind a controlled Service whose pods carry the Service's readiness
gate, the provider taking a second per call (docs/zero-downtime.md). After each step it waits
(with a deadline) until the provider and the pods have converged, showing the provider's
backends and each pod's gate and finalizers as a live table on a terminal (plain tables
otherwise), then tears everything down.

``RolloutWatch`` (also used by bench/bench_rollout.py) records a rollout from the provider's
side: which backends serve at every instant, and whether one serves a pod that has stopped.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from resourceconsist import wire
from resourceconsist.cluster import kube
from resourceconsist.cluster.cache import Store, WatchEvent
from resourceconsist.cluster.kube import KubeClient
from resourceconsist.experimental.demo import DemoAdapter, FakeProvider, RealServer
from resourceconsist.options import ManagerOptions
from resourceconsist.rules import lifecycle
from resourceconsist.runtime.manager import Manager
from resourceconsist.testing import Cluster, LocalCluster, LocalControlPlane, condition, finalizers

NAMESPACE = "demo"
SERVICE = "web"
PODS = ("web-0", "web-1", "web-2")
ROLLOUT_NAMESPACE = "rollout"
ROLLOUT_SERVICE = "shop"
ROLLOUT_REPLICAS = 4
_FINALIZER_WORDS = {wire.GUARD_FINALIZER_PREFIX: "guard", wire.LIFECYCLE_FINALIZER_PREFIX: "lifecycle"}


def _finalizer_words(pod: kube.KubeObject) -> str:
    """The pod's finalizers by kind (guard, lifecycle), so a reader tells them apart; a bare
    hash would hide which one holds the pod (docs/concepts.md, "The guard")."""
    return ", ".join(_FINALIZER_WORDS.get(f.rpartition("/")[0], f) for f in finalizers(pod)) or "-"


# -- a rollout seen from the load balancer's side (the demo's rollout step, bench/bench_rollout.py) --


@dataclass
class LoggedProvider(FakeProvider):
    """The demo's fake provider with its own change log: after every real-server change, when it
    took effect and which pods the employer's VIP then serves."""

    changes: list[tuple[float, str, frozenset[str]]] = field(default_factory=list)

    def put_rs(self, action: str, employer: str, servers: dict[str, RealServer]) -> None:
        try:
            super().put_rs(action, employer, servers)
        finally:
            self._log(employer)

    def delete_rs(self, employer: str, pods: list[str]) -> None:
        try:
            super().delete_rs(employer, pods)
        finally:
            self._log(employer)

    def _log(self, employer: str) -> None:
        with self._lock:
            self.changes.append((time.monotonic(), employer, frozenset(self.serving(employer))))


def drain_seconds(latency: float) -> int:
    """The preStop a gated rollout gives its pods when each provider call takes ``latency``.

    The frame runs one pass of an employer at a time, each calling create, update, then delete:
    a leaving pod's backend may wait for the pass in flight (three calls) and then for the
    creates and updates of its own pass before its delete (three more), so six calls, plus a
    second of slack. bench/bench_rollout.py measured 3 calls + 1 s too short at 2 s a call."""
    return math.ceil(6 * latency) + 1


def _running(pod: kube.KubeObject | None) -> bool:
    """The pod's containers run and are ready (not stopped, not gone)."""
    return pod is not None and condition(pod, "ContainersReady") == "True"


@dataclass
class RolloutStats:
    """A rollout window judged from the provider's side."""

    min_serving: int
    #: Fewest serving backends whose pod runs: what clients can actually reach.
    min_useful: int
    #: Time with fewer useful backends than the floor.
    seconds_below_floor: float
    #: Pods the VIP served while their containers were stopped (or the pod was gone).
    on_stopped_pods: set[str]
    seconds_on_stopped: float
    samples: int


@dataclass
class RolloutWatch:
    """Records, at every instant of a rollout, which pods one employer's VIP serves and whether
    each runs: the provider's change log against the pods' watch events, exactly, and a sample
    of both every ``interval`` seconds from a thread of its own as a second witness."""

    provider: LoggedProvider
    employer: str
    pods: Store
    interval: float = 0.01
    pod_log: list[tuple[float, str, bool]] = field(default_factory=list)
    samples: list[tuple[float, int, frozenset[str]]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    @property
    def namespace(self) -> str:
        return self.employer.partition("/")[0]

    def on_pod(self, event: WatchEvent) -> None:
        """An informer handler: log each pod's running state as it changes."""
        name = event.obj["metadata"]["name"]
        self.pod_log.append((time.monotonic(), name, event.type != "DELETED" and _running(event.obj)))

    def running(self, pod: str) -> bool:
        return _running(self.pods.get(f"{self.namespace}/{pod}"))

    def serving(self) -> set[str]:
        return self.provider.serving(self.employer)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._sample, name="rollout-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def _sample(self) -> None:
        while not self._stop.wait(self.interval):
            serving = self.serving()
            stopped = frozenset(p for p in serving if not self.running(p))
            self.samples.append((time.monotonic(), len(serving), stopped))

    def stats(self, start: float, end: float, floor: int) -> RolloutStats:
        """Judge [start, end]: fewest serving backends, time below ``floor``, backends on stopped
        pods, from the merged timelines (exact) and the samples (the witness)."""
        changes = [
            (t, 0, served) for t, employer, served in self.provider.changes if employer == self.employer
        ]
        pods = [(t, 1, (name, up)) for t, name, up in self.pod_log]
        serving: frozenset[str] = frozenset()
        running: dict[str, bool] = {}
        none = 1 << 30
        least, useful, below, stopped_time = none, none, 0.0, 0.0
        on_stopped: set[str] = set()
        timeline: list[tuple[float, int, object]] = sorted([*changes, *pods], key=lambda e: (e[0], e[1]))
        timeline.append((end, 2, None))
        last = start
        for t, kind, what in timeline:
            if t > start:
                span = min(t, end) - last
                if span > 0:
                    bad = {p for p in serving if not running.get(p, False)}
                    least = min(least, len(serving))
                    useful = min(useful, len(serving) - len(bad))
                    below += span if len(serving) - len(bad) < floor else 0.0
                    stopped_time += span if bad else 0.0
                    on_stopped |= bad
                last = max(last, min(t, end))
            if t > end:
                break
            if kind == 0:
                assert isinstance(what, frozenset)
                serving = what
            elif kind == 1:
                assert isinstance(what, tuple)
                running[what[0]] = what[1]
        window = [(n, bad) for t, n, bad in self.samples if start <= t <= end]
        for n, sampled in window:
            least, useful = min(least, n), min(useful, n - len(sampled))
            on_stopped |= sampled
        return RolloutStats(
            least if least != none else 0,
            useful if useful != none else 0,
            below,
            on_stopped,
            stopped_time,
            len(window),
        )


@dataclass
class _View:
    """What the tables show: provider state and pod guards, read fresh each refresh."""

    cluster: Cluster
    provider: FakeProvider
    step: str = ""

    async def render(self) -> Group:
        servers = self.provider.snapshot().get(f"{NAMESPACE}/{SERVICE}", {})
        vip = self.provider.vips.get(f"{NAMESPACE}/{SERVICE}")
        provider = Table(title=f"provider: VIP {vip.vip + ' qps ' + str(vip.qps) if vip else '(none)'}")
        for column in ("real server", "ip", "traffic", "weight"):
            provider.add_column(column)
        for name, rs in sorted(servers.items()):
            provider.add_row(name, rs.ip, "on" if rs.traffic_on else "off", str(rs.weight))
        pods = Table(title="pods")
        for column in ("pod", "lifecycle ready", "expected finalizers", "finalizers"):
            pods.add_column(column)
        listing = await asyncio.to_thread(self.cluster.client.list, kube.POD, NAMESPACE)
        for pod in sorted(listing.get("items", []), key=lambda p: p["metadata"]["name"]):
            entries = lifecycle.expected_finalizers(pod)
            pods.add_row(
                pod["metadata"]["name"] + (" (deleting)" if lifecycle.is_deleting(pod) else ""),
                "yes" if lifecycle.is_lifecycle_ready(pod) else "no",
                ", ".join(entries) or "-",
                _finalizer_words(pod),
            )
        return Group(Text(self.step, style="bold"), provider, pods)


@dataclass
class _RolloutView:
    """The rollout's tables: the provider's serving backends, and each pod's containers, gate,
    Ready and finalizers, read fresh each refresh."""

    cluster: Cluster
    watch: RolloutWatch
    floor: int
    step: str = ""

    async def render(self) -> Group:
        serving = self.watch.serving()
        useful = sum(1 for p in serving if self.watch.running(p))
        gate = lifecycle.readiness_gate(ROLLOUT_SERVICE)
        pods = Table(
            title=f"provider: {len(serving)} serving backends, {useful} on running pods (floor {self.floor})"
        )
        for column in ("pod", "containers", "gate", "Ready", "provider", "finalizers"):
            pods.add_column(column)
        listing = await self.cluster.pods({"app": ROLLOUT_SERVICE})
        for pod in sorted(listing, key=lambda p: p["metadata"].get("creationTimestamp", "")):
            name = pod["metadata"]["name"]
            running = _running(pod)
            style = "red" if name in serving and not running else ""
            deleting = lifecycle.is_deleting(pod)
            pods.add_row(
                name,
                ("draining" if deleting else "running")
                if running
                else ("stopped" if deleting else "starting"),
                condition(pod, gate) or "-",
                condition(pod, "Ready") or "-",
                "serving" if name in serving else "-",
                _finalizer_words(pod),
                style=style,
            )
        return Group(Text(self.step, style="bold"), pods)


@dataclass
class _Stepper:
    """Runs one step: act, then refresh the tables until every check holds or the deadline passes."""

    console: Console
    live: Live | None
    step_timeout: float
    hold: float

    async def __call__(
        self,
        view: _View | _RolloutView,
        title: str,
        action: Callable[[], Awaitable[object]],
        *checks: Callable[[], Awaitable[bool]],
    ) -> bool:
        view.step = title
        await action()
        deadline = time.monotonic() + self.step_timeout
        while True:
            results = [await check() for check in checks]
            table = await view.render()
            if self.live is not None:
                self.live.update(table, refresh=True)
            if all(results):
                if self.live is None:
                    self.console.print(table)
                self.console.print(f"[green]converged[/]: {title}")
                await asyncio.sleep(self.hold)  # let a person read the converged state
                return True
            if time.monotonic() > deadline:
                self.console.print(table)
                self.console.print(f"[red]not converged within {self.step_timeout:.0f}s[/]: {title}")
                return False
            await asyncio.sleep(0.2)


async def run_demo(
    console: Console | None = None,
    step_timeout: float = 30.0,
    pace: float | None = None,
    rollout: bool = True,
    latency: float = 1.0,
) -> bool:
    """Run the walkthrough; True when every step converged before its deadline.

    ``pace`` holds each converged step on screen that many seconds so a person can read it
    (default: 2 s on a terminal, none otherwise). ``rollout`` adds the rolling update on a
    ``LocalCluster``, its provider taking ``latency`` seconds per real-server call."""
    console = console or Console()
    live_display = console.is_terminal
    hold = (2.0 if live_display else 0.0) if pace is None else pace
    live = Live(console=console, auto_refresh=False) if live_display else None
    stepper = _Stepper(console, live, step_timeout, hold)
    console.print("[bold]resourceconsist demo[/]: starting a local kube-apiserver + etcd ...")
    try:
        if live is not None:
            live.start()
        with LocalControlPlane() as cp:
            client = KubeClient.from_kubeconfig(str(cp.kubeconfig))
            try:
                ok = await _walkthrough(console, client, stepper)
            finally:
                client.close()
        if ok and rollout:
            console.print(
                "[bold]rolling update[/]: starting a local cluster (controllers, scheduler, nodes) ..."
            )
            with LocalCluster() as lc:
                client = KubeClient.from_kubeconfig(str(lc.kubeconfig))
                try:
                    ok = await _rollout(console, client, stepper, latency)
                finally:
                    client.close()
    finally:
        if live is not None:
            live.stop()
    console.print("[bold green]demo converged[/]" if ok else "[bold red]demo did not converge[/]")
    return ok


async def _walkthrough(console: Console, client: KubeClient, step: _Stepper) -> bool:
    await asyncio.to_thread(client.create, kube.NAMESPACE, None, {"metadata": {"name": NAMESPACE}})
    cluster = Cluster(client, NAMESPACE)
    provider = FakeProvider()
    manager = Manager(client, ManagerOptions(namespace=NAMESPACE))
    await manager.add(DemoAdapter(provider))
    await manager.start()
    view = _View(cluster, provider)
    flz = lifecycle.lifecycle_finalizer(SERVICE)
    skey = f"{NAMESPACE}/{SERVICE}"

    async def pods_guarded(names: tuple[str, ...]) -> bool:
        listing = await asyncio.to_thread(client.list, kube.POD, NAMESPACE)
        guarded = {p["metadata"]["name"] for p in listing["items"] if flz in finalizers(p)}
        return guarded == set(names)

    def traffic(expected: dict[str, bool]) -> Callable[[], Awaitable[bool]]:
        async def check() -> bool:
            servers = provider.snapshot().get(skey, {})
            return {n: rs.traffic_on for n, rs in servers.items()} == expected

        return check

    async def service_gone() -> bool:
        return await asyncio.to_thread(client.get_or_none, kube.SERVICE, NAMESPACE, SERVICE) is None

    async def create_all() -> None:
        await cluster.service(SERVICE)
        for name in PODS:
            await cluster.pod(name, {"app": SERVICE}, readiness_gate=True)

    async def ready_all() -> None:
        for name in PODS:
            await cluster.set_status(name, ready=True, service_ready=True)

    try:
        ok = (
            await step(
                view,
                "1. Service web and 3 pods created (not ready yet)",
                create_all,
                traffic(dict.fromkeys(PODS, False)),
            )
            and await step(
                view,
                "2. pods become ready",
                ready_all,
                traffic(dict.fromkeys(PODS, True)),
                lambda: pods_guarded(PODS),
            )
            and await step(
                view,
                "3. web-1 loses service-ready: traffic off, finalizer released",
                lambda: cluster.set_status("web-1", ready=True, service_ready=False),
                traffic({"web-0": True, "web-1": False, "web-2": True}),
                lambda: pods_guarded(("web-0", "web-2")),
            )
            and await step(
                view,
                "4. web-1 is service-ready again",
                lambda: cluster.set_status("web-1", ready=True, service_ready=True),
                traffic(dict.fromkeys(PODS, True)),
                lambda: pods_guarded(PODS),
            )
            and await step(
                view,
                "5. web-2 deleted: removed from the provider, then released",
                lambda: cluster.delete(kube.POD, "web-2"),
                traffic({"web-0": True, "web-1": True}),
                lambda: pods_guarded(("web-0", "web-1")),
            )
            and await step(
                view,
                "6. Service web deleted: provider cleaned, pods released, Service gone",
                lambda: cluster.delete(kube.SERVICE, SERVICE),
                traffic({}),
                lambda: pods_guarded(()),
                service_gone,
            )
        )
    finally:
        await manager.stop(timeout=5)
    console.print(f"provider calls: {dict(sorted(provider.calls.items()))}")
    console.print(f"API requests: {dict(sorted(client.requests.items()))}")
    return bool(ok)


async def _rollout(console: Console, client: KubeClient, step: _Stepper, latency: float) -> bool:
    """A Deployment behind a controlled Service with readiness gates, rolled with maxSurge 25%
    and maxUnavailable 0, watched from the provider's side (bench/bench_rollout.py measures it)."""
    await asyncio.to_thread(client.create, kube.NAMESPACE, None, {"metadata": {"name": ROLLOUT_NAMESPACE}})
    cluster = Cluster(client, ROLLOUT_NAMESPACE)
    provider = LoggedProvider(latency=latency)
    manager = Manager(client, ManagerOptions(namespace=ROLLOUT_NAMESPACE))
    await manager.add(DemoAdapter(provider))
    await manager.start()
    informer = manager.informers.informer(kube.POD)
    watch = RolloutWatch(provider, f"{ROLLOUT_NAMESPACE}/{ROLLOUT_SERVICE}", informer.store)
    informer.add_handler(watch.on_pod)
    view = _RolloutView(cluster, watch, ROLLOUT_REPLICAS)
    drain = drain_seconds(latency)

    async def deploy() -> None:
        annotations = {wire.READINESS_GATE_ANNOTATION: "true"}
        await cluster.service(ROLLOUT_SERVICE, annotations=annotations)
        await cluster.deployment(
            ROLLOUT_SERVICE,
            ROLLOUT_REPLICAS,
            readiness_gates=(lifecycle.readiness_gate(ROLLOUT_SERVICE),),
            pre_stop_seconds=drain,
            termination_grace_seconds=drain + 30,
        )

    async def served() -> bool:
        pods = await cluster.pods({"app": ROLLOUT_SERVICE})
        if any(lifecycle.is_deleting(p) for p in pods):
            return False
        live = {p["metadata"]["name"] for p in pods}
        return await cluster.rollout_done(ROLLOUT_SERVICE) and watch.serving() == live

    started: list[float] = []

    async def roll() -> None:
        watch.start()
        started.append(time.monotonic())
        await cluster.roll(ROLLOUT_SERVICE, "2")

    try:
        ok = await step(
            view,
            f"7. Deployment {ROLLOUT_SERVICE}: {ROLLOUT_REPLICAS} pods gated on the provider "
            f"({latency:g} s per call), each Ready once served",
            deploy,
            served,
        ) and await step(
            view,
            "8. rolled (maxSurge 25%, maxUnavailable 0): new pods served before old ones go",
            roll,
            served,
        )
    finally:
        watch.stop()
        await manager.stop(timeout=5)
    if started:
        stats = watch.stats(started[0], time.monotonic(), ROLLOUT_REPLICAS)
        console.print(
            f"during the rollout: fewest backends on running pods {stats.min_useful} "
            f"(floor {ROLLOUT_REPLICAS}), backends on stopped pods {len(stats.on_stopped_pods)}"
        )
    return bool(ok)
