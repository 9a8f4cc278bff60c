"""CPU and wall time per API write: the thread path, the loop transport, and aiohttp's client.

One local control plane; P pods exist in one namespace. The same N merge PATCHes of one pod
annotation each (16 concurrent callers, round-robin over the pods) go through

(a) the thread path: ``await asyncio.to_thread(client.patch, ...)`` on the frame's own executor
    (``DaemonThreadExecutor``, as the manager installs it), i.e. urllib3's pool;
(b) the loop transport (``resourceconsist.cluster.aiokube`` on ``resourceconsist.cluster.http1``),
    its TLS and credentials taken from the same kubeconfig, no thread hand-off;
(c) an aiohttp client session on the event loop doing what (b) does: the same TLS context,
    headers, at most 16 connections, the body encoded and the answer decoded the same way
    (what the loop transport was built on before it had a client of its own).

Each figure is this process's CPU seconds (``time.process_time``, all threads) and wall seconds,
per write; rounds rotate (a), (b), (c) so load on the shared machine falls on all alike, and the
report is the medians and the ratios to (a). A watch from resourceVersion 0 (P synthetic ADDED
events, decoded to dicts) is measured for (a) and (b): the sync ``WatchStream`` read in a thread
against the loop transport's stream. docs/benchmarks.md ("The API transport", "The write path")
explains the figures.

Run: ``python bench/bench_transport.py [--writes 2000 --pods 1000 --rounds 3]``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable

import aiohttp
import msgspec
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


async def aiohttp_path(
    session: aiohttp.ClientSession, client: KubeClient, names: list[str], writes: int, tag: str
) -> tuple[float, float]:
    access = client.access
    assert access is not None
    headers = kube.request_headers(kube.PATCH_CONTENT_TYPES["merge"], access.bearer())

    async def patch(name: str, body: dict[str, object]) -> object:
        url = access.host + kube.request_url("", kube.POD.path(NS, name), None)
        async with session.patch(url, data=msgspec.json.encode(body), headers=headers) as answer:
            payload = await answer.read()
            if answer.status >= 400:
                raise kube.api_error(answer.status, answer.reason or "", payload, "PATCH", url)
            return kube.decode_json(payload)

    return await _writes(patch, names, writes, tag)


def aiohttp_session(client: KubeClient) -> aiohttp.ClientSession:
    access = client.access
    assert access is not None
    context = access.ssl_context()
    connector = aiohttp.TCPConnector(limit=aiokube.CONNECTIONS, ssl=context if context is not None else False)
    return aiohttp.ClientSession(connector=connector, skip_auto_headers=("User-Agent",))


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
    session = aiohttp_session(client)
    try:
        # One warm-up write each: TLS handshakes and imports are not per-write costs.
        await thread_path(client, names, CALLERS, "warm")
        await loop_path(transport, names, CALLERS, "warm")
        await aiohttp_path(session, client, names, CALLERS, "warm")
        for r in range(rounds):
            paths = [
                ("a", lambda r=r: thread_path(client, names, writes, f"a{r}")),
                ("b", lambda r=r: loop_path(transport, names, writes, f"b{r}")),
                ("c", lambda r=r: aiohttp_path(session, client, names, writes, f"c{r}")),
            ]
            for label, run in paths[r % 3 :] + paths[: r % 3]:
                cpu, wall = await run()
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
        await session.close()
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
    print(f"{'':28} {'(a) thread':>12} {'(b) loop':>12} {'(c) aiohttp':>12} {'(b)/(a)':>8} {'(b)/(c)':>8}")
    for what, unit, scale in (
        ("cpu", "CPU ms per write", 1e3),
        ("wall", "wall ms per write", 1e3),
        ("watch cpu", "CPU us per watch event", 1e6),
        ("watch wall", "wall us per watch event", 1e6),
    ):
        a, b, c = med[f"a {what}"], med[f"b {what}"], med.get(f"c {what}")
        cs = f"{c * scale:12.3f}" if c is not None else f"{'':12}"
        bc = f"{b / c:8.2f}" if c is not None else ""
        print(f"{unit:28} {a * scale:12.3f} {b * scale:12.3f} {cs} {b / a:8.2f} {bc}")
    print(f"(b) TCP connections opened: {int(med['b connections'])}")
    for what in ("cpu", "wall"):
        rounds = ", ".join(
            f"{a * 1e3:.3f}/{b * 1e3:.3f}/{c * 1e3:.3f}"
            for a, b, c in zip(figures[f"a {what}"], figures[f"b {what}"], figures[f"c {what}"], strict=True)
        )
        print(f"{what} ms per write by round, (a)/(b)/(c): {rounds}")


if __name__ == "__main__":
    main()
