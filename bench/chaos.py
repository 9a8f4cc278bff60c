"""Chaos benchmark of the guard (issue 8): does a pod ever leave while a load balancer routes to it?

Runs, as separate processes, a real control plane (``LocalControlPlane``), the SLB emulator
served over real HTTPS (``slb_emulator_server``) and the controller (``resourceconsist run --adapter
alibabacloudslb``, manage mode). A driver plays kubectl and kubelet: 3 Services over overlapping
subsets of ~60 pods, flipping readiness, adding and deleting pods, deleting and re-creating a
Service, every ~0.15 s. Phases: calm (no faults, to show the instrument reads 0 when nothing
breaks), kill -9 of the controller at random moments, 30% provider faults on reads and writes,
2 replicas with the leader killed, SIGTERM mid-pass, and sharded replicas (``--sharding``) added,
SIGKILLed and removed mid-run, so the Services move between shards through drains and take-overs
(docs/scaling.md), and freezes: a leader (``--leader-elect``) or a shard or the sharder's holder
(``--sharding``) stopped with SIGSTOP for 2 to 3 lease durations while it writes, then resumed
(docs/concepts.md, "Fencing"). After each phase the driver and the faults stop and the run waits
for convergence.

What it records comes from the API server's side (a pod watch, object reads) and the provider's
side (the emulator's state and its wall-clock backend history) only, never from the controller:

* unguarded deletions: a pod's DELETED watch event observed while the emulator holds a backend
  of that pod (description ``resourceconsist/<pod>``) at weight > 0;
* lost / stale ``pod.kusionstack.io/available-conditions`` entries at convergence;
* stuck lifecycle finalizers at convergence (on a pod its Service does not route to, or on a
  terminating pod not released by the deadline);
* duplicate backends (two backends of one pod in one group, at any time of the history);
* convergence time after the last fault: provider state == expected (every ready selected pod
  registered with weight > 0, no backend of any other pod);
* in the freeze phases, the requests that reached the API server (its audit log) or the provider
  (the emulator's request log) after their sender's Lease deadline, each replica under its own
  identity (bench/chaos_fencing.py).

Run: ``make chaos`` or ``python bench/chaos.py [--quick] [--seed N] [--only PHASE]``. Not part of CI
(``.ci/run``): the full run takes minutes. Words and figures: docs/chaos.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import random
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from bisect import bisect_right
from collections import defaultdict
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from resourceconsist import wire
from resourceconsist.adapters.alibabacloudslb import config as slb
from resourceconsist.adapters.alibabacloudslb.config import LOAD_BALANCER_ID_LABEL
from resourceconsist.adapters.alibabacloudslb.emulator_server import EmulatorAdmin
from resourceconsist.adapters.alibabacloudslb.slbclient import MUTATING_ACTIONS
from resourceconsist.cluster import kube
from resourceconsist.cluster.kube import ApiError, KubeClient, KubeObject
from resourceconsist.rules import lifecycle, marks
from resourceconsist.rules.labels import map_selects
from resourceconsist.runtime.leaderelection import parse_lease_time
from resourceconsist.runtime.sharding.ring import drain_label, shard_label
from resourceconsist.testing import LocalControlPlane, free_port
from resourceconsist.testing.controlplane import _die_with_parent as die_with_parent

sys.path.insert(0, str(Path(__file__).resolve().parent))
from chaos_fencing import (
    AuditTail,
    Freeze,
    Identity,
    RequestLog,
    Takeover,
    Verdict,
    after_freeze,
    as_json,
    audit_policy,
    judge,
    sharder_act,
    takeovers,
)

NAMESPACE = "chaos"
SERVICES = ("svc-0", "svc-1", "svc-2")
#: Three more Services for the sharded freeze phase, each over the pods two of the first three
#: select, on load balancers of their own: six Services over three shards leave no shard idle,
#: and give the sharder more to place.
EXTRA_SERVICES = {"svc-3": ("g0", "g1"), "svc-4": ("g1", "g2"), "svc-5": ("g0", "g2")}
ALL_SERVICES = (*SERVICES, *EXTRA_SERVICES)
LEASE = "resourceconsist-manager"
#: 30% of provider calls fail, reads and writes alike, in four ways.
FAULT_RATES = {"throttle": 0.09, "5xx": 0.09, "drop": 0.06, "execute_fail": 0.06}
SHUTDOWN_TIMEOUT = 10.0
#: The sharded phase's ring, and its shard Leases' timings: short, so that a SIGKILLed shard's
#: Services move (two lease durations after its last renewal) within the phase.
RING = "chaos"
SHARD_LEASE_SECONDS = 6
SHARD_LEASE_ARGS = (
    "--lease-duration",
    str(SHARD_LEASE_SECONDS),
    "--renew-deadline",
    "4",
    "--retry-period",
    "1",
)
#: The sharder's Lease of the ring (``<ring>-sharder``, docs/scaling.md).
SHARDER_LEASE = f"{RING}-sharder"
#: The freeze phases: every Lease (leader election's, shards', the sharder's) has the shard
#: timings above; a replica is stopped for 2 to 3 of its lease durations.
FREEZE_LEASE_SECONDS = SHARD_LEASE_SECONDS
FREEZE_DURATIONS = (2.0, 3.0)
#: Seconds the provider takes to answer a write in the freeze phases (the real one takes a
#: fraction of a second): a write stays in flight long enough to be seen, and frozen in.
FREEZE_WRITE_LATENCY = 0.2


@dataclass(frozen=True)
class Settings:
    seed: int = 1
    pods: int = 60
    tick: float = 0.15
    calm_seconds: float = 30.0
    kills: int = 30
    fault_seconds: float = 90.0
    leader_kills: int = 8
    sigterms: int = 3
    #: Rounds of the sharded phase: a replica added, a shard SIGKILLed, one added, one removed.
    shard_rounds: int = 3
    #: Freezes of the leader (``--leader-elect``, 2 replicas), and of the sharded replicas
    #: (``--sharding``, 3 replicas): every second one at the sharder's holder.
    leader_freezes: int = 6
    shard_freezes: int = 6
    converge_timeout: float = 180.0
    settle_timeout: float = 60.0
    #: Extra arguments for every ``resourceconsist run`` (e.g. lease timings).
    controller_args: tuple[str, ...] = ()
    #: With ``--pod-employer-label``, create the pods without the label, as pods the webhook is not
    #: sent are (plain Kubernetes): the shards must label them.
    unstamped: bool = False

    @classmethod
    def quick(cls, seed: int, controller_args: tuple[str, ...] = ()) -> Settings:
        return cls(
            seed=seed,
            controller_args=controller_args,
            pods=40,
            calm_seconds=10.0,
            kills=5,
            fault_seconds=20.0,
            leader_kills=2,
            sigterms=1,
            shard_rounds=1,
            leader_freezes=1,
            shard_freezes=2,
            converge_timeout=90.0,
            settle_timeout=30.0,
        )


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


# ---- processes -----------------------------------------------------------------------------


class Process:
    """A child process with its own log, killed with its process group on teardown."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        logdir: Path,
        env: dict[str, str] | None = None,
        *,
        capture_stdout: bool = False,
        cwd: Path | None = None,
    ) -> None:
        self.name = name
        self.log_path = logdir / f"{name}.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE if capture_stdout else self._log,
            stderr=self._log,
            stdin=subprocess.DEVNULL,
            env=env,
            # Not the checkout's root, whose package would shadow another interpreter's install.
            cwd=cwd,
            start_new_session=True,
            # Children die with this process even when it is killed outright (no teardown runs).
            preexec_fn=die_with_parent,  # noqa: PLW1509 - only sets the death signal
        )

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def signal(self, signum: int) -> None:
        with suppress(ProcessLookupError):
            os.kill(self.proc.pid, signum)

    def stop(self, timeout: float = 20.0) -> float:
        """SIGTERM, wait up to ``timeout`` (then SIGKILL); the seconds it took to exit."""
        started = time.monotonic()
        if self.alive:
            self.signal(signal.SIGCONT)  # a frozen process would not hear the SIGTERM
            self.signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        return time.monotonic() - started

    def kill(self) -> None:
        with suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def close(self) -> None:
        if self.alive:
            self.kill()
        self._log.close()


class Emulator:
    """The SLB emulator server process and a client of its admin API."""

    def __init__(self, workdir: Path, seed: int) -> None:
        lbs = [arg for i in range(len(SERVICES)) for arg in ("--load-balancer", f"lb-chaos-{i}")]
        argv = [sys.executable, "-m", "resourceconsist.adapters.alibabacloudslb.emulator_server"]
        self.process = Process(
            "slb-emulator",
            [*argv, "--dir", str(workdir), "--seed", str(seed), *lbs],
            workdir,
            capture_stdout=True,
        )
        stdout = self.process.proc.stdout
        assert stdout is not None
        ready, _, _ = select.select([stdout], [], [], 30.0)
        line = stdout.readline() if ready else b""
        if not line:
            raise RuntimeError(f"the SLB emulator did not start; see {self.process.log_path}")
        self.info: dict[str, str] = json.loads(line)
        self.admin = EmulatorAdmin(self.info["admin_url"])

    def calls(self) -> int:
        return sum(self.admin.call_counts().values())


class Controllers:
    """Controller processes (``resourceconsist run``), numbered in start order."""

    def __init__(
        self,
        plane: LocalControlPlane,
        api: KubeClient,
        emulator: Emulator,
        logdir: Path,
        extra_args: tuple[str, ...] = (),
        python: str = sys.executable,
    ) -> None:
        self.plane = plane
        self.api = api
        self.emulator = emulator
        self.kubeconfig = plane.kubeconfig
        self.extra_args = list(extra_args)
        self.logdir = logdir
        #: The interpreter that runs ``-m resourceconsist`` (another checkout's, to measure it).
        self.python = python
        self.started = 0
        self.running: dict[str, tuple[Process, int]] = {}
        #: The replicas started under their own identity (``start(identity=...)``).
        self.identities: list[Identity] = []
        info = emulator.info
        self.env = {
            **{k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"},
            "ALIYUN_SLB_AK_KEY": info["access_key_id"],
            "ALIYUN_SLB_AK_SECRET": info["access_key_secret"],
            "ALIYUN_SLB_ENDPOINT": info["endpoint"],
            "ALIBABA_CLOUD_REGION_ID": info["region_id"],
            # The SDK's own setting for the CA that signed the emulator's certificate.
            "ALIBABA_CLOUD_CA_BUNDLE": info["ca_bundle"],
            # Manage mode tags its VServer groups with the cluster's name (docs/alibabacloudslb.md).
            "ALIYUN_SLB_CLUSTER_NAME": "chaos",
        }

    def start(self, *, leader_elect: bool = False, sharded: bool = False, identity: str | None = None) -> str:
        """A controller process; with ``identity`` (the phase's name), under its own identity:
        its own ServiceAccount at the API server and its own STS key at the provider, both named
        after it, with every Lease on the freeze timings."""
        name = f"controller-{self.started:03d}"
        self.started += 1
        port = free_port()
        kubeconfig = self.kubeconfig if identity is None else self._own_identity(name)
        argv = [
            self.python,
            "-m",
            "resourceconsist",
            "run",
            "--adapter",
            "alibabacloudslb",
            "--kubeconfig",
            str(kubeconfig),
            "--namespace",
            NAMESPACE,
            # One port for /metrics and the probes (docs/observability.md).
            "--metrics-bind-address",
            f"127.0.0.1:{port}",
            "--health-probe-bind-address",
            f"127.0.0.1:{port}",
            "--shutdown-timeout",
            str(SHUTDOWN_TIMEOUT),
        ]
        if leader_elect:
            argv += ["--leader-elect", "--leader-election-namespace", NAMESPACE]
        if sharded:
            # The shard's name is POD_NAME (below), as in the chart.
            argv += ["--sharding", "--controller-ring", RING, "--leader-election-namespace", NAMESPACE]
            argv += SHARD_LEASE_ARGS
        env = {**self.env, "POD_NAME": name}
        if identity is not None:
            if leader_elect:
                argv += SHARD_LEASE_ARGS
            env = self._own_provider_identity(name, env)
            self.identities.append(
                Identity(name, identity, name, SHARDER_LEASE, RING)
                if sharded
                else Identity(name, identity, LEASE)
            )
        argv += self.extra_args
        # POD_NAME starts the Lease's holderIdentity, so the leader can be found by name.
        process = Process(name, argv, self.logdir, env, cwd=self.logdir)
        self.running[name] = (process, port)
        return name

    def _own_identity(self, name: str) -> Path:
        """A ServiceAccount ``name`` (bound to cluster-admin: the measurement is of who writes
        when, not of permissions) and a kubeconfig with its token."""
        self.api.create(self.api.resource("v1", "ServiceAccount"), NAMESPACE, {"metadata": {"name": name}})
        binding = {
            "metadata": {"name": f"{NAMESPACE}-{name}"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "cluster-admin",
            },
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": NAMESPACE}],
        }
        bindings = self.api.resource("rbac.authorization.k8s.io/v1", "ClusterRoleBinding")
        self.api.create(bindings, None, binding)
        token = self.plane.service_account_token(NAMESPACE, name, seconds=24 * 3600)
        (self.logdir / f"{name}.token").write_text(token)
        return self.plane.token_kubeconfig(token, self.logdir / f"{name}.kubeconfig")

    def _own_provider_identity(self, name: str, env: dict[str, str]) -> dict[str, str]:
        """RRSA: the ServiceAccount's token exchanged at the emulator's STS for a key of its own,
        issued for the role session ``name`` (the request log names its calls by it)."""
        token_file = self.logdir / f"{name}.token"
        self.emulator.admin.accept_oidc_token(token_file.read_text())
        info = self.emulator.info
        own = {k: v for k, v in env.items() if k not in ("ALIYUN_SLB_AK_KEY", "ALIYUN_SLB_AK_SECRET")}
        return {
            **own,
            "ALIBABA_CLOUD_ROLE_ARN": info["role_arn"],
            "ALIBABA_CLOUD_OIDC_PROVIDER_ARN": info["oidc_provider_arn"],
            "ALIBABA_CLOUD_OIDC_TOKEN_FILE": str(token_file),
            "ALIBABA_CLOUD_ROLE_SESSION_NAME": name,
            "ALIBABA_CLOUD_STS_ENDPOINT": info["sts_endpoint"],
            # The credentials library trusts the emulator's CA through the default verify paths.
            "SSL_CERT_FILE": info["ca_bundle"],
        }

    def wait_ready(self, name: str, timeout: float = 90.0) -> bool:
        process, port = self.running[name]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and process.alive:
            with suppress(OSError), urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
                if r.status == 200:
                    return True
            time.sleep(0.1)
        log(f"{name} not ready within {timeout:.0f}s (see {process.log_path})")
        return False

    def kill(self, name: str) -> None:
        process, _ = self.running.pop(name)
        process.kill()
        process.close()

    def terminate(self, name: str) -> float:
        """SIGTERM; seconds until it exited (SIGKILL after shutdown-timeout + 10 s)."""
        process, _ = self.running.pop(name)
        took = process.stop(timeout=SHUTDOWN_TIMEOUT + 10.0)
        process.close()
        return took

    def stop_all(self) -> None:
        for name in list(self.running):
            self.terminate(name)


# ---- the driver: kubectl and kubelet --------------------------------------------------------


def _ip(n: int) -> str:
    return f"10.{100 + n // 65536 % 100}.{n // 256 % 256}.{n % 256}"


class Driver:
    """Services and pods changing every ``tick`` seconds, from a seeded random stream."""

    def __init__(self, client: KubeClient, settings: Settings) -> None:
        self.client = client
        self.settings = settings
        self.rng = random.Random(settings.seed)
        self.pods: dict[str, bool] = {}  # live pods the driver knows -> ready
        self.counter = 0
        self.pending_service: tuple[str, float] | None = None
        self.ops: defaultdict[str, int] = defaultdict(int)
        self.errors = 0
        #: Held for each step: a freeze's aiming change is made between two steps.
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- objects --

    def create_service(self, name: str) -> None:
        index = ALL_SERVICES.index(name)
        groups = EXTRA_SERVICES.get(name, (f"g{index}",))
        body = {
            "metadata": {
                "name": name,
                "labels": {
                    wire.CONTROL_LABEL: wire.CONTROL_LABEL_VALUE,
                    LOAD_BALANCER_ID_LABEL: f"lb-chaos-{index}",
                },
                "annotations": {slb.MODE_ANNOTATION: "manage"},
            },
            "spec": {"selector": dict.fromkeys(groups, "y"), "ports": [{"port": 80, "targetPort": "http"}]},
        }
        self.client.create(kube.SERVICE, NAMESPACE, body)

    def create_pod(self) -> None:
        n = self.counter
        self.counter += 1
        name = f"pod-{n:05d}"
        groups = [i for i in range(len(SERVICES)) if self.rng.random() < 0.5] or [self.rng.randrange(3)]
        labels = {"chaos": "y", **{f"g{i}": "y" for i in groups}}
        if "--pod-employer-label" in self.settings.controller_args and not self.settings.unstamped:
            # Stamped as the webhook's --pod-employer-label would (docs/scaling.md, "Pods selected
            # by the API server"); every Service that may select the pod counts, a safe superset.
            selecting = [
                s
                for s in ALL_SERVICES
                if set(EXTRA_SERVICES.get(s, (f"g{ALL_SERVICES.index(s)}",))) <= set(labels)
            ]
            stamped = marks.widened_employer_label(None, selecting)
            if stamped is not None:
                labels[wire.EMPLOYER_LABEL] = stamped
        body = {
            "metadata": {
                "name": name,
                "labels": labels,
                "annotations": {slb.SERVER_ID_ANNOTATION: f"eni-{n:05d}"},
            },
            "spec": {
                "containers": [
                    {"name": "app", "image": "app", "ports": [{"name": "http", "containerPort": 8080}]}
                ]
            },
        }
        self.client.create(kube.POD, NAMESPACE, body)
        self.pods[name] = False
        self.set_ready(name, self.rng.random() < 0.7)

    def set_ready(self, name: str, ready: bool) -> None:
        status = "True" if ready else "False"
        ip = _ip(int(name.rsplit("-", 1)[1]))
        body = {
            "status": {
                "podIP": ip,
                "podIPs": [{"ip": ip}],
                "conditions": [
                    {"type": "Ready", "status": status},
                    {"type": "ContainersReady", "status": status},
                ],
            }
        }
        self.client.patch(kube.POD, NAMESPACE, name, body, subresource="status")
        self.pods[name] = ready

    def populate(self) -> None:
        for name in SERVICES:
            self.create_service(name)
        for _ in range(self.settings.pods):
            self.create_pod()

    # -- the loop --

    def step(self) -> None:
        roll = self.rng.random()
        count = len(self.pods)
        if self.pending_service is not None and time.monotonic() >= self.pending_service[1]:
            self.recreate_pending()
        elif roll < 0.015 and self.pending_service is None:
            name = self.rng.choice(SERVICES)
            self.client.delete(kube.SERVICE, NAMESPACE, name)
            self.pending_service = (name, time.monotonic() + 1.5)
            self.ops["service deleted"] += 1
        elif roll < 0.2 and count < self.settings.pods + 10:
            self.create_pod()
            self.ops["pod created"] += 1
        elif roll < 0.35 and count > self.settings.pods - 10:
            name = self.rng.choice(sorted(self.pods))
            del self.pods[name]
            self.client.delete(kube.POD, NAMESPACE, name)
            self.ops["pod deleted"] += 1
        elif self.pods:
            name = self.rng.choice(sorted(self.pods))
            self.set_ready(name, not self.pods[name])
            self.ops["readiness flipped"] += 1

    def recreate_pending(self) -> bool:
        if self.pending_service is None:
            return True
        try:
            self.create_service(self.pending_service[0])
        except ApiError as err:
            if err.status != 409:  # the old one is still terminating: try again later
                raise
            self.pending_service = (self.pending_service[0], time.monotonic() + 0.5)
            return False
        self.pending_service = None
        self.ops["service re-created"] += 1
        return True

    def _loop(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                with self.lock:
                    self.step()
            except ApiError:
                self.errors += 1
            self._stop.wait(max(0.0, self.settings.tick - (time.monotonic() - started)))

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="driver", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 60.0) -> None:
        """Stop changing things; re-create a Service deleted last (once its old self is gone)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if self.recreate_pending():
                    return
            except ApiError as err:
                log(f"re-creating {self.pending_service}: {err}")
            time.sleep(0.5)


# ---- the observers ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Deletion:
    pod: str
    time: float


class DeletionWatch:
    """Pod DELETED events as the API server's watch delivers them, stamped on arrival (wall time)."""

    def __init__(self, client: KubeClient) -> None:
        self.client = client
        self.deletions: list[Deletion] = []
        self._stop = threading.Event()
        self._stream: kube.WatchStream | None = None
        self._thread = threading.Thread(target=self._run, name="deletion-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._stream is not None:
            self._stream.close()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        known: set[str] = set()
        while not self._stop.is_set():
            try:
                listing = self.client.list(kube.POD, NAMESPACE)
                now = time.time()
                names = {p["metadata"]["name"] for p in listing.get("items", [])}
                # Gone between a lost watch and this list: seen late, stamped now.
                self.deletions.extend(Deletion(name, now) for name in sorted(known - names))
                known = names
                self._watch(listing["metadata"]["resourceVersion"], known)
            except Exception as err:
                if not self._stop.is_set():
                    log(f"deletion watch restarts after {type(err).__name__}: {err}")
                    time.sleep(0.5)

    def _watch(self, version: str, known: set[str]) -> None:
        while not self._stop.is_set():
            self._stream = self.client.watch(kube.POD, NAMESPACE, version, timeout_seconds=60)
            for event in self._stream:
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    return  # expired: list again
                version = obj.get("metadata", {}).get("resourceVersion", version)
                name = obj.get("metadata", {}).get("name", "")
                if kind == "ADDED":
                    known.add(name)
                elif kind == "DELETED":
                    self.deletions.append(Deletion(name, time.time()))
                    known.discard(name)


class History:
    """The emulator's backend history, fetched incrementally, as per-(group, pod) timelines."""

    def __init__(self, admin: EmulatorAdmin) -> None:
        self.admin = admin
        self.last = 0
        self.changes: list[dict[str, Any]] = []

    def fetch(self) -> None:
        changes, self.last = self.admin.history(self.last)
        self.changes.extend(changes)

    def timelines(self) -> dict[tuple[str, str], list[tuple[float, int]]]:
        """(group, pod) -> [(time, weight after; -1 when removed)], in time order."""
        lines: dict[tuple[str, str], list[tuple[float, int]]] = defaultdict(list)
        for change in self.changes:
            pod = _pod_of(change.get("Description"))
            if pod is None:
                continue
            weight = -1 if change["change"] == "removed" else int(change["Weight"])
            lines[(change["vserver_group_id"], pod)].append((float(change["time"]), weight))
        return lines

    def duplicates(self) -> list[tuple[float, str, str]]:
        """(time, group, pod) whenever a second backend of one pod joined a group."""
        present: dict[str, dict[tuple[str, int, str], str]] = defaultdict(dict)
        found: list[tuple[float, str, str]] = []
        for change in self.changes:
            group = present[change["vserver_group_id"]]
            key = (change["ServerId"], int(change["Port"]), change.get("ServerIp") or "")
            pod = _pod_of(change.get("Description"))
            if change["change"] == "removed":
                group.pop(key, None)
                continue
            if change["change"] == "added" and pod is not None and pod in group.values():
                found.append((float(change["time"]), change["vserver_group_id"], pod))
            group[key] = pod or ""
        return found


def _pod_of(description: Any) -> str | None:
    if isinstance(description, str) and slb.is_our_member_description(description):
        return description[len(slb.MEMBER_DESCRIPTION_PREFIX) :]
    return None


@dataclass
class Unguarded:
    pod: str
    deleted_at: float
    group: str
    weight: int
    #: Seconds the backend still routed after the deletion (None: still routing at the end).
    routed_for: float | None
    #: Seconds between the backend's last change to a weight above 0 and the deletion.
    routing_before: float


def unguarded_deletions(
    deletions: list[Deletion], lines: dict[tuple[str, str], list[tuple[float, int]]]
) -> list[Unguarded]:
    by_pod: dict[str, list[tuple[str, list[tuple[float, int]]]]] = defaultdict(list)
    for (group, pod), line in lines.items():
        by_pod[pod].append((group, line))
    found: list[Unguarded] = []
    for deletion in deletions:
        for group, line in by_pod.get(deletion.pod, []):
            at = bisect_right([t for t, _ in line], deletion.time) - 1
            if at < 0 or line[at][1] <= 0:
                continue
            after = [t for t, w in line[at + 1 :] if w <= 0]
            routed_for = after[0] - deletion.time if after else None
            found.append(
                Unguarded(
                    deletion.pod, deletion.time, group, line[at][1], routed_for, deletion.time - line[at][0]
                )
            )
    return found


# ---- convergence ---------------------------------------------------------------------------


@dataclass
class View:
    """One look at both sides: Services, pods and the provider's groups."""

    services: dict[str, KubeObject]
    pods: dict[str, KubeObject]
    groups: dict[str, dict[str, Any]]  # by group name

    @classmethod
    def read(cls, client: KubeClient, admin: EmulatorAdmin) -> View:
        services = {s["metadata"]["name"]: s for s in client.list(kube.SERVICE, NAMESPACE)["items"]}
        pods = {p["metadata"]["name"]: p for p in client.list(kube.POD, NAMESPACE)["items"]}
        groups = {g["name"]: g for g in admin.state()["groups"]}
        return cls(services, pods, groups)

    def alive_services(self) -> dict[str, KubeObject]:
        return {n: s for n, s in self.services.items() if not lifecycle.is_deleting(s)}

    def selected(self, service: KubeObject) -> list[KubeObject]:
        selector = service.get("spec", {}).get("selector")
        return [
            p
            for p in self.pods.values()
            if not lifecycle.is_deleting(p) and map_selects(selector, p["metadata"].get("labels"))
        ]

    def routed(self, service: KubeObject, *, min_weight: int = 1) -> set[str]:
        """Pods with a backend in the Service's group at ``min_weight`` or more (0: any backend)."""
        group = self.groups.get(slb.vserver_group_name(service), {})
        return {
            pod
            for b in group.get("backends", [])
            if (pod := _pod_of(b.get("Description"))) and b["Weight"] >= min_weight
        }

    def provider_mismatches(self) -> list[str]:
        """What keeps the provider from the expected state (empty: converged)."""
        wrong: list[str] = []
        ours = set()
        for name, service in self.alive_services().items():
            ours.add(slb.vserver_group_name(service))
            selected = self.selected(service)
            expected = {
                p["metadata"]["name"]
                for p in selected
                if lifecycle.is_lifecycle_ready(p) and p.get("status", {}).get("podIP")
            }
            group = self.groups.get(slb.vserver_group_name(service), {})
            members = {pod for b in group.get("backends", []) if (pod := _pod_of(b.get("Description")))}
            routed = self.routed(service)
            if routed != expected:
                wrong.append(f"{name}: routes {sorted(routed ^ expected)} wrongly")
            extra = members - {p["metadata"]["name"] for p in selected}
            if extra:
                wrong.append(f"{name}: backends of pods it does not select: {sorted(extra)}")
        prefix = f"{slb.GROUP_NAME_PREFIX}{NAMESPACE}/"
        for group_name, group in self.groups.items():
            if group_name.startswith(prefix) and group_name not in ours and group["backends"]:
                wrong.append(f"group {group_name} of no Service still has {len(group['backends'])} backends")
        return wrong

    def api_findings(self) -> dict[str, list[str]]:
        """Lost and stale entries, stuck finalizers, routes without their guard."""
        alive = self.alive_services()
        finalizer_of = {lifecycle.lifecycle_finalizer(n): n for n in ALL_SERVICES}
        guard_of = {lifecycle.guard_finalizer(n): n for n in ALL_SERVICES}
        found: dict[str, list[str]] = {"lost": [], "stale": [], "stuck": [], "unguarded_routes": []}
        routed = {n: self.routed(s) for n, s in alive.items()}
        held = {n: self.routed(s, min_weight=0) for n, s in alive.items()}
        selects = {n: {p["metadata"]["name"] for p in self.selected(s)} for n, s in alive.items()}
        for name, pod in self.pods.items():
            finalizers = pod["metadata"].get("finalizers") or []
            if lifecycle.is_deleting(pod):
                found["stuck"].append(f"{name}: terminating, still held by {finalizers}")
                continue
            entries = lifecycle.expected_finalizers(pod)
            for service in alive:
                key = lifecycle.expected_finalizer_key("Service", NAMESPACE, service)
                if name in selects[service] and key not in entries:
                    found["lost"].append(f"{name}: no entry of {service}")
                guarded = {lifecycle.lifecycle_finalizer(service), lifecycle.guard_finalizer(service)}
                if name in routed[service] and not guarded & set(finalizers):
                    found["unguarded_routes"].append(f"{name}: routed by {service} without its guard")
            for key in entries:
                service = key.rsplit("/", 1)[-1]
                if key.startswith(f"Service/{NAMESPACE}/") and name not in selects.get(service, set()):
                    found["stale"].append(f"{name}: entry {key}")
            for flz in finalizers:
                if flz.startswith(wire.LIFECYCLE_FINALIZER_PREFIX + "/"):
                    service = finalizer_of.get(flz, flz)
                    if name not in routed.get(service, set()):
                        found["stuck"].append(f"{name}: {flz} ({service}) but not routed by it")
                elif flz.startswith(wire.GUARD_FINALIZER_PREFIX + "/"):
                    # The guard stands for any registration, weight 0 included (docs/concepts.md).
                    service = guard_of.get(flz, flz)
                    if name not in held.get(service, set()):
                        found["stuck"].append(f"{name}: {flz} ({service}) but no backend in its group")
        for name, obj in self.services.items():
            if lifecycle.is_deleting(obj):
                found["stuck"].append(f"Service {name}: still terminating")
        return found


# ---- phases ------------------------------------------------------------------------------------


@dataclass
class PhaseResult:
    phase: str
    what: str
    started: float = 0.0
    ended: float = 0.0
    deletions: int = 0
    unguarded: list[Unguarded] = field(default_factory=list)
    lost: int = 0
    stale: int = 0
    stuck: int = 0
    unguarded_routes: int = 0
    duplicates: int = 0
    converged_after: float | None = None
    settled_after: float | None = None
    notes: list[str] = field(default_factory=list)
    findings: dict[str, list[str]] = field(default_factory=dict)


class Run:
    def __init__(self, settings: Settings, workdir: Path, controller_python: str = sys.executable) -> None:
        self.settings = settings
        self.workdir = workdir
        self.controller_python = controller_python
        self.rng = random.Random(settings.seed * 7919)
        self.results: list[PhaseResult] = []
        #: The freezes so far, the verdict per identity and the take-overs of the frozen ones'
        #: Leases (``score``).
        self.freezes: list[Freeze] = []
        self.verdicts: list[Verdict] = []
        self.takeovers: list[Takeover] = []

    @contextmanager
    def environment(self) -> Iterator[None]:
        logdir = self.workdir
        # The audit log keeps the requests of the freeze phases' replicas (their own identities).
        with LocalControlPlane(audit_policy=audit_policy(NAMESPACE)) as cp:
            api = KubeClient.from_kubeconfig(str(cp.kubeconfig), name="chaos-driver")
            watcher_client = KubeClient.from_kubeconfig(str(cp.kubeconfig), name="chaos-observer")
            api.create(kube.NAMESPACE, None, {"metadata": {"name": NAMESPACE}})
            self.api = api
            self.emulator = Emulator(self.workdir, self.settings.seed)
            self.controllers = Controllers(
                cp, api, self.emulator, logdir, self.settings.controller_args, self.controller_python
            )
            self.driver = Driver(api, self.settings)
            self.watch = DeletionWatch(watcher_client)
            self.history = History(self.emulator.admin)
            self.audit = AuditTail(cp.audit_log, NAMESPACE)
            self.requests = RequestLog(self.emulator.admin)
            self.requests.start()
            try:
                yield
            finally:
                with suppress(Exception):
                    self.driver.stop(timeout=0)
                if cp.audit_log.exists():
                    # The replicas' requests, kept for a look beside results.json.
                    shutil.copyfile(cp.audit_log, self.workdir / "audit.log")
                self.requests.stop()
                self.watch.stop()
                self.controllers.stop_all()
                self.emulator.process.close()
                api.close()
                watcher_client.close()

    def execute(self, only: Collection[str] = ()) -> list[PhaseResult]:
        with self.environment():
            self.watch.start()
            name = self.controllers.start()
            self.controllers.wait_ready(name)
            self.driver.populate()
            phases: list[tuple[str, Callable[[PhaseResult], None]]] = [
                ("calm", self.phase_calm),
                ("kill -9", self.phase_kills),
                ("provider faults", self.phase_faults),
                ("leader kills", self.phase_leader),
                ("SIGTERM", self.phase_sigterm),
                ("SIGTERM, hung provider", self.phase_hung_sigterm),
                ("shard kills and rebalances", self.phase_sharded),
                ("leader freezes", self.phase_freeze_leader),
                ("shard and sharder freezes", self.phase_freeze_sharded),
            ]
            if only:
                phases = [(title, body) for title, body in phases if PHASES[title] in only]
            for title, body in phases:
                result = PhaseResult(title, "")
                result.started = time.time()
                log(f"phase {title}: start")
                self.driver.start()
                body(result)
                self.driver.stop()
                self.emulator.admin.clear_faults()
                self.converge(result)
                self.history.fetch()
                result.ended = time.time()
                self.results.append(result)
                log(f"phase {title}: {result.what}; converged after {result.converged_after}")
            self.controllers.stop_all()
            self.score()
        return self.results

    # -- the phases --

    def _single(self) -> str:
        """The one plain controller (started if none runs)."""
        if not self.controllers.running:
            name = self.controllers.start()
            self.controllers.wait_ready(name)
        return next(iter(self.controllers.running))

    def phase_calm(self, result: PhaseResult) -> None:
        self._single()
        time.sleep(self.settings.calm_seconds)
        result.what = f"{self.settings.calm_seconds:.0f}s, no faults"

    def _busy_kill(self, name: str, signum: int) -> tuple[bool, float]:
        """Wait a random moment while the driver runs, then signal; whether the provider was busy."""
        offset = self.rng.uniform(0.05, 2.0)
        time.sleep(max(0.0, offset - 0.5))
        before = self.emulator.calls()
        time.sleep(min(0.5, offset))
        busy = self.emulator.calls() > before
        took = 0.0
        if signum == signal.SIGKILL:
            self.controllers.kill(name)
        else:
            took = self.controllers.terminate(name)
        return busy, took

    def phase_kills(self, result: PhaseResult) -> None:
        busy = 0
        for _ in range(self.settings.kills):
            name = self._single()
            was_busy, _ = self._busy_kill(name, signal.SIGKILL)
            busy += was_busy
            self.controllers.wait_ready(self.controllers.start())
        result.what = f"{self.settings.kills} kill -9 ({busy} amid provider calls)"

    def phase_faults(self, result: PhaseResult) -> None:
        self._single()
        before = self.emulator.admin.call_counts()
        self.emulator.admin.set_faults(FAULT_RATES, actions="all")
        time.sleep(self.settings.fault_seconds)
        self.emulator.admin.clear_faults()
        after = self.emulator.admin.call_counts()
        calls = sum(after.values()) - sum(before.values())
        faulted = sum(n - before.get(k, 0) for k, n in after.items() if k[1] in _FAULT_CODES)
        result.what = f"{self.settings.fault_seconds:.0f}s at 30%: {faulted} of {calls} calls failed"

    def _leader(self) -> str | None:
        lease = self.api.get_or_none(kube.LEASE, NAMESPACE, LEASE)
        holder = str(((lease or {}).get("spec") or {}).get("holderIdentity") or "")
        name = holder.split("_", 1)[0]
        return name if name in self.controllers.running else None

    def _wait_leader(self, other_than: str | None, timeout: float = 90.0) -> str | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            leader = self._leader()
            if leader is not None and leader != other_than:
                return leader
            time.sleep(0.1)
        return None

    def phase_leader(self, result: PhaseResult) -> None:
        self.controllers.stop_all()
        for _ in range(2):
            self.controllers.start(leader_elect=True)
        takeovers: list[float] = []
        busy = 0
        leader = self._wait_leader(None)
        for _ in range(self.settings.leader_kills):
            if leader is None:
                result.notes.append("no leader within 90 s")
                break
            self.controllers.wait_ready(leader)
            was_busy, _ = self._busy_kill(leader, signal.SIGKILL)
            busy += was_busy
            killed_at = time.monotonic()
            self.controllers.start(leader_elect=True)
            new = self._wait_leader(leader)
            if new is not None:
                takeovers.append(time.monotonic() - killed_at)
            leader = new
        self.controllers.stop_all()
        spread = f"{min(takeovers):.1f}-{max(takeovers):.1f}s" if takeovers else "none"
        result.what = f"{len(takeovers)} leader kills ({busy} amid provider calls), takeover {spread}"

    def phase_sigterm(self, result: PhaseResult) -> None:
        exits: list[float] = []
        busy = 0
        for _ in range(self.settings.sigterms):
            name = self._single()
            was_busy, took = self._busy_kill(name, signal.SIGTERM)
            busy += was_busy
            exits.append(took)
            self.controllers.wait_ready(self.controllers.start())
        slowest = f", slowest exit {max(exits):.1f}s" if exits else ""
        result.what = f"{len(exits)} SIGTERM ({busy} amid provider calls){slowest}"

    def phase_hung_sigterm(self, result: PhaseResult) -> None:
        """SIGTERM while every SLB answer takes 20 s: the process must exit within
        --shutdown-timeout + 2 s and leave nothing half-written (the counts after convergence)."""
        exits: list[float] = []
        for _ in range(self.settings.sigterms):
            name = self._single()
            self.emulator.admin.set_faults(latency_seconds=20.0)
            time.sleep(self.rng.uniform(0.5, 2.0))  # the driver keeps a pass waiting on the provider
            exits.append(self.controllers.terminate(name))
            self.emulator.admin.clear_faults()
            self.controllers.wait_ready(self.controllers.start())
        limit = SHUTDOWN_TIMEOUT + 2.0
        over = sum(took > limit for took in exits)
        slowest = f"slowest exit {max(exits):.1f}s" if exits else "none"
        result.what = f"{len(exits)} SIGTERM, SLB answering after 20 s: {slowest}, {over} over {limit:g}s"

    def phase_sharded(self, result: PhaseResult) -> None:
        """Sharded replicas (docs/scaling.md) while the driver runs: each round adds a replica (a
        share of the Services moves to it through the drain handshake), SIGKILLs a shard (its
        Services wait for the take-over of its Lease, two lease durations, then move without a
        drain), adds one back and removes one gracefully (its Lease released: its Services move
        at once). Two or three shards run at any time; the counts are the other phases'."""
        self.controllers.stop_all()
        for name in [self.controllers.start(sharded=True) for _ in range(2)]:
            self.controllers.wait_ready(name)
        added = kills = removed = busy = 0
        for _ in range(self.settings.shard_rounds):
            time.sleep(self.rng.uniform(2.0, 5.0))
            self.controllers.wait_ready(self.controllers.start(sharded=True))
            added += 1
            time.sleep(self.rng.uniform(2.0, 5.0))
            was_busy, _ = self._busy_kill(self.rng.choice(sorted(self.controllers.running)), signal.SIGKILL)
            kills += 1
            busy += was_busy
            time.sleep(2 * SHARD_LEASE_SECONDS + self.rng.uniform(1.0, 3.0))
            self.controllers.wait_ready(self.controllers.start(sharded=True))
            added += 1
            time.sleep(self.rng.uniform(2.0, 5.0))
            was_busy, _ = self._busy_kill(self.rng.choice(sorted(self.controllers.running)), signal.SIGTERM)
            removed += 1
            busy += was_busy
        # Convergence is read with the shards left running (``converge`` uses any one running).
        result.what = (
            f"{added} shards added, {kills} SIGKILLed, {removed} removed by SIGTERM "
            f"({busy} amid provider calls)"
        )

    # -- freezes (docs/chaos.md, "Freezes") --

    def phase_freeze_leader(self, result: PhaseResult) -> None:
        """Two replicas with ``--leader-elect``, each under its own identity; the leader is frozen
        (SIGSTOP) while it writes, for 2 to 3 lease durations, then resumed (SIGCONT); the other
        takes over meanwhile and serves the changes the driver keeps making."""
        self.controllers.stop_all()
        for name in [self.controllers.start(leader_elect=True, identity="freeze-leader") for _ in range(2)]:
            self.controllers.wait_ready(name)
        self.emulator.admin.set_faults(latency_seconds=FREEZE_WRITE_LATENCY, actions="writes")
        done: list[Freeze] = []
        for _ in range(self.settings.leader_freezes):
            leader = self._wait_leader(None)
            if leader is None:
                result.notes.append("no leader within 90 s")
                break
            time.sleep(self.rng.uniform(1.0, 3.0))  # it serves for a while
            done.append(self._freeze(leader, "leader", "freeze-leader"))
            # The other one leads, and the resumed one's passes (if any) have run their course.
            self._wait_leader(None)
            time.sleep(self.rng.uniform(2.0, 4.0))
        result.what = f"{len(done)} leader freezes ({_aimed(done)})"

    def phase_freeze_sharded(self, result: PhaseResult) -> None:
        """Three replicas with ``--sharding`` and the built-in sharder, each under its own
        identity, and three more Services (``EXTRA_SERVICES``). Rounds of two freezes: a shard
        that does not run the sharder (its Services move to the others once its Lease is taken
        over), then, when that shard comes back and the sharder moves Services to it, the
        sharder's holder, right after one of its sharder writes; each for 2 to 3 lease
        durations."""
        self.controllers.stop_all()
        for name in [self.controllers.start(sharded=True, identity="freeze-sharded") for _ in range(3)]:
            self.controllers.wait_ready(name)
        known = {lb["id"] for lb in self.emulator.admin.state()["load_balancers"]}
        for name in EXTRA_SERVICES:
            balancer = f"lb-chaos-{ALL_SERVICES.index(name)}"
            if balancer not in known:
                self.emulator.admin.add_load_balancer(balancer)
            if self.api.get_or_none(kube.SERVICE, NAMESPACE, name) is None:
                with self.driver.lock:
                    self.driver.create_service(name)
        self.emulator.admin.set_faults(latency_seconds=FREEZE_WRITE_LATENCY, actions="writes")
        self._wait_ring_ready()
        done: list[Freeze] = []
        while len(done) < self.settings.shard_freezes:
            time.sleep(self.rng.uniform(1.0, 3.0))
            holder = self._sharder_holder()
            shards = sorted(n for n in self.controllers.running if n != holder)
            # One that serves Services (three Services over three shards may leave one without).
            serving = {_shard_of(s) for s in self.api.list(kube.SERVICE, NAMESPACE)["items"]}
            shards = [n for n in shards if n in serving] or shards
            if holder is None or not shards:
                result.notes.append("no sharder holder, or no other shard, within the wait")
                break
            done.append(self._freeze(self.rng.choice(shards), "shard", "freeze-sharded"))
            if len(done) >= self.settings.shard_freezes:
                break
            holder = self._sharder_holder()
            if holder is None:
                result.notes.append("no sharder holder after a shard's freeze")
                break
            # The resumed shard comes back when the Lease the sharder took over expires; the
            # sharder then drains Services to it: the holder is frozen amid those writes.
            done.append(self._freeze(holder, "sharder holder", "freeze-sharded", sharder=True))
            self._wait_ring_ready()
        at_holder = sum(1 for f in done if f.role == "sharder holder")
        result.what = f"{len(done)} freezes, {at_holder} at the sharder's holder ({_aimed(done)})"

    def _freeze(self, target: str, role: str, phase: str, *, sharder: bool = False) -> Freeze:
        """Stop ``target`` at a moment it writes (``_aim``), for 2 to 3 lease durations; resume it."""
        process, _ = self.controllers.running[target]
        aim = self._aim(target, process, phase, sharder=sharder)
        stopped = time.time()
        seconds = self.rng.uniform(*FREEZE_DURATIONS) * FREEZE_LEASE_SECONDS
        log(f"froze {target} ({role}) for {seconds:.1f}s: {aim}")
        time.sleep(seconds)
        resumed = time.time()  # stamped before the signal: nothing it sends can arrive earlier
        process.signal(signal.SIGCONT)
        freeze = Freeze(target, phase, role, aim, stopped, resumed)
        self.freezes.append(freeze)
        return freeze

    def _aim(self, target: str, process: Process, phase: str, *, sharder: bool) -> str:
        """SIGSTOP ``target`` while it writes; what it was doing then.

        A sharder's holder: right after a sharder write of it appears in the audit log (its round
        is under way), waiting up to 40 s. Any replica (and the holder when none came): the driver
        changes a pod of one of its Services (readiness flipped), and the target is stopped as
        soon as the emulator shows a provider write of it in flight (up to 4 s; then any call of
        it; then, after 6 s, at once)."""
        if sharder:
            since = time.time()
            deadline = time.monotonic() + 40.0
            self.audit.read()
            while time.monotonic() < deadline:
                for request in self.audit.read():
                    identity = next((i for i in self.controllers.identities if i.name == target), None)
                    act = sharder_act(request, identity) if identity is not None else None
                    if request.identity == target and act is not None and request.received >= since:
                        process.signal(signal.SIGSTOP)
                        late = time.time() - request.received
                        return f"{late * 1000:.0f} ms after its sharder {act} of {request.name}"
                time.sleep(0.01)
        changed = self._change_for(target, sharded=phase == "freeze-sharded")
        cursor = self.requests.last
        started = time.monotonic()
        while True:
            waited = time.monotonic() - started
            _, in_flight, _ = self.emulator.admin.requests(cursor)
            mine = [c for c in in_flight if c["session"] == target]
            writes = [c for c in mine if c["action"] in MUTATING_ACTIONS]
            chosen = writes[0] if writes else (mine[0] if mine and waited > 4.0 else None)
            if chosen is not None or waited > 6.0:
                process.signal(signal.SIGSTOP)
                if chosen is None:
                    return f"no call of it in flight within 6 s of {changed}"
                age = (time.time() - float(chosen["received"])) * 1000
                return f"{chosen['action']} in flight for {age:.0f} ms, {waited:.1f}s after {changed}"
            time.sleep(0.02)

    def _change_for(self, target: str, *, sharded: bool) -> str:
        """Flip the readiness of a pod one of ``target``'s Services selects (a leader's: any
        Service's; a shard's: those labeled for it, or unassigned); what was changed."""
        services = [
            s
            for s in View.read(self.api, self.emulator.admin).alive_services().values()
            if not sharded or not _shard_of(s) or (_shard_of(s) == target and not _draining(s))
        ]
        with self.driver.lock:
            for service in self.rng.sample(services, len(services)):
                selector = service.get("spec", {}).get("selector")
                pods = sorted(
                    p["metadata"]["name"]
                    for p in self.api.list(kube.POD, NAMESPACE)["items"]
                    if map_selects(selector, p["metadata"].get("labels")) and not lifecycle.is_deleting(p)
                )
                pods = [p for p in pods if p in self.driver.pods]
                if pods:
                    pod = self.rng.choice(pods)
                    ready = not self.driver.pods[pod]
                    with suppress(ApiError):
                        self.driver.set_ready(pod, ready)
                    return f"{pod} of {service['metadata']['name']} made {'ready' if ready else 'not ready'}"
        return "no pod to change"

    def _sharder_holder(self, timeout: float = 60.0) -> str | None:
        """The running replica holding the sharder's Lease, renewed in time."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            lease = self.api.get_or_none(kube.LEASE, NAMESPACE, SHARDER_LEASE)
            spec = (lease or {}).get("spec") or {}
            holder = str(spec.get("holderIdentity") or "").split("_", 1)[0]
            if holder in self.controllers.running and _renewed_within(spec):
                return holder
            time.sleep(0.2)
        return None

    def _wait_ring_ready(self, timeout: float = 60.0) -> bool:
        """Every running replica holds its own shard Lease, renewed in time, and one of them the
        sharder's."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            listed = self.api.list(kube.LEASE, NAMESPACE)["items"]
            leases = {lease["metadata"]["name"]: lease for lease in listed}
            ready = all(
                name in leases
                and (leases[name].get("spec") or {}).get("holderIdentity") == name
                and _renewed_within(leases[name].get("spec") or {})
                for name in self.controllers.running
            )
            if ready and self._sharder_holder(timeout=0.5) is not None:
                return True
            time.sleep(0.2)
        log(f"the ring was not ready within {timeout:.0f}s")
        return False

    # -- convergence and scoring --

    def converge(self, result: PhaseResult) -> None:
        self._single()
        since = time.monotonic()
        deadline = since + self.settings.converge_timeout
        wrong: list[str] = ["not looked yet"]
        while time.monotonic() < deadline:
            wrong = View.read(self.api, self.emulator.admin).provider_mismatches()
            if not wrong:
                result.converged_after = time.monotonic() - since
                break
            time.sleep(0.5)
        if wrong:
            result.notes.append(
                f"provider not converged after {self.settings.converge_timeout:.0f}s: {wrong[:3]}"
            )
        settle = time.monotonic() + self.settings.settle_timeout
        while True:
            view = View.read(self.api, self.emulator.admin)
            findings = view.api_findings()
            if not any(findings.values()) and not view.provider_mismatches():
                result.settled_after = time.monotonic() - since
                break
            if time.monotonic() >= settle:
                break
            time.sleep(0.5)
        result.findings = findings
        result.lost, result.stale = len(findings["lost"]), len(findings["stale"])
        result.stuck, result.unguarded_routes = len(findings["stuck"]), len(findings["unguarded_routes"])

    def score(self) -> None:
        time.sleep(1.0)  # the last DELETED events of the last phase
        self.history.fetch()
        lines = self.history.timelines()
        duplicates = self.history.duplicates()
        deletions = list(self.watch.deletions)
        for result in self.results:
            window = [d for d in deletions if result.started <= d.time < result.ended]
            result.deletions = len(window)
            result.unguarded = unguarded_deletions(window, lines)
            result.duplicates = sum(1 for t, _, _ in duplicates if result.started <= t < result.ended)
        self.requests.fetch()
        self.audit.read()
        self.verdicts = judge(
            self.controllers.identities,
            self.audit.requests,
            self.requests.calls,
            self.freezes,
            FREEZE_LEASE_SECONDS,
        )
        self.takeovers = takeovers(self.controllers.identities, self.audit.requests, self.freezes)
        if self.requests.missed:
            self.results[-1].notes.append(
                f"the emulator dropped {self.requests.missed} calls before they were fetched"
            )


def _shard_of(service: KubeObject) -> str:
    return str((service["metadata"].get("labels") or {}).get(shard_label(RING)) or "")


def _draining(service: KubeObject) -> bool:
    return drain_label(RING) in (service["metadata"].get("labels") or {})


def _renewed_within(spec: dict[str, Any]) -> bool:
    """A Lease's spec says it was renewed less than its duration ago."""
    renewed = parse_lease_time(spec.get("renewTime"))
    if renewed is None:
        return False
    age = datetime.datetime.now(datetime.UTC) - renewed
    return age.total_seconds() < float(spec.get("leaseDurationSeconds") or 0)


def _aimed(freezes: list[Freeze]) -> str:
    in_flight = sum(1 for f in freezes if "in flight" in f.aim)
    after_sharder = sum(1 for f in freezes if "after its sharder" in f.aim)
    parts = [f"{in_flight} amid a provider call"]
    if after_sharder:
        parts.append(f"{after_sharder} right after a sharder write")
    return ", ".join(parts)


#: ``--only``'s name of each phase.
PHASES = {
    "calm": "calm",
    "kill -9": "kills",
    "provider faults": "faults",
    "leader kills": "leader",
    "SIGTERM": "sigterm",
    "SIGTERM, hung provider": "hung-sigterm",
    "shard kills and rebalances": "sharded",
    "leader freezes": "freeze-leader",
    "shard and sharder freezes": "freeze-sharded",
}

_FAULT_CODES = {"Throttling", "ServiceUnavailable", "ConnectionReset", "InternalError"}


# ---- output ----------------------------------------------------------------------------------


def _longest(unguarded: list[Unguarded]) -> str:
    if not unguarded:
        return "-"
    if any(u.routed_for is None for u in unguarded):
        return "still"
    return f"{max(u.routed_for or 0.0 for u in unguarded):.1f}"


def _seconds(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"


def table(results: list[PhaseResult]) -> str:
    header = (
        "phase",
        "what happened",
        "pod deletions",
        "unguarded deletions",
        "longest routed after delete (s)",
        "lost entries",
        "stale entries",
        "stuck finalizers",
        "routes w/o guard",
        "duplicate backends",
        "converged (s)",
        "settled (s)",
    )
    rows = [
        (
            r.phase,
            r.what,
            str(r.deletions),
            str(len({(u.pod, u.deleted_at) for u in r.unguarded})),
            _longest(r.unguarded),
            str(r.lost),
            str(r.stale),
            str(r.stuck),
            str(r.unguarded_routes),
            str(r.duplicates),
            _seconds(r.converged_after),
            _seconds(r.settled_after),
        )
        for r in results
    ]
    every = [u for r in results for u in r.unguarded]
    converged = [r.converged_after for r in results if r.converged_after is not None]
    settled = [r.settled_after for r in results if r.settled_after is not None]
    rows.append(
        (
            "total",
            "",
            str(sum(r.deletions for r in results)),
            str(len({(u.pod, u.deleted_at) for u in every})),
            _longest(every),
            str(sum(r.lost for r in results)),
            str(sum(r.stale for r in results)),
            str(sum(r.stuck for r in results)),
            str(sum(r.unguarded_routes for r in results)),
            str(sum(r.duplicates for r in results)),
            f"max {max(converged):.1f}" if len(converged) == len(results) else "n/a",
            f"max {max(settled):.1f}" if len(settled) == len(results) else "n/a",
        )
    )
    return _render(header, rows)


def _render(header: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> str:
    """A Markdown table (docs/chaos.md quotes them as printed)."""
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]

    def line(cells: tuple[str, ...]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(header), rule, *map(line, rows)])


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f} ms"


def _spread(values: list[float]) -> str:
    """Median and range, in seconds."""
    if not values:
        return "-"
    return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"


def freeze_table(results: list[PhaseResult], freezes: list[Freeze], verdicts: list[Verdict]) -> str:
    """Per freeze phase: the freezes, and the requests that reached a server after their
    sender's Lease deadline (bench/chaos_fencing.py)."""
    header = (
        "phase",
        "freezes (at sharder holder)",
        "late API writes (accepted / refused)",
        "late provider writes (accepted / refused)",
        "late writes after another took the Lease over",
        "late provider reads",
        "sharder writes by a non-holder: assign / drain / take-over (accepted)",
        "late requests of replicas never frozen",
    )
    rows: list[tuple[str, ...]] = []
    for result in results:
        phase = PHASES[result.phase]
        mine = [v for v in verdicts if v.phase == phase]
        if not phase.startswith("freeze"):
            continue
        frozen = [f for f in freezes if f.phase == phase]
        never = sum(len(v.late) for v in mine if not v.frozen)
        kinds = ("assign", "drain", "take-over")
        rows.append(
            (
                result.phase,
                f"{len(frozen)} ({sum(1 for f in frozen if f.role == 'sharder holder')})",
                f"{sum(v.count('api') for v in mine)} "
                f"({sum(v.count('api', accepted=True) for v in mine)} / "
                f"{sum(v.count('api', accepted=False) for v in mine)})",
                f"{sum(v.count('provider') for v in mine)} "
                f"({sum(v.count('provider', accepted=True) for v in mine)} / "
                f"{sum(v.count('provider', accepted=False) for v in mine)})",
                str(sum(v.count(w, after_takeover=True) for v in mine for w in ("api", "provider"))),
                str(sum(v.count("provider", write=False) for v in mine)),
                " / ".join(str(sum(v.sharder(k) for v in mine)) for k in kinds)
                + " ("
                + " / ".join(str(sum(v.sharder(k, accepted=True) for v in mine)) for k in kinds)
                + ")",
                str(never),
            )
        )
    return _render(header, rows)


def takeover_table(taken: list[Takeover]) -> str:
    """Per frozen role and Lease: seconds from the SIGSTOP until another replica's first accepted
    write of a Lease the frozen one held."""
    header = ("frozen", "Lease", "take-overs", "not taken over", "after SIGSTOP, s: median (range)")
    rows: list[tuple[str, ...]] = []
    for role, kind in sorted({(t.role, t.kind) for t in taken}):
        mine = [t for t in taken if (t.role, t.kind) == (role, kind)]
        seconds = [t.seconds for t in mine if t.seconds is not None]
        rows.append((role, kind, str(len(seconds)), str(len(mine) - len(seconds)), _spread(seconds)))
    return _render(header, rows)


def identity_table(verdicts: list[Verdict]) -> str:
    """Per replica (its own identity): what it sent, and what arrived after its deadline."""
    header = (
        "identity",
        "phase",
        "frozen",
        "own Lease writes",
        "API writes",
        "late API writes",
        "provider writes",
        "late provider writes",
        "provider reads",
        "late provider reads",
    )
    rows = [
        (
            v.identity,
            v.phase,
            str(v.frozen),
            str(v.lease_writes),
            str(v.api_writes),
            str(v.count("api")),
            str(v.provider_writes),
            str(v.count("provider")),
            str(v.provider_reads),
            str(v.count("provider", write=False)),
        )
        for v in verdicts
    ]
    return _render(header, rows)


def freeze_counts(verdicts: list[Verdict], freezes: list[Freeze], freeze: Freeze) -> str:
    """What reached a server late from ``freeze``'s SIGCONT to its replica's next SIGSTOP."""
    following = [f.stopped for f in freezes if f.identity == freeze.identity and f.stopped > freeze.resumed]
    late = after_freeze(verdicts, freeze, min(following, default=None))
    api = [item for item in late if item.where == "api"]
    writes = [item for item in late if item.where == "provider" and item.write]
    sharder = [item for item in api if item.kind in ("assign", "drain", "take-over", "delete-lease")]
    return (
        f"{len(api)} late API writes ({sum(i.accepted for i in api)} accepted), "
        f"{len(writes)} late provider writes ({sum(i.accepted for i in writes)} accepted), "
        f"{len(sharder)} of them sharder writes ({sum(i.accepted for i in sharder)} accepted)"
    )


def late_lines(verdicts: list[Verdict], freezes: list[Freeze], limit: int = 40) -> list[str]:
    """The late requests, each with its time after the sender's resume and past its deadline."""
    late = sorted((item for v in verdicts for item in v.late), key=lambda item: item.received)
    lines = [
        f"{item.identity} {item.where}: {item.what} [{item.kind}, for {item.lease}] "
        f"{_ms(item.after_resume)} after its SIGCONT, "
        + ("never held" if item.past_deadline is None else f"{_ms(item.past_deadline)} past its deadline")
        + (", after another took the Lease over" if item.after_takeover else "")
        for item in late[:limit]
    ]
    if len(late) > limit:
        lines.append(f"... and {len(late) - limit} more (results.json)")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer kills, shorter phases (a few minutes)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the driver and the kill moments")
    parser.add_argument("--workdir", type=Path, default=None, help="logs and results (default: a temp dir)")
    parser.add_argument(
        "--controller-arg",
        action="append",
        default=[],
        help="extra argument for every `resourceconsist run` (repeatable: --controller-arg=--flag=value)",
    )
    parser.add_argument(
        "--unstamped-pods",
        action="store_true",
        help="with --controller-arg=--pod-employer-label: create pods without the employer label, "
        "as pods the webhook is not sent are (plain Kubernetes); the shards label them",
    )
    parser.add_argument(
        "--only",
        choices=sorted(PHASES.values()),
        action="append",
        default=[],
        help="run this phase only (after the start-up every phase shares; repeatable), e.g. --only sharded",
    )
    parser.add_argument(
        "--controller-python",
        default=sys.executable,
        help="the interpreter that runs the controllers (`-m resourceconsist`): another checkout's "
        "virtualenv measures that checkout's code with this run's instruments",
    )
    args = parser.parse_args()
    # A SIGTERM to the benchmark still tears every process down (the context managers' exits).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    extra = tuple(args.controller_arg)
    settings = dataclasses.replace(
        Settings.quick(args.seed, extra) if args.quick else Settings(seed=args.seed, controller_args=extra),
        unstamped=args.unstamped_pods,
    )
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="resourceconsist-chaos-"))
    workdir.mkdir(parents=True, exist_ok=True)
    only = f", phases {', '.join(args.only)} only" if args.only else ""
    code = "" if args.controller_python == sys.executable else f", controllers: {args.controller_python}"
    log(f"chaos run ({'quick' if args.quick else 'full'}, seed {args.seed}{only}{code}); logs in {workdir}")
    started = time.monotonic()
    run = Run(settings, workdir, args.controller_python)
    results = run.execute(args.only)
    (workdir / "results.json").write_text(
        json.dumps(
            {
                "settings": asdict(settings),
                "phases": [asdict(r) for r in results],
                "fencing": as_json(run.verdicts, run.freezes, run.takeovers),
            },
            indent=1,
        )
    )
    print()
    print(table(results))
    if run.freezes:
        print()
        print(freeze_table(results, run.freezes, run.verdicts))
        print()
        print(takeover_table(run.takeovers))
        print()
        print(identity_table(run.verdicts))
        for line in late_lines(run.verdicts, run.freezes):
            print(f"late: {line}")
        for freeze in run.freezes:
            took = freeze.resumed - freeze.stopped
            print(f"freeze: {freeze.identity} ({freeze.role}) {took:.1f}s: {freeze.aim}")
            print(f"  after its SIGCONT: {freeze_counts(run.verdicts, run.freezes, freeze)}")
            for t in run.takeovers:
                if (t.identity, t.stopped) == (freeze.identity, freeze.stopped):
                    by = "nobody" if t.by is None else f"{t.by} after {_seconds(t.seconds)}s"
                    print(f"  take-over of {t.lease} ({t.kind} Lease): {by}")
    print(f"\n{time.monotonic() - started:.0f}s in all; details in {workdir / 'results.json'}")
    for r in results:
        for note in r.notes:
            print(f"note ({r.phase}): {note}")


if __name__ == "__main__":
    main()
