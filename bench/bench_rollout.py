"""A rolling update seen from the load balancer's side, with the readiness gates off and on.

On the working local cluster (``LocalCluster``: kube-controller-manager, kube-scheduler, kwok
nodes), a Deployment of 10 replicas behind a controlled Service, kept by the demo adapter whose
fake provider takes ``--latency`` seconds for each real-server call (2-10 s is reported for
SLB), is rolled with ``maxSurge: 25%, maxUnavailable: 0``. The provider's change log and the
pods' watch events give, at every instant, which backends serve and whether any serves a pod
whose containers have stopped (ContainersReady False, or the pod gone); a sampler every 10 ms
is the second witness. Two runs:

- **gates off**, today's plain Kubernetes: a new pod is Ready when its containers are, so the
  rollout deletes old pods before the provider serves the new ones, and a deleted pod's
  containers stop at once while the provider still routes to it.
- **gates on**: each pod carries the Service's readiness gate (what the webhook injects,
  docs/zero-downtime.md), so it is Ready only once the provider serves it, and a preStop sleep
  of the drain time (the webhook's ``drain-seconds``) keeps a deleted pod's containers up while
  the provider lets it go.

Columns: *min serving* counts the provider's serving backends; *min on running pods* only those
whose pod's containers run (what clients can reach); *s below floor* the time with fewer of
those than replicas - maxUnavailable; *on stopped pods* the pods served after their containers
stopped, *s on stopped* for how long in all; *rollout s* until the Deployment is rolled out;
*provider settled s* until the provider serves exactly the new pods.

Measured on 2 shared cores (2026-11-22, 10 replicas, preStop of ``drain_seconds``):

    latency 2 s   gates off: min on running pods 0, 9.9-12.3 s below floor, 10 pods served
                  after they stopped (11.9-14.3 s); rollout 2.8-3.8 s, provider settled 12-15 s
                  gates on (preStop 13 s): min 10, 0 s below, 0 on stopped; rollout 14.9-15.3 s
                  (two runs each)
    latency 5 s   gates off: min 0, 14.7 s below floor, 10 on stopped (19.7 s); rollout 3.1 s
                  gates on (preStop 31 s): min 10, 0 s below, 0 on stopped; rollout 36.4 s
    latency 2 s, gates on, preStop 7 s (3 calls + 1 s): min 10, 0 s below, but 9 pods served
                  after they stopped (5.9 s): the preStop must cover two passes' calls.

Run: ``python bench/bench_rollout.py [--latency 2 --replicas 10 --pre-stop N --only on]``
(``make bench``).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from resourceconsist import wire
from resourceconsist.cluster import kube
from resourceconsist.cluster.kube import KubeClient
from resourceconsist.commands.showcase import LoggedProvider, RolloutWatch, drain_seconds
from resourceconsist.experimental.demo import DemoAdapter
from resourceconsist.options import ManagerOptions
from resourceconsist.rules import lifecycle
from resourceconsist.runtime.manager import Manager
from resourceconsist.testing import Cluster, LocalCluster, async_wait_for

SERVICE = "web"


async def run(
    client: KubeClient, namespace: str, gates: bool, replicas: int, latency: float, pre_stop: int
) -> dict[str, Any]:
    await asyncio.to_thread(client.create, kube.NAMESPACE, None, {"metadata": {"name": namespace}})
    cluster = Cluster(client, namespace)
    provider = LoggedProvider(latency=latency)
    key = f"{namespace}/{SERVICE}"
    manager = Manager(client, ManagerOptions(namespace=namespace))
    await manager.add(DemoAdapter(provider))
    await manager.start()
    informer = manager.informers.informer(kube.POD)
    watch = RolloutWatch(provider, key, informer.store)
    informer.add_handler(watch.on_pod)
    try:
        annotations = {wire.READINESS_GATE_ANNOTATION: "true"} if gates else {}
        await cluster.service(SERVICE, annotations=annotations)
        await cluster.deployment(
            SERVICE,
            replicas,
            readiness_gates=(lifecycle.readiness_gate(SERVICE),) if gates else (),
            pre_stop_seconds=pre_stop if gates else None,
            termination_grace_seconds=pre_stop + 30,
        )

        async def settled() -> bool:
            pods = [p for p in await cluster.pods({"app": SERVICE}) if not lifecycle.is_deleting(p)]
            names = {p["metadata"]["name"] for p in pods}
            return await cluster.rollout_done(SERVICE) and watch.serving() == names and len(names) == replicas

        await async_wait_for(settled, timeout=300, interval=0.2, message="first rollout served")
        watch.start()
        start = time.monotonic()
        await cluster.roll(SERVICE, "2")
        await cluster.wait_rollout(SERVICE, timeout=600)
        rolled = time.monotonic()
        await async_wait_for(settled, timeout=300, interval=0.1, message="provider caught up")
        end = time.monotonic()
        watch.stop()
        floor = replicas - 0  # maxUnavailable 0
        stats = watch.stats(start, end, floor)
        return {
            "gates": "on" if gates else "off",
            "min serving": stats.min_serving,
            "min on running pods": stats.min_useful,
            "s below floor": round(stats.seconds_below_floor, 2),
            "on stopped pods": len(stats.on_stopped_pods),
            "s on stopped": round(stats.seconds_on_stopped, 2),
            "rollout s": round(rolled - start, 1),
            "provider settled s": round(end - start, 1),
            "samples": stats.samples,
        }
    finally:
        watch.stop()
        await manager.stop(timeout=10)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency", type=float, default=2.0, help="seconds each real-server call takes")
    parser.add_argument("--replicas", type=int, default=10)
    parser.add_argument(
        "--pre-stop",
        type=int,
        default=None,
        help="gates on: preStop seconds (default: drain_seconds(latency))",
    )
    parser.add_argument("--only", choices=["off", "on"], default=None, help="run one of the two")
    args = parser.parse_args()
    pre_stop = drain_seconds(args.latency) if args.pre_stop is None else args.pre_stop
    print(
        f"rollout of {args.replicas} replicas, maxSurge 25%, maxUnavailable 0, provider latency "
        f"{args.latency:g} s, floor {args.replicas} serving backends; gates on: preStop "
        f"{pre_stop} s"
    )
    rows: list[dict[str, Any]] = []
    with LocalCluster() as lc:
        client = KubeClient.from_kubeconfig(str(lc.kubeconfig))
        try:
            for gates in (False, True):
                if args.only not in (None, "on" if gates else "off"):
                    continue
                namespace = f"rollout-{'on' if gates else 'off'}"
                rows.append(await run(client, namespace, gates, args.replicas, args.latency, pre_stop))
        finally:
            client.close()
    columns = list(rows[0])
    widths = [max(len(c), *(len(str(r[c])) for r in rows)) for c in columns]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)))
    for row in rows:
        print("  ".join(str(row[c]).ljust(w) for c, w in zip(columns, widths, strict=True)))


if __name__ == "__main__":
    asyncio.run(main())
