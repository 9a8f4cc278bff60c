"""Least privilege, proven as the ServiceAccount (docs/security.md): the chart's RBAC and its
ValidatingAdmissionPolicy are applied to a real kube-apiserver that writes an audit log, a token
of the manager's ServiceAccount is minted by the TokenRequest API, and the manager runs as its own
process with that token (`resourceconsist run`, the chart's own arguments, the SLB adapter
against the SLB emulator served as its own process, the webhook with its certificate bootstrap).

Everything the promise needs is allowed: webhook admission, guard and lifecycle finalizers,
readiness-gate condition, a pod's deletion released, the employer's deletion, and after a
restart the garbage pass over a Service force-deleted while the manager was down. With the same
token, every write beyond that is refused by the policy with a message naming what was refused
(the table in docs/security.md is this module's). The grants the runs used are read from the
audit log, never from a list written by hand, and every grant of the chart is either used or
explained in docs/security.md. A namespaced install (`watchNamespaces`, two namespaces) runs on
a Role and RoleBinding in each: guard, gate, drain and the garbage pass after a restart work in
both, a third namespace is neither touched nor read, and what it may not read answers 403:
unknown, never gone. An adapter's sub-resource (a PodDisruptionBudget) is kept as the
ServiceAccount too, with one Role for its kind.

Each install has a control plane of its own: the chart's webhook configuration (failurePolicy
Fail) and policy must not reach the session's other tests.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from resourceconsist import wire
from resourceconsist.adapters.alibabacloudslb import (
    DRAIN_ANNOTATION,
    LOAD_BALANCER_ID_LABEL,
    MODE_ANNOTATION,
    SERVER_ID_ANNOTATION,
)
from resourceconsist.adapters.alibabacloudslb.emulator_server import EmulatorAdmin, served_emulator
from resourceconsist.cluster import kube
from resourceconsist.cluster.kube import ApiError, KubeClient
from resourceconsist.experimental.demo import DEMO_CONDITION_ANNOTATION
from resourceconsist.hooks.orphans import LOOKUP_REFUSED_REASON
from resourceconsist.rules import lifecycle, marks
from resourceconsist.testing import (
    Cluster,
    LocalControlPlane,
    async_wait_for,
    condition,
    finalizers,
    find_helm,
    wait_for,
)
from resourceconsist.testing.controlplane import free_port
from resourceconsist.testing.process import CommandProcess

pytestmark = pytest.mark.controlplane

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "resourceconsist"
SECURITY_DOC = REPO / "docs" / "security.md"
MANAGER = "resourceconsist-manager"
RELEASE_NAMESPACE = wire.DEFAULT_NAMESPACE
USER = f"system:serviceaccount:{RELEASE_NAMESPACE}:{MANAGER}"
CLUSTER_NAME = "privilege-test"
LOAD_BALANCER = "lb-privilege"
#: Where the controlled pods and their Service live.
APP = "shop"
#: The second namespace a namespaced install watches.
SECOND = "payments"
#: A namespace a namespaced install does not watch.
ELSEWHERE = "elsewhere"
FLZ = lifecycle.lifecycle_finalizer("web")
GUARD = lifecycle.guard_finalizer("web")
GATE = lifecycle.readiness_gate("web")
CLUSTER_ROLE = kube.Resource(
    "rbac.authorization.k8s.io", "v1", "ClusterRole", "clusterroles", namespaced=False
)
#: One grant: (API group, resource[/subresource], verb).
Grant = tuple[str, str, str]


def _render(values: dict[str, Any], tmp_path: Path) -> list[dict[str, Any]]:
    values_file = tmp_path / "values.yaml"
    values_file.write_text(yaml.safe_dump(values))
    rendered = subprocess.run(
        [
            str(find_helm()),
            *("template", "resourceconsist", str(CHART), "--namespace", RELEASE_NAMESPACE),
            *("--set", "createNamespace=true", "--values", str(values_file)),
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert rendered.returncode == 0, rendered.stderr
    return [d for d in yaml.safe_load_all(rendered.stdout) if d]


def _apply(admin: KubeClient, docs: list[dict[str, Any]], webhook_port: int) -> None:
    """Create every rendered object as admin, Namespaces first. The webhook configuration calls
    the manager process on loopback (no Service networking here) instead of its Service: the
    caBundle is still left for the manager's bootstrap to fill."""
    for doc in sorted(docs, key=lambda d: d["kind"] != "Namespace"):
        if doc["kind"] == "MutatingWebhookConfiguration":
            for hook in doc["webhooks"]:
                path = hook["clientConfig"]["service"]["path"]
                hook["clientConfig"] = {"url": f"https://127.0.0.1:{webhook_port}{path}"}
        resource = admin.resource(doc["apiVersion"], doc["kind"])
        admin.create(resource, doc["metadata"].get("namespace") if resource.namespaced else None, doc)


def _manager_args(docs: list[dict[str, Any]], deployment_name: str = MANAGER) -> list[str]:
    (deployment,) = [
        d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == deployment_name
    ]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return list(container["args"])


def _granted(docs: list[dict[str, Any]]) -> set[Grant]:
    """Every (group, resource, verb) the rendered RBAC grants the manager's ServiceAccount."""
    roles = {(d["kind"], d["metadata"]["name"]): d for d in docs if d["kind"] in {"Role", "ClusterRole"}}
    granted: set[Grant] = set()
    for binding in (d for d in docs if d["kind"] in {"RoleBinding", "ClusterRoleBinding"}):
        if not any(s["kind"] == "ServiceAccount" and s["name"] == MANAGER for s in binding["subjects"]):
            continue
        role = roles[(binding["roleRef"]["kind"], binding["roleRef"]["name"])]
        for rule in role["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    granted.update((group, resource, verb) for verb in rule["verbs"])
    return granted


def _used(events: list[dict[str, Any]]) -> set[Grant]:
    """The grants the manager's requests were authorized by, from the audit log: every request of
    its user that RBAC let through (a 404 too: the bootstrap looks for a configuration)."""
    used: set[Grant] = set()
    for event in events:
        ref = event.get("objectRef")
        if event["user"]["username"] != USER or ref is None or _forbidden_by_rbac(event):
            continue
        resource = ref["resource"] + (f"/{ref['subresource']}" if ref.get("subresource") else "")
        used.add((ref.get("apiGroup", ""), resource, event["verb"]))
    return used


def _forbidden_by_rbac(event: dict[str, Any]) -> bool:
    return event.get("annotations", {}).get("authorization.k8s.io/decision") == "forbid"


@dataclass
class Install:
    """A control plane with the chart applied, and a kubeconfig of the manager's ServiceAccount;
    the tokens of a Prometheus bound to the chart's metrics reader, and of a stranger who is not."""

    cp: LocalControlPlane
    admin: KubeClient
    docs: list[dict[str, Any]]
    kubeconfig: Path
    webhook_port: int
    reader_token: str = ""
    stranger_token: str = ""

    def as_manager(self) -> KubeClient:
        """A client with the manager's token: what its process can do, the test can try."""
        return KubeClient.from_kubeconfig(str(self.kubeconfig), name="as-manager")


def _install(values: dict[str, Any], tmp_path: Path) -> Iterator[Install]:
    """The chart rendered with ``values``, applied as admin to a control plane that writes an
    audit log, the policy enforced; a token of the manager's ServiceAccount in a kubeconfig."""
    webhook_port = free_port()
    docs = _render(values, tmp_path)
    with LocalControlPlane(audit=True) as cp:
        admin = KubeClient.from_kubeconfig(str(cp.kubeconfig), name="admin")
        try:
            # The webhook changes the pods' specs (readiness gates) in namespaces that opt in. They
            # exist before the install, which may put a Role in them (watchNamespaces).
            inject = {wire.READINESS_GATE_INJECT_LABEL: wire.READINESS_GATE_INJECT_VALUE}
            for namespace in (APP, SECOND, ELSEWHERE):
                admin.create(kube.NAMESPACE, None, {"metadata": {"name": namespace, "labels": inject}})
            _apply(admin, docs, webhook_port)
            token = cp.service_account_token(RELEASE_NAMESPACE, MANAGER)
            kubeconfig = cp.token_kubeconfig(token, tmp_path / "manager.kubeconfig")
            install = Install(cp, admin, docs, kubeconfig, webhook_port, *_metrics_readers(cp, admin))
            _wait_for_the_policy(install)
            yield install
        finally:
            admin.close()


#: Where the scrapers' ServiceAccounts live.
MONITORING = "monitoring"
METRICS_READER = "resourceconsist-metrics-reader"


def _metrics_readers(cp: LocalControlPlane, admin: KubeClient) -> tuple[str, str]:
    """Tokens of ServiceAccounts `monitoring/prometheus`, bound to the chart's ClusterRole
    resourceconsist-metrics-reader as docs/observability.md says to, and `monitoring/stranger`,
    bound to nothing."""
    admin.create(kube.NAMESPACE, None, {"metadata": {"name": MONITORING}})
    account = admin.resource("v1", "ServiceAccount")
    for name in ("prometheus", "stranger"):
        admin.create(account, MONITORING, {"metadata": {"name": name}})
    binding = admin.resource("rbac.authorization.k8s.io/v1", "ClusterRoleBinding")
    admin.create(
        binding,
        None,
        {
            "metadata": {"name": "prometheus-reads-resourceconsist"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": METRICS_READER,
            },
            "subjects": [{"kind": "ServiceAccount", "name": "prometheus", "namespace": MONITORING}],
        },
    )
    return cp.service_account_token(MONITORING, "prometheus"), cp.service_account_token(
        MONITORING, "stranger"
    )


def _scrape(port: int | None, token: str | None) -> tuple[int, str]:
    """GET https://127.0.0.1:<port>/metrics with ``token`` as the bearer, not verifying the
    self-signed certificate (as the chart's ServiceMonitor): the status and the body."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    request = urllib.request.Request(
        f"https://127.0.0.1:{port}/metrics", headers={"Authorization": f"Bearer {token}"} if token else {}
    )
    try:
        with urllib.request.urlopen(request, timeout=15, context=context) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


async def _scraped(install: Install, process: CommandProcess) -> None:
    """The process's secure /metrics, scraped as the chart's reader: 200 (its ServiceAccount
    reviewed the token and the access with the chart's grants)."""
    status, text = await asyncio.to_thread(_scrape, process.metrics_port, install.reader_token)
    assert status == 200 and "controller_runtime_" in text, (status, text[:500])


def _wait_for_the_policy(install: Install) -> None:
    """The API server enforces a new policy a moment after it is created: wait until a write it
    refuses is refused, on a pod made for that and then deleted."""
    probe = "policy-probe"
    install.admin.create(
        kube.POD,
        APP,
        {"metadata": {"name": probe}, "spec": {"containers": [{"name": "app", "image": "probe"}]}},
    )
    manager = install.as_manager()
    try:

        def refused() -> bool:
            try:
                manager.patch(
                    kube.POD, APP, probe, {"metadata": {"labels": {"probe": str(time.monotonic())}}}
                )
            except ApiError as err:
                return err.status == 403
            return False

        wait_for(refused, timeout=60, interval=0.5, message="the least-privilege policy enforced")
    finally:
        manager.close()
        install.admin.delete(kube.POD, APP, probe)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Install]:
    """The chart with its default values (a cluster-wide install) on a control plane of its own."""
    yield from _install({}, tmp_path_factory.mktemp("cluster-wide"))


@pytest.fixture(scope="module")
def emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict[str, str], EmulatorAdmin]]:
    """The SLB emulator server process with one load balancer; its start-up line and admin."""
    with served_emulator(tmp_path_factory.mktemp("slb"), LOAD_BALANCER) as served:
        yield served


def _manager_process(install: Install, info: dict[str, str], cert_dir: Path) -> CommandProcess:
    """`resourceconsist run` with the chart's arguments, as the ServiceAccount: the token's
    kubeconfig, loopback addresses, and the emulator's endpoint for the SLB adapter."""
    return _chart_process(
        install,
        info,
        [*_manager_args(install.docs), *_webhook_args(install, cert_dir), *_controller_args()],
    )


def _webhook_args(install: Install, cert_dir: Path) -> list[str]:
    """The webhook served on loopback, its certificate bootstrapped into ``cert_dir``."""
    return [
        "--webhook-host=127.0.0.1",
        f"--webhook-port={install.webhook_port}",
        f"--cert-dir={cert_dir}",
        "--webhook-cert-host=127.0.0.1",
    ]


def _controller_args() -> list[str]:
    """The SLB adapter's cluster name, and a garbage pass every second."""
    return [f"--slb-cluster-name={CLUSTER_NAME}", "--garbage-interval=1"]


def _chart_process(
    install: Install, info: dict[str, str], args: list[str], env: dict[str, str] | None = None
) -> CommandProcess:
    """`resourceconsist` with ``args`` (a Deployment's, then this test's), as the ServiceAccount:
    the token's kubeconfig, loopback addresses, and the emulator's endpoint for the SLB adapter
    (``info``; empty for an adapter without a provider outside the process, the demo's)."""
    health_port, metrics_port = free_port(), free_port()
    args = [
        *args,
        f"--kubeconfig={install.kubeconfig}",
        f"--metrics-bind-address=127.0.0.1:{metrics_port}",
        f"--health-probe-bind-address=127.0.0.1:{health_port}",
        "--log-format=text",
    ]
    env = {
        **{
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("ALIYUN_", "ALIBABA_CLOUD_")) and k != "KUBECONFIG"
        },
        wire.POD_NAMESPACE_ENV: RELEASE_NAMESPACE,
        **(
            {
                "ALIYUN_SLB_AK_KEY": info["access_key_id"],
                "ALIYUN_SLB_AK_SECRET": info["access_key_secret"],
                "ALIYUN_SLB_ENDPOINT": info["endpoint"],
                "ALIBABA_CLOUD_REGION_ID": info["region_id"],
                "ALIBABA_CLOUD_CA_BUNDLE": info["ca_bundle"],
            }
            if info
            else {}
        ),
        **(env or {}),
    }
    return CommandProcess(args, env, health_port, metrics_port=metrics_port)


@asynccontextmanager
async def _manager(install: Install, info: dict[str, str], cert_dir: Path) -> AsyncIterator[CommandProcess]:
    """The manager as its ServiceAccount, ready, its webhook's caBundle filled by its bootstrap,
    its secure /metrics read by the chart's reader."""
    manager = _manager_process(install, info, cert_dir)
    try:
        await async_wait_for(manager.ready, timeout=90, message="the manager ready")
        await _ca_bundle_filled(install)
        await _scraped(install, manager)
        yield manager
    except BaseException:
        # Shown by pytest with the failure: what the manager said, and what it was refused.
        print(manager.output[-20000:])
        print("\n".join(_manager_forbidden(install.cp.audit_events())))
        raise
    finally:
        manager.stop()


async def _ca_bundle_filled(install: Install) -> None:
    """Wait until the webhook's certificate bootstrap has filled the configuration's caBundle."""

    async def filled() -> bool:
        config = await Cluster(install.admin, APP).call(
            install.admin.get,
            kube.MUTATING_WEBHOOK_CONFIGURATION,
            None,
            wire.MUTATING_WEBHOOK_CONFIGURATION,
        )
        return all(hook["clientConfig"].get("caBundle") for hook in config["webhooks"])

    await async_wait_for(filled, timeout=60, message="the bootstrap's caBundle in the configuration")


def _manager_forbidden(events: list[dict[str, Any]]) -> list[str]:
    """The manager's requests that were refused (by RBAC or by admission)."""
    return [
        f"{e['verb']} {e['requestURI']}: {e.get('responseStatus', {}).get('message', '')}"
        for e in events
        if e["user"]["username"] == USER and e.get("responseStatus", {}).get("code") == 403
    ]


async def _serve(
    cluster: Cluster,
    admin: EmulatorAdmin,
    service: str,
    pods: list[str],
    first_eni: int,
    *,
    pre_stop: bool = False,
) -> None:
    """Service ``service`` (already created, selecting ``app: <service>``) gets ``pods``: admitted
    by the webhook (``pre_stop``: given the sleep of the Service's `drain-seconds`), guarded,
    served by its VServer group, their gate True."""
    group_name = f"resourceconsist/{cluster.namespace}/{service}"
    flz, gate = lifecycle.lifecycle_finalizer(service), lifecycle.readiness_gate(service)
    for index, name in enumerate(pods, start=first_eni):
        created = await cluster.pod(
            name,
            {"app": service, wire.CONTROL_LABEL: wire.CONTROL_LABEL_VALUE},
            readiness_gate=True,
            annotations={SERVER_ID_ANNOTATION: f"eni-{index}"},
        )
        # Admitted by the webhook, served by the manager process with its bootstrapped certificate.
        assert gate in [g["conditionType"] for g in created["spec"].get("readinessGates", [])]
        if pre_stop:
            assert created["spec"]["containers"][0]["lifecycle"]["preStop"]["sleep"]["seconds"] == 5
        # As the kubelet: containers ready (a pod with the frame's gate is Ready only once the
        # gate is True), PodOpsLifecycle's gate True.
        await cluster.set_status(name, ready=False, service_ready=True)
        await cluster.set_condition(name, "ContainersReady", True)

    async def served() -> bool:
        groups = [g for g in admin.state()["groups"] if g["name"] == group_name]
        if len(groups) != 1 or sorted(b["Weight"] for b in groups[0]["backends"]) != [100] * len(pods):
            return False
        for name in pods:
            pod = await cluster.get(kube.POD, name)
            if flz not in finalizers(pod) or condition(pod, gate) != "True":
                return False
        return True

    await async_wait_for(served, timeout=90, message=f"{service}'s pods served, guarded, their gate True")


async def _serve_and_release(
    cluster: Cluster, admin: EmulatorAdmin, pods: list[str], *, first_eni: int = 0, drained: bool = False
) -> None:
    """Service `web` (already created) serves `pods` (``_serve``); then one pod's deletion is
    released (``drained``: after its backend was seen at weight 0 while the pod waited, the
    Service's `slb-drain-seconds`), and the Service's deletion releases the rest."""
    await _serve(cluster, admin, "web", pods, first_eni=first_eni, pre_stop=drained)
    first, rest = pods[0], pods[1:]
    await cluster.delete(kube.POD, first)
    if drained:
        group_name = f"resourceconsist/{cluster.namespace}/web"

        async def draining() -> bool:
            (group,) = [g for g in admin.state()["groups"] if g["name"] == group_name]
            weights = sorted(b["Weight"] for b in group["backends"])
            pod = await cluster.get(kube.POD, first)
            return weights == [0] + [100] * len(rest) and pod is not None and FLZ in finalizers(pod)

        await async_wait_for(draining, timeout=60, message=f"{first} drained at weight 0 while it waits")

    async def deleted(name: str) -> bool:
        return await cluster.get(kube.POD, name) is None

    await async_wait_for(lambda: deleted(first), timeout=60, message=f"{first}'s deletion released")
    await cluster.delete(kube.SERVICE, "web")

    async def employer_gone_pods_released() -> bool:
        if await cluster.get(kube.SERVICE, "web") is not None:
            return False
        for name in rest:
            held = finalizers(await cluster.get(kube.POD, name))
            if FLZ in held or GUARD in held:
                return False
        return True

    await async_wait_for(
        employer_gone_pods_released, timeout=90, message="the Service deleted, its pods released"
    )


async def _collected_after_restart(
    install: Install, info: dict[str, str], clusters: list[Cluster], admin: EmulatorAdmin, cert_dir: Path
) -> CommandProcess:
    """While the manager is down an operator force-deletes Service `gone` (served, with pod
    `gone-0`) in each of ``clusters``: its group and its pod's marks are orphans, which the
    garbage pass of the next start collects and releases (docs/lifecycle-hooks.md); then gone-0's
    deletion is released. Returns the restarted manager (stopped)."""
    for cluster in clusters:
        await cluster.patch(kube.SERVICE, "gone", {"metadata": {"finalizers": None}})
        await cluster.delete(kube.SERVICE, "gone")
    held = (lifecycle.lifecycle_finalizer("gone"), lifecycle.guard_finalizer("gone"))
    async with _manager(install, info, cert_dir) as restarted:
        for cluster in clusters:

            async def collected_and_released(cluster: Cluster = cluster) -> bool:
                name = f"resourceconsist/{cluster.namespace}/gone"
                if [g for g in admin.state()["groups"] if g["name"] == name]:
                    return False
                return not set(held) & set(finalizers(await cluster.get(kube.POD, "gone-0")))

            await async_wait_for(
                collected_and_released,
                timeout=90,
                message=f"the orphaned group collected, gone-0 released in {cluster.namespace}",
            )
            await cluster.delete(kube.POD, "gone-0")

            async def deleted(cluster: Cluster = cluster) -> bool:
                return await cluster.get(kube.POD, "gone-0") is None

            await async_wait_for(
                deleted, timeout=60, message=f"gone-0's deletion released in {cluster.namespace}"
            )
    return restarted


async def test_the_manager_keeps_the_promise_as_its_service_account(
    installed: Install, emulator: tuple[dict[str, str], EmulatorAdmin], tmp_path: Path
) -> None:
    info, slb = emulator
    cluster = Cluster(installed.admin, APP)
    before = len(installed.cp.audit_events())
    await cluster.service(
        "web",
        labels={LOAD_BALANCER_ID_LABEL: LOAD_BALANCER},
        annotations={MODE_ANNOTATION: "manage", wire.READINESS_GATE_ANNOTATION: "true"},
    )
    await cluster.service(
        "gone",
        labels={LOAD_BALANCER_ID_LABEL: LOAD_BALANCER},
        annotations={MODE_ANNOTATION: "manage", wire.READINESS_GATE_ANNOTATION: "true"},
    )
    async with _manager(installed, info, tmp_path / "certs") as manager:
        await _serve_and_release(cluster, slb, ["web-0", "web-1"])
        await _serve(cluster, slb, "gone", ["gone-0"], first_eni=10)
        lease = await cluster.call(
            installed.admin.get, kube.LEASE, RELEASE_NAMESPACE, "resourceconsist-manager"
        )
        assert lease["spec"]["holderIdentity"]
    restarted = await _collected_after_restart(installed, info, [cluster], slb, tmp_path / "certs-again")
    events = installed.cp.audit_events()[before:]
    assert not _manager_forbidden(events), manager.output + restarted.output
    secret = installed.admin.get(kube.SECRET, RELEASE_NAMESPACE, wire.WEBHOOK_CERT_SECRET)
    assert set(wire.WEBHOOK_CERT_KEYS) <= set(secret["data"])
    _every_grant_is_used_or_explained(events, installed.docs)


async def test_secure_metrics_answer_a_reader_a_stranger_and_no_token_as_the_service_account(
    installed: Install, emulator: tuple[dict[str, str], EmulatorAdmin], tmp_path: Path
) -> None:
    """`resourceconsist run` with the chart's arguments (`--metrics-secure`), as the manager's
    ServiceAccount with the chart's grants: /metrics answers 200 to a ServiceAccount bound to the
    chart's resourceconsist-metrics-reader, 403 to one bound to nothing, 401 without a token or
    with one the API server does not know; the reviews are the manager's own requests (the
    chart's ClusterRole resourceconsist-metrics-auth), and repeated scrapes send none: the
    answers are kept (docs/observability.md, "Secure metrics")."""
    info, _ = emulator
    assert "--metrics-secure" in _manager_args(installed.docs)
    before = len(installed.cp.audit_events())
    async with _manager(installed, info, tmp_path / "certs") as manager:  # scrapes as the reader
        port = manager.metrics_port
        status, text = await asyncio.to_thread(_scrape, port, installed.stranger_token)
        assert status == 403, text
        assert f"Authorization denied for user system:serviceaccount:{MONITORING}:stranger" in text
        assert (await asyncio.to_thread(_scrape, port, None))[0] == 401
        assert (await asyncio.to_thread(_scrape, port, "not-a-token"))[0] == 401
        for _ in range(3):
            assert (await asyncio.to_thread(_scrape, port, installed.reader_token))[0] == 200
            assert (await asyncio.to_thread(_scrape, port, installed.stranger_token))[0] == 403
            assert (await asyncio.to_thread(_scrape, port, "not-a-token"))[0] == 401
    events = installed.cp.audit_events()[before:]
    assert not _manager_forbidden(events), manager.output
    reviews = [
        e["objectRef"]["resource"]
        for e in events
        if e["user"]["username"] == USER
        and e.get("objectRef", {}).get("resource") in {"tokenreviews", "subjectaccessreviews"}
    ]
    # Who the reader, the stranger and the unknown token are; what the reader and the stranger
    # may: once each, within the minute the answers are kept.
    assert sorted(reviews) == ["subjectaccessreviews"] * 2 + ["tokenreviews"] * 3, reviews
    assert (
        {
            ("authentication.k8s.io", "tokenreviews", "create"),
            (
                "authorization.k8s.io",
                "subjectaccessreviews",
                "create",
            ),
        }
        <= _used(events)
        <= _granted(installed.docs)
    )


@dataclass(frozen=True)
class Attempt:
    """One write beyond what the promise needs, tried with the manager's token."""

    what: str
    resource: kube.Resource
    namespace: str | None
    name: str
    #: The patch (or object), or a function of the stored object that makes it.
    body: Any
    patch_type: str = "merge"
    subresource: str | None = None


#: Sharding's employer label on pods (docs/scaling.md, "Pods selected by the API server").
EMPLOYER = wire.EMPLOYER_LABEL


def _attempts(victim_pod: str, victim_service: str, named_pod: str, bare_pod: str) -> list[Attempt]:
    """The writes the policy refuses; ``victim_pod``'s employer label is Shared by then,
    ``named_pod``'s names the Service ``victim_service``, ``bare_pod`` has none."""
    return [
        Attempt(
            "relabel a pod (pull it out of its Service)",
            kube.POD,
            APP,
            victim_pod,
            {"metadata": {"labels": {"app": "evil"}}},
        ),
        Attempt(
            "change a pod's image",
            kube.POD,
            APP,
            victim_pod,
            {"spec": {"containers": [{"name": "app", "image": "registry.evil/miner:1"}]}},
            patch_type="strategic",
        ),
        Attempt(
            "strip a foreign finalizer from a pod",
            kube.POD,
            APP,
            victim_pod,
            {"metadata": {"finalizers": None}},
        ),
        Attempt(
            "add an annotation of someone else to a pod",
            kube.POD,
            APP,
            victim_pod,
            {"metadata": {"annotations": {"example.com/owner": "evil"}}},
        ),
        Attempt(
            "set a pod's Ready condition",
            kube.POD,
            APP,
            victim_pod,
            {"status": {"conditions": [{"type": "Ready", "status": "False"}]}},
            patch_type="strategic",
            subresource="status",
        ),
        Attempt(
            "give a pod another IP",
            kube.POD,
            APP,
            victim_pod,
            {"status": {"podIPs": [{"ip": "10.9.0.1"}, {"ip": "fd00::66"}]}},
            subresource="status",
        ),
        Attempt(
            "rewrite a pod's observedGeneration",
            kube.POD,
            APP,
            victim_pod,
            {"status": {"observedGeneration": 7}},
            subresource="status",
        ),
        Attempt(
            "point a pod's claim at another ResourceClaim",
            kube.POD,
            APP,
            victim_pod,
            {"status": {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "stolen-gpu"}]}},
            subresource="status",
        ),
        Attempt(
            "report a pod's resize as infeasible",
            kube.POD,
            APP,
            victim_pod,
            {"status": {"resize": "Infeasible"}},
            subresource="status",
        ),
        Attempt(
            "change a pod's generateName",
            kube.POD,
            APP,
            victim_pod,
            {"metadata": {"generateName": "evil-"}},
        ),
        Attempt(
            "give another field manager's entry a field it never wrote",
            kube.POD,
            APP,
            victim_pod,
            lambda pod: {
                "metadata": {"managedFields": _claimed_for(pod, ARGO, {"f:spec": {"f:nodeName": {}}})}
            },
        ),
        Attempt(
            "drop every field manager's entry",
            kube.POD,
            APP,
            victim_pod,
            {"metadata": {"managedFields": [{}]}},
        ),
        Attempt(
            "put sharding's shard label on a pod",
            kube.POD,
            APP,
            victim_pod,
            {"metadata": {"labels": {wire.SHARD_LABEL_PREFIX + "ring": "shard-0"}}},
        ),
        Attempt(
            "remove sharding's employer label from a pod",
            kube.POD,
            APP,
            victim_pod,
            {"metadata": {"labels": {EMPLOYER: None}}},
        ),
        Attempt(
            "narrow a pod's employer label from Shared to a name",
            kube.POD,
            APP,
            victim_pod,
            {"metadata": {"labels": {EMPLOYER: victim_service}}},
        ),
        Attempt(
            "move a pod's employer label to another Service",
            kube.POD,
            APP,
            named_pod,
            {"metadata": {"labels": {EMPLOYER: "cart"}}},
        ),
        Attempt(
            "label a pod with an employer no Service can be named",
            kube.POD,
            APP,
            bare_pod,
            {"metadata": {"labels": {EMPLOYER: "Checkout.v2"}}},
        ),
        Attempt(
            "widen a pod's employer label through pods/status",
            kube.POD,
            APP,
            named_pod,
            {"metadata": {"labels": {EMPLOYER: wire.EMPLOYER_LABEL_SHARED}}},
            subresource="status",
        ),
        Attempt(
            "relabel a Service with anything but sharding's labels",
            kube.SERVICE,
            APP,
            victim_service,
            {"metadata": {"labels": {"tier": "evil"}}},
        ),
        Attempt(
            "rewrite a Service's selector",
            kube.SERVICE,
            APP,
            victim_service,
            {"spec": {"selector": {"app": "evil"}}},
        ),
        Attempt(
            "change a Service's SLB mode annotation",
            kube.SERVICE,
            APP,
            victim_service,
            {"metadata": {"annotations": {MODE_ANNOTATION: "manage"}}},
        ),
        Attempt(
            "rename the field manager that owns a Service's selector",
            kube.SERVICE,
            APP,
            victim_service,
            lambda service: {"metadata": {"managedFields": _renamed(service, HELM, "evil")}},
        ),
        Attempt(
            "loosen the webhook's failurePolicy",
            kube.MUTATING_WEBHOOK_CONFIGURATION,
            None,
            wire.MUTATING_WEBHOOK_CONFIGURATION,
            {"failurePolicy": "Ignore"},
            patch_type="replace-webhooks",
        ),
        Attempt(
            "write a Secret other than the webhook's certificate",
            kube.SECRET,
            RELEASE_NAMESPACE,
            "stolen",
            {"metadata": {"name": "stolen"}, "stringData": {"x": "y"}},
            patch_type="create",
        ),
        Attempt(
            "make its certificate Secret a ServiceAccount token",
            kube.SECRET,
            RELEASE_NAMESPACE,
            wire.WEBHOOK_CERT_SECRET,
            {
                "metadata": {
                    "name": wire.WEBHOOK_CERT_SECRET,
                    "annotations": {"kubernetes.io/service-account.name": MANAGER},
                },
                "type": "kubernetes.io/service-account-token",
            },
            patch_type="create",
        ),
    ]


#: Field managers other than the manager that write the victims of the denied-write test.
ARGO, HELM, KUBELET, CONTROLLER_MANAGER = "argocd-controller", "helm", "kubelet", "kube-controller-manager"


def _entries(obj: dict[str, Any]) -> list[dict[str, Any]]:
    return [dict(entry) for entry in obj["metadata"].get("managedFields") or []]


def _claimed_for(obj: dict[str, Any], manager: str, fields: dict[str, Any]) -> list[dict[str, Any]]:
    """``obj``'s managedFields with ``manager``'s entry owning ``fields`` too."""
    entries = _entries(obj)
    (entry,) = [e for e in entries if e["manager"] == manager]
    entry["fieldsV1"] = {**entry["fieldsV1"], **fields}
    return entries


def _renamed(obj: dict[str, Any], manager: str, new_name: str) -> list[dict[str, Any]]:
    """``obj``'s managedFields with ``manager``'s entries renamed ``new_name``."""
    return [{**e, "manager": new_name} if e["manager"] == manager else e for e in _entries(obj)]


def _write_as(client: KubeClient, manager: str, method: str, path: str, body: Any, content_type: str) -> Any:
    """A request under field manager ``manager`` (``?fieldManager=``), as that tool sends it: the
    kube client has no such option, the project's code never names itself another manager."""
    query = {"fieldManager": manager, **({"force": "true"} if "apply-patch" in content_type else {})}
    return client._send(method, path, query=query, body=body, content_type=content_type)


def _try(client: KubeClient, attempt: Attempt) -> str:
    """The API server's answer to ``attempt``: its message when refused, "allowed" otherwise."""
    body = attempt.body
    if callable(body):
        body = body(client.get(attempt.resource, attempt.namespace, attempt.name))
    try:
        if attempt.patch_type == "create":
            client.create(attempt.resource, attempt.namespace, body)
        elif attempt.patch_type == "replace-webhooks":
            config = client.get(attempt.resource, attempt.namespace, attempt.name)
            for hook in config["webhooks"]:
                hook.update(body)
            client.replace(attempt.resource, attempt.namespace, attempt.name, config)
        else:
            client.patch(
                attempt.resource,
                attempt.namespace,
                attempt.name,
                body,
                patch_type=attempt.patch_type,  # type: ignore[arg-type]
                subresource=attempt.subresource,
            )
    except ApiError as err:
        return err.message if err.status == 403 else f"not a 403: {err}"
    return "allowed"


#: The denied-write table of docs/security.md sits between these lines.
TABLE_BEGIN = "<!-- denied-writes: generated by tests/api/test_privilege.py -->"
TABLE_END = "<!-- end of denied-writes -->"


def _doc_section(begin: str, end: str) -> str:
    text = SECURITY_DOC.read_text()
    assert begin in text and end in text, f"docs/security.md lacks the lines {begin!r} ... {end!r}"
    return text[text.index(begin) + len(begin) : text.index(end)].strip()


def test_writes_beyond_the_promise_are_refused_by_the_policy(installed: Install) -> None:
    admin = installed.admin
    # The victims are written by the tools that write such objects (each its own field manager,
    # read by server-side apply and GitOps tools): the manager's allowed writes move only the
    # ownership of what they write, and no write may rewrite the ownership of the rest.
    victim_service = "checkout"
    json_type, apply_type = "application/json", "application/apply-patch+yaml"
    _write_as(
        admin,
        HELM,
        "POST",
        kube.SERVICE.path(APP),
        {
            "metadata": {"name": victim_service},
            "spec": {"selector": {"app": "checkout"}, "ports": [{"port": 80}]},
        },
        json_type,
    )
    victim_pod = "checkout-0"
    _write_as(
        admin,
        CONTROLLER_MANAGER,
        "POST",
        kube.POD.path(APP),
        {
            "metadata": {
                "name": victim_pod,
                "labels": {"app": "checkout"},
                "finalizers": ["example.com/keep"],
            },
            "spec": {
                "containers": [{"name": "app", "image": "registry.example/checkout:1"}],
                "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "gpu"}],
            },
        },
        json_type,
    )
    # A GitOps tool applies the available-conditions annotation (the manager takes it over) and
    # one of its own.
    _write_as(
        admin,
        ARGO,
        "PATCH",
        kube.POD.path(APP, victim_pod),
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": victim_pod,
                "annotations": {wire.AVAILABLE_CONDITIONS_ANNOTATION: "{}", "example.com/team": "shop"},
            },
        },
        apply_type,
    )
    _write_as(
        admin,
        KUBELET,
        "PATCH",
        kube.POD.path(APP, victim_pod, "status"),
        {
            "status": {
                "podIP": "10.9.0.1",
                "conditions": [{"type": "Ready", "status": "True"}],
                "resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "checkout-0-gpu"}],
            }
        },
        "application/strategic-merge-patch+json",
    )
    owners_before = {e["manager"] for e in _entries(admin.get(kube.POD, APP, victim_pod))}
    assert {ARGO, KUBELET, CONTROLLER_MANAGER} <= owners_before
    # Two more pods of the Service: one the webhook labelled for it, one with no employer label.
    named_pod, bare_pod = "checkout-1", "checkout-2"
    for name, labels in (
        (named_pod, {"app": "checkout", EMPLOYER: victim_service}),
        (bare_pod, {"app": "checkout"}),
    ):
        admin.create(
            kube.POD,
            APP,
            {
                "metadata": {"name": name, "labels": labels},
                "spec": {"containers": [{"name": "app", "image": "app:1"}]},
            },
        )
    manager = installed.as_manager()
    try:
        # What the promise needs is allowed on this very pod: its own finalizer, its annotation,
        # its readiness gate's condition (the policy is no blanket refusal).
        for allowed in (
            {"metadata": {"finalizers": ["example.com/keep", FLZ]}},
            {
                "metadata": {
                    "annotations": {wire.AVAILABLE_CONDITIONS_ANNOTATION: '{"Service/shop/web": "x"}'}
                }
            },
        ):
            manager.patch(kube.POD, APP, victim_pod, allowed)
        manager.patch(
            kube.POD,
            APP,
            victim_pod,
            {"status": {"conditions": [{"type": GATE, "status": "True"}]}},
            patch_type="strategic",
            subresource="status",
        )
        manager.patch(kube.POD, APP, victim_pod, {"metadata": {"finalizers": ["example.com/keep"]}})
        # Sharding's employer label on the pod, only widened, as a sharded manager writes it
        # (--pod-employer-label): added as its Service's name by a merge patch, then widened to
        # Shared by a strategic one, each with the resourceVersion it was read at as precondition.
        for name, patch_type in ((victim_service, "merge"), (wire.EMPLOYER_LABEL_SHARED, "strategic")):
            version = admin.get(kube.POD, APP, victim_pod)["metadata"]["resourceVersion"]
            manager.patch(
                kube.POD,
                APP,
                victim_pod,
                {"metadata": {"resourceVersion": version, "labels": {EMPLOYER: name}}},
                patch_type=patch_type,  # type: ignore[arg-type]
            )
        # Sharding's labels on the Service: the sharder assigns and drains, the shard lets go
        # (docs/scaling.md).
        shard, drain = wire.SHARD_LABEL_PREFIX + "ring", wire.DRAIN_LABEL_PREFIX + "ring"
        for labels in ({shard: "shard-0"}, {drain: "true"}, {shard: None, drain: None}):
            manager.patch(kube.SERVICE, APP, victim_service, {"metadata": {"labels": labels}})

        attempts = _attempts(victim_pod, victim_service, named_pod, bare_pod)
        rows = [(attempt.what, _try(manager, attempt)) for attempt in attempts]
    finally:
        manager.close()
    pod = admin.get(kube.POD, APP, victim_pod)
    assert pod["metadata"]["labels"] == {"app": "checkout", EMPLOYER: wire.EMPLOYER_LABEL_SHARED}
    assert finalizers(pod) == ["example.com/keep"]
    assert admin.get(kube.POD, APP, named_pod)["metadata"]["labels"][EMPLOYER] == victim_service
    assert EMPLOYER not in admin.get(kube.POD, APP, bare_pod)["metadata"]["labels"]
    assert pod["spec"]["containers"][0]["image"] == "registry.example/checkout:1"
    assert condition(pod, "Ready") == "True" and pod["status"]["podIPs"] == [{"ip": "10.9.0.1"}]
    assert pod["status"]["resourceClaimStatuses"] == [{"name": "gpu", "resourceClaimName": "checkout-0-gpu"}]
    assert "observedGeneration" not in pod["status"] and "resize" not in pod["status"]
    assert "generateName" not in pod["metadata"]
    # The ownership the manager's allowed writes moved: the annotation it wrote is its own now,
    # the kubelet's and the controller manager's entries are as they were.
    owners = {e["manager"]: e for e in _entries(pod)}
    assert owners_before <= set(owners), owners
    assert wire.AVAILABLE_CONDITIONS_ANNOTATION not in json.dumps(owners.get(ARGO, {}))
    secret = admin.get_or_none(kube.SECRET, RELEASE_NAMESPACE, wire.WEBHOOK_CERT_SECRET)
    assert secret is None or secret["type"] == "Opaque"
    service_now = admin.get(kube.SERVICE, APP, victim_service)
    assert service_now["spec"]["selector"] == {"app": "checkout"}
    assert not (service_now["metadata"].get("labels") or {}), "the Service kept a label"
    assert admin.get_or_none(kube.SECRET, RELEASE_NAMESPACE, "stolen") is None
    # Anyone else may still make the same change: the binding matches the manager's user only.
    admin.patch(kube.POD, APP, victim_pod, {"metadata": {"labels": {"app": "checkout", "tier": "web"}}})

    for what, answer in rows:
        assert answer != "allowed", f"{what}: allowed"
        assert "(docs/security.md)" in answer, f"{what}: refused by something else than the policy: {answer}"
    pod, status, service = f"pods {APP}/{victim_pod}", f"pods/status {APP}/{victim_pod}", f"services {APP}/"
    expected = {
        "relabel a pod (pull it out of its Service)": f"may not change label app of {pod}",
        "change a pod's image": f"may not change the spec of {pod}",
        "strip a foreign finalizer from a pod": f"may not add or remove finalizer example.com/keep of {pod}",
        "add an annotation of someone else to a pod": f"may not change annotation example.com/owner of {pod}",
        "set a pod's Ready condition": f"may not change condition Ready of {status}",
        "give a pod another IP": f"may change only its readiness gates in the status of {status}, not podIPs",
        "rewrite a pod's observedGeneration": f"in the status of {status}, not observedGeneration",
        "point a pod's claim at another ResourceClaim": (
            f"in the status of {status}, not resourceClaimStatuses"
        ),
        "report a pod's resize as infeasible": f"in the status of {status}, not resize",
        "change a pod's generateName": f"may not change metadata generateName of {pod}",
        "give another field manager's entry a field it never wrote": (
            f"may not change the managedFields of {pod}"
        ),
        "drop every field manager's entry": f"may not change the managedFields of {pod}",
        "rename the field manager that owns a Service's selector": (
            f"may not change the managedFields of {service}{victim_service}"
        ),
        "make its certificate Secret a ServiceAccount token": (
            f"may not write secrets {RELEASE_NAMESPACE}/{wire.WEBHOOK_CERT_SECRET} of type "
            "kubernetes.io/service-account-token"
        ),
        "put sharding's shard label on a pod": f"may not change label {wire.SHARD_LABEL_PREFIX}ring of {pod}",
        "remove sharding's employer label from a pod": (
            f"may not change label {EMPLOYER} of {pod} from Shared to (none): it may only add it"
        ),
        "narrow a pod's employer label from Shared to a name": (
            f"may not change label {EMPLOYER} of {pod} from Shared to {victim_service}: it may only add it"
        ),
        "move a pod's employer label to another Service": (
            f"may not change label {EMPLOYER} of pods {APP}/{named_pod} from {victim_service} to cart"
        ),
        "label a pod with an employer no Service can be named": (
            f"may not change label {EMPLOYER} of pods {APP}/{bare_pod} from (none) to Checkout.v2"
        ),
        "widen a pod's employer label through pods/status": (
            f"may not change label {EMPLOYER} of pods/status {APP}/{named_pod} (docs/security.md)"
        ),
        "relabel a Service with anything but sharding's labels": (
            f"may not change label tier of {service}{victim_service}"
        ),
        "rewrite a Service's selector": f"may not change the spec of {service}{victim_service}",
        "change a Service's SLB mode annotation": f"may not change annotation {MODE_ANNOTATION} of {service}",
        "loosen the webhook's failurePolicy": "may change only the caBundle of mutatingwebhookconfigurations "
        + wire.MUTATING_WEBHOOK_CONFIGURATION,
        "write a Secret other than the webhook's certificate": f"may not write secrets {RELEASE_NAMESPACE}/",
    }
    for what, answer in rows:
        assert expected[what] in answer, f"{what}: {answer}"
    table = "\n".join(
        ["| What the manager's token tried | The API server's answer (403) |", "| --- | --- |"]
        + [f"| {what} | {_policy_message(answer)} |" for what, answer in rows]
    )
    assert _doc_section(TABLE_BEGIN, TABLE_END) == table, f"docs/security.md's table is not:\n{table}"


def test_the_ownership_rule_lets_the_api_server_merge_old_entries(installed: Install) -> None:
    """Past 10 entries of Update operations the API server merges the oldest into one entry,
    ancient-changes, on the next write: the manager's own writes to a pod many tools have written
    must still pass (they were refused before the policy knew it), while an applier's entry still
    may not be dropped."""
    admin = installed.admin
    victim = "crowded-0"
    _write_as(
        admin,
        CONTROLLER_MANAGER,
        "POST",
        kube.POD.path(APP),
        {"metadata": {"name": victim}, "spec": {"containers": [{"name": "app", "image": "app:1"}]}},
        "application/json",
    )
    _write_as(
        admin,
        ARGO,
        "PATCH",
        kube.POD.path(APP, victim),
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": victim, "labels": {"team": "shop"}}},
        "application/apply-patch+yaml",
    )
    for tool in range(12):
        body = {"metadata": {"annotations": {f"tool-{tool}.example.com/seen": "yes"}}}
        _write_as(
            admin, f"tool-{tool}", "PATCH", kube.POD.path(APP, victim), body, "application/merge-patch+json"
        )
    entries = _entries(admin.get(kube.POD, APP, victim))
    assert "ancient-changes" in {e["manager"] for e in entries}
    # The API server merges the oldest entries by their time (whole seconds): the manager's write
    # must come in a later second than the tools', or its own new entry is the one merged.
    latest = max(datetime.fromisoformat(e["time"]).timestamp() for e in entries)
    wait_for(
        lambda: time.time() >= latest + 1.1, timeout=5, interval=0.05, message="a second after the tools"
    )
    manager = installed.as_manager()
    try:
        for step in range(3):
            manager.patch(kube.POD, APP, victim, {"metadata": {"finalizers": [f"{GUARD}-{step}"[:63]]}})
        manager.patch(
            kube.POD,
            APP,
            victim,
            {"status": {"conditions": [{"type": GATE, "status": "True"}]}},
            patch_type="strategic",
            subresource="status",
        )
        dropped = [e for e in _entries(admin.get(kube.POD, APP, victim)) if e["manager"] != ARGO]
        refused = _try(
            manager,
            Attempt(
                "drop the applier's entry", kube.POD, APP, victim, {"metadata": {"managedFields": dropped}}
            ),
        )
        manager.patch(kube.POD, APP, victim, {"metadata": {"finalizers": None}})
    finally:
        manager.close()
    assert "may not change the managedFields" in refused, refused
    assert ARGO in {e["manager"] for e in _entries(admin.get(kube.POD, APP, victim))}


#: A change of each field of a pod's status (PodStatus, as the API server serves it), for the test
#: below: its new value, or the whole status patch where the field is valid only beside another;
#: a field Kubernetes adds fails that test until it has a line here.
STATUS_CHANGES: dict[str, Any] = {
    "containerStatuses": [{"name": "app", "image": "evil", "imageID": "", "ready": True, "restartCount": 0}],
    "ephemeralContainerStatuses": [
        {"name": "debug", "image": "evil", "imageID": "", "ready": False, "restartCount": 0}
    ],
    "extendedResourceClaimStatus": {
        "resourceClaimName": "evil",
        "requestMappings": [{"containerName": "app", "resourceName": "example.com/gpu", "requestName": "r"}],
    },
    "hostIP": "192.0.2.7",
    # Valid only beside the hostIP it starts with.
    "hostIPs": {"hostIP": "192.0.2.7", "hostIPs": [{"ip": "192.0.2.7"}]},
    "initContainerStatuses": [
        {"name": "init", "image": "evil", "imageID": "", "ready": False, "restartCount": 0}
    ],
    "message": "evil",
    "nominatedNodeName": "node-evil",
    "observedGeneration": 7,
    "phase": "Failed",
    "podIP": "192.0.2.8",
    "podIPs": [{"ip": "192.0.2.8"}],
    "qosClass": "Guaranteed",
    "reason": "Evicted",
    "resize": "Infeasible",
    "resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "stolen-gpu"}],
    "startTime": "2020-01-01T00:00:00Z",
}
#: Fields the API server itself refuses to change (422), whoever writes.
IMMUTABLE_STATUS = {"qosClass"}


def test_no_pod_status_field_but_its_readiness_gates_is_writable(installed: Install) -> None:
    """The policy compares a pod's status whole but for the conditions (its own readiness gates'
    only): every field of PodStatus that the API server serves (its OpenAPI, not a list here) is
    tried with the manager's token and refused, the stored pod unchanged."""
    served = json.loads(installed.cp.raw_get("/openapi/v3/api/v1"))
    fields = set(served["components"]["schemas"]["io.k8s.api.core.v1.PodStatus"]["properties"]) - {
        "conditions"
    }
    assert fields - set(STATUS_CHANGES) == set(), "PodStatus has fields this test does not try: add them"
    victim = "status-victim"
    installed.admin.create(
        kube.POD,
        APP,
        {
            "metadata": {"name": victim},
            "spec": {
                "containers": [{"name": "app", "image": "registry.example/app:1"}],
                "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "gpu"}],
            },
        },
    )
    manager = installed.as_manager()
    answers: dict[str, str] = {}
    try:
        for field in sorted(fields):
            before = installed.admin.get(kube.POD, APP, victim)["status"]
            try:
                change = STATUS_CHANGES[field]
                patch = change if isinstance(change, dict) and field in change else {field: change}
                manager.patch(kube.POD, APP, victim, {"status": patch}, subresource="status")
            except ApiError as err:
                answers[field] = f"{err.status} {err.message}"
            else:
                answers[field] = "allowed"
            assert installed.admin.get(kube.POD, APP, victim)["status"] == before, f"{field} was changed"
    finally:
        manager.close()
    for field, answer in answers.items():
        if field in IMMUTABLE_STATUS:
            assert answer.startswith("422") and "field is immutable" in answer, f"{field}: {answer}"
            continue
        assert answer.startswith("403") and "(docs/security.md)" in answer, f"{field}: {answer}"
        # Refused by the status rule, naming the field; or, for a field the API server drops (a
        # feature gate off), by the ownership rule: the field's ownership would still have moved.
        named = re.search(r", not (.*) \(docs/security.md\)", answer)
        refused = (named is not None and field in named.group(1).split(", ")) or "the managedFields" in answer
        assert refused, f"{field}: {answer}"


def _policy_message(answer: str) -> str:
    """The policy's own words in the API server's message (which names the policy first)."""
    found = re.search(r"resourceconsist-manager may .*", answer)
    assert found, answer
    return found.group(0).replace("|", "\\|")


#: The grants table of docs/security.md sits between these lines.
GRANTS_BEGIN = "<!-- grants: checked by tests/api/test_privilege.py -->"
GRANTS_END = "<!-- end of grants -->"


#: The grants a sharded install adds (docs/security.md, "Sharding's grants").
SHARDING_GRANTS_BEGIN = "<!-- sharding grants: checked by tests/api/test_privilege.py -->"
SHARDING_GRANTS_END = "<!-- end of sharding grants -->"


def _doc_grants(begin: str = GRANTS_BEGIN, end: str = GRANTS_END) -> dict[Grant, bool]:
    """A grants table of docs/security.md: each (group, resource, verb) and whether it says every
    scenario run uses it ("yes") or it is kept for a path a run need not reach ("not always")."""
    rows: dict[Grant, bool] = {}
    for line in _doc_section(begin, end).splitlines()[2:]:
        cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        group, resource, verbs, used = cells[0], cells[1], cells[2], cells[3]
        assert used in {"yes", "not always"}, line
        for verb in verbs.split(", "):
            rows[("" if group == "core" else group, resource, verb)] = used == "yes"
    return rows


def _every_grant_is_used_or_explained(
    events: list[dict[str, Any]], docs: list[dict[str, Any]], *, sharded: bool = False
) -> None:
    """What the manager used, read from the audit log of a scenario run as the ServiceAccount,
    against what the chart grants it and what docs/security.md says (``sharded``: its table of
    sharding's grants too; where both tables name a grant, sharding's says whether it is used)."""
    used = _used(events)
    granted = _granted(docs)
    assert used <= granted  # anything else would have been a 403
    documented = _doc_grants()
    if sharded:
        documented |= _doc_grants(SHARDING_GRANTS_BEGIN, SHARDING_GRANTS_END)
    unused = sorted(granted - used)
    assert set(documented) == granted, (
        f"docs/security.md's grants differ from the chart's: missing {sorted(granted - set(documented))}, "
        f"extra {sorted(set(documented) - granted)}"
    )
    # A grant the run did not use must be one the page explains; one it says is always used must be.
    unexplained = [grant for grant in unused if documented[grant]]
    assert not unexplained, f"granted, documented as used, but not in the audit log: {unexplained}"


@pytest.fixture
def installed_namespaced(tmp_path: Path) -> Iterator[Install]:
    """The chart with `watchNamespaces` (a Role and RoleBinding in each) on a control plane of
    its own."""
    yield from _install({"watchNamespaces": [APP, SECOND]}, tmp_path)


async def test_a_namespaced_install_serves_its_namespaces_and_cannot_read_the_others(
    installed_namespaced: Install, emulator: tuple[dict[str, str], EmulatorAdmin], tmp_path: Path
) -> None:
    install = installed_namespaced
    manager_roles = {
        (d["kind"], d["metadata"].get("namespace")) for d in install.docs if d["metadata"]["name"] == MANAGER
    }
    assert {("Role", APP), ("Role", SECOND), ("RoleBinding", APP), ("RoleBinding", SECOND)} <= manager_roles
    assert not {kind for kind, _ in manager_roles} & {"ClusterRole", "ClusterRoleBinding"}
    assert f"--namespace={','.join(sorted((APP, SECOND)))}" in _manager_args(install.docs)
    info, slb = emulator
    cluster, second = Cluster(install.admin, APP), Cluster(install.admin, SECOND)
    elsewhere = Cluster(install.admin, ELSEWHERE)
    before = len(install.cp.audit_events())
    for where in (cluster, second, elsewhere):
        await where.service(
            "web",
            labels={LOAD_BALANCER_ID_LABEL: LOAD_BALANCER},
            annotations={
                MODE_ANNOTATION: "manage",
                wire.READINESS_GATE_ANNOTATION: "true",
                # The drain of a leaving backend (weight 0 first) and the webhook's preStop sleep.
                DRAIN_ANNOTATION: "3",
                wire.DRAIN_SECONDS_ANNOTATION: "5",
            },
        )
    for where in (cluster, second):
        await where.service(
            "gone",
            labels={LOAD_BALANCER_ID_LABEL: LOAD_BALANCER},
            annotations={MODE_ANNOTATION: "manage", wire.READINESS_GATE_ANNOTATION: "true"},
        )
    async with _manager(install, info, tmp_path / "certs") as manager:
        # A pod of the unwatched namespace, which its Service selects: it is not sent to the
        # webhook (the chart's namespaceSelector of a namespaced install), the controller never
        # sees it while it serves the other two.
        stray = await elsewhere.pod(
            "web-0", {"app": "web", wire.CONTROL_LABEL: wire.CONTROL_LABEL_VALUE}, readiness_gate=True
        )
        assert GATE not in [g["conditionType"] for g in stray["spec"].get("readinessGates", [])]
        assert "lifecycle" not in stray["spec"]["containers"][0]
        await elsewhere.set_status("web-0", ready=True, service_ready=True)
        await _serve_and_release(cluster, slb, ["web-0", "web-1"], drained=True)
        await _serve_and_release(second, slb, ["web-0", "web-1"], first_eni=30, drained=True)
        for index, where in enumerate((cluster, second)):
            await _serve(where, slb, "gone", ["gone-0"], first_eni=50 + index)
    # The garbage pass of each watched namespace, as the ServiceAccount of Roles only.
    restarted = await _collected_after_restart(
        install, info, [cluster, second], slb, tmp_path / "certs-again"
    )
    assert finalizers(await elsewhere.get(kube.SERVICE, "web")) == []
    assert finalizers(await elsewhere.get(kube.POD, "web-0")) == []
    assert not [g for g in slb.state()["groups"] if g["name"] == f"resourceconsist/{ELSEWHERE}/web"]
    events = install.cp.audit_events()[before:]
    assert not _manager_forbidden(events), manager.output + restarted.output
    # Nothing of another namespace was asked for (not even tried: no 403 above), nor anything
    # namespaced across all namespaces; only the cluster-scoped reads the page lists.
    outside = {
        (e["verb"], e["objectRef"]["resource"], e["objectRef"].get("namespace"))
        for e in events
        if e["user"]["username"] == USER
        and "objectRef" in e
        and e["objectRef"].get("namespace") not in {APP, SECOND, RELEASE_NAMESPACE}
    }
    assert {resource for _, resource, _ in outside} <= {
        "namespaces",
        "mutatingwebhookconfigurations",
        "validatingwebhookconfigurations",
        # The reviews of secure metrics: cluster-scoped, created, never read.
        "tokenreviews",
        "subjectaccessreviews",
    }, outside
    _every_grant_is_used_or_explained(events, install.docs)

    # What the install may not read is a 403, which the garbage pass takes for "unknown", never
    # for "gone" (a 404 would be): the employer's live lookup fails instead of answering None.
    manager_client = install.as_manager()
    try:
        with pytest.raises(ApiError) as refused:
            manager_client.get_or_none(kube.SERVICE, ELSEWHERE, "web")
    finally:
        manager_client.close()
    assert refused.value.status == 403
    assert not isinstance(refused.value, kube.NotFound)


def test_the_policy_names_the_wire_contracts_keys(tmp_path: Path) -> None:
    """The policy's CEL spells the project's finalizers, annotations and condition domain out;
    they are the wire contract's (resourceconsist/wire.py), byte for byte."""
    (policy,) = [d for d in _render({}, tmp_path) if d["kind"] == "ValidatingAdmissionPolicy"]
    text = json.dumps(policy["spec"])
    for key in (
        wire.AVAILABLE_CONDITIONS_ANNOTATION,
        wire.EXPECTED_FINALIZER_ADDED_ANNOTATION,
        wire.LIFECYCLE_FINALIZER_RECORDED_ANNOTATION,
        wire.OLD_CLEAN_FINALIZER_PREFIX,  # the clean finalizer is one of these
        wire.LIFECYCLE_FINALIZER_PREFIX + "/",
        wire.GUARD_FINALIZER_PREFIX + "/",
        wire.READINESS_GATE_DOMAIN + "/",
        wire.WEBHOOK_CERT_SECRET,
        wire.SHARD_LABEL_PREFIX,
        wire.DRAIN_LABEL_PREFIX,
        wire.EMPLOYER_LABEL,
        USER,
    ):
        assert f"'{key}" in text, key
    assert f"== '{wire.EMPLOYER_LABEL_SHARED}'" in text
    assert wire.CLEAN_FINALIZER.startswith(wire.OLD_CLEAN_FINALIZER_PREFIX)


async def test_a_refused_lookup_of_a_gone_employer_is_unknown_never_gone(
    installed: Install, emulator: tuple[dict[str, str], EmulatorAdmin], tmp_path: Path
) -> None:
    """When the install may not make the garbage pass's live lookup (403), the employer is
    unknown: its pod keeps its marks and its group stays, until the lookup answers (404)."""
    info, slb = emulator
    admin, cluster = installed.admin, Cluster(installed.admin, APP)
    held = (lifecycle.lifecycle_finalizer("hidden"), lifecycle.guard_finalizer("hidden"))
    group_name = f"resourceconsist/{APP}/hidden"
    await cluster.service(
        "hidden",
        labels={LOAD_BALANCER_ID_LABEL: LOAD_BALANCER},
        annotations={MODE_ANNOTATION: "manage", wire.READINESS_GATE_ANNOTATION: "true"},
    )
    async with _manager(installed, info, tmp_path / "certs"):
        await _serve(cluster, slb, "hidden", ["hidden-0"], first_eni=20)
    await cluster.patch(kube.SERVICE, "hidden", {"metadata": {"finalizers": None}})
    await cluster.delete(kube.SERVICE, "hidden")

    # The manager's ClusterRoles without `get` on Services: its live lookup is refused.
    roles = {name: admin.get(CLUSTER_ROLE, None, name) for name in (MANAGER, "resourceconsist-webhook")}
    for name, role in roles.items():
        narrowed = [
            {**rule, "verbs": [v for v in rule["verbs"] if v != "get"]}
            if "services" in rule["resources"]
            else rule
            for rule in role["rules"]
        ]
        admin.patch(CLUSTER_ROLE, None, name, {"rules": narrowed})
    try:
        before = len(installed.cp.audit_events())

        def refused_lookups() -> int:
            return sum(
                1
                for e in installed.cp.audit_events()[before:]
                if e["user"]["username"] == USER
                and e["verb"] == "get"
                and e.get("objectRef", {}).get("name") == "hidden"
                and e.get("responseStatus", {}).get("code") == 403
            )

        async with _manager(installed, info, tmp_path / "certs-narrowed") as narrowed:
            await async_wait_for(
                lambda: refused_lookups() >= 3, timeout=60, message="three garbage passes refused the lookup"
            )
            # The pod keeps its lifecycle finalizer (it may not leave) and the group still routes.
            assert held[0] in finalizers(await cluster.get(kube.POD, "hidden-0"))
            assert [g for g in slb.state()["groups"] if g["name"] == group_name]
            # That employer is unknown, the pass itself did not fail; the operator is told once
            # what permission is missing.
            assert "garbage pass failed" not in narrowed.output
            told_in_log = f"Service {APP}/hidden looks gone but looking it up was refused"
            assert narrowed.output.count(told_in_log) == 1
            told = [m for _, r, m in await cluster.events(APP) if r == LOOKUP_REFUSED_REASON]
            assert len(told) == 1 and 'cannot get resource "services"' in told[0], told
    finally:
        for name, role in roles.items():
            admin.patch(CLUSTER_ROLE, None, name, {"rules": role["rules"]})

    async with _manager(installed, info, tmp_path / "certs-restored"):

        async def released() -> bool:
            if [g for g in slb.state()["groups"] if g["name"] == group_name]:
                return False
            return not set(held) & set(finalizers(await cluster.get(kube.POD, "hidden-0")))

        await async_wait_for(released, timeout=90, message="the lookup answered 404: collected and released")


async def test_a_gone_employer_named_only_by_its_events_is_collected_as_the_service_account(
    installed: Install, emulator: tuple[dict[str, str], EmulatorAdmin], tmp_path: Path
) -> None:
    """A pod whose only mark of its gone Service is the lifecycle finalizer (its entry erased, no
    readiness gate names the Service): the garbage pass asks the namespace's Events about it
    (docs/lifecycle-hooks.md, "Gone employers"), which the chart's grants let it list, and the
    group is collected and the pod released, as the ServiceAccount, nothing refused. (The SLB
    adapter's listing names the group too; where no listing does, the Events are all that name
    the Service: the demo's test below.)"""
    info, slb = emulator
    cluster = Cluster(installed.admin, APP)
    name, pod = "evented", "evented-0"
    held = (lifecycle.lifecycle_finalizer(name), lifecycle.guard_finalizer(name))
    group_name = f"resourceconsist/{APP}/{name}"
    before = len(installed.cp.audit_events())
    await cluster.service(
        name, labels={LOAD_BALANCER_ID_LABEL: LOAD_BALANCER}, annotations={MODE_ANNOTATION: "manage"}
    )
    async with _manager(installed, info, tmp_path / "certs") as first:
        await cluster.pod(
            pod,
            {"app": name, wire.CONTROL_LABEL: wire.CONTROL_LABEL_VALUE},
            readiness_gate=True,
            annotations={SERVER_ID_ANNOTATION: "eni-40"},
        )
        await cluster.set_status(pod, ready=True, service_ready=True)

        async def served() -> bool:
            groups = [g for g in slb.state()["groups"] if g["name"] == group_name]
            marked = await cluster.get(kube.POD, pod)
            return bool(groups and groups[0]["backends"]) and held[0] in finalizers(marked)

        await async_wait_for(served, timeout=90, message=f"{pod} served and marked")
    assert await cluster.events(name), "the Service has Events that name it"
    # While the manager is down: the Service is force-deleted and the pod's entry erased; its
    # finalizer's hash is all that names the Service on the pod.
    await cluster.patch(kube.SERVICE, name, {"metadata": {"finalizers": None}})
    await cluster.delete(kube.SERVICE, name)
    await cluster.patch(
        kube.POD, pod, {"metadata": {"annotations": {wire.AVAILABLE_CONDITIONS_ANNOTATION: None}}}
    )
    async with _manager(installed, info, tmp_path / "certs-again") as restarted:

        async def collected_and_released() -> bool:
            if [g for g in slb.state()["groups"] if g["name"] == group_name]:
                return False
            return not set(held) & set(finalizers(await cluster.get(kube.POD, pod)))

        await async_wait_for(
            collected_and_released, timeout=90, message="the group collected, the pod released, by its Events"
        )
    events = installed.cp.audit_events()[before:]
    assert not _manager_forbidden(events), first.output + restarted.output
    listed = [
        e
        for e in events
        if e["user"]["username"] == USER
        and e["verb"] == "list"
        and e.get("objectRef", {}).get("resource") == "events"
        and e.get("objectRef", {}).get("namespace") == APP
    ]
    assert listed and all(e["responseStatus"]["code"] == 200 for e in listed), listed
    assert "listing Events of" not in restarted.output
    await cluster.delete(kube.POD, pod)


#: The chart running the demo adapter (its webhook and controller), as the ServiceAccount.
DEMO_VALUES = {"adapters": ["demo"]}


@pytest.fixture
def installed_demo(tmp_path: Path) -> Iterator[Install]:
    """The chart with `adapters: [demo]` on a control plane of its own."""
    yield from _install(DEMO_VALUES, tmp_path)


async def test_the_demo_adapter_runs_as_the_service_account(installed_demo: Install, tmp_path: Path) -> None:
    """`adapters: [demo]`, run as the ServiceAccount with the chart's arguments. The demo records
    its last error on its Service (`demo-condition`) and erases it after a clean pass: the chart's
    policy lets it (the chart adds the annotations of the adapters it runs, and only those: the
    default install refuses the same write). And its garbage pass releases a pod held by a
    Service force-deleted while the manager was down, of which only the finalizer's hash is left
    on the pod: the Service is named by the namespace's Events about it, which the chart lets the
    manager list (docs/lifecycle-hooks.md, "Gone employers"); the demo's listing is complete, so
    a bare stand-in pass confirms the provider holds nothing and the pod goes. Nothing is refused."""
    install = installed_demo
    (policy,) = [d for d in install.docs if d["kind"] == "ValidatingAdmissionPolicy"]
    assert DEMO_CONDITION_ANNOTATION in json.dumps(policy["spec"])
    (default_policy,) = [d for d in _render({}, tmp_path) if d["kind"] == "ValidatingAdmissionPolicy"]
    assert DEMO_CONDITION_ANNOTATION not in json.dumps(default_policy["spec"])
    args = [*_manager_args(install.docs), "--garbage-interval=1"]
    assert "--adapter=demo" in args
    cluster = Cluster(install.admin, APP)
    before = len(install.cp.audit_events())
    # The condition a failed pass of an earlier run left (the demo's provider is in memory: a
    # new process's first pass is clean, and erases it).
    stale = {DEMO_CONDITION_ANNOTATION: "create_rs: injected failure", wire.READINESS_GATE_ANNOTATION: "true"}
    await cluster.service("web", annotations=stale)
    # No readiness gate names this one on its pod.
    await cluster.service("evented")
    held = (lifecycle.lifecycle_finalizer("evented"), lifecycle.guard_finalizer("evented"))
    outputs: list[str] = []

    @asynccontextmanager
    async def demo_manager(cert_dir: Path) -> AsyncIterator[None]:
        manager = _chart_process(install, {}, [*args, *_webhook_args(install, cert_dir)])
        try:
            await async_wait_for(manager.ready, timeout=90, message="the demo manager ready")
            await _ca_bundle_filled(install)
            yield
        except BaseException:
            print(manager.output[-20000:])
            raise
        finally:
            manager.stop()
            outputs.append(manager.output)

    async with demo_manager(tmp_path / "certs"):
        created = await cluster.pod("web-0", {"app": "web", wire.CONTROL_LABEL: wire.CONTROL_LABEL_VALUE})
        assert GATE in [g["conditionType"] for g in created["spec"].get("readinessGates", [])]
        await cluster.set_status("web-0", ready=False)
        await cluster.set_condition("web-0", "ContainersReady", True)
        await cluster.pod(
            "evented-0", {"app": "evented", wire.CONTROL_LABEL: wire.CONTROL_LABEL_VALUE}, readiness_gate=True
        )
        await cluster.set_status("evented-0", ready=True, service_ready=True)

        async def served_and_erased() -> bool:
            service = await cluster.get(kube.SERVICE, "web")
            annotations = (service or {}).get("metadata", {}).get("annotations") or {}
            gate_true = condition(await cluster.get(kube.POD, "web-0"), GATE) == "True"
            marked = held[0] in finalizers(await cluster.get(kube.POD, "evented-0"))
            return DEMO_CONDITION_ANNOTATION not in annotations and gate_true and marked

        await async_wait_for(served_and_erased, timeout=90, message="pods served, the stale condition erased")
        # Setting it is the same grant: the manager's token may record an error too.
        as_manager = install.as_manager()
        try:
            body = {"metadata": {"annotations": {DEMO_CONDITION_ANNOTATION: "x"}}}
            as_manager.patch(kube.SERVICE, APP, "web", body)
        finally:
            as_manager.close()
    assert await cluster.events("evented"), "the Service has Events that name it"
    # While the manager is down: the Service is force-deleted and the pod's entry erased; its
    # finalizer's hash is all that names the Service on the pod.
    await cluster.patch(kube.SERVICE, "evented", {"metadata": {"finalizers": None}})
    await cluster.delete(kube.SERVICE, "evented")
    erase = {"metadata": {"annotations": {wire.AVAILABLE_CONDITIONS_ANNOTATION: None}}}
    await cluster.patch(kube.POD, "evented-0", erase)
    async with demo_manager(tmp_path / "certs-again"):

        async def released() -> bool:
            return not set(held) & set(finalizers(await cluster.get(kube.POD, "evented-0")))

        await async_wait_for(
            released, timeout=60, message="evented-0 released, its Service named by its Events"
        )
    events = install.cp.audit_events()[before:]
    assert not _manager_forbidden(events), "\n".join(outputs)
    assert _used(events) <= _granted(install.docs)
    assert ("", "events", "list") in _used(events)
    await cluster.delete(kube.POD, "evented-0")


PDB = kube.Resource("policy", "v1", "PodDisruptionBudget", "poddisruptionbudgets")
#: A third-party adapter with a sub-resource (docs/lifecycle-hooks.md, "Sub-resources"): the demo
#: adapter, with a PodDisruptionBudget per Service; registered by entry point, as theirs would be.
GUARDED_ADAPTER = """
from resourceconsist.experimental.demo import DemoAdapter


class Guarded(DemoAdapter):
    def sub_resources(self, ctx, employer):
        meta = employer["metadata"]
        return [
            {
                "apiVersion": "policy/v1",
                "kind": "PodDisruptionBudget",
                "metadata": {"name": meta["name"] + "-drain"},
                "spec": {"maxUnavailable": 1, "selector": {"matchLabels": employer["spec"]["selector"]}},
            }
        ]

    def sub_resource_kinds(self):
        return []


def register(registry):
    registry.register("guarded", controller=lambda env: Guarded(name="guarded"))
"""
#: What an adapter with a namespaced sub-resource adds to the chart's grants, in each namespace
#: it serves (docs/security.md, "Sub-resources"): the chart grants no sub-resource kind.
SUB_RESOURCE_RULES = [
    {"apiGroups": ["policy"], "resources": ["poddisruptionbudgets"], "verbs": ["get", "create", "patch"]}
]


async def test_an_adapter_s_sub_resource_is_kept_as_the_service_account(
    installed: Install, tmp_path: Path
) -> None:
    """`resourceconsist run` with a third-party adapter that owns a PodDisruptionBudget per
    Service, as the manager's ServiceAccount with the chart's grants and one Role for the
    sub-resource's kind: the PDB is made with its owner reference and put back after an edit,
    nothing is refused, and the audit log shows the grants it used on PDBs are the Role's."""
    admin, cluster = installed.admin, Cluster(installed.admin, APP)
    (tmp_path / "guarded_adapter.py").write_text(GUARDED_ADAPTER)
    dist = tmp_path / "guarded_adapter-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: guarded-adapter\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[resourceconsist.adapters]\nguarded = guarded_adapter:register\n")
    role = admin.resource("rbac.authorization.k8s.io/v1", "Role")
    binding = admin.resource("rbac.authorization.k8s.io/v1", "RoleBinding")
    admin.create(role, APP, {"metadata": {"name": "guarded-sub-resources"}, "rules": SUB_RESOURCE_RULES})
    admin.create(
        binding,
        APP,
        {
            "metadata": {"name": "guarded-sub-resources"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "guarded-sub-resources",
            },
            "subjects": [{"kind": "ServiceAccount", "name": MANAGER, "namespace": RELEASE_NAMESPACE}],
        },
    )
    service = await cluster.service("guarded")
    before = len(installed.cp.audit_events())
    health_port = free_port()
    args = [
        *("run", "--adapter=guarded", f"--namespace={APP}", f"--kubeconfig={installed.kubeconfig}"),
        *("--metrics-bind-address=0", f"--health-probe-bind-address=127.0.0.1:{health_port}"),
        "--log-format=text",
    ]
    env = {
        **{k: v for k, v in os.environ.items() if k != "KUBECONFIG"},
        "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
        wire.POD_NAMESPACE_ENV: RELEASE_NAMESPACE,
    }
    manager = CommandProcess(args, env, health_port)
    try:
        await async_wait_for(manager.ready, timeout=90, message="the manager ready")

        async def pdb() -> dict[str, Any] | None:
            return await cluster.get(PDB, "guarded-drain")

        made = await async_wait_for(pdb, timeout=60, message="the PDB made for Service guarded")
        (owner,) = made["metadata"]["ownerReferences"]
        owned_by = ("Service", "guarded", service["metadata"]["uid"])
        assert (owner["kind"], owner["name"], owner["uid"]) == owned_by
        # Someone edits the PDB; the Service's next pass puts it back, as the ServiceAccount.
        await cluster.patch(PDB, "guarded-drain", {"spec": {"maxUnavailable": 3}})
        await cluster.patch(kube.SERVICE, "guarded", {"metadata": {"annotations": {"touch": "1"}}})

        async def restored() -> bool:
            found = await pdb()
            return found is not None and found["spec"]["maxUnavailable"] == 1

        await async_wait_for(restored, timeout=60, message="the PDB put back")
    except BaseException:
        print(manager.output[-20000:])
        raise
    finally:
        manager.stop()
    events = installed.cp.audit_events()[before:]
    assert not _manager_forbidden(events), manager.output
    on_pdbs = {grant for grant in _used(events) if grant[1] == "poddisruptionbudgets"}
    assert on_pdbs == {("policy", "poddisruptionbudgets", verb) for verb in SUB_RESOURCE_RULES[0]["verbs"]}
    # Everything else it used is the chart's.
    assert _used(events) - on_pdbs <= _granted(installed.docs)


#: The chart with sharding on, its Lease timings short so that a killed shard's Services move
#: within the test (docs/scaling.md, "The chart").
SHARDED_VALUES = {
    # The pods selected by the API server (docs/scaling.md): the shards write the label as the
    # ServiceAccount, under the policy, where the webhook did not stamp it.
    "sharding": {"enabled": True, "controllerRing": "slb", "podEmployerLabel": True},
    "leaderElection": {"leaseDuration": 6, "renewDeadline": 4, "retryPeriod": 1},
}
SHARDS = ("shard-a", "shard-b", "shard-c")
SHARD_KEY = wire.SHARD_LABEL_PREFIX + "slb"


@pytest.fixture
def installed_sharded(tmp_path: Path) -> Iterator[Install]:
    """The chart with sharding on (the shards' and the webhook's Deployments, the sharding Role)
    on a control plane of its own."""
    yield from _install(SHARDED_VALUES, tmp_path)


def _shard_process(install: Install, info: dict[str, str], shard: str) -> CommandProcess:
    """One replica of the shards' Deployment, its pod named ``shard`` (the downward API's
    POD_NAME, which the chart's `--shard-name=$(POD_NAME)` names; the kubelet expands it)."""
    args = [a.replace("$(POD_NAME)", shard) for a in _manager_args(install.docs)]
    return _chart_process(install, info, [*args, *_controller_args()], {"POD_NAME": shard})


async def test_sharded_replicas_share_and_serve_the_services_as_the_service_account(
    installed_sharded: Install, emulator: tuple[dict[str, str], EmulatorAdmin], tmp_path: Path
) -> None:
    """The chart with sharding on, run as its two Deployments would run (the webhook with
    `resourceconsist webhook`, three shards with `resourceconsist run --sharding`), as the
    ServiceAccount under the policy: the Services are shared among the shards and served; a
    shard SIGKILLed loses its Services to the others, whose guard releases their pods; and the
    audit log shows only the grants of docs/security.md used, sharding's among them."""
    install = installed_sharded
    assert "--sharding" in _manager_args(install.docs)
    info, slb = emulator
    cluster = Cluster(install.admin, APP)
    before = len(install.cp.audit_events())
    services = [f"shop-{i}" for i in range(6)]
    for name in services:
        await cluster.service(
            name,
            labels={LOAD_BALANCER_ID_LABEL: LOAD_BALANCER},
            annotations={MODE_ANNOTATION: "manage", wire.READINESS_GATE_ANNOTATION: "true"},
        )
    webhook_args = _manager_args(install.docs, "resourceconsist-webhook")
    assert webhook_args[0] == "webhook"
    processes = {"webhook": _chart_process(install, info, [*webhook_args, *_webhook_args(install, tmp_path)])}
    try:
        await async_wait_for(processes["webhook"].ready, timeout=90, message="the webhook ready")
        await _ca_bundle_filled(install)
        for shard in SHARDS:
            processes[shard] = _shard_process(install, info, shard)
        for shard in SHARDS:
            await async_wait_for(processes[shard].ready, timeout=90, message=f"{shard} ready")
        # Both Deployments serve secure metrics, reviewed with the chart's grants.
        await _scraped(install, processes["webhook"])
        await _scraped(install, processes[SHARDS[0]])

        async def owners() -> dict[str, str]:
            found = {}
            for name in services:
                service = await cluster.get(kube.SERVICE, name)
                assert service is not None
                found[name] = (service["metadata"].get("labels") or {}).get(SHARD_KEY, "")
            return found

        async def assigned_among(shards: set[str]) -> bool:
            return set((await owners()).values()) <= shards

        await async_wait_for(
            lambda: assigned_among(set(SHARDS)), timeout=60, message="every Service assigned"
        )
        for index, name in enumerate(services):
            await _serve(cluster, slb, name, [f"{name}-0"], first_eni=10 * index)
        first = await owners()
        assert len(set(first.values())) >= 2, f"the Services are shared among the shards: {first}"
        # The webhook stamped each pod's employer label; one taken off by a person is written
        # again by its shard, as the ServiceAccount, and the pod stays served meanwhile.
        for name in services:
            pod = await cluster.get(kube.POD, f"{name}-0")
            assert pod is not None and marks.employer_label(pod) == name
        await cluster.patch(
            kube.POD, f"{services[0]}-0", {"metadata": {"labels": {wire.EMPLOYER_LABEL: None}}}
        )

        async def labelled_again() -> bool:
            pod = await cluster.get(kube.POD, f"{services[0]}-0")
            return pod is not None and marks.employer_label(pod) == services[0]

        await async_wait_for(labelled_again, timeout=60, message="the label written again by its shard")
        group = f"resourceconsist/{APP}/{services[0]}"
        assert any(g["name"] == group and g["backends"] for g in slb.state()["groups"]), "still served"

        # The shard holding the most Services is killed: no release, its Lease goes silent, and
        # the sharder (another replica, as the ServiceAccount) takes it over and moves them.
        killed = max(SHARDS, key=lambda s: sum(1 for o in first.values() if o == s))
        processes[killed].process.kill()
        moved = [name for name, owner in first.items() if owner == killed]
        survivors = set(SHARDS) - {killed}
        await async_wait_for(
            lambda: assigned_among(survivors), timeout=90, message=f"{killed}'s Services moved to the others"
        )
        # The new owners serve them: a pod's deletion is released after its backend is gone.
        for name in moved:
            await cluster.delete(kube.POD, f"{name}-0")

            async def released(name: str = name) -> bool:
                groups = [g for g in slb.state()["groups"] if g["name"] == f"resourceconsist/{APP}/{name}"]
                return await cluster.get(kube.POD, f"{name}-0") is None and all(
                    not g["backends"] for g in groups
                )

            await async_wait_for(
                released, timeout=90, message=f"{name}-0's deletion released by its new shard"
            )
    except BaseException:
        for label, process in processes.items():
            print(f"--- {label}\n{process.output[-8000:]}")
        print("\n".join(_manager_forbidden(install.cp.audit_events())))
        raise
    finally:
        for process in processes.values():
            process.stop()
    events = install.cp.audit_events()[before:]
    assert not _manager_forbidden(events)
    used = _used(events)
    for verb in ("get", "create", "patch", "list", "watch"):
        assert ("coordination.k8s.io", "leases", verb) in used, verb
    _every_grant_is_used_or_explained(events, install.docs, sharded=True)
