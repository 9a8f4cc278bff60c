"""Benchmark figures of the frame, each beside a baseline measured in the same process.

1. Convergence of S Services x P pods with the demo adapter on a real control plane: seconds,
   reconciles, and API writes per pod, against the Go frame's write pattern (an annotation
   patch then a finalizer update per new pod) replayed on the same API server as the baseline.
2. A steady-state resync round: seconds per round of S reconciles, and writes (must be 0).
3. "Which controlled Services select this pod" for 1000 Services: the informer index against
   a scan of the same cache (what the Go handler does), as lookups per second and a ratio.
4. A pod's whole life under the guard (created not ready -> ready -> not ready -> deleted):
   the frame's pod writes per pod at each stage and in all, with the demo adapter (which keeps
   a not-ready pod registered at weight 0) and with the tutorial-style "register only when
   ready" adapter, so the guard's cost is visible where it is paid (docs/concepts.md).
5. The hand-off of a plain adapter call (``call_adapter`` on a trivial function, its thread and
   back) at 1, 8 and 32 calls in flight: CPU microseconds per call, against asyncio's own
   ``run_in_executor`` on a stock ``ThreadPoolExecutor``; interleaved rounds, medians and spread
   (docs/benchmarks.md, "Thread hand-offs").

Run: ``python bench/bench_frame.py [--services 50 --pods 10]`` (``make bench``).
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import statistics
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from resourceconsist import wire
from resourceconsist.cluster import kube
from resourceconsist.cluster.cache import SERVICE_SELECTOR_INDEX, Store, index_by_service_selector
from resourceconsist.cluster.kube import KubeClient
from resourceconsist.experimental.demo import DemoAdapter, FakeProvider
from resourceconsist.flow.cancellation import call_adapter
from resourceconsist.options import ManagerOptions
from resourceconsist.rules import lifecycle
from resourceconsist.rules.labels import map_selects
from resourceconsist.runtime.manager import Manager
from resourceconsist.testing import Cluster, LocalControlPlane, async_wait_for, finalizers


def _populate(client: KubeClient, ns: str, services: int, pods: int) -> list[str]:
    cluster = Cluster(client, ns)
    names: list[str] = []

    def make(i: int) -> None:
        svc = f"svc-{i:03d}"
        client.create(
            kube.SERVICE,
            ns,
            {
                "metadata": {"name": svc, "labels": {wire.CONTROL_LABEL: "true"}},
                "spec": {"selector": {"app": svc}, "ports": [{"port": 80}]},
            },
        )
        for j in range(pods):
            name = f"{svc}-{j}"
            names.append(name)
            client.create(
                kube.POD,
                ns,
                {
                    "metadata": {"name": name, "labels": {"app": svc}},
                    "spec": {"containers": [{"name": "c", "image": "x"}]},
                },
            )
            ip = cluster.ip_of(name)
            client.patch(
                kube.POD,
                ns,
                name,
                {"status": {"podIP": ip, "conditions": [{"type": "Ready", "status": "True"}]}},
                subresource="status",
            )

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(make, range(services)))
    return names


def _writes(client: KubeClient, resource: str | None = None) -> int:
    verbs = ("post", "put", "patch", "delete")
    if resource is None:
        return sum(client.requests[v] for v in verbs)
    return sum(client.requests_by_resource[f"{v} {resource}"] for v in verbs)


def _go_pattern_baseline(client: KubeClient, ns: str, pods: list[str]) -> tuple[float, int]:
    """The Go frame's writes for new pods: GET + annotation merge patch, GET + full Update."""
    before = _writes(client, "pods")
    started = time.perf_counter()

    def guard(name: str) -> None:
        svc = name.rsplit("-", 1)[0]
        key = lifecycle.expected_finalizer_key("Service", ns, svc)
        pod = client.get(kube.POD, ns, name)
        value = lifecycle.updated_available_conditions(pod, add={key: lifecycle.lifecycle_finalizer(svc)})
        client.patch(
            kube.POD, ns, name, {"metadata": {"annotations": {wire.AVAILABLE_CONDITIONS_ANNOTATION: value}}}
        )
        pod = client.get(kube.POD, ns, name)
        pod["metadata"]["finalizers"] = [*finalizers(pod), lifecycle.lifecycle_finalizer(svc)]
        client.replace(kube.POD, ns, name, pod)

    with ThreadPoolExecutor(5) as pool:
        list(pool.map(guard, pods))
    return time.perf_counter() - started, _writes(client, "pods") - before


async def bench_convergence(cp: LocalControlPlane, services: int, pods: int) -> dict[str, Any]:
    client = KubeClient.from_kubeconfig(str(cp.kubeconfig))
    figures: dict[str, Any] = {}
    for ns in ("bench-frame", "bench-go"):
        client.create(kube.NAMESPACE, None, {"metadata": {"name": ns}})
    names = await asyncio.to_thread(_populate, client, "bench-frame", services, pods)
    baseline_names = await asyncio.to_thread(_populate, client, "bench-go", services, pods)

    provider = FakeProvider()
    manager = Manager(client, ManagerOptions(namespace="bench-frame"))
    controller = await manager.add(DemoAdapter(provider))
    writes_before, pod_writes_before = _writes(client), _writes(client, "pods")
    started = time.perf_counter()
    await manager.start()

    async def converged() -> bool:
        listing = await asyncio.to_thread(client.list, kube.POD, "bench-frame")
        return all(
            lifecycle.lifecycle_finalizer(p["metadata"]["labels"]["app"]) in finalizers(p)
            for p in listing["items"]
        )

    await async_wait_for(converged, timeout=600, interval=0.2, message="convergence")
    figures["converge_seconds"] = time.perf_counter() - started
    await async_wait_for(lambda: len(controller.queue) == 0 and not controller.queue.processing(), timeout=60)
    figures["frame_writes"] = _writes(client) - writes_before
    figures["frame_writes_per_pod"] = (_writes(client, "pods") - pod_writes_before) / len(names)

    # Steady state: every Service reconciled three times over, back to back.
    steady_writes, mark = _writes(client), controller.reconciles
    round_started = time.perf_counter()
    for _ in range(3):
        for i in range(services):
            controller.queue.add(f"bench-frame/svc-{i:03d}")
        target = controller.reconciles + services
        await async_wait_for(lambda t=target: controller.reconciles >= t, timeout=120, interval=0.005)
    figures["steady_reconciles_per_second"] = (controller.reconciles - mark) / (
        time.perf_counter() - round_started
    )
    figures["steady_writes"] = _writes(client) - steady_writes
    await manager.stop(timeout=5)

    go_seconds, go_writes = await asyncio.to_thread(_go_pattern_baseline, client, "bench-go", baseline_names)
    figures["go_pattern_pod_writes_per_pod"] = go_writes / len(baseline_names)
    figures["go_pattern_pod_guard_seconds"] = go_seconds
    client.close()
    return figures


class ReadyOnlyDemo(DemoAdapter):
    """The demo adapter registering a pod only while it is ready (a register-when-ready provider)."""

    def get_expected_employee(self, ctx: Any, employer: Any) -> list[Any]:
        items = super().get_expected_employee(ctx, employer)
        return [item for item in items if item.statuses.lifecycle_ready]


_LIFE_STAGES = ("created, not ready", "ready", "not ready", "deleted")


async def bench_life(cp: LocalControlPlane, pods: int, adapter: DemoAdapter, ns: str) -> dict[str, float]:
    """Pod writes per pod made by the frame at each stage of a pod's life (driver writes apart)."""
    frame = KubeClient.from_kubeconfig(str(cp.kubeconfig))
    driver = KubeClient.from_kubeconfig(str(cp.kubeconfig))
    cluster = Cluster(driver, ns)
    driver.create(kube.NAMESPACE, None, {"metadata": {"name": ns}})
    await cluster.service("life", {"app": "life"})
    manager = Manager(frame, ManagerOptions(namespace=ns))
    controller = await manager.add(adapter)
    await manager.start()
    names = [f"life-{i:04d}" for i in range(pods)]
    flz = lifecycle.lifecycle_finalizer("life")
    skey = f"{ns}/life"

    async def settled() -> None:
        await async_wait_for(
            lambda: len(controller.queue) == 0 and not controller.queue.processing(),
            timeout=120,
            interval=0.05,
        )

    def pods_now() -> list[Any]:
        return list(driver.list(kube.POD, ns)["items"])

    async def each(fn: Any) -> None:
        with ThreadPoolExecutor(8) as pool:
            await asyncio.get_running_loop().run_in_executor(None, lambda: list(pool.map(fn, names)))

    def status(ready: bool) -> Any:
        def set_status(name: str) -> None:
            ip = cluster.ip_of(name)
            body = {"status": {"podIP": ip, "conditions": [{"type": "Ready", "status": str(ready)}]}}
            driver.patch(kube.POD, ns, name, body, subresource="status")

        return set_status

    def create(name: str) -> None:
        body = {
            "metadata": {"name": name, "labels": {"app": "life"}},
            "spec": {"containers": [{"name": "c", "image": "x"}]},
        }
        driver.create(kube.POD, ns, body)
        status(False)(name)

    def delete(name: str) -> None:
        driver.delete(kube.POD, ns, name)

    def served() -> bool:
        servers = adapter.provider.snapshot().get(skey, {})
        return all(servers.get(n) is not None and servers[n].traffic_on for n in names) and all(
            flz in finalizers(p) for p in pods_now()
        )

    def out_of_traffic() -> bool:
        servers = adapter.provider.snapshot().get(skey, {})
        return not any(s.traffic_on for s in servers.values()) and not any(
            flz in finalizers(p) for p in pods_now()
        )

    def entered() -> bool:
        listing = pods_now()
        return len(listing) == pods and all(lifecycle.expected_finalizers(p) for p in listing)

    figures: dict[str, float] = {}
    await async_wait_for(
        lambda: wire.CLEAN_FINALIZER in finalizers(driver.get(kube.SERVICE, ns, "life")), timeout=30
    )
    steps = (
        (create, entered),
        (status(True), served),
        (status(False), out_of_traffic),
        (delete, lambda: not pods_now()),
    )
    for stage, (act, done) in zip(_LIFE_STAGES, steps, strict=True):
        before = _writes(frame, "pods")
        await each(act)
        await async_wait_for(lambda d=done: asyncio.to_thread(d), timeout=300, interval=0.1, message=stage)
        await settled()
        figures[stage] = (_writes(frame, "pods") - before) / pods
    figures["whole life"] = sum(figures[s] for s in _LIFE_STAGES)
    await manager.stop(timeout=5)
    frame.close()
    driver.close()
    return figures


def bench_lookup(services: int = 1000, rounds: int = 20000) -> dict[str, float]:
    store = Store({SERVICE_SELECTOR_INDEX: index_by_service_selector})
    for i in range(services):
        store.upsert(
            {
                "metadata": {"name": f"s{i}", "namespace": "ns"},
                "spec": {"selector": {"app": f"a{i % 200}", "tier": "web"}},
            }
        )
    pod_labels = {"app": "a7", "tier": "web", "pod-template-hash": "x"}

    def indexed() -> int:
        keys: set[str] = set()
        for k, v in pod_labels.items():
            keys |= store.keys_by_index(SERVICE_SELECTOR_INDEX, f"ns/{k}={v}")
        return sum(1 for key in keys if map_selects((store.get(key) or {})["spec"]["selector"], pod_labels))

    def scan() -> int:
        return sum(1 for s in store.list("ns") if map_selects(s["spec"]["selector"], pod_labels))

    assert indexed() == scan() == services // 200
    results = {}
    for name, fn, n in (("index", indexed, rounds), ("scan", scan, max(200, rounds // 50))):
        started = time.perf_counter()
        for _ in range(n):
            fn()
        results[f"{name}_lookups_per_second"] = n / (time.perf_counter() - started)
    results["index_vs_scan_ratio"] = results["index_lookups_per_second"] / results["scan_lookups_per_second"]
    return results


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _handoffs(in_flight: int, calls: int, hand_off: Callable[[], Awaitable[object]]) -> float:
    """CPU microseconds per call of ``calls`` hand-offs, ``in_flight`` at a time."""

    async def one_after_another(n: int) -> None:
        for _ in range(n):
            await hand_off()

    began = _cpu()
    await asyncio.gather(*(one_after_another(calls // in_flight) for _ in range(in_flight)))
    return (_cpu() - began) / calls * 1e6


async def bench_handoff(rounds: int = 7, calls: int = 8000) -> dict[int, tuple[list[float], list[float]]]:
    """Per number of calls in flight: the frame's per-call CPU and asyncio's, one list each."""
    stock = ThreadPoolExecutor(max_workers=32)
    loop = asyncio.get_running_loop()

    def trivial() -> int:
        return 1

    async def frame() -> object:
        return await call_adapter(trivial)

    async def asyncio_stock() -> object:
        return await loop.run_in_executor(stock, trivial)

    figures: dict[int, tuple[list[float], list[float]]] = {n: ([], []) for n in (1, 8, 32)}
    for _ in range(rounds):
        for n, (ours, theirs) in figures.items():
            ours.append(await _handoffs(n, calls, frame))
            theirs.append(await _handoffs(n, calls, asyncio_stock))
    stock.shutdown()
    return figures


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--services", type=int, default=50)
    parser.add_argument("--pods", type=int, default=10)
    parser.add_argument("--life-pods", type=int, default=200)
    args = parser.parse_args()
    with LocalControlPlane() as cp:
        figures = await bench_convergence(cp, args.services, args.pods)
        lives = {
            "demo (registers at weight 0)": await bench_life(
                cp, args.life_pods, DemoAdapter(FakeProvider()), "life-a"
            ),
            "register only when ready": await bench_life(
                cp, args.life_pods, ReadyOnlyDemo(FakeProvider()), "life-b"
            ),
        }
    pods = args.services * args.pods
    print(f"convergence of {args.services} Services x {args.pods} pods ({pods} pods), demo adapter:")
    print(f"  converge: {figures['converge_seconds']:.2f} s")
    ratio = figures["go_pattern_pod_writes_per_pod"] / max(figures["frame_writes_per_pod"], 1e-9)
    print(
        f"  pod writes per pod: frame {figures['frame_writes_per_pod']:.2f}, "
        f"Go write pattern {figures['go_pattern_pod_writes_per_pod']:.2f} (ratio Go/frame {ratio:.2f}); "
        f"all frame writes incl. Services and Events: {figures['frame_writes']}"
    )
    print(f"  Go write pattern alone took {figures['go_pattern_pod_guard_seconds']:.2f} s for the same pods")
    print(
        f"steady state: {figures['steady_reconciles_per_second']:.0f} reconciles/s, "
        f"{figures['steady_writes']} writes"
    )
    print(f"a pod's whole life, {args.life_pods} pods, frame pod writes per pod (Go pattern: 2 at creation):")
    print(f"  {'adapter':30} " + " ".join(f"{stage:>18}" for stage in (*_LIFE_STAGES, "whole life")))
    for label, life in lives.items():
        print(f"  {label:30} " + " ".join(f"{life[stage]:>18.2f}" for stage in (*_LIFE_STAGES, "whole life")))
    lookup = bench_lookup()
    print(
        "pod -> selecting Services among 1000: "
        f"index {lookup['index_lookups_per_second']:.0f}/s, scan {lookup['scan_lookups_per_second']:.0f}/s, "
        f"ratio {lookup['index_vs_scan_ratio']:.1f}x"
    )
    print("hand-off of a plain adapter call, CPU us per call: frame / asyncio run_in_executor (spread):")
    for n, (ours, theirs) in (await bench_handoff()).items():
        ratios = sorted(o / t for o, t in zip(ours, theirs, strict=True))
        print(
            f"  {n:>2} in flight: {statistics.median(ours):6.1f} ({min(ours):.1f}-{max(ours):.1f}) / "
            f"{statistics.median(theirs):6.1f} ({min(theirs):.1f}-{max(theirs):.1f}), "
            f"ratio {statistics.median(ratios):.2f} ({ratios[0]:.2f}-{ratios[-1]:.2f})"
        )


if __name__ == "__main__":
    asyncio.run(main())
