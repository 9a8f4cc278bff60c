"""The traffic benchmark: requests that fail while a Deployment rolls behind a real HAProxy, counted
by an open-loop load generator (docs/zero-downtime.md, "Measured under traffic"; issue 36).

On a real node (``RealNodeCluster``: containerd, runc, the kubelet; root), a Deployment of the HTTP
test server behind the built-in ``haproxy`` adapter: Debian's HAProxy on the host, its frontend on
loopback, the pods its servers at their IPs on the node's bridge; the controller as two
``resourceconsist run --adapter haproxy --leader-elect`` processes (a leader and a standby) reaching
the runtime API through a proxy (the latency fault); the admission webhook in this process. The
load generator sends ``--rate`` requests a second (500) only to HAProxy's frontend, in a process of
its own, bounded in count and time, and reports its own lag; a run whose lag passed 50 ms is void
and run again (up to twice). A request fails on a non-2xx answer, a refused or reset connection,
or no answer within 1 s; HAProxy retries nothing (``retries 0``, ``retry-on none``, no
``redispatch``) and logs every request that failed, with its termination state.

Scenarios (``--only``; resourceconsist/testing/traffic.py): a rolling update of 10 replicas
(Kubernetes' default maxSurge/maxUnavailable, 25%/25%); the same with the leader SIGKILLed
mid-rollout, frozen (SIGSTOP) until the standby took its Lease over and then resumed, and with
every runtime API command 300 ms slower; scale down 10 -> 2; 3 pods evicted at once through the
Eviction API; and, apart from the zero target, 3 pods deleted with grace period 0. Each under
each protection (``--protection``): ``off`` (no readiness gate, no preStop), ``gates+sleep`` (the
gate and a preStop sleep of ``--drain-seconds``) and ``gates+wait`` (the gate and the drain waiter:
the preStop ends when a manager says HAProxy let go, at most the drain time), ``--runs`` rounds (3),
each round every scenario under every protection once.

    make bench-traffic                                                   # every scenario, 3 rounds
    python bench/bench_traffic.py --runs 1 --only roll --protection off   # one quick look
    python bench/bench_traffic.py --report build/bench-traffic.json      # the table again

Prints a Markdown table (each cell: run 1, 2, 3) and why what failed failed (HAProxy's log), and
writes every figure as JSON (``--out``). Needs root, the node's packages and images (``make
node-setup``), Debian's haproxy (``make setup``). Not part of CI: the short version is
tests/extensions/test_traffic_realnode.py.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from resourceconsist.adapters.haproxy import BACKEND_ANNOTATION, PORT_ANNOTATION, webhook_adapter
from resourceconsist.testing import RealNodeCluster, find_image
from resourceconsist.testing.haproxy import LocalHAProxy, SocketProxy
from resourceconsist.testing.traffic import (
    APART,
    PROTECTIONS,
    SCENARIOS,
    RunResult,
    TrafficRig,
    haproxy_target,
    table,
)

#: A void run (the generator late by more than 50 ms) is run again, at most this often.
VOID_RETRIES = 2


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


async def bench(args: argparse.Namespace, workdir: Path) -> list[RunResult]:
    results: list[RunResult] = []
    with (
        RealNodeCluster(images=[find_image("testserver")]) as cluster,
        LocalHAProxy(["web"], log_failures=True, niceness=APART) as haproxy,
        SocketProxy(haproxy.socket) as proxy,
    ):
        (manager_image,) = cluster.import_image(find_image("manager"))
        target = haproxy_target(
            haproxy,
            proxy,
            adapter="haproxy",
            webhook=webhook_adapter(),
            service_annotations={BACKEND_ANNOTATION: "web", PORT_ANNOTATION: "http"},
        )
        log(f"node up; HAProxy frontend {target.frontend[0]}:{target.frontend[1]}; logs in {workdir}")
        async with TrafficRig(
            cluster,
            target,
            workdir,
            rate=args.rate,
            drain_seconds=args.drain_seconds,
            waiter_image=manager_image,
        ) as rig:
            # Run-major: each round measures every scenario under every protection once, so a
            # benchmark cut short has whole rounds, and a drift in the machine's load spreads
            # over all cells instead of falling on one.
            for run in range(1, args.runs + 1):
                for key in args.only:
                    scenario = SCENARIOS[key]
                    for name in args.protection:
                        for attempt in range(args.void_retries + 1):
                            result = await rig.run(scenario, PROTECTIONS[name], run)
                            log(_line(result))
                            if not result.void:
                                break
                            result.notes.append(f"void (attempt {attempt + 1}): the generator was late")
                        results.append(result)
                        _save(args.out, results)
    return results


def _line(r: RunResult) -> str:
    s = r.summary
    return (
        f"{r.scenario} / {r.protection} / run {r.run}: sent {s.get('sent')}, failed {r.failed} "
        f"{r.failures or ''}, gap {s.get('longest_gap_seconds')} s, rolled {r.rolled_seconds} s, "
        f"settled {r.settled_seconds} s, lag {s.get('lag_seconds')} s"
        + (f", takeover {r.takeover_seconds} s" if r.takeover_seconds is not None else "")
        + (f", answers {r.answer_ms} ms" if r.answer_ms else "")
        + (f", failed by second {r.failed_by_second}" if r.failed_by_second else "")
        + (f"; HAProxy: {r.logged}" if r.logged else "")
        + (f"; notes: {r.notes}" if r.notes else "")
    )


def _save(path: Path, results: list[RunResult]) -> None:
    path.write_text(json.dumps([dataclasses.asdict(r) for r in results], indent=1))


def _load(path: Path) -> list[RunResult]:
    return [RunResult(**found) for found in json.loads(path.read_text())]


def _print(results: list[RunResult]) -> None:
    print(table(results))
    print()
    for r in results:
        if r.logged or r.notes:
            said = f"HAProxy {r.logged or '{}'} {r.notes or ''}"
            print(f"- {r.scenario} / {r.protection} / run {r.run}: {said}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--only", nargs="+", choices=list(SCENARIOS), default=list(SCENARIOS))
    parser.add_argument("--protection", nargs="+", choices=list(PROTECTIONS), default=list(PROTECTIONS))
    parser.add_argument(
        "--rate", type=float, default=500.0, help="requests a second (at least 500 for the table)"
    )
    parser.add_argument("--drain-seconds", type=int, default=30, help="the Services' drain time")
    parser.add_argument(
        "--void-retries", type=int, default=VOID_RETRIES, help="runs again of a void run, at most"
    )
    parser.add_argument("--out", type=Path, default=Path("build/bench-traffic.json"))
    parser.add_argument(
        "--report",
        type=Path,
        nargs="+",
        metavar="JSON",
        help="measure nothing: print the table of the figures these files (--out of earlier runs) hold",
    )
    args = parser.parse_args()
    if args.report:
        _print([r for path in args.report for r in _load(path)])
        return
    if os.geteuid() != 0:
        sys.exit("the traffic benchmark runs a real node, which needs root")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="resourceconsist-bench-traffic-"))
    log(f"load average before: {os.getloadavg()[0]:.2f}")
    results = asyncio.run(bench(args, workdir))
    print()
    _print(results)
    log(f"load average after: {os.getloadavg()[0]:.2f}; figures in {args.out}")


if __name__ == "__main__":
    main()
