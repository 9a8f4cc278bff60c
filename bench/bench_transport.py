"""CPU and wall time per API write: the thread path against an aiohttp session on the event loop.

One local control plane; P pods exist in one namespace. The same N merge PATCHes of one pod
annotation each (16 concurrent callers, round-robin over the pods) go through

(a) today's path: ``await asyncio.to_thread(client.patch, ...)`` on the frame's own executor
    (``DaemonThreadExecutor``, as the manager installs it), i.e. the official client's urllib3 pool;
(b) an aiohttp session on the event loop, its TLS and credentials taken from the same
    kubeconfig (``resourceconsist.cluster.aiokube``), no thread hand-off.

Each figure is this process's CPU seconds (``time.process_time``, all threads) and wall seconds,
per write; rounds alternate (a), (b) so load on the shared machine falls on both alike, and the
report is the medians and the ratio (b)/(a). A watch from resourceVersion 0 (P synthetic ADDED
events, decoded to dicts) is measured the same way: the sync ``WatchStream`` read in a thread
against the aiohttp stream read on the loop. docs/benchmarks.md ("The API transport") explains
the figures.

Run: ``python bench/bench_transport.py [--writes 2000 --pods 1000 --rounds 3]``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable

from bench_pace import _pool_map

from resourceconsist.cluster import aiokube, kube
from resourceconsist.cluster.kube import KubeClient
from resourceconsist.flow.cancellation import DaemonThreadExecutor
from resourceconsist.testing import LocalControlPlane

CALLERS = 16
NS = "bench-transport"

Patch = Callable[[str, dict[str, object]], Awaitable[object]]


def populate(client: KubeClient, pods: int) -> list[str]:
    client.create(kube.NAMESPACE, None, {"metadata": {"name": NS}})
    names = [f"pod-{i}" for i in range(pods)]

    def make(name: str) -> None:
        body = {"metadata": {"name": name}, "spec": {"containers": [{"name": "c", "image": "x"}]}}
        client.create(kube.POD, NS, body)

    _pool_map(make, names)
    return names


async def _writes(patch: Patch, names: list[str], writes: int, tag: str) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of ``writes`` patches by CALLERS concurrent callers."""
    todo = iter(range(writes))

    async def caller() -> None:
        for i in todo:
            body = {"metadata": {"annotations": {"bench/transport": f"{tag}-{i}"}}}
            await patch(names[i % len(names)], body)

    cpu, wall = time.process_time(), time.monotonic()
    await asyncio.gather(*(caller() for _ in range(CALLERS)))
    return time.process_time() - cpu, time.monotonic() - wall


async def thread_path(client: KubeClient, names: list[str], writes: int, tag: str) -> tuple[float, float]:
    async def patch(name: str, body: dict[str, object]) -> object:
        return await asyncio.to_thread(client.patch, kube.POD, NS, name, body)

    return await _writes(patch, names, writes, tag)


async def loop_path(
    transport: aiokube.AsyncTransport, names: list[str], writes: int, tag: str
) -> tuple[float, float]:
    async def patch(name: str, body: dict[str, object]) -> object:
        return await transport.patch(kube.POD, NS, name, body)

    return await _writes(patch, names, writes, tag)


async def watch_thread(client: KubeClient, count: int) -> tuple[float, float]:
    def read() -> None:
        stream = client.watch(kube.POD, NS, "0", timeout_seconds=60)
        seen = 0
        for event in stream:
            seen += event["type"] == "ADDED"
            if seen >= count:
                stream.close()
                return

    cpu, wall = time.process_time(), time.monotonic()
    await asyncio.to_thread(read)
    return time.process_time() - cpu, time.monotonic() - wall


async def watch_loop(transport: aiokube.AsyncTransport, count: int) -> tuple[float, float]:
    cpu, wall = time.process_time(), time.monotonic()
    seen = 0
    async with transport.watch(kube.POD, NS, "0", timeout_seconds=60) as events:
        async for event in events:
            seen += event["type"] == "ADDED"
            if seen >= count:
                break
    return time.process_time() - cpu, time.monotonic() - wall


async def measure(client: KubeClient, names: list[str], writes: int, rounds: int) -> dict[str, list[float]]:
    asyncio.get_running_loop().set_default_executor(DaemonThreadExecutor(name="bench-io"))
    transport = aiokube.for_client(client)
    assert transport is not None, "this kubeconfig is one the async transport serves"
    figures: dict[str, list[float]] = {}
    try:
        # One warm-up write each: TLS handshakes and imports are not per-write costs.
        await thread_path(client, names, CALLERS, "warm")
        await loop_path(transport, names, CALLERS, "warm")
        for r in range(rounds):
            for label, run in (
                ("a", thread_path(client, names, writes, f"a{r}")),
                ("b", loop_path(transport, names, writes, f"b{r}")),
            ):
                cpu, wall = await run
                figures.setdefault(f"{label} cpu", []).append(cpu / writes)
                figures.setdefault(f"{label} wall", []).append(wall / writes)
            for label, watch in (
                ("a", watch_thread(client, len(names))),
                ("b", watch_loop(transport, len(names))),
            ):
                cpu, wall = await watch
                figures.setdefault(f"{label} watch cpu", []).append(cpu / len(names))
                figures.setdefault(f"{label} watch wall", []).append(wall / len(names))
        figures["b connections"] = [float(transport.connections_opened)]
    finally:
        await transport.close()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writes", type=int, default=2000)
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with LocalControlPlane() as cp:
        client = KubeClient.from_kubeconfig(str(cp.kubeconfig))
        try:
            names = populate(client, args.pods)
            figures = asyncio.run(measure(client, names, args.writes, args.rounds))
        finally:
            client.close()
    med = {k: statistics.median(v) for k, v in figures.items()}
    print(f"{args.writes} merge PATCHes x {args.rounds} rounds, {CALLERS} callers, {args.pods} pods; medians")
    print(f"{'':28} {'(a) thread':>12} {'(b) loop':>12} {'(b)/(a)':>8}")
    for what, unit, scale in (
        ("cpu", "CPU ms per write", 1e3),
        ("wall", "wall ms per write", 1e3),
        ("watch cpu", "CPU us per watch event", 1e6),
        ("watch wall", "wall us per watch event", 1e6),
    ):
        a, b = med[f"a {what}"], med[f"b {what}"]
        print(f"{unit:28} {a * scale:12.3f} {b * scale:12.3f} {b / a:8.2f}")
    print(f"(b) TCP connections opened: {int(med['b connections'])}")
    for what in ("cpu", "wall"):
        rounds = ", ".join(
            f"{a * 1e3:.2f}/{b * 1e3:.2f}"
            for a, b in zip(figures[f"a {what}"], figures[f"b {what}"], strict=True)
        )
        print(f"{what} ms per write by round, (a)/(b): {rounds}")


if __name__ == "__main__":
    main()
