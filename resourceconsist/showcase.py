"""``resourceconsist demo``: a walkthrough a person can follow, on an embedded control plane.

It starts a ``LocalControlPlane``, runs the experimental demo adapter in a manager, creates a
controlled Service and three readiness-gated pods, and drives them like a kubelet and a user
would: pods become ready, one loses ``service-ready`` and gets it back, one is deleted, then
the Service is deleted. After each step it waits (with a deadline) until the provider and the
pods have converged, showing the provider's real servers and each pod's finalizers as a live
table on a terminal (plain tables otherwise), then tears everything down.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from resourceconsist import kube, lifecycle
from resourceconsist.experimental.demo import DemoAdapter, FakeProvider
from resourceconsist.kube import KubeClient
from resourceconsist.manager import Manager
from resourceconsist.testing import Cluster, LocalControlPlane, finalizers

NAMESPACE = "demo"
SERVICE = "web"
PODS = ("web-0", "web-1", "web-2")


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
                ", ".join(f.rsplit("/", 1)[-1] for f in finalizers(pod)) or "-",
            )
        return Group(Text(self.step, style="bold"), provider, pods)


async def run_demo(
    console: Console | None = None, step_timeout: float = 30.0, pace: float | None = None
) -> bool:
    """Run the walkthrough; True when every step converged before its deadline.

    ``pace`` holds each converged step on screen that many seconds so a person can read it
    (default: 2 s on a terminal, none otherwise)."""
    console = console or Console()
    live_display = console.is_terminal
    hold = (2.0 if live_display else 0.0) if pace is None else pace
    console.print("[bold]resourceconsist demo[/]: starting a local kube-apiserver + etcd ...")
    with LocalControlPlane() as cp:
        client = KubeClient.from_kubeconfig(str(cp.kubeconfig))
        try:
            return await _walkthrough(console, client, live_display, step_timeout, hold)
        finally:
            client.close()


async def _walkthrough(
    console: Console, client: KubeClient, live_display: bool, step_timeout: float, hold: float
) -> bool:
    await asyncio.to_thread(client.create, kube.NAMESPACE, None, {"metadata": {"name": NAMESPACE}})
    cluster = Cluster(client, NAMESPACE)
    provider = FakeProvider()
    manager = Manager(client, namespace=NAMESPACE)
    await manager.add(DemoAdapter(provider))
    await manager.start()
    view = _View(cluster, provider)
    flz = lifecycle.lifecycle_finalizer(SERVICE)
    skey = f"{NAMESPACE}/{SERVICE}"
    live = Live(console=console, auto_refresh=False) if live_display else None

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

    async def step(
        title: str, action: Callable[[], Awaitable[object]], *checks: Callable[[], Awaitable[bool]]
    ) -> bool:
        view.step = title
        await action()
        deadline = time.monotonic() + step_timeout
        while True:
            results = [await check() for check in checks]
            table = await view.render()
            if live is not None:
                live.update(table, refresh=True)
            if all(results):
                if live is None:
                    console.print(table)
                console.print(f"[green]converged[/]: {title}")
                await asyncio.sleep(hold)  # let a person read the converged state
                return True
            if time.monotonic() > deadline:
                console.print(table)
                console.print(f"[red]not converged within {step_timeout:.0f}s[/]: {title}")
                return False
            await asyncio.sleep(0.2)

    async def create_all() -> None:
        await cluster.service(SERVICE)
        for name in PODS:
            await cluster.pod(name, {"app": SERVICE}, readiness_gate=True)

    async def ready_all() -> None:
        for name in PODS:
            await cluster.set_status(name, ready=True, service_ready=True)

    try:
        if live is not None:
            live.start()
        ok = (
            await step(
                "1. Service web and 3 pods created (not ready yet)",
                create_all,
                traffic(dict.fromkeys(PODS, False)),
            )
            and await step(
                "2. pods become ready",
                ready_all,
                traffic(dict.fromkeys(PODS, True)),
                lambda: pods_guarded(PODS),
            )
            and await step(
                "3. web-1 loses service-ready: traffic off, finalizer released",
                lambda: cluster.set_status("web-1", ready=True, service_ready=False),
                traffic({"web-0": True, "web-1": False, "web-2": True}),
                lambda: pods_guarded(("web-0", "web-2")),
            )
            and await step(
                "4. web-1 is service-ready again",
                lambda: cluster.set_status("web-1", ready=True, service_ready=True),
                traffic(dict.fromkeys(PODS, True)),
                lambda: pods_guarded(PODS),
            )
            and await step(
                "5. web-2 deleted: removed from the provider, then released",
                lambda: cluster.delete(kube.POD, "web-2"),
                traffic({"web-0": True, "web-1": True}),
                lambda: pods_guarded(("web-0", "web-1")),
            )
            and await step(
                "6. Service web deleted: provider cleaned, pods released, Service gone",
                lambda: cluster.delete(kube.SERVICE, SERVICE),
                traffic({}),
                lambda: pods_guarded(()),
                service_gone,
            )
        )
    finally:
        if live is not None:
            live.stop()
        await manager.stop(timeout=5)
    console.print(f"provider calls: {dict(sorted(provider.calls.items()))}")
    console.print(f"API requests: {dict(sorted(client.requests.items()))}")
    console.print("[bold green]demo converged[/]" if ok else "[bold red]demo did not converge[/]")
    return bool(ok)
