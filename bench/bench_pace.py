"""Pace, cost and scale of a controller in its own process, each figure beside a baseline.

One local control plane per run; S Services x P pods (default 1 x 1000) exist, not ready, when
the controller starts in its OWN process (ours: ``python -m resourceconsist run --adapter demo``;
with ``--go``, the Go original built by hack/build-go-original.sh, at its default client QPS and
unthrottled), so its CPU seconds (/proc/PID/stat) and peak RSS (VmHWM) are its own. A driver
with 16 concurrent clients, never slowed, then:

1. patches every pod Ready: seconds until all pods carry their Service's lifecycle finalizer
   (total convergence), of which after the driver's last readiness patch returned, the
   controller's CPU seconds from the first patch until the pods are quiet again, and the
   controller's pod writes per pod (the API server's ``apiserver_request_total`` less the
   driver's own writes), and each pod's wait from its own patch to its finalizer (median, 99th
   percentile);
2. takes readiness from 100 pods: seconds until their lifecycle finalizers are gone, each pod's
   wait likewise, and the controller's CPU seconds for it;
3. leaves things be for 30 s (10 s with ``--quick``) while touching each Service three times
   (an annotation no adapter reads, so passes run): the controller's writes, which must be 0.

Baselines on the same API server, in this process: the raw PATCH rate of 16 threads (the
physical limit: seconds for N writes, and the driver's CPU per write), the Go frame's write
pattern for new pods replayed (bench_frame's ``_go_pattern_baseline``), and the peak RSS of a
process that only imports what ``run`` imports. docs/benchmarks.md explains every figure.

Run: ``python bench/bench_pace.py`` (``make bench``); ``--go`` adds the Go original beside ours,
``--rounds 3`` takes medians of interleaved rounds, ``--scale`` prints the curve at 1k, 3k and
10k pods (one Service, 1000 x 10 and 100 x 100).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench_frame import _go_pattern_baseline, _writes
from prometheus_client.parser import text_string_to_metric_families

from resourceconsist import wire
from resourceconsist.cluster import kube
from resourceconsist.cluster.kube import KubeClient
from resourceconsist.rules import lifecycle
from resourceconsist.testing import Cluster, LocalControlPlane, finalizers
from resourceconsist.testing.controlplane import free_port

CLIENTS = 16
FLIPS = 100
WRITE_VERBS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
#: The resources a controller of ours or the original writes (the API server writes Leases itself).
CONTROLLER_RESOURCES = frozenset({"pods", "services", "events"})
GO_BINARY = (
    Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "resourceconsist/goorig-v0.0.7/goorig"
)
#: What ``resourceconsist run --adapter demo`` imports before it reconciles anything: urllib3,
#: the threads' transport, too; neither aiohttp (the loop's transport and the probe and metrics
#: endpoints have their own: resourceconsist.cluster.http1, resourceconsist.runtime.endpoints)
#: nor the official client (docs/index.md, "Which cluster").
IMPORT_BASELINE = (
    "import resourceconsist.commands.cli, resourceconsist.runtime.manager, "
    "resourceconsist.experimental.demo, resourceconsist.adapters, resourceconsist.cluster.kubeconfig, "
    "urllib3"
)


# -- the controller under test, in its own process ------------------------------------------------


@dataclass(frozen=True)
class Kind:
    """A controller to measure: a label and how to start it for a kubeconfig and namespace."""

    label: str
    argv: Callable[[Path, str], list[str]]


def ours_argv(kubeconfig: Path, ns: str, *extra: str, metrics_port: int = 0) -> list[str]:
    """``resourceconsist run --adapter demo`` of ours in its own process, with ``extra`` flags
    (bench_shards.py adds sharding's); plain-HTTP metrics on ``metrics_port`` when given."""
    return [
        sys.executable,
        "-m",
        "resourceconsist",
        "--log-level",
        os.environ.get("BENCH_LOG_LEVEL", "warning"),
        "run",
        "--adapter",
        "demo",
        "--kubeconfig",
        str(kubeconfig),
        "--namespace",
        ns,
        *extra,
        # Metrics off unless asked for, probes on a free port: the :8080/:8081 defaults may be taken.
        "--metrics-bind-address",
        f"127.0.0.1:{metrics_port}" if metrics_port else "0",
        "--health-probe-bind-address",
        f"127.0.0.1:{free_port()}",
    ]


def ours() -> Kind:
    return Kind("ours", ours_argv)


def go(binary: Path, qps: float) -> Kind:
    label = f"Go, {qps:g} QPS" if qps > 0 else "Go, no throttle"
    return Kind(
        label, lambda kc, ns: [str(binary), "--kubeconfig", str(kc), "--namespace", ns, "--qps", str(qps)]
    )


class Process:
    """A started controller: its CPU seconds and peak RSS as the kernel counts them."""

    def __init__(self, argv: list[str], log: Path) -> None:
        self._log = log.open("wb")
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT)

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        # utime and stime, fields 14 and 15 of proc(5), counted from the 3rd after the name.
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def peak_rss_mb(self) -> float:
        return _vm_hwm_mb(Path(f"/proc/{self.proc.pid}/status").read_text())

    def check(self) -> None:
        if self.proc.poll() is not None:
            raise RuntimeError(f"the controller exited with {self.proc.returncode}; see {self._log.name}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()


def _vm_hwm_mb(status: str) -> float:
    line = next(x for x in status.splitlines() if x.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024


def import_baseline_mb() -> float:
    """Peak RSS of a Python process that imports what ``run`` imports and does nothing else."""
    code = f"{IMPORT_BASELINE}; print(open('/proc/self/status').read())"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    return _vm_hwm_mb(out)


# -- what the API server counts ---------------------------------------------------------------


def api_writes(cp: LocalControlPlane) -> dict[str, float]:
    """Write requests the API server served so far, by resource (all subresources, all codes)."""
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(cp.raw_get("/metrics")):
        if family.name != "apiserver_request":
            continue
        for sample in family.samples:
            if sample.name == "apiserver_request_total" and sample.labels.get("verb") in WRITE_VERBS:
                resource = sample.labels.get("resource", "")
                counts[resource] = counts.get(resource, 0.0) + sample.value
    return counts


@dataclass
class WriteMeter:
    """The controller's writes: what the API server served less what the driver sent."""

    cp: LocalControlPlane
    driver: KubeClient
    _mark: tuple[dict[str, float], dict[str, int]] = field(default_factory=lambda: ({}, {}))

    def _driver(self) -> dict[str, int]:
        return {r: _writes(self.driver, r) for r in CONTROLLER_RESOURCES}

    def mark(self) -> None:
        self._mark = (api_writes(self.cp), self._driver())

    def since(self, resources: frozenset[str] = CONTROLLER_RESOURCES) -> int:
        api, drv = api_writes(self.cp), self._driver()
        return round(
            sum(api.get(r, 0) - self._mark[0].get(r, 0) - (drv[r] - self._mark[1][r]) for r in resources)
        )


# -- the cluster as the driver sees it --------------------------------------------------------


class PodWatch:
    """Every pod of the namespace, from a watch: which carry their lifecycle finalizer, and when
    a condition first held (the time of the event that made it true)."""

    def __init__(self, client: KubeClient, ns: str) -> None:
        self.client, self.ns = client, ns
        self.guarded: dict[str, bool] = {}
        #: When each pod's guard last came or went (the time its event reached this watch).
        self.turned: dict[str, float] = {}
        self.count = 0
        #: Pods whose expected-finalizer annotation names their Service (docs/wire-contract.md).
        self.entered: set[str] = set()
        self.last_event = time.monotonic()
        self._cond = threading.Condition()
        self._stream: Any = None
        self._stopped = False
        listing = client.list(kube.POD, ns)
        for pod in listing["items"]:
            self._apply(pod)
        self._rv = listing["metadata"]["resourceVersion"]
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _apply(self, pod: kube.KubeObject) -> None:
        name = pod["metadata"]["name"]
        svc = pod["metadata"]["labels"]["app"]
        now = lifecycle.lifecycle_finalizer(svc) in finalizers(pod)
        was = self.guarded.get(name, False)
        if now != was:
            self.turned[name] = time.monotonic()
        self.count += int(now) - int(was)
        self.guarded[name] = now
        if lifecycle.expected_finalizers(pod):
            self.entered.add(name)
        else:
            self.entered.discard(name)

    def _run(self) -> None:
        while not self._stopped:
            try:
                self._stream = self.client.watch(kube.POD, self.ns, self._rv, timeout_seconds=120)
                for event in self._stream:
                    obj = event["object"]
                    self._rv = obj["metadata"]["resourceVersion"]
                    if event["type"] in ("ADDED", "MODIFIED"):
                        with self._cond:
                            self._apply(obj)
                            self.last_event = time.monotonic()
                            self._cond.notify_all()
            except Exception:
                if self._stopped:
                    return
                time.sleep(0.1)

    def when(self, holds: Callable[[PodWatch], bool], timeout: float, what: str) -> float:
        """Wait until ``holds(self)``; return the monotonic time of the event that made it true."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not holds(self):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{what}: not within {timeout:.0f} s ({self.count} pods guarded)")
                self._cond.wait(left)
            return self.last_event

    def quiet(self, seconds: float, timeout: float, proc: Process) -> None:
        """Wait until no pod changed for ``seconds`` (the controller has nothing left to write)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() - self.last_event < seconds:
            proc.check()
            if time.monotonic() > deadline:
                raise TimeoutError(f"pods still changing after {timeout:.0f} s")
            time.sleep(0.1)

    def stop(self) -> None:
        self._stopped = True
        if self._stream is not None:
            self._stream.close()


def _pool_map(fn: Callable[[str], Any], names: list[str]) -> float:
    """Run ``fn`` over ``names`` from CLIENTS threads as fast as the API server answers; the
    driver threads' own CPU seconds in all."""
    cpu: list[float] = []

    def timed(chunk: list[str]) -> None:
        started = time.thread_time()
        for name in chunk:
            fn(name)
        cpu.append(time.thread_time() - started)

    with ThreadPoolExecutor(CLIENTS) as pool:
        list(pool.map(timed, [names[i::CLIENTS] for i in range(CLIENTS)]))
    return sum(cpu)


def _paced_map(fn: Callable[[str], Any], names: list[str], rate: float) -> float:
    """``_pool_map`` at a fixed rate: the i-th call starts no sooner than i / ``rate`` seconds
    after the first (0: as fast as the API server answers), from CLIENTS threads; a slow answer
    delays only its own thread, so the driver falls behind only where the API server does."""
    if rate <= 0:
        return _pool_map(fn, names)
    cpu: list[float] = []
    start = time.monotonic()
    lock = threading.Lock()
    order = iter(enumerate(names))

    def worker() -> None:
        started = time.thread_time()
        while True:
            with lock:
                nxt = next(order, None)
            if nxt is None:
                break
            i, name = nxt
            delay = start + i / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            fn(name)
        cpu.append(time.thread_time() - started)

    with ThreadPoolExecutor(CLIENTS) as pool:
        for future in [pool.submit(worker) for _ in range(CLIENTS)]:
            future.result()
    return sum(cpu)


def _answered(fn: Callable[[str], Any], at: dict[str, float]) -> Callable[[str], None]:
    """``fn``, noting in ``at`` when the API server answered each name's call."""

    def call(name: str) -> None:
        fn(name)
        at[name] = time.monotonic()

    return call


def per_pod(watch: PodWatch, since: dict[str, float], f: dict[str, float], key: str) -> None:
    """Each pod's milliseconds from its driver's patch answered to its guard turning (its lifecycle
    finalizer written or gone), into ``f``: the median and the 99th percentile. A controller
    following a driver that ramps at a fixed rate ends with the ramp whatever it does; how long
    each pod waits is what the controller decides (docs/benchmarks.md, "Each pod's wait")."""
    waits = sorted(max(0.0, watch.turned[name] - at) * 1000 for name, at in since.items())
    f[f"{key}_p50_ms"] = statistics.median(waits)
    f[f"{key}_p99_ms"] = waits[min(len(waits) - 1, round(0.99 * (len(waits) - 1)))]


def create_services(client: KubeClient, ns: str, services: int) -> None:
    """The S controlled Services svc-NNN, each selecting the pods labelled app=svc-NNN."""
    for i in range(services):
        body = {
            "metadata": {"name": f"svc-{i:03d}", "labels": {wire.CONTROL_LABEL: wire.CONTROL_LABEL_VALUE}},
            "spec": {"selector": {"app": f"svc-{i:03d}"}, "ports": [{"port": 80}]},
        }
        client.create(kube.SERVICE, ns, body)


def populate(
    client: KubeClient,
    ns: str,
    services: int,
    pods: int,
    *,
    ready: bool = False,
    with_services: bool = True,
    employer_label: bool = False,
) -> list[str]:
    """S controlled Services svc-NNN (unless not ``with_services``: ``create_services`` later),
    each selecting P pods svc-NNN-J with an IP, Ready or not; with ``employer_label``, each pod
    labelled for its Service as the webhook's ``--pod-employer-label`` stamps it."""
    cluster = Cluster(client, ns)
    client.create(kube.NAMESPACE, None, {"metadata": {"name": ns}})
    if with_services:
        create_services(client, ns, services)
    names = [f"svc-{i:03d}-{j}" for i in range(services) for j in range(pods)]

    def make(name: str) -> None:
        client.create(kube.POD, ns, pod_body(name, employer_label=employer_label))
        set_ready(client, cluster, name, ready)

    _pool_map(make, names)
    return names


def pod_body(name: str, *, employer_label: bool = False) -> dict[str, Any]:
    """The pod ``svc-NNN-J`` (or ``svc-NNN-rJ``) of the Service ``svc-NNN``."""
    service = name.rsplit("-", 1)[0]
    labels = {"app": service, **({wire.EMPLOYER_LABEL: service} if employer_label else {})}
    return {
        "metadata": {"name": name, "labels": labels},
        "spec": {"containers": [{"name": "c", "image": "x"}]},
    }


def set_ready(client: KubeClient, cluster: Cluster, name: str, ready: bool) -> None:
    ip = cluster.ip_of(name)
    conditions = [{"type": "Ready", "status": "True" if ready else "False"}]
    body = {"status": {"podIP": ip, "podIPs": [{"ip": ip}], "conditions": conditions}}
    client.patch(kube.POD, cluster.namespace, name, body, subresource="status")


# -- one run ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    services: int
    pods: int  # per Service

    @property
    def total(self) -> int:
        return self.services * self.pods

    def __str__(self) -> str:
        return f"{self.services} x {self.pods}" if self.services > 1 else f"{self.pods} pods"


def run_once(
    kind: Kind,
    shape: Shape,
    steady: float,
    go_pattern: bool,
    workdir: Path,
    *,
    late: bool = False,
    rate: float = 0.0,
) -> dict[str, float]:
    """One controller on a fresh control plane: the figures of the module docstring, and the
    baselines measured on the same API server once the controller is gone. ``late``: the
    Services are created just before the Ready ramp (registration and the ramp in one window),
    not before the controller starts; ``rate``: the ramp's pods per second (0: as fast as the
    API server answers)."""
    ns = "bench-pace"
    n = shape.total
    timeout = max(300.0, n / 5)
    with LocalControlPlane() as cp, contextlib.ExitStack() as stack:
        driver = KubeClient.from_kubeconfig(str(cp.kubeconfig))
        stack.callback(driver.close)
        cluster = Cluster(driver, ns)
        names = populate(driver, ns, shape.services, shape.pods, with_services=not late)
        watch = PodWatch(driver, ns)
        stack.callback(watch.stop)
        meter = WriteMeter(cp, driver)
        meter.mark()
        spawned = time.monotonic()
        tag = kind.label.replace(" ", "_").replace(",", "")
        proc = Process(kind.argv(cp.kubeconfig, ns), workdir / f"{tag}{'-late' if late else ''}.log")
        stack.callback(proc.stop)
        f: dict[str, float] = {}

        if late:
            # Start-up: nothing to take in; the controller is up once its CPU stops moving
            # (caches listed, nothing to do), judged the same way for every controller.
            _idle(proc, timeout)
            f["startup_s"] = time.monotonic() - spawned
            f["startup_cpu_s"] = proc.cpu_seconds()
            f["startup_pod_writes_per_pod"] = meter.since(frozenset({"pods"})) / n
        else:
            # Start-up: every Service takes its clean finalizer, every (not ready) pod its
            # expected finalizer (both record them), then the pods stop changing.
            def started() -> bool:
                proc.check()
                svcs = driver.list(kube.SERVICE, ns)["items"]
                return all(wire.CLEAN_FINALIZER in finalizers(s) for s in svcs)

            _until(started, timeout, "the controller takes every Service")
            entered_at = watch.when(lambda w: len(w.entered) == n, timeout, "every pod's expected finalizer")
            watch.quiet(2.0, timeout, proc)
            f["startup_s"] = max(watch.last_event, entered_at) - spawned
            f["startup_cpu_s"] = proc.cpu_seconds()  # imports, first lists and taking the pods in
            f["startup_pod_writes_per_pod"] = meter.since(frozenset({"pods"})) / n

        # 1. All pods become Ready (the Services, when late, created just before).
        meter.mark()
        cpu = proc.cpu_seconds()
        started_at = time.monotonic()
        if late:
            create_services(driver, ns, shape.services)
        readied: dict[str, float] = {}
        _paced_map(_answered(lambda name: set_ready(driver, cluster, name, True), readied), names, rate)
        last_change = time.monotonic()
        guarded_at = watch.when(lambda w: w.count == n, timeout, "all pods guarded")
        f["converge_s"] = guarded_at - started_at
        per_pod(watch, readied, f, "pod_wait")
        f["after_last_s"] = max(0.0, guarded_at - last_change)
        f["ramp_s"] = last_change - started_at
        watch.quiet(1.0, timeout, proc)
        f["converge_cpu_s"] = proc.cpu_seconds() - cpu
        f["pod_writes_per_pod"] = meter.since(frozenset({"pods"})) / n

        # 2. 100 pods lose readiness.
        flipped = names[:: max(1, n // FLIPS)][:FLIPS]
        meter.mark()
        cpu = proc.cpu_seconds()
        started_at = time.monotonic()
        unreadied: dict[str, float] = {}
        _pool_map(_answered(lambda name: set_ready(driver, cluster, name, False), unreadied), flipped)
        gone_at = watch.when(
            lambda w: not any(w.guarded[p] for p in flipped), timeout, "flipped pods unguarded"
        )
        f["flip_s"] = gone_at - started_at
        per_pod(watch, unreadied, f, "flip_wait")
        watch.quiet(1.0, timeout, proc)
        f["flip_cpu_s"] = proc.cpu_seconds() - cpu
        f["flip_pod_writes_per_pod"] = meter.since(frozenset({"pods"})) / len(flipped)

        # 3. Steady state: nothing changes but an annotation no adapter reads.
        meter.mark()
        for touch in range(3):
            for i in range(shape.services):
                body = {"metadata": {"annotations": {"bench/touch": str(touch)}}}
                driver.patch(kube.SERVICE, ns, f"svc-{i:03d}", body)
            time.sleep(steady / 3)
        proc.check()
        f["steady_writes"] = meter.since()
        f["cpu_s"] = proc.cpu_seconds()
        f["rss_mb"] = proc.peak_rss_mb()
        proc.stop()
        watch.stop()

        # Baselines on this API server: the raw PATCH rate (capped at 2000 writes) ...
        sample = names[:2000]
        started_at = time.monotonic()
        driver_cpu = _pool_map(
            lambda name: driver.patch(kube.POD, ns, name, {"metadata": {"annotations": {"bench/raw": "1"}}}),
            sample,
        )
        f["raw_patch_per_s"] = len(sample) / (time.monotonic() - started_at)
        f["raw_cpu_per_write_ms"] = driver_cpu / len(sample) * 1000
        # ... and the Go frame's write pattern for as many new pods.
        if go_pattern:
            go_names = populate(driver, "bench-go", shape.services, shape.pods)
            seconds, writes = _go_pattern_baseline(driver, "bench-go", go_names)
            f["go_pattern_s"], f["go_pattern_writes_per_pod"] = seconds, writes / n
    return f


def _idle(proc: Process, timeout: float, *, settle: float = 1.0, at_least: float = 2.0) -> None:
    """Wait until ``proc`` has run ``at_least`` seconds and then spent under 2 % of a core for
    ``settle`` seconds."""
    deadline = time.monotonic() + timeout
    time.sleep(at_least)
    while True:
        proc.check()
        before = proc.cpu_seconds()
        time.sleep(settle)
        if proc.cpu_seconds() - before < 0.02 * settle:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"the controller is still busy after {timeout:.0f} s")


def _until(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout:.0f} s")
        time.sleep(0.2)


def rounds(
    kinds: list[Kind], shape: Shape, n: int, steady: float, workdir: Path, *, late: bool, rate: float
) -> dict[str, list[dict[str, float]]]:
    """``n`` interleaved rounds of every kind: each kind's figures, round by round."""
    runs: dict[str, list[dict[str, float]]] = {k.label: [] for k in kinds}
    what = "late" if late else "registered"
    for r in range(n):
        for kind in kinds:
            print(f"  round {r + 1}/{n}: {kind.label}, {shape}, {what} ...", file=sys.stderr, flush=True)
            f = run_once(kind, shape, steady, go_pattern=not late, workdir=workdir, late=late, rate=rate)
            f["load1"] = os.getloadavg()[0]
            runs[kind.label].append(f)
            (workdir / f"rounds-{what}.json").write_text(json.dumps(runs, indent=1))
    return runs


def medians(runs: list[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


# -- printing -----------------------------------------------------------------------------------


def _load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


@dataclass(frozen=True)
class Row:
    """A printed figure: its title, key, unit, and the baseline it is divided by (with a name)."""

    title: str
    key: str
    unit: str
    baseline: Callable[[dict[str, float]], float] | None = None
    against: str = ""


def pace_rows(n: int) -> list[Row]:
    def limit(writes: int) -> Callable[[dict[str, float]], float]:
        return lambda f: writes / f["raw_patch_per_s"]

    def driver_cpu(writes: int) -> Callable[[dict[str, float]], float]:
        return lambda f: writes * f["raw_cpu_per_write_ms"] / 1000

    return [
        Row("start-up: not-ready pods taken in", "startup_s", "s"),
        Row("  pod writes per pod at start-up", "startup_pod_writes_per_pod", "", lambda f: 1.0, "one write"),
        Row(
            "pods Ready -> all guarded by the lifecycle finalizer", "converge_s", "s", limit(n), "PATCH limit"
        ),
        Row("  the driver's readiness ramp itself", "ramp_s", "s", limit(n), "PATCH limit"),
        Row("  of which after the last readiness change", "after_last_s", "s", limit(n), "PATCH limit"),
        Row("  each pod: its Ready patch -> guarded, median", "pod_wait_p50_ms", "ms"),
        Row("  each pod: its Ready patch -> guarded, 99th pct", "pod_wait_p99_ms", "ms"),
        Row(f"{FLIPS} pods lose readiness -> finalizers gone", "flip_s", "s", limit(FLIPS), "PATCH limit"),
        Row("  each pod: its patch -> finalizer gone, median", "flip_wait_p50_ms", "ms"),
        Row("  each pod: its patch -> finalizer gone, 99th pct", "flip_wait_p99_ms", "ms"),
        Row(
            "pod writes per pod (becoming Ready)",
            "pod_writes_per_pod",
            "",
            lambda f: f["go_pattern_writes_per_pod"],
            "Go pattern",
        ),
        Row(
            "  per flipped pod (losing readiness)", "flip_pod_writes_per_pod", "", lambda f: 1.0, "one write"
        ),
        Row("  Go write pattern for new pods, same server", "go_pattern_writes_per_pod", ""),
        Row(
            "CPU while converging (Ready ramp)", "converge_cpu_s", "s", driver_cpu(n), "driver CPU, N writes"
        ),
        Row(
            f"CPU for those {FLIPS} flips", "flip_cpu_s", "s", driver_cpu(FLIPS), "driver CPU, as many writes"
        ),
        Row("CPU, whole process", "cpu_s", "s", driver_cpu(n), "driver CPU, N writes"),
        Row("peak RSS", "rss_mb", "MB", lambda f: f["import_rss_mb"], "imports only"),
        Row("steady state writes", "steady_writes", "", None, "target 0"),
    ]


def print_pace(shape: Shape, runs: dict[str, list[dict[str, float]]], *, late: bool, rate: float) -> None:
    """The medians of every kind, ours against each other kind (the ratio of the medians), and
    each round's ratio (rounds are interleaved: round i of ours ran beside round i of the other)."""
    figures = {label: medians(rs) for label, rs in runs.items()}
    main = figures["ours"]
    what = "Services created just before the ramp" if late else "pods registered at start-up"
    pace = f"ramp at {rate:g} pods/s" if rate > 0 else "ramp as fast as the API server answers"
    count = len(runs["ours"])
    print(
        f"\npace at {shape}, {what}; {pace} from {CLIENTS} driver clients; medians of {count} "
        f"interleaved round(s); {_load()}"
    )
    go_pattern = ""
    if "go_pattern_s" in main:
        go_pattern = f"Go write pattern for new pods replayed: {main['go_pattern_s']:.2f} s; "
    print(
        f"baselines on the same API server: raw PATCH {main['raw_patch_per_s']:.0f}/s from {CLIENTS} threads "
        f"({main['raw_cpu_per_write_ms']:.2f} ms driver CPU per write); {go_pattern}"
        f"a process importing what `run` imports: {main['import_rss_mb']:.0f} MB peak RSS; "
        "load average (1 min) at each round's end: " + " ".join(f"{r['load1']:.1f}" for r in runs["ours"])
    )
    labels = list(figures)
    others = labels[1:]
    head = f"{'figure':52} " + " ".join(f"{label[:16]:>16}" for label in labels)
    head += "".join(f" {'ours/' + _short(label):>14}" for label in others)
    print(head + "   ours against its baseline")
    rows = [row for row in pace_rows(shape.total) if row.key in main]
    for row in rows:
        cells = " ".join(f"{_fmt(figures[label][row.key], row.unit):>16}" for label in labels)
        for label in others:
            theirs = figures[label][row.key]
            cells += f" {main[row.key] / theirs:>14.2f}" if theirs else f" {'-':>14}"
        against = row.against
        if row.baseline is not None:
            try:
                base = row.baseline(main)
            except KeyError:
                base = 0.0
            against = f"{main[row.key] / base:.2f}x {row.against}" if base else f"- ({row.against} 0)"
        print(f"{row.title:52} {cells}   {against}")
    for label in others:
        print(f"\neach round's ratio, ours/{label} (round 1 ... {count}; min-max):")
        for row in rows:
            ratios = [
                o[row.key] / t[row.key] for o, t in zip(runs["ours"], runs[label], strict=False) if t[row.key]
            ]
            if not ratios or row.key in ("steady_writes",):
                continue
            cells = " ".join(f"{r:.2f}" for r in ratios)
            print(f"{row.title:52} {cells}   ({min(ratios):.2f}-{max(ratios):.2f})")


def _short(label: str) -> str:
    return label.split(",")[1].strip() if "," in label else label


def print_scale(results: list[tuple[str, Shape, dict[str, float]]]) -> None:
    print(f"\nscale, one controller process each; {_load()}")
    print(
        f"{'controller':>16} {'shape':>12} {'pods':>6} {'converge s':>10} {'ms/pod':>7} {'x limit':>8} "
        f"{'CPU s':>7} {'ms/pod':>7} {'start CPU':>9} {'ramp CPU':>8} {'RSS MB':>7} {'KB/pod':>7} "
        f"{'steady writes':>13}"
    )
    for label, shape, f in results:
        n = shape.total
        # RSS per pod: above what the imports alone take (ours; the Go binary has no such baseline).
        per_pod = f"{(f['rss_mb'] - f['import_rss_mb']) * 1024 / n:.1f}" if label == "ours" else "-"
        print(
            f"{label:>16} {shape!s:>12} {n:>6} {f['converge_s']:>10.2f} {f['converge_s'] / n * 1000:>7.2f} "
            f"{f['converge_s'] / (n / f['raw_patch_per_s']):>8.2f} {f['cpu_s']:>7.2f} "
            f"{f['cpu_s'] / n * 1000:>7.2f} {f['startup_cpu_s']:>9.2f} {f['converge_cpu_s']:>8.2f} "
            f"{f['rss_mb']:>7.0f} {per_pod:>7} {f['steady_writes']:>13.0f}"
        )


def _fmt(value: float, unit: str) -> str:
    return f"{value:.2f} {unit}".strip() if unit else f"{value:.2f}"


def package_view(tree: Path) -> Path:
    """A symlink view of ``tree``'s package as it installs (its own hack/package-view.sh), to
    put first on the path. The tree's root alone would not do: its ``resourceconsist`` has no
    ``experimental`` or ``adapters`` inside, so those would come through this checkout's
    editable install, and the tree would run this checkout's adapters."""
    view = Path(tempfile.mkdtemp(prefix="tree-view-"))
    subprocess.run([str(tree / "hack" / "package-view.sh"), str(view)], check=True)
    return view


def main_tree(path: Path) -> Kind:
    """Ours from another checkout of this repository (the code at a branch point, say), started
    the same way: its package, adapters included, first on the path."""
    view = package_view(path)

    def argv(kubeconfig: Path, ns: str) -> list[str]:
        python, *rest = ours_argv(kubeconfig, ns)
        # -P: ``python -m`` puts the working directory first on the path, and run from a
        # checkout that would import that checkout's package, not the tree's.
        return ["env", f"PYTHONPATH={view}", python, "-P", *rest]

    return Kind(f"tree {path.name}", argv)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=1000, help="pods behind the one Service of the pace run")
    parser.add_argument("--rounds", type=int, default=1, help="interleaved rounds; figures are medians")
    parser.add_argument("--quick", action="store_true", help="10 s of steady state instead of 30 s")
    parser.add_argument(
        "--rate",
        type=float,
        default=300.0,
        help="the Ready ramp's pods per second, for every controller alike (default 300; 0: as fast "
        "as the API server answers)",
    )
    parser.add_argument(
        "--shapes",
        default="registered,late",
        help="the pace run's shapes: registered (the Service and its pods exist when the controller "
        "starts), late (the Service is created just before the ramp); default both",
    )
    parser.add_argument(
        "--go", action="store_true", help="also run the Go original, unthrottled (hack/build-go-original.sh)"
    )
    parser.add_argument("--go-binary", type=Path, default=GO_BINARY)
    parser.add_argument(
        "--go-qps",
        type=float,
        default=0.0,
        help="with --go, also run it at this client QPS (controller-runtime's default is 20; 0: not)",
    )
    parser.add_argument(
        "--against-tree",
        type=Path,
        help="also run ours from this checkout (e.g. a worktree of main at the branch point), beside",
    )
    parser.add_argument(
        "--also-asyncio",
        action="store_true",
        help="also run ours on the standard library's event loop (--event-loop asyncio), beside",
    )
    parser.add_argument("--scale", action="store_true", help="the scale curve at 1k, 3k, 10k pods")
    parser.add_argument(
        "--scale-shapes",
        # 1000 x 10: many Services in one namespace, where a pass must cost what its Service has,
        # not what the namespace has (docs/benchmarks.md, "The scale curve").
        default="1x250,1x500,1x1000,1000x10",
        help="SERVICESxPODS,... for the curve without --scale (default: a quick one, and 1000 x 10)",
    )
    parser.add_argument("--curve-rounds", type=int, default=1, help="interleaved rounds of each curve shape")
    parser.add_argument("--no-pace", action="store_true", help="only the scale curve")
    parser.add_argument(
        "--curve-of",
        choices=("all", "ours", "go"),
        default="all",
        help="whose scale curve to run (go: the unthrottled Go original alone; needs --go)",
    )
    args = parser.parse_args()
    if args.pods < FLIPS:
        parser.error(f"--pods must be at least {FLIPS} (the flip test takes readiness from {FLIPS} pods)")
    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    if not shapes or any(s not in ("registered", "late") for s in shapes):
        parser.error(f"--shapes takes registered and/or late, comma-separated, not {args.shapes!r}")
    kinds = [ours()]
    if args.go:
        if not args.go_binary.is_file():
            parser.error(f"no Go original at {args.go_binary}: run hack/build-go-original.sh first")
        kinds += [go(args.go_binary, 0)]
        if args.go_qps > 0:
            kinds += [go(args.go_binary, args.go_qps)]
    if args.against_tree is not None:
        if not (args.against_tree / "resourceconsist" / "__init__.py").is_file():
            parser.error(f"--against-tree: no resourceconsist package in {args.against_tree}")
        kinds += [main_tree(args.against_tree.resolve())]
    if args.also_asyncio:
        kinds += [Kind("ours, asyncio loop", lambda kc, ns: ours_argv(kc, ns, "--event-loop", "asyncio"))]
    curve_shapes = "1x1000,1x3000,1x10000,1000x10,100x100" if args.scale else args.scale_shapes
    try:
        scale = [Shape(*(int(x) for x in s.split("x"))) for s in curve_shapes.split(",")]
    except (TypeError, ValueError):
        parser.error(f"--scale-shapes takes SERVICESxPODS,... (e.g. 1x1000,100x10), not {curve_shapes!r}")
    steady = 10.0 if args.quick else 30.0
    baseline_rss = import_baseline_mb()
    workdir = Path(tempfile.mkdtemp(prefix="bench-pace-"))
    print(f"  controller logs in {workdir}", file=sys.stderr)
    if not args.no_pace:
        shape = Shape(1, args.pods)
        for what in shapes:
            late = what == "late"
            runs = rounds(kinds, shape, args.rounds, steady, workdir, late=late, rate=args.rate)
            for rs in runs.values():
                for f in rs:
                    f["import_rss_mb"] = baseline_rss
            print_pace(shape, runs, late=late, rate=args.rate)
    results = []
    # The throttled Go original is bound by its QPS (writes / QPS), so the curve leaves it out.
    curve = [k for k in kinds if "QPS" not in k.label]
    if args.curve_of != "all":
        curve = [k for k in curve if (k.label == "ours") == (args.curve_of == "ours")]
    for shape in scale:
        for r in range(args.curve_rounds):
            for kind in curve:
                print(f"  scale: {kind.label}, {shape}, round {r + 1} ...", file=sys.stderr, flush=True)
                f = run_once(kind, shape, steady, go_pattern=False, workdir=workdir, rate=args.rate)
                f["import_rss_mb"] = baseline_rss
                results.append((kind.label, shape, f))
                (workdir / "scale.json").write_text(
                    json.dumps([(k, str(s), r) for k, s, r in results], indent=1)
                )
    print_scale(results)


if __name__ == "__main__":
    main()
