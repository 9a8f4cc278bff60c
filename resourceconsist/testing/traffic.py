"""Rollouts under traffic: the promise judged by the requests clients send through the load
balancer (docs/zero-downtime.md, "Measured under traffic").

A ``TrafficRig`` runs on a ``RealNodeCluster``: a load balancer on the host (a ``Target``) whose
frontend the open-loop load generator (``resourceconsist.testing.loadgen``) sends to; the
controller that keeps it, as ``resourceconsist run`` processes with leader election (a leader and
a standby, so a killed or frozen leader is taken over, as in a cluster); and the admission webhook
that gives new pods their readiness gate and drain. Each ``run(scenario, protection)`` makes a
fresh namespace with a Service and a Deployment of the HTTP test server
(``realnode.http_server_pod_spec``), waits until the load balancer serves every pod, then sends
traffic while the scenario acts (a rolling update, alone or with the leader SIGKILLed, frozen past
its Lease, or with every provider call slowed; a scale-down; evictions; deletions with grace
period 0) and returns a ``RunResult``: what the generator counted, how long the rollout took, and
why what failed failed, from the load balancer's own log where it keeps one.

The kit imports no adapter: the caller names the adapter, its webhook adapter and the annotations
that make a Service its own (``Target``). ``haproxy_target`` builds the target for the kit's
``LocalHAProxy`` and ``SocketProxy`` (bench/bench_traffic.py and
tests/extensions/test_traffic_realnode.py use it with the ``haproxy`` adapter).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Self, cast

from resourceconsist import wire
from resourceconsist.adapter import WebhookAdapter
from resourceconsist.cluster import kube
from resourceconsist.cluster.cache import InformerFactory
from resourceconsist.cluster.kube import KubeClient, KubeObject
from resourceconsist.rules import lifecycle
from resourceconsist.testing.cluster import DEPLOYMENT, Cluster, rolled_out
from resourceconsist.testing.controlplane import _die_with_parent, free_port
from resourceconsist.testing.haproxy import LocalHAProxy, SocketProxy, failed_requests
from resourceconsist.testing.loadgen import LoadGenerator, LoadReport
from resourceconsist.testing.realnode import BRIDGE_ADDRESS, RealNodeCluster, http_server_pod_spec
from resourceconsist.testing.wait import WaitTimeout, async_wait_for
from resourceconsist.webhook.options import WebhookOptions
from resourceconsist.webhook.server import WebhookServer

#: Where the controllers' Lease lives.
LEASE_NAMESPACE = "resourceconsist"
LEASE_NAME = "resourceconsist-manager"
#: The webhook's objectSelector: the pods it is called for.
CONTROLLED = {wire.CONTROL_LABEL: wire.CONTROL_LABEL_VALUE}
#: The scheduling priority (``set_priority``) of what stands for other machines: the load
#: generator (the clients) and the load balancer. On one host with the node they would
#: otherwise queue behind the node's work, which never delays another machine; the pods, the
#: controller and the control plane keep theirs.
APART = -10
POD_CREATE = [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}]
APP = "web"
SERVICE_ACCOUNT = kube.Resource("", "v1", "ServiceAccount", "serviceaccounts")


# -- what a run measures ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Protection:
    """What a run's namespace and Service ask for: the readiness gates, and the drain on
    termination (``off``: no preStop; ``sleep``: the webhook's preStop sleep of the drain time;
    ``wait``: the preStop waits for the manager's word that the provider let go, at most the drain
    time, docs/zero-downtime.md)."""

    name: str
    gates: bool
    drain: Literal["off", "sleep", "wait"]


OFF = Protection("off", gates=False, drain="off")
SLEEP = Protection("gates+sleep", gates=True, drain="sleep")
WAIT = Protection("gates+wait", gates=True, drain="wait")
PROTECTIONS = {p.name: p for p in (OFF, SLEEP, WAIT)}

Action = Literal["roll", "scale-down", "evict", "delete-grace-0"]
Fault = Literal["kill", "freeze", "latency"]


@dataclass(frozen=True)
class Scenario:
    """One thing users do to a Deployment behind the load balancer, with a fault or without."""

    key: str
    title: str
    action: Action
    fault: Fault | None = None
    replicas: int = 10
    #: Pods the action takes away at once (evict, delete-grace-0); replicas left (scale-down).
    count: int = 3
    #: Counted in the zero target: pods deleted with grace period 0 are not (their containers are
    #: killed at once, so nothing can drain them).
    in_target: bool = True
    #: The Deployment's strategy: Kubernetes' defaults, what users get when they set nothing.
    max_surge: str = "25%"
    max_unavailable: str = "25%"


SCENARIOS = {
    s.key: s
    for s in (
        Scenario("roll", "rolling update of 10 replicas", "roll"),
        Scenario("roll-kill", "the same, leader SIGKILLed mid-rollout", "roll", "kill"),
        Scenario("roll-freeze", "the same, leader frozen (SIGSTOP) past its Lease", "roll", "freeze"),
        Scenario("roll-latency", "the same, runtime API +300 ms a command", "roll", "latency"),
        Scenario("scale-down", "scale down 10 -> 2", "scale-down", count=2),
        Scenario("evict", "3 pods evicted at once (Eviction API)", "evict"),
        Scenario("grace-0", "3 pods deleted with grace period 0", "delete-grace-0", in_target=False),
    )
}


@dataclass(frozen=True)
class LoggedFailure:
    """A failed request as the load balancer logged it: why (``503 SC--``) and where it went (the
    pod, or ``no server``)."""

    why: str
    where: str


@dataclass
class RunResult:
    """One run of one scenario under one protection."""

    scenario: str
    protection: str
    run: int
    summary: dict[str, Any] = field(default_factory=dict)
    #: Failed requests by outcome and status (``status 503``, ``reset``, ``timeout``, ...).
    failures: dict[str, int] = field(default_factory=dict)
    #: Failed requests sent before the scenario acted (the steady state; must be 0).
    failed_before: int = 0
    #: The load balancer's reasons, ``why @ where`` (pods named by their role: old, new, leaving).
    logged: dict[str, int] = field(default_factory=dict)
    #: Seconds from the action to the Deployment complete (``kubectl rollout status``), and to
    #: every pod that had to leave gone.
    rolled_seconds: float | None = None
    settled_seconds: float | None = None
    #: The fault: seconds from it until another replica held the Lease.
    takeover_seconds: float | None = None
    #: When they failed: seconds after the action (whole, ``-1`` before it) -> outcome -> count.
    failed_by_second: dict[str, dict[str, int]] = field(default_factory=dict)
    #: Successful answers' time (ms): median, 99th percentile, longest.
    answer_ms: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def failed(self) -> int:
        return int(self.summary.get("failed", 0) or 0)

    @property
    def void(self) -> bool:
        return bool(self.summary.get("void"))


# -- the load balancer under test -------------------------------------------------------------------


@dataclass
class Target:
    """The load balancer under test and the controller that keeps it."""

    #: ``resourceconsist run --adapter <adapter>``.
    adapter: str
    #: The adapter's webhook adapter (the rig serves it in its own process).
    webhook: WebhookAdapter
    #: The controller processes' environment (how to reach the load balancer).
    env: Mapping[str, str]
    #: What makes a Service this adapter's (beside ``kusionstack.io/control``).
    service_annotations: Mapping[str, str]
    #: Where the load generator sends.
    frontend: tuple[str, int]
    #: The pod IPs the load balancer sends traffic to now.
    serving: Callable[[], set[str]]
    #: What the load balancer still holds of a namespace (its servers), by any name.
    holds: Callable[[str], list[str]]
    #: Slows every provider call by the seconds given (0: no more); None: not available.
    latency: Callable[[float], None] | None = None
    #: Starts a window of the load balancer's failure log; the function it returns closes it.
    failure_log: Callable[[], Callable[[], list[LoggedFailure]]] | None = None


def haproxy_target(
    haproxy: LocalHAProxy,
    proxy: SocketProxy,
    *,
    adapter: str,
    webhook: WebhookAdapter,
    service_annotations: Mapping[str, str],
    backend: str = "web",
    server_prefix: str = "rc:",
) -> Target:
    """The kit's HAProxy as a ``Target``: the controllers reach its runtime API through ``proxy``
    (whose ``delay`` fault is the latency), the generator its frontend of ``backend``; a server
    serves when HAProxy reports it UP with a weight above 0; failures come from its log
    (``log_failures=True``). Servers are named ``<server_prefix><namespace>:...``."""

    def serving() -> set[str]:
        found = set()
        for row in haproxy.servers(backend):
            status = row.get("status", "")
            if (status.startswith("UP") or status == "no check") and int(row.get("weight") or 0) > 0:
                found.add(row.get("addr", "").rpartition(":")[0])
        return found

    def holds(namespace: str) -> list[str]:
        prefix = f"{server_prefix}{namespace}:"
        return [r["svname"] for r in haproxy.servers(backend) if r.get("svname", "").startswith(prefix)]

    def latency(seconds: float) -> None:
        proxy.clear()
        if seconds > 0:
            proxy.fault("delay", seconds=seconds)

    def failure_log() -> Callable[[], list[LoggedFailure]]:
        _, start = haproxy.log_lines(0)

        def close() -> list[LoggedFailure]:
            lines, _ = haproxy.log_lines(start)
            return [
                LoggedFailure(
                    f"{f.status} {f.state}",
                    "no server" if f.server.startswith("<") else f.server.rpartition(":")[2],
                )
                for f in failed_requests(lines)
                if f.backend == backend
            ]

        return close

    return Target(
        adapter=adapter,
        webhook=webhook,
        env={"HAPROXY_RUNTIME_API": proxy.address},
        service_annotations=dict(service_annotations),
        frontend=("127.0.0.1", haproxy.ports[backend]),
        serving=serving,
        holds=holds,
        latency=latency,
        failure_log=failure_log if haproxy.log_failures else None,
    )


# -- the controller processes -------------------------------------------------------------------------


class ControllerProcess:
    """One ``resourceconsist run`` process, its output in ``<workdir>/<name>.log``."""

    def __init__(
        self, name: str, argv: list[str], env: Mapping[str, str], workdir: Path, health: int
    ) -> None:
        self.name = name
        self.health_port = health
        self.log_path = workdir / f"{name}.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in close()
        self.process = subprocess.Popen(
            argv,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent,  # noqa: PLW1509 - only sets the death signal
        )
        self.frozen = False

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def signal(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.process.pid, signum)

    def ready(self) -> bool:
        import urllib.request

        if not self.alive:
            raise RuntimeError(
                f"controller {self.name} exited ({self.process.returncode}); see {self.log_path}"
            )
        with (
            contextlib.suppress(OSError),
            urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}/readyz", timeout=2) as r,
        ):
            return bool(r.status == 200)
        return False

    def close(self, timeout: float = 20.0) -> None:
        if self.alive:
            if self.frozen:
                self.signal(signal.SIGCONT)
            self.signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self._log.close()


class Controllers:
    """The controller's replicas: ``resourceconsist run --leader-elect``, numbered in start order;
    one holds the Lease, the others stand by."""

    def __init__(
        self,
        client: KubeClient,
        kubeconfig: Path,
        target: Target,
        workdir: Path,
        *,
        drain_endpoint: bool,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.client = client
        self.kubeconfig = kubeconfig
        self.target = target
        self.workdir = workdir
        self.drain_endpoint = drain_endpoint
        self.extra_args = list(extra_args)
        self.running: dict[str, ControllerProcess] = {}
        #: The drain endpoints of every replica, started or to come: the waiters ask each.
        self.drain_ports = [free_port() for _ in range(3)] if drain_endpoint else []
        self._free_drain_ports = list(self.drain_ports)
        self._by_port: dict[str, int] = {}
        self._numbers = itertools.count()

    @property
    def drain_urls(self) -> list[str]:
        return [f"http://{BRIDGE_ADDRESS}:{p}" for p in self.drain_ports]

    def start(self) -> ControllerProcess:
        name = f"controller-{next(self._numbers):02d}"
        health = free_port()
        argv = [
            sys.executable,
            "-m",
            "resourceconsist",
            "run",
            "--adapter",
            self.target.adapter,
            "--kubeconfig",
            str(self.kubeconfig),
            "--leader-elect",
            "--leader-election-namespace",
            LEASE_NAMESPACE,
            "--metrics-bind-address",
            f"127.0.0.1:{health}",
            "--health-probe-bind-address",
            f"127.0.0.1:{health}",
            "--shutdown-timeout",
            "10",
        ]
        if self.drain_endpoint:
            # Pods reach the host at the bridge's address.
            port = self._free_drain_ports.pop(0)
            self._by_port[name] = port
            argv += ["--drain-bind-address", f"{BRIDGE_ADDRESS}:{port}"]
        argv += self.extra_args
        env = {k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"}
        # POD_NAME starts the Lease's holderIdentity: the leader is found by name.
        env.update({**self.target.env, "POD_NAME": name})
        process = ControllerProcess(name, argv, env, self.workdir, health)
        self.running[name] = process
        return process

    async def wait_ready(self, timeout: float = 90.0) -> None:
        await async_wait_for(
            lambda: all(p.ready() for p in self.running.values() if not p.frozen),
            timeout=timeout,
            interval=0.2,
            message="the controllers ready",
        )

    def leader(self) -> str | None:
        """The replica that holds the Lease (by its holderIdentity), None when none does."""
        lease = self.client.get_or_none(kube.LEASE, LEASE_NAMESPACE, LEASE_NAME)
        holder = str(((lease or {}).get("spec") or {}).get("holderIdentity") or "")
        name = holder.split("_", 1)[0]
        return name if name in self.running else None

    def kill(self, name: str) -> None:
        """SIGKILL; its drain port is free for the replica that replaces it."""
        process = self.running.pop(name)
        process.signal(signal.SIGKILL)
        process.process.wait(30)
        process.close()
        if name in self._by_port:
            self._free_drain_ports.append(self._by_port.pop(name))

    def freeze(self, name: str) -> None:
        self.running[name].signal(signal.SIGSTOP)
        self.running[name].frozen = True

    def thaw(self, name: str) -> None:
        self.running[name].signal(signal.SIGCONT)
        self.running[name].frozen = False

    def close(self) -> None:
        for process in self.running.values():
            process.close()
        self.running.clear()


# -- the rig ----------------------------------------------------------------------------------------------


class TrafficRig:
    """A load balancer, its controller replicas and the webhook on a real node; ``run`` measures
    one scenario under one protection (module doc). ``async with TrafficRig(...) as rig:``."""

    def __init__(
        self,
        cluster: RealNodeCluster,
        target: Target,
        workdir: Path,
        *,
        rate: float = 500.0,
        drain_seconds: int = 30,
        replicas_processes: int = 2,
        waiter_image: str | None = None,
        controller_args: Sequence[str] = (),
        settle_timeout: float = 300.0,
        niceness: int = APART,
    ) -> None:
        self.cluster = cluster
        self.target = target
        self.workdir = workdir
        self.rate = rate
        self.drain_seconds = drain_seconds
        self.replicas_processes = replicas_processes
        self.waiter_image = waiter_image
        self.settle_timeout = settle_timeout
        #: The generator's scheduling priority: it stands for clients on other machines, which
        #: the node's work never delays (negative values need root, which a real node has).
        self.niceness = niceness
        self.client = KubeClient.from_kubeconfig(str(cluster.kubeconfig))
        self.controllers = Controllers(
            self.client,
            cluster.kubeconfig,
            target,
            workdir,
            drain_endpoint=waiter_image is not None,
            extra_args=controller_args,
        )
        self._webhook: WebhookServer | None = None
        self._webhook_name = "resourceconsist-traffic"
        self._runs = itertools.count(1)

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    # -- life ---------------------------------------------------------------------------------------

    async def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(kube.ApiError):
            await asyncio.to_thread(
                self.client.create, kube.NAMESPACE, None, {"metadata": {"name": LEASE_NAMESPACE}}
            )
        await self._start_webhook()
        for _ in range(self.replicas_processes):
            self.controllers.start()
        await self.controllers.wait_ready()
        await async_wait_for(
            lambda: asyncio.to_thread(self.controllers.leader),
            timeout=60,
            message="a leader among the controllers",
        )

    async def _start_webhook(self) -> None:
        from resourceconsist.webhook.options import DrainWaiterOptions

        cert, key = self.cluster.webhook_certificate()
        cert_dir = self.workdir / "webhook-certs"
        cert_dir.mkdir(exist_ok=True)
        shutil.copy(cert, cert_dir / "tls.crt")
        shutil.copy(key, cert_dir / "tls.key")
        waiter = (
            DrainWaiterOptions(image=self.waiter_image, endpoints=tuple(self.controllers.drain_urls))
            if self.waiter_image is not None
            else None
        )
        server = WebhookServer(
            [self.target.webhook],
            WebhookOptions(host="127.0.0.1", port=0, cert_dir=cert_dir, bootstrap=None, drain_waiter=waiter),
            informers=InformerFactory(self.client),
            own_informers=True,
        )
        await server.start()
        self._webhook = server
        await server.wait_ready(timeout=30)
        await asyncio.to_thread(
            self.cluster.install_webhook,
            self._webhook_name,
            port=server.port,
            path=f"/mutating-{self.target.webhook.name}",
            rules=POD_CREATE,
            object_selector={"matchLabels": CONTROLLED},
        )

    async def stop(self) -> None:
        self.controllers.close()
        with contextlib.suppress(kube.ApiError):
            await asyncio.to_thread(
                self.client.delete, kube.MUTATING_WEBHOOK_CONFIGURATION, None, self._webhook_name
            )
        if self._webhook is not None:
            await self._webhook.stop()
            self._webhook = None
        self.client.close()

    async def _replicas_up(self) -> None:
        """Every replica alive and not frozen, as many as asked (a killed one was replaced)."""
        for name, process in list(self.controllers.running.items()):
            if process.frozen:
                self.controllers.thaw(name)
            if not process.alive:
                self.controllers.running.pop(name).close()
        while len(self.controllers.running) < self.replicas_processes:
            self.controllers.start()
        await self.controllers.wait_ready()

    # -- one run --------------------------------------------------------------------------------------

    def annotations(self, protection: Protection) -> dict[str, str]:
        found = dict(self.target.service_annotations)
        if protection.gates:
            found[wire.READINESS_GATE_ANNOTATION] = "true"
        if protection.drain != "off":
            found[wire.DRAIN_SECONDS_ANNOTATION] = str(self.drain_seconds)
        if protection.drain == "wait":
            found[wire.DRAIN_MODE_ANNOTATION] = "wait"
        return found

    async def run(
        self,
        scenario: Scenario,
        protection: Protection,
        run: int = 1,
        *,
        annotations: Mapping[str, str] | None = None,
    ) -> RunResult:
        """Measure ``scenario`` once under ``protection`` (module doc); ``annotations`` go on the
        Service beside the target's and the protection's (e.g. the adapter's health checks)."""
        if protection.drain == "wait" and self.waiter_image is None:
            raise ValueError("the wait drain needs the rig made with waiter_image=")
        await self._replicas_up()
        namespace = f"traffic-{os.getpid()}-{next(self._runs)}"
        result = RunResult(scenario.key, protection.name, run)
        c = Cluster(self.client, namespace)
        await self._namespace(namespace, protection)
        try:
            await self._deploy(c, scenario, protection, annotations or {})
            await self._measure(c, scenario, result)
        finally:
            await self._remove(namespace)
        return result

    async def _namespace(self, namespace: str, protection: Protection) -> None:
        labels = (
            {wire.READINESS_GATE_INJECT_LABEL: wire.READINESS_GATE_INJECT_VALUE} if protection.gates else {}
        )
        body = {"metadata": {"name": namespace, "labels": labels}}
        await asyncio.to_thread(self.client.create, kube.NAMESPACE, None, body)
        await async_wait_for(
            lambda: asyncio.to_thread(self.client.get_or_none, SERVICE_ACCOUNT, namespace, "default"),
            timeout=30,
            message=f"the default ServiceAccount of {namespace}",
        )

    async def _deploy(
        self, c: Cluster, scenario: Scenario, protection: Protection, annotations: Mapping[str, str]
    ) -> None:
        service = await c.service(
            APP, {"app": APP}, annotations={**annotations, **self.annotations(protection)}
        )
        assert self._webhook is not None
        reader = self._webhook.reader

        def seen() -> bool:
            # The webhook's caches hold the namespace's label and the Service as made.
            ns = reader.get(kube.NAMESPACE, None, c.namespace)
            svc = reader.get(kube.SERVICE, c.namespace, APP)
            labelled = wire.READINESS_GATE_INJECT_LABEL in ((ns or {}).get("metadata") or {}).get(
                "labels", {}
            )
            return (
                svc is not None
                and labelled == protection.gates
                and svc["metadata"]["uid"] == service["metadata"]["uid"]
            )

        await async_wait_for(seen, timeout=30, message="the webhook's caches to see the Service")
        await c.deployment(
            APP,
            scenario.replicas,
            labels={"app": APP, **CONTROLLED},
            max_surge=scenario.max_surge,
            max_unavailable=scenario.max_unavailable,
            pod_spec=http_server_pod_spec(log_served=False),
        )
        await c.wait_rollout(APP, timeout=300)
        pods = await self._live_pods(c)
        for pod in pods:
            problem = spec_problem(pod, protection, self.drain_seconds)
            if problem:
                raise RuntimeError(
                    f"pod {pod['metadata']['name']}: {problem} (the webhook did not act as asked)"
                )
        ips = {p["status"]["podIP"] for p in pods}
        await async_wait_for(
            lambda: asyncio.to_thread(lambda: self.target.serving() == ips),
            timeout=120,
            interval=0.2,
            message="the load balancer serving every pod",
        )

    async def _measure(self, c: Cluster, scenario: Scenario, result: RunResult) -> None:
        failure_log = self.target.failure_log() if self.target.failure_log is not None else None
        before = {p["metadata"]["name"]: p["status"].get("podIP", "") for p in await self._live_pods(c)}
        if scenario.fault == "latency":
            assert self.target.latency is not None, "this target has no latency fault"
            self.target.latency(0.3)
        generator = LoadGenerator(*self.target.frontend, niceness=self.niceness)
        generator.start(self.rate, limit_seconds=self.settle_timeout + 120)
        acted = 0.0
        try:
            await async_wait_for(
                lambda: generator.finished_so_far >= self.rate * 2, timeout=30, message="2 s of requests"
            )
            acted = time.monotonic()
            leaving = await self._act(c, scenario, result, set(before), acted)
            await self._settle(c, scenario, result, leaving, acted)
            ended = generator.finished_so_far
            await async_wait_for(
                lambda: generator.finished_so_far >= ended + self.rate * 2,
                timeout=30,
                message="2 s more of requests",
            )
        finally:
            if scenario.fault == "latency" and self.target.latency is not None:
                self.target.latency(0)
            report = await asyncio.to_thread(generator.stop)
        self._record(report, result, acted)
        if failure_log is not None:
            after = {p["metadata"]["name"] for p in await self._live_pods(c)}
            logged: Counter[str] = Counter()
            for failure in failure_log():
                role = (
                    "no server" if failure.where == "no server" else _role(failure.where, set(before), after)
                )
                logged[f"{failure.why} @ {role}"] += 1
            result.logged = dict(logged)

    def _record(self, report: LoadReport, result: RunResult, acted: float) -> None:
        result.summary = report.summary()
        failures: Counter[str] = Counter()
        for record in report.failed:
            failures[f"status {record.status}" if record.outcome == "status" else record.outcome] += 1
        result.failures = dict(failures)
        result.failed_before = sum(1 for r in report.failed if r.due < acted)
        by_second: dict[str, Counter[str]] = {}
        for record in report.failed:
            second = str(max(-1, math.floor(record.due - acted)))
            by_second.setdefault(second, Counter())[record.outcome] += 1
        result.failed_by_second = {k: dict(v) for k, v in by_second.items()}
        answers = sorted(r.seconds for r in report.records if r.ok)
        if answers:
            result.answer_ms = {
                "p50": round(answers[len(answers) // 2] * 1000, 1),
                "p99": round(answers[int(len(answers) * 0.99)] * 1000, 1),
                "max": round(answers[-1] * 1000, 1),
            }

    async def _act(
        self, c: Cluster, scenario: Scenario, result: RunResult, before: set[str], acted: float
    ) -> set[str]:
        """Do what the scenario does; the names of the pods that must leave (None known yet: a
        scale-down's, found as they go)."""
        if scenario.action == "roll":
            await c.roll(APP, f"run-{result.run}-{time.time_ns()}")
            if scenario.fault in ("kill", "freeze"):
                await self._fault_mid_rollout(c, scenario.fault, before, result)
            return before
        if scenario.action == "scale-down":
            await c.patch(DEPLOYMENT, APP, {"spec": {"replicas": scenario.count}})
            return set()
        victims = sorted(before)[: scenario.count]
        await asyncio.gather(
            *(asyncio.to_thread(self._take, c.namespace, v, scenario.action) for v in victims)
        )
        return set(victims)

    def _take(self, namespace: str, pod: str, action: Action) -> None:
        from kubernetes import client

        with self.cluster.api_client() as api:
            core = client.CoreV1Api(api)
            if action == "evict":
                body = {
                    "apiVersion": "policy/v1",
                    "kind": "Eviction",
                    "metadata": {"name": pod, "namespace": namespace},
                }
                core.create_namespaced_pod_eviction(pod, namespace, cast(Any, body))
            else:
                core.delete_namespaced_pod(pod, namespace, grace_period_seconds=0)

    async def _fault_mid_rollout(self, c: Cluster, fault: Fault, before: set[str], result: RunResult) -> None:
        """Once an old pod is leaving (its drain under way), SIGKILL the leader (a new replica
        starts at once, as a Deployment's would) or freeze it until another replica holds the Lease."""

        async def leaving() -> bool:
            return any(
                p["metadata"]["name"] in before and p["metadata"].get("deletionTimestamp")
                for p in await c.pods()
            )

        await async_wait_for(leaving, timeout=120, interval=0.2, message="an old pod leaving")
        leader = await asyncio.to_thread(self.controllers.leader)
        if leader is None:
            result.notes.append("no leader when the fault was due")
            return
        struck = time.monotonic()
        if fault == "kill":
            self.controllers.kill(leader)
            self.controllers.start()
        else:
            self.controllers.freeze(leader)

        async def taken_over() -> bool:
            found = await asyncio.to_thread(self.controllers.leader)
            return found is not None and found != leader

        try:
            await async_wait_for(taken_over, timeout=90, interval=0.2, message="another replica leading")
            result.takeover_seconds = round(time.monotonic() - struck, 1)
        except WaitTimeout as err:
            result.notes.append(str(err))
        if fault == "freeze":
            self.controllers.thaw(leader)

    async def _settle(
        self, c: Cluster, scenario: Scenario, result: RunResult, leaving: set[str], acted: float
    ) -> None:
        replicas = scenario.count if scenario.action == "scale-down" else scenario.replicas

        async def rolled() -> bool:
            return rolled_out(await c.get(DEPLOYMENT, APP))

        async def settled() -> bool:
            if not await rolled():
                return False
            pods = await c.pods()
            names = {p["metadata"]["name"] for p in pods}
            return not (names & leaving) and len(pods) == replicas

        for check, attr in ((rolled, "rolled_seconds"), (settled, "settled_seconds")):
            try:
                # A look every 0.25 s: the figures' resolution, at a cost the node under test hardly feels.
                await async_wait_for(check, timeout=self.settle_timeout, interval=0.25, message=attr)
                setattr(result, attr, round(time.monotonic() - acted, 1))
            except WaitTimeout as err:
                result.notes.append(str(err))
                return

    async def _live_pods(self, c: Cluster) -> list[KubeObject]:
        return [p for p in await c.pods({"app": APP}) if not p["metadata"].get("deletionTimestamp")]

    async def _remove(self, namespace: str) -> None:
        """Delete the namespace, its pods at once (grace period 1: the run is over), and wait until
        it is gone and the load balancer holds nothing of it."""
        with contextlib.suppress(kube.NotFound):
            await asyncio.to_thread(self.client.delete, kube.NAMESPACE, None, namespace)
        await asyncio.to_thread(self._delete_pods_now, namespace)
        await async_wait_for(
            lambda: asyncio.to_thread(
                lambda: (
                    self.client.get_or_none(kube.NAMESPACE, None, namespace) is None
                    and not self.target.holds(namespace)
                )
            ),
            timeout=180,
            interval=0.5,
            message=f"namespace {namespace} gone",
        )

    def _delete_pods_now(self, namespace: str) -> None:
        from kubernetes import client

        with self.cluster.api_client() as api, contextlib.suppress(client.ApiException):
            client.CoreV1Api(api).delete_collection_namespaced_pod(namespace, grace_period_seconds=1)


def _role(pod: str, before: set[str], after: set[str]) -> str:
    if pod in before:
        return "a leaving pod" if pod not in after else "a staying pod"
    return "a new pod"


def spec_problem(pod: KubeObject, protection: Protection, drain_seconds: int) -> str | None:
    """What in the pod's spec does not match the protection (the webhook's work), None when all
    does: the readiness gate, and the drain (none, a sleep, or the waiter's hook)."""
    spec = pod["spec"]
    has_gate = lifecycle.readiness_gate(APP) in lifecycle.readiness_gates(pod)
    if has_gate != protection.gates:
        return f"readiness gate {'missing' if protection.gates else 'present'}"
    pre_stop = ((spec["containers"][0].get("lifecycle") or {}).get("preStop")) or None
    want: dict[str, Any] | None
    if protection.drain == "off":
        want = None
    elif protection.drain == "sleep":
        want = {"sleep": {"seconds": drain_seconds}}
    else:
        want = {"httpGet": {"path": wire.DRAIN_WAITER_PATH, "port": wire.DRAIN_WAITER_PORT, "scheme": "HTTP"}}
    if pre_stop != want:
        return f"preStop {pre_stop!r}, not {want!r}"
    sidecars = [c for c in spec.get("initContainers") or [] if c["name"] == wire.DRAIN_WAITER_CONTAINER]
    if bool(sidecars) != (protection.drain == "wait"):
        return "drain waiter sidecar " + ("missing" if protection.drain == "wait" else "present")
    return None


_PROTECTION_ORDER = list(PROTECTIONS)


def _cell(runs: Sequence[RunResult], fn: Callable[[RunResult], object]) -> str:
    """One figure of each run, in run order, comma-separated."""
    return ", ".join(str(fn(r)) for r in runs)


def _failed_cell(r: RunResult) -> str:
    s = r.summary
    return f"**{r.failed}** ({s['non_2xx']}/{s['connection_errors']}/{s['resets']}/{s['timeouts']})"


def _lag_ms(r: RunResult) -> str:
    """The generator's lag in ms, ``void`` beside it when over the limit (the run does not count)."""
    lag = round(float(r.summary.get("lag_seconds", 0) or 0) * 1000)
    return f"{lag} void" if r.void else str(lag)


def table(results: Sequence[RunResult], scenarios: Mapping[str, Scenario] = SCENARIOS) -> str:
    """The results as a Markdown table: one row per scenario and protection, each run's figures
    in run order (requests sent, failed and how, the longest gap without a successful answer, the
    seconds to rolled and to settled, the generator's lag)."""
    rows = [
        "| scenario | protection | requests sent | failed (non-2xx/conn. errors/resets/timeouts) "
        "| longest gap (s) | rolled (s) | settled (s) | lag (ms) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    order = list(scenarios)

    def position(r: RunResult) -> tuple[int, int, int]:
        where = order.index(r.scenario) if r.scenario in order else len(order)
        how = _PROTECTION_ORDER.index(r.protection) if r.protection in _PROTECTION_ORDER else 99
        return where, how, r.run

    ordered = sorted(results, key=position)
    for (scenario, protection), group in itertools.groupby(ordered, key=lambda r: (r.scenario, r.protection)):
        runs = list(group)
        title = scenarios[scenario].title if scenario in scenarios else scenario
        rows.append(
            f"| {title} | {protection} | {_cell(runs, lambda r: r.summary.get('sent'))} "
            f"| {_cell(runs, _failed_cell)} | {_cell(runs, lambda r: r.summary.get('longest_gap_seconds'))} "
            f"| {_cell(runs, lambda r: r.rolled_seconds)} | {_cell(runs, lambda r: r.settled_seconds)} "
            f"| {_cell(runs, _lag_ms)} |"
        )
    return "\n".join(rows)
