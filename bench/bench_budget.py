"""Time from a pod's deletion to its backend's removal under a throttled provider, without and
with the provider API budget (docs/benchmarks.md, "Under a throttled provider").

One local control plane (kube-apiserver + etcd) and the SLB emulator, in this process, throttling
the account at ``--rate`` requests a second with SLB's own answer (HTTP 400 ``Throttling.User``).
A manager runs the SLB adapter in manage mode over ``--rolling`` Services, each rolling out
``--new`` pods, and one Service that loses one pod; the deletion and the rollout start at once.
The figure is the seconds from the pod's deletion to its backend's removal from the group
(drain to weight 0, then removal), the median of ``--rounds`` rounds:

- without the budget (no client-side rate, the default): every worker's requests race for the
  account, and each throttled one retries on its own backoff;
- with it (``--provider-rate`` at 80 % of the account's rate): the drain and the removal, and the
  reads of their passes, go before the rollout's registrations and reads.

Both run in this process, on the same API server, each round on a fresh emulator and namespace;
the ratio is the figure. Also shown: seconds until the rollout's pods are all registered, and the
throttling answers the account gave. Run: ``python bench/bench_budget.py`` (``make bench``).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

from resourceconsist.adapters.alibabacloudslb import (
    MODE_ANNOTATION,
    SERVER_ID_ANNOTATION,
    SLBAdapter,
    vserver_group_name,
)
from resourceconsist.adapters.alibabacloudslb.config import LOAD_BALANCER_ID_LABEL
from resourceconsist.adapters.alibabacloudslb.emulator import SLBEmulator
from resourceconsist.adapters.alibabacloudslb.slbclient import SLBClient
from resourceconsist.cluster import kube
from resourceconsist.cluster.kube import KubeClient
from resourceconsist.flow import budget
from resourceconsist.options import ManagerOptions, ProviderBudgetOptions
from resourceconsist.runtime.manager import Manager
from resourceconsist.testing import Cluster, LocalControlPlane, async_wait_for

LEAVING = "leaving"


async def _ready_pod(cluster: Cluster, service: str, name: str) -> None:
    await cluster.pod(
        name, {"app": service}, readiness_gate=True, annotations={SERVER_ID_ANNOTATION: "eni-1"}
    )
    await cluster.set_status(name, ready=True, service_ready=True)


async def one_round(
    client: KubeClient, namespace: str, args: argparse.Namespace, with_budget: bool
) -> dict[str, Any]:
    await asyncio.to_thread(client.create, kube.NAMESPACE, None, {"metadata": {"name": namespace}})
    cluster = Cluster(client, namespace)
    rolling = [f"roll-{i}" for i in range(args.rolling)]
    services = [*rolling, LEAVING]
    options = ProviderBudgetOptions(rate=args.rate * 0.8, burst=2) if with_budget else ProviderBudgetOptions()
    with SLBEmulator(seed=7) as slb:
        lb = slb.add_load_balancer()
        for service in services:
            await cluster.service(
                service, labels={LOAD_BALANCER_ID_LABEL: lb}, annotations={MODE_ANNOTATION: "manage"}
            )
        await asyncio.gather(*(_ready_pod(cluster, s, f"{s}-old-{i}") for s in services for i in range(2)))
        slb_client = SLBClient(slb.credentials())
        manager = Manager(client, ManagerOptions(namespace=namespace, provider_budget=options))
        await manager.add(SLBAdapter(slb_client, cluster_name="bench"))
        await manager.start()
        try:
            groups: dict[str, str] = {}

            def steady() -> bool:
                for service in services:
                    name = vserver_group_name({"metadata": {"namespace": namespace, "name": service}})
                    found = next((g.id for g in slb.vserver_groups(lb) if g.name == name), None)
                    if found is None or len(slb.backends(found)) != 2:
                        return False
                    groups[service] = found
                return True

            await async_wait_for(steady, timeout=300, interval=0.1, message="every group with its 2 backends")
            await asyncio.sleep(2)  # the passes the guard writes bring have ended
            slb.rate_limit(args.rate, burst=2)
            throttled_before = sum(
                n for (_, code), n in slb.call_counts().items() if code == "Throttling.User"
            )
            leaving_ip = cluster.ip_of(f"{LEAVING}-old-0")
            new = {s: [f"{s}-new-{i}" for i in range(args.new)] for s in rolling}
            started = time.monotonic()
            await asyncio.gather(
                cluster.delete(kube.POD, f"{LEAVING}-old-0"),
                *(_ready_pod(cluster, s, p) for s, pods in new.items() for p in pods),
            )

            def removed() -> bool:
                return all(b.server_ip != leaving_ip for b in slb.backends(groups[LEAVING]))

            await async_wait_for(
                removed, timeout=600, interval=0.02, message="the leaving pod's backend removed"
            )
            removal = time.monotonic() - started

            def registered() -> bool:
                return all(
                    {b.server_ip for b in slb.backends(groups[s])} >= {cluster.ip_of(p) for p in pods}
                    for s, pods in new.items()
                )

            await async_wait_for(registered, timeout=600, interval=0.05, message="the rollout registered")
            rollout = time.monotonic() - started
            throttled = sum(n for (_, code), n in slb.call_counts().items() if code == "Throttling.User")
        finally:
            await manager.stop(timeout=10)
            slb_client.close()
            budget.configure(ProviderBudgetOptions())
    return {"removal": removal, "rollout": rollout, "throttled": throttled - throttled_before}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=3.0, help="requests a second the account allows")
    parser.add_argument("--rolling", type=int, default=4, help="Services rolling out at once")
    parser.add_argument("--new", type=int, default=5, help="new pods per rolling Service")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of each mode, interleaved")
    args = parser.parse_args()
    print(
        f"throttled provider: {args.rate:g} requests/s; {args.rolling} Services rolling out {args.new} pods "
        f"each while 1 pod of another Service is deleted; {args.rounds} round(s) each"
    )
    results: dict[bool, list[dict[str, Any]]] = {False: [], True: []}
    with LocalControlPlane() as cp:
        client = KubeClient.from_kubeconfig(str(cp.kubeconfig))
        try:
            for round_ in range(args.rounds):
                for with_budget in (False, True):
                    namespace = f"budget-{'on' if with_budget else 'off'}-{round_}"
                    results[with_budget].append(await one_round(client, namespace, args, with_budget))
        finally:
            client.close()
    rows = []
    for with_budget, label in ((False, "without budget"), (True, f"budget {args.rate * 0.8:g}/s")):
        runs = results[with_budget]
        rows.append(
            {
                "mode": label,
                "deletion->removal s": round(statistics.median(r["removal"] for r in runs), 2),
                "rollout registered s": round(statistics.median(r["rollout"] for r in runs), 2),
                "throttled answers": round(statistics.median(r["throttled"] for r in runs)),
            }
        )
    columns = list(rows[0])
    widths = [max(len(c), *(len(str(r[c])) for r in rows)) for c in columns]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)))
    for row in rows:
        print("  ".join(str(row[c]).ljust(w) for c, w in zip(columns, widths, strict=True)))
    ratio = rows[0]["deletion->removal s"] / max(rows[1]["deletion->removal s"], 1e-9)
    print(f"deletion->removal without / with the budget: {ratio:.1f}x")


if __name__ == "__main__":
    asyncio.run(main())
