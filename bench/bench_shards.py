"""Sharded replicas at scale: cold convergence, per-replica cost and a rollout, for 1, 2 and 4 replicas.

Not part of ``make bench`` nor CI (``make bench-shards``; docs/benchmarks.md, "Sharded
replicas"). For each replica count R, on a fresh local control plane (etcd + kube-apiserver of
the testing kit; no nodes: pods are plain objects made Ready by the driver, as in
bench_pace.py), S controlled Services x P pods exist and are Ready before any controller runs.
(The cluster is filled once and each run starts from a copy of its etcd data.)
Then R ``resourceconsist run --adapter demo --sharding --shard-name shard-K`` processes start
(each with the built-in sharder on; one of them wins its election), and the driver measures:

1. cold convergence: seconds from the spawn until every pod carries its Service's lifecycle
   finalizer, and the controllers' writes per pod (the API server's ``apiserver_request_total``
   less the driver's own, as in bench_pace.py), of which answered 409 Conflict;
2. a rollout of 100 pods: 100 new pods created and made Ready and 100 old ones deleted at once,
   from 16 driver threads; seconds until every new pod is guarded and every old one is gone
   (its finalizer released after deregistration);
3. per replica: its Services (shard label), CPU seconds (/proc/PID/stat) and peak RSS (VmHWM),
   and the pod lists the replicas made during the cold convergence (each decodes every pod of
   the namespace: docs/scaling.md, "What a shard's employers need of pods"), and the pod
   watches the API server closed because a replica did not keep up
   (``apiserver_terminated_watchers_total``), and each replica's reconcile passes during the
   cold convergence with their mean wall time (its own ``controller_runtime_reconcile_*``):
   whether the passes divide as the pods do.

The table gives each figure beside the 1-replica run of the same invocation, so a ratio compares
runs on the same machine at the same moment.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from bench_pace import (
    CLIENTS,
    WRITE_VERBS,
    PodWatch,
    Process,
    WriteMeter,
    _load,
    _pool_map,
    _until,
    ours_argv,
    pod_body,
    populate,
    set_ready,
)
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from resourceconsist.cluster import kube
from resourceconsist.cluster.kube import KubeClient, NotFound
from resourceconsist.runtime.sharding.ring import shard_label
from resourceconsist.testing import Cluster, LocalControlPlane
from resourceconsist.testing.controlplane import free_port

NAMESPACE = "bench-shards"
RING = "bench"
ROLLOUT = 100


def replica_argv(
    kubeconfig: Path,
    shard: str,
    *,
    employer_label: bool = False,
    namespace: str = NAMESPACE,
    placement: str = "ring",
    metrics_port: int = 0,
) -> list[str]:
    """One sharded replica of ours, its built-in sharder on (docs/scaling.md); with
    ``employer_label``, watching only the pods labelled for its Services."""
    return ours_argv(
        kubeconfig,
        namespace,
        "--sharding",
        "--controller-ring",
        RING,
        "--shard-name",
        shard,
        "--leader-election-namespace",
        namespace,
        *(["--pod-employer-label"] if employer_label else []),
        f"--shard-placement={placement}",
        metrics_port=metrics_port,
    )


@dataclass
class Idle:
    """What a replica costs with nothing to do: its peak RSS, the CPU seconds of its start
    (interpreter, imports, first lists), and its CPU seconds per second after that."""

    rss_mb: float
    cpu_per_s: float
    start_cpu_s: float

    def cpu_s(self, alive_s: float) -> float:
        """The CPU seconds an idle replica uses in ``alive_s`` seconds of life."""
        return self.start_cpu_s + self.cpu_per_s * alive_s


def idle_replica(
    workdir: Path, filled: tuple[Path, list[str]], employer_label: bool, seconds: float = 40.0
) -> Idle:
    """One replica watching an empty namespace of the filled control plane for ``seconds``: the
    baseline each replica's figures are taken above (the issue's "above its idle baseline").

    Its CPU is read at a quarter of ``seconds`` and at the end: the rate between the two is the
    idle rate, and what it had used at the first reading beyond that rate is its start. A rate
    taken over the whole life (as before 2026-11-29) counts the start once per 20 s of a measured
    replica's life, and so took off more than an idle replica costs: it flattered the shares."""
    with LocalControlPlane(etcd_seed=filled[0]) as cp, contextlib.ExitStack() as stack:
        driver = KubeClient.from_kubeconfig(str(cp.kubeconfig))
        stack.callback(driver.close)
        driver.create(kube.NAMESPACE, None, {"metadata": {"name": "bench-idle"}})
        started = time.monotonic()
        proc = Process(
            replica_argv(cp.kubeconfig, "idle", employer_label=employer_label, namespace="bench-idle"),
            workdir / "idle.log",
        )
        stack.callback(proc.stop)
        readings: list[tuple[float, float]] = []
        for until in (started + seconds / 4, started + seconds):
            while time.monotonic() < until:
                proc.check()
                time.sleep(0.5)
            readings.append((time.monotonic() - started, proc.cpu_seconds()))
        (t1, cpu1), (t2, cpu2) = readings
        rate = max(0.0, (cpu2 - cpu1) / (t2 - t1))
        return Idle(proc.peak_rss_mb(), rate, max(0.0, cpu1 - rate * t1))


def pod_writes_by_answer(cp: LocalControlPlane) -> dict[str, float]:
    """Write requests on pods the API server served so far, by HTTP code (409: a conflict)."""
    return {code: float(n) for code, n in cp.requests_served("pods", WRITE_VERBS).items()}


@dataclass
class Result:
    replicas: int
    pods: int
    converge_s: float
    pod_writes_per_pod: float
    service_writes: int
    rollout_s: float
    rollout_pod_writes_per_pod: float
    conflicts_per_pod: float
    pod_lists_per_replica: float
    #: Pod watches the API server closed because a watcher fell behind (the replicas' and the
    #: benchmark's own), and the replicas' pod watches that expired (410 Gone: re-listed).
    pod_watches_dropped: int
    pod_watches_expired: list[int]
    #: Assignments by the sharder while each replica ran it: which replica held the sharder.
    sharder_assigns: list[int]
    services_per_replica: list[int]
    #: Each replica's reconcile passes during the cold convergence, and the wall seconds they
    #: took together (``controller_runtime_reconcile_total``, ``..._time_seconds_sum``).
    passes: list[int]
    pass_s: list[float]
    cpu_s: list[float]
    rss_mb: list[float]
    #: Each replica's seconds from its spawn to the moment its CPU was read.
    alive_s: list[float]


def seed(services: int, pods: int, workdir: Path, employer_label: bool) -> tuple[Path, list[str]]:
    """Fill a control plane once with the Services and their Ready pods and keep its etcd data:
    each replica count starts on a fresh control plane from a copy of it (at 100k pods, filling
    takes longer than converging)."""
    kept = workdir / "etcd-seed"
    with LocalControlPlane() as cp:
        driver = KubeClient.from_kubeconfig(str(cp.kubeconfig))
        try:
            names = populate(driver, NAMESPACE, services, pods, ready=True, employer_label=employer_label)
        finally:
            driver.close()
        cp.stop(keep_etcd=kept)
    return kept, names


def run_replicas(
    replicas: int,
    services: int,
    pods: int,
    workdir: Path,
    filled: tuple[Path, list[str]],
    employer_label: bool,
    placement: str = "ring",
) -> Result:
    n = services * pods
    timeout = max(300.0, n / 5)
    seeded, names = filled
    with LocalControlPlane(etcd_seed=seeded) as cp, contextlib.ExitStack() as stack:
        driver = KubeClient.from_kubeconfig(str(cp.kubeconfig))
        stack.callback(driver.close)
        cluster = Cluster(driver, NAMESPACE)
        watch = PodWatch(driver, NAMESPACE)
        stack.callback(watch.stop)
        meter = WriteMeter(cp, driver)
        meter.mark()
        answers = pod_writes_by_answer(cp)
        lists = sum(cp.requests_served("pods", {"LIST"}).values())
        dropped = cp.watchers_terminated("pods")

        # 1. Cold convergence: every Ready pod guarded by its Service's lifecycle finalizer.
        spawned = time.monotonic()
        procs = []
        ports = [free_port() for _ in range(replicas)]
        for k in range(replicas):
            proc = Process(
                replica_argv(
                    cp.kubeconfig,
                    f"shard-{k}",
                    employer_label=employer_label,
                    placement=placement,
                    metrics_port=ports[k],
                ),
                workdir / f"r{replicas}-shard-{k}.log",
            )
            stack.callback(proc.stop)
            procs.append(proc)

        def converged() -> bool:
            for proc in procs:
                proc.check()
            return watch.count == n

        _until(converged, timeout, "every pod guarded")
        converge_s = watch.last_event - spawned
        watch.quiet(2.0, timeout, procs[0])
        pod_writes = meter.since(frozenset({"pods"}))
        service_writes = meter.since(frozenset({"services", "events"}))
        conflicts = pod_writes_by_answer(cp).get("409", 0.0) - answers.get("409", 0.0)
        pod_lists = sum(cp.requests_served("pods", {"LIST"}).values()) - lists
        passes = [replica_passes(port) for port in ports]

        # 2. A rollout: ROLLOUT new pods made Ready, as many old ones deleted, at once.
        old = names[:: max(1, n // ROLLOUT)][:ROLLOUT]
        new = [f"svc-{i % services:03d}-r{i}" for i in range(ROLLOUT)]
        meter.mark()
        started = time.monotonic()

        def step(i: int) -> None:
            driver.create(kube.POD, NAMESPACE, pod_body(new[i], employer_label=employer_label))
            set_ready(driver, cluster, new[i], True)
            driver.delete(kube.POD, NAMESPACE, old[i])

        _pool_map(lambda s: step(int(s)), [str(i) for i in range(ROLLOUT)])

        def served() -> bool:
            for proc in procs:
                proc.check()
            if not all(watch.guarded.get(p, False) for p in new):
                return False
            for p in old:
                with contextlib.suppress(NotFound):
                    driver.get(kube.POD, NAMESPACE, p)
                    return False
            return True

        _until(served, timeout, "the rollout served")
        rollout_s = time.monotonic() - started
        watch.quiet(1.0, timeout, procs[0])
        rollout_writes = meter.since(frozenset({"pods"}))

        label = shard_label(RING)
        held = [
            s["metadata"].get("labels", {}).get(label) for s in driver.list(kube.SERVICE, NAMESPACE)["items"]
        ]
        scraped = [replica_metrics(port) for port in ports]
        result = Result(
            replicas=replicas,
            pods=n,
            converge_s=converge_s,
            pod_writes_per_pod=pod_writes / n,
            service_writes=service_writes,
            rollout_s=rollout_s,
            rollout_pod_writes_per_pod=rollout_writes / (2 * ROLLOUT),
            conflicts_per_pod=conflicts / n,
            # LIST requests are pages of 500 pods (``Informer.page_size``): a full list is n/500.
            pod_lists_per_replica=pod_lists / replicas / -(-n // 500),
            pod_watches_dropped=cp.watchers_terminated("pods") - dropped,
            pod_watches_expired=[e for e, _ in scraped],
            sharder_assigns=[a for _, a in scraped],
            services_per_replica=[held.count(f"shard-{k}") for k in range(replicas)],
            passes=[n for n, _ in passes],
            pass_s=[t for _, t in passes],
            cpu_s=[p.cpu_seconds() for p in procs],
            rss_mb=[p.peak_rss_mb() for p in procs],
            alive_s=[time.monotonic() - spawned for _ in procs],
        )
    return result


def _samples(port: int) -> Iterator[Sample]:
    """A replica's metrics, read from its ``/metrics``."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    for family in text_string_to_metric_families(text):
        yield from family.samples


def replica_passes(port: int) -> tuple[int, float]:
    """A replica's reconcile passes so far and their summed wall seconds: whether a replica
    with a quarter of the pods makes a quarter of the passes (docs/benchmarks.md)."""
    passes, seconds = 0, 0.0
    for sample in _samples(port):
        if sample.name == "controller_runtime_reconcile_total":
            passes += int(sample.value)
        elif sample.name == "controller_runtime_reconcile_time_seconds_sum":
            seconds += sample.value
    return passes, seconds


def replica_metrics(port: int) -> tuple[int, int]:
    """From a replica's own metrics: its pod watches that ended in 410 Gone
    (``resourceconsist_informer_watch_expired_total``), and the assignments the sharder made
    while this replica ran it (``resourceconsist_sharder_moves_total``)."""
    expired = assigned = 0
    for sample in _samples(port):
        if sample.name == "resourceconsist_informer_watch_expired_total":
            expired += int(sample.value) if sample.labels.get("resource") == "pods" else 0
        elif sample.name == "resourceconsist_sharder_moves_total":
            assigned += int(sample.value) if sample.labels.get("move") == "assign" else 0
    return expired, assigned


def above_idle(r: Result, idle: Idle) -> tuple[list[float], list[float]]:
    """Each replica's CPU seconds and peak RSS above the idle replica's."""
    cpu = [c - idle.cpu_s(t) for c, t in zip(r.cpu_s, r.alive_s, strict=True)]
    return cpu, [m - idle.rss_mb for m in r.rss_mb]


def print_table(
    services: int, pods: int, results: list[Result], idle: Idle, employer_label: bool, placement: str
) -> None:
    base = results[0]
    print(
        f"\nsharded replicas, {services} Services x {pods} pods = {services * pods} pods, "
        f"demo adapter, {CLIENTS} driver clients, {os.cpu_count()} cores; {_load()}; "
        f"pods selected by the employer label: {'yes' if employer_label else 'no'}; placement: {placement}; "
        f"idle replica: {idle.rss_mb:.0f} MB, {idle.start_cpu_s:.2f} CPU s to start, then "
        f"{idle.cpu_per_s * 100:.2f}% of a core"
    )
    head = (
        f"{'replicas':>8} {'converge s':>10} {'x1':>5} {'pod writes/pod':>14} {'of which 409':>12} "
        f"{'svc+event writes':>16} {'pod lists/replica':>17} {'watches dropped':>15} {'expired (410)':>15} "
        f"{'rollout s':>9} {'x1':>5} "
        f"{'Services per replica':>22} {'sharder assigns':>16} "
        f"{'CPU s per replica':>24} {'max CPU x1':>10} {'peak RSS MB per replica':>26} {'max RSS x1':>10}"
    )
    print(head)
    for r in results:
        print(
            f"{r.replicas:>8} {r.converge_s:>10.1f} {r.converge_s / base.converge_s:>5.2f} "
            f"{r.pod_writes_per_pod:>14.2f} {r.conflicts_per_pod:>12.2f} {r.service_writes:>16} "
            f"{r.pod_lists_per_replica:>17.1f} {r.pod_watches_dropped:>15} "
            f"{'/'.join(map(str, r.pod_watches_expired)):>15} "
            f"{r.rollout_s:>9.2f} "
            f"{r.rollout_s / base.rollout_s:>5.2f} {'/'.join(map(str, r.services_per_replica)):>22} "
            f"{'/'.join(map(str, r.sharder_assigns)):>16} "
            f"{'/'.join(f'{c:.1f}' for c in r.cpu_s):>24} {max(r.cpu_s) / max(base.cpu_s):>10.2f} "
            f"{'/'.join(f'{m:.0f}' for m in r.rss_mb):>26} {max(r.rss_mb) / max(base.rss_mb):>10.2f}"
        )
    base_cpu, base_rss = above_idle(base, idle)
    print(f"\nabove the idle replica, each replica's share of the {base.replicas}-replica run's figure:")
    print(f"{'replicas':>8} {'CPU s above idle':>28} {'ratios':>28} {'RSS MB above idle':>24} {'ratios':>28}")
    for r in results:
        cpu, rss = above_idle(r, idle)
        print(
            f"{r.replicas:>8} {'/'.join(f'{c:.1f}' for c in cpu):>28} "
            f"{'/'.join(f'{c / max(base_cpu):.3f}' for c in cpu):>28} "
            f"{'/'.join(f'{m:.0f}' for m in rss):>24} {'/'.join(f'{m / max(base_rss):.3f}' for m in rss):>28}"
        )
    print("\nreconcile passes while converging (a replica's share of the passes, and the wall ms of each):")
    print(f"{'replicas':>8} {'passes per replica':>28} {'all / x1':>9} {'ms per pass':>28}")
    for r in results:
        print(
            f"{r.replicas:>8} {'/'.join(map(str, r.passes)):>28} "
            f"{sum(r.passes) / max(1, sum(base.passes)):>9.2f} "
            f"{'/'.join(f'{1000 * t / max(1, n):.1f}' for n, t in zip(r.passes, r.pass_s, strict=True)):>28}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--services", type=int, default=100, help="controlled Services (default 100)")
    parser.add_argument("--pods", type=int, default=100, help="pods per Service (default 100)")
    parser.add_argument("--replicas", default="1,2,4", help="replica counts, comma-separated (default 1,2,4)")
    parser.add_argument(
        "--pod-employer-label",
        action="store_true",
        help="pods carry the employer label (as the webhook stamps it) and replicas watch by it",
    )
    parser.add_argument(
        "--shard-placement",
        choices=["ring", "balanced"],
        default="ring",
        help="how the sharder places the Services (run --shard-placement; default ring)",
    )
    args = parser.parse_args()
    try:
        counts = [int(x) for x in args.replicas.split(",")]
    except ValueError:
        parser.error(f"--replicas takes counts separated by commas (e.g. 1,2,4), not {args.replicas!r}")
    if not counts or min(counts) < 1:
        parser.error("--replicas: every count must be at least 1")
    if args.services < 1 or args.services * args.pods < ROLLOUT:
        parser.error(f"at least one Service and {ROLLOUT} pods in all (the rollout replaces {ROLLOUT})")
    workdir = Path(tempfile.mkdtemp(prefix="bench-shards-"))
    print(f"  controller logs in {workdir}", file=sys.stderr)
    print(f"  filling {args.services} x {args.pods} once ...", file=sys.stderr, flush=True)
    label = args.pod_employer_label
    filled = seed(args.services, args.pods, workdir, label)
    results = []
    try:
        print("  an idle replica ...", file=sys.stderr, flush=True)
        idle = idle_replica(workdir, filled, label)
        for count in counts:
            print(f"  {count} replica(s), {args.services} x {args.pods} ...", file=sys.stderr, flush=True)
            results.append(
                run_replicas(count, args.services, args.pods, workdir, filled, label, args.shard_placement)
            )
            (workdir / "results.json").write_text(json.dumps([r.__dict__ for r in results], indent=1))
    finally:
        shutil.rmtree(filled[0], ignore_errors=True)  # etcd's data: large, and only a seed
    print_table(args.services, args.pods, results, idle, label, args.shard_placement)


if __name__ == "__main__":
    main()
