"""The chart installed as users install it, on a real node (docs/install.md; docs/testing.md, "A
real node"): `helm install` with the project's own image (imported, `pullPolicy: Never`), the
manager's Pods Ready under the chart's securityContext, the API server calling the webhook
through its Service, a controlled Deployment's Pods getting their entries, finalizers, gate and
preStop, and served by the provider. Its modes: the default (the alibabacloudslb adapter against
the SLB emulator served on the node's bridge address, its Secret, endpoint and CA given through
values), `adapters: [demo]`, a namespaced install, sharding with 3 replicas reached by
`helm upgrade` from the default and back, and the wait drain (`drainWaiter`); `helm uninstall`
refused while a controlled Service exists (docs/install.md, "Uninstalling"), then leaving no Pod
stuck on a finalizer.
"""

from __future__ import annotations

import logging
import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from resourceconsist import wire
from resourceconsist.adapters.alibabacloudslb.config import (
    LOAD_BALANCER_ID_LABEL,
    MODE_ANNOTATION,
    SERVER_ID_ANNOTATION,
)
from resourceconsist.adapters.alibabacloudslb.emulator_server import EmulatorAdmin, served_emulator
from resourceconsist.cluster import kube
from resourceconsist.cluster.kube import KubeClient, KubeObject
from resourceconsist.rules import lifecycle
from resourceconsist.testing import RealNodeCluster, condition, finalizers, find_helm, wait_for
from resourceconsist.testing.cluster import DEPLOYMENT, rolled_out
from resourceconsist.testing.realnode import BRIDGE_ADDRESS, NODE_NAME, http_server_log, http_server_pod_spec

log = logging.getLogger(__name__)
REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "resourceconsist"
RELEASE, RELEASE_NS = "resourceconsist", "resourceconsist"
LB = "lb-realnode"
CLUSTER_NAME = "realnode"
CONTROLLED = {wire.CONTROL_LABEL: wire.CONTROL_LABEL_VALUE}
#: What every install on the node sets: the image built from this checkout and imported.
NODE_VALUES: dict[str, Any] = {"image": {"repository": "localhost/resourceconsist", "pullPolicy": "Never"}}
CONFIG_MAP = kube.Resource("", "v1", "ConfigMap", "configmaps")
SECRET = kube.Resource("", "v1", "Secret", "secrets")
JOB = kube.Resource("batch", "v1", "Job", "jobs")
LEASE = kube.Resource("coordination.k8s.io", "v1", "Lease", "leases")
ENDPOINT_SLICE = kube.Resource("discovery.k8s.io", "v1", "EndpointSlice", "endpointslices")


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in extra.items():
        merged[key] = _merge(merged[key], value) if isinstance(value, dict) and key in merged else value
    return merged


@dataclass
class Release:
    """The chart on the session's real node, driven by helm as a user drives it."""

    cluster: RealNodeCluster
    client: KubeClient
    tmp: Path
    env: dict[str, str] = field(default_factory=dict)

    def helm(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(find_helm()), *args],
            capture_output=True,
            text=True,
            env=self.env,
            timeout=timeout,
            check=False,
        )

    def _values(self, values: dict[str, Any]) -> str:
        path = self.tmp / f"values-{len(list(self.tmp.glob('values-*')))}.yaml"
        path.write_text(yaml.safe_dump(_merge(NODE_VALUES, values)))
        return str(path)

    def install(self, values: dict[str, Any]) -> None:
        """`helm install --wait` into the namespace resourceconsist (docs/install.md)."""
        values_file = self._values(values)
        done = self.helm(
            "install", RELEASE, str(CHART), "-n", RELEASE_NS, "--create-namespace", "-f", values_file,
            "--wait", "--timeout", "240s",
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr + self.diagnose()

    def upgrade(self, values: dict[str, Any]) -> subprocess.CompletedProcess[str]:
        return self.helm(
            "upgrade",
            RELEASE,
            str(CHART),
            "-n",
            RELEASE_NS,
            "-f",
            self._values(values),
            "--wait",
            "--timeout",
            "240s",
        )

    def uninstall(self) -> subprocess.CompletedProcess[str]:
        return self.helm("uninstall", RELEASE, "-n", RELEASE_NS, "--wait", "--timeout", "240s")

    def pods(self, namespace: str, selector: str) -> list[KubeObject]:
        return list(self.client.list(kube.POD, namespace, label_selector=selector).get("items") or [])

    def diagnose(self) -> str:
        """The release's pods, their states and the manager's log tail, for a failure's message."""
        lines = []
        for pod in self.pods(RELEASE_NS, "app.kubernetes.io/instance=resourceconsist"):
            name = pod["metadata"]["name"]
            states = [c.get("state") for c in (pod.get("status") or {}).get("containerStatuses") or []]
            lines.append(f"{name}: {pod.get('status', {}).get('phase')} {states}")
            try:
                lines.append(self.cluster.pod_log(RELEASE_NS, name)[-3000:])
            except Exception as err:  # a diagnosis never hides the failure
                lines.append(f"(no log: {err})")
        return "\n" + "\n".join(lines)

    def clean_up(self) -> None:
        """Whatever a failed test left: the release gone without its hook, controlled Services and
        the finalizers of ours taken off, so the node's other tests meet no webhook of ours."""
        for svc in self.client.list(kube.SERVICE, None, label_selector="kusionstack.io/control=true")[
            "items"
        ]:
            self.client.delete(kube.SERVICE, svc["metadata"]["namespace"], svc["metadata"]["name"])
        if self.helm("status", RELEASE, "-n", RELEASE_NS).returncode == 0:
            self.helm("uninstall", RELEASE, "-n", RELEASE_NS, "--no-hooks", "--wait", "--timeout", "120s")
        for pod in self.client.list(kube.POD, None)["items"]:
            held = [
                f
                for f in finalizers(pod)
                if f.startswith((wire.GUARD_FINALIZER_PREFIX, wire.LIFECYCLE_FINALIZER_PREFIX))
            ]
            if held:
                meta = pod["metadata"]
                kept = [f for f in finalizers(pod) if f not in held]
                self.client.patch(
                    kube.POD, meta["namespace"], meta["name"], {"metadata": {"finalizers": kept}}
                )
        if self.client.get_or_none(kube.NAMESPACE, None, RELEASE_NS) is not None:
            self.client.delete(kube.NAMESPACE, None, RELEASE_NS)
            wait_for(
                lambda: self.client.get_or_none(kube.NAMESPACE, None, RELEASE_NS) is None,
                timeout=120,
                message="the release's namespace gone",
            )


@pytest.fixture
def release(real_node_cluster: RealNodeCluster, tmp_path: Path) -> Iterator[Release]:
    client = KubeClient.from_kubeconfig(str(real_node_cluster.kubeconfig))
    home = tmp_path / "helm-home"
    env = {
        **os.environ,
        "KUBECONFIG": str(real_node_cluster.kubeconfig),
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
    }
    found = Release(real_node_cluster, client, tmp_path, env)
    try:
        yield found
    finally:
        found.clean_up()
        client.close()


@pytest.fixture
def emulator(tmp_path: Path) -> Iterator[tuple[dict[str, str], EmulatorAdmin]]:
    """The SLB emulator as its own process, its endpoint on the node's bridge address."""
    with served_emulator(tmp_path / "slb", LB, host=BRIDGE_ADDRESS) as served:
        yield served


def _slb_values(release: Release, info: dict[str, str]) -> dict[str, Any]:
    """The default install's values against the emulator: the Secret with the endpoint and a key
    pair (created first, as users do), the emulator's CA through a ConfigMap, extraVolumes and the
    SDK's ALIBABA_CLOUD_CA_BUNDLE."""
    release.client.create(kube.NAMESPACE, None, {"metadata": {"name": RELEASE_NS}})
    secret = {
        "metadata": {"name": "resourceconsist-slb-credentials"},
        "stringData": {
            "ALIYUN_SLB_ENDPOINT": info["endpoint"],
            "ALIYUN_SLB_AK_KEY": info["access_key_id"],
            "ALIYUN_SLB_AK_SECRET": info["access_key_secret"],
            "ALIBABA_CLOUD_REGION_ID": info["region_id"],
        },
    }
    release.client.create(SECRET, RELEASE_NS, secret)
    ca = {"metadata": {"name": "slb-ca"}, "data": {"ca.pem": Path(info["ca_bundle"]).read_text()}}
    release.client.create(CONFIG_MAP, RELEASE_NS, ca)
    return {
        "clusterName": CLUSTER_NAME,
        "extraVolumes": [{"name": "slb-ca", "configMap": {"name": "slb-ca"}}],
        "extraVolumeMounts": [{"name": "slb-ca", "mountPath": "/etc/slb-ca", "readOnly": True}],
        "extraEnv": [{"name": "ALIBABA_CLOUD_CA_BUNDLE", "value": "/etc/slb-ca/ca.pem"}],
    }


def _manager_pods_ready(release: Release, selector: str, count: int) -> list[KubeObject]:
    def ready() -> list[KubeObject] | None:
        pods = [p for p in release.pods(RELEASE_NS, selector) if not p["metadata"].get("deletionTimestamp")]
        if len(pods) == count and all(condition(p, "Ready") == "True" for p in pods):
            return pods
        return None

    found = wait_for(ready, timeout=180, interval=0.5, message=f"{count} pods {selector} Ready")
    assert found is not None
    return found


def _assert_hardened(pod: KubeObject) -> None:
    """The chart's securityContext, as the kubelet ran it."""
    spec = pod["spec"]
    assert spec["nodeName"] == NODE_NAME
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = spec["containers"]
    context = container["securityContext"]
    assert context["readOnlyRootFilesystem"] is True and context["capabilities"] == {"drop": ["ALL"]}
    assert container["image"].startswith("localhost/resourceconsist:")


def _workload(
    release: Release,
    namespace: str,
    name: str,
    replicas: int,
    service: dict[str, Any],
    pod_spec: dict[str, Any] | None = None,
) -> None:
    """A controlled Service and a Deployment of the HTTP test server (``pod_spec``, else
    ``http_server_pod_spec()``) behind it."""
    body = {
        "metadata": {"name": name, **service},
        "spec": {"selector": {"app": name}, "ports": [{"port": 80, "targetPort": 8080}]},
    }
    body["metadata"].setdefault("labels", {}).update(CONTROLLED)
    release.client.create(kube.SERVICE, namespace, body)
    deployment = {
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "strategy": {"rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": {
                "metadata": {"labels": {"app": name, **CONTROLLED}},
                "spec": pod_spec or http_server_pod_spec(),
            },
        },
    }
    release.client.create(DEPLOYMENT, namespace, deployment)


def _name_enis(release: Release, namespace: str, name: str) -> None:
    """Play the tooling that names each pod's ENI (docs/alibabacloudslb.md, "The ENI id")."""
    for pod in release.pods(namespace, f"app={name}"):
        if SERVER_ID_ANNOTATION not in (pod["metadata"].get("annotations") or {}):
            patch = {"metadata": {"annotations": {SERVER_ID_ANNOTATION: f"eni-{pod['metadata']['name']}"}}}
            release.client.patch(kube.POD, namespace, pod["metadata"]["name"], patch)


def _served_by_slb(release: Release, admin: EmulatorAdmin, namespace: str, name: str, replicas: int) -> bool:
    """Every live pod of the Deployment: admitted by the webhook (entry), Ready, behind the SLB
    group at weight 100 by its IP, and held by the Service's lifecycle finalizer."""
    _name_enis(release, namespace, name)
    pods = [p for p in release.pods(namespace, f"app={name}") if not p["metadata"].get("deletionTimestamp")]
    if len(pods) != replicas or not rolled_out(release.client.get(DEPLOYMENT, namespace, name)):
        return False
    groups = [g for g in admin.state()["groups"] if g["name"] == f"resourceconsist/{namespace}/{name}"]
    if len(groups) != 1:
        return False
    backends = {b.get("ServerIp"): b["Weight"] for b in groups[0]["backends"]}
    flz = lifecycle.lifecycle_finalizer(name)
    return all(
        backends.get(p["status"].get("podIP")) == 100
        and p["spec"]["nodeName"] == NODE_NAME
        and flz in finalizers(p)
        and lifecycle.expected_finalizers(p)
        and condition(p, "Ready") == "True"
        for p in pods
    )


def test_the_default_install_serves_through_slb_moves_to_sharding_and_uninstalls_leaving_no_pod(
    release: Release, real_node_namespace: str, emulator: tuple[dict[str, str], EmulatorAdmin]
) -> None:
    info, admin = emulator
    ns = real_node_namespace
    values = _slb_values(release, info)
    release.install(values)
    for pod in _manager_pods_ready(release, "control-plane=resourceconsist-manager", 2):
        _assert_hardened(pod)
    # The namespace opts in to gates and the Service asks for one and a drain: the webhook adds
    # both to the pods it admits, which it can only do if the API server reached it through the
    # Service (an endpoint's IP on the bridge, the certificate the manager made for the Service).
    release.client.patch(
        kube.NAMESPACE,
        None,
        ns,
        {"metadata": {"labels": {wire.READINESS_GATE_INJECT_LABEL: wire.READINESS_GATE_INJECT_VALUE}}},
    )
    service = {
        "labels": {LOAD_BALANCER_ID_LABEL: LB},
        "annotations": {
            MODE_ANNOTATION: "manage",
            wire.READINESS_GATE_ANNOTATION: "true",
            wire.DRAIN_SECONDS_ANNOTATION: "2",
        },
    }
    _workload(release, ns, "web", 2, service)
    wait_for(
        lambda: _served_by_slb(release, admin, ns, "web", 2),
        timeout=180,
        interval=0.5,
        message="web served by SLB",
    )
    for pod in release.pods(ns, "app=web"):
        assert lifecycle.readiness_gates(pod) == [lifecycle.readiness_gate("web")]
        assert pod["spec"]["containers"][0]["lifecycle"]["preStop"] == {"sleep": {"seconds": 2}}

    # Into sharding, three shards: the manager Deployment keeps its selector (immutable), its pods
    # are all replaced before the shards start (Recreate, this once), the webhook gets its own.
    sharded = _merge(values, {"sharding": {"enabled": True}, "replicaCount": 3})
    done = release.upgrade(sharded)
    assert done.returncode == 0, done.stdout + done.stderr + release.diagnose()
    manager = release.client.get(DEPLOYMENT, RELEASE_NS, "resourceconsist-manager")
    assert manager["spec"]["strategy"]["type"] == "Recreate"
    assert manager["spec"]["selector"]["matchLabels"] == {"control-plane": "resourceconsist-manager"}
    for pod in _manager_pods_ready(release, "control-plane=resourceconsist-manager", 3):
        assert "--sharding" in pod["spec"]["containers"][0]["args"]
        _assert_hardened(pod)
    _manager_pods_ready(release, "control-plane=resourceconsist-webhook", 2)
    leases = release.client.list(LEASE, RELEASE_NS, label_selector=f"{wire.SHARD_RING_LABEL}=resourceconsist")
    assert len(leases["items"]) == 3
    # A rollout under the shards: new pods admitted by the webhook Deployment, served, old ones
    # deregistered before they go.
    old = {p["metadata"]["name"] for p in release.pods(ns, "app=web")}
    release.client.patch(
        DEPLOYMENT,
        ns,
        "web",
        {"spec": {"replicas": 3, "template": {"metadata": {"annotations": {"rev": "2"}}}}},
    )
    wait_for(
        lambda: _served_by_slb(release, admin, ns, "web", 3),
        timeout=180,
        interval=0.5,
        message="web rolled, served",
    )
    wait_for(
        lambda: not old & {p["metadata"]["name"] for p in release.pods(ns, "app=web")},
        timeout=60,
        message="the old pods drained and gone",
    )

    # Uninstall is refused while the controlled Service exists: the manager stays, and says why.
    refused = release.uninstall()
    assert refused.returncode != 0
    assert release.client.get_or_none(DEPLOYMENT, RELEASE_NS, "resourceconsist-manager") is not None
    (check,) = release.pods(RELEASE_NS, "app.kubernetes.io/component=uninstall-check")
    said = check["status"]["containerStatuses"][0]["state"]["terminated"]["message"]
    assert f"uninstall refused: 1 controlled Service(s) still exist ({ns}/web)" in said
    # The Service deleted, the manager deregisters its pods and releases them; then it may go.
    release.client.delete(kube.SERVICE, ns, "web")
    wait_for(
        lambda: not [g for g in admin.state()["groups"] if g["name"] == f"resourceconsist/{ns}/web"],
        timeout=120,
        message="the SLB group deleted",
    )
    done = release.uninstall()
    assert done.returncode == 0, done.stdout + done.stderr + release.diagnose()
    assert (
        release.client.get_or_none(
            kube.MUTATING_WEBHOOK_CONFIGURATION, None, "resourceconsist-manager-mutating"
        )
        is None
    )
    # No pod stuck: the workload's pods leave as soon as it is deleted.
    release.client.delete(DEPLOYMENT, ns, "web")
    wait_for(lambda: not release.pods(ns, "app=web"), timeout=120, message="web's pods gone")
    wait_for(
        lambda: not release.pods(RELEASE_NS, "app.kubernetes.io/instance=resourceconsist"),
        timeout=120,
        message="the release's pods gone",
    )


def _guarded(release: Release, namespace: str, name: str, replicas: int) -> bool:
    """The Deployment rolled out, each live pod admitted (entry) and held by the lifecycle finalizer."""
    pods = [p for p in release.pods(namespace, f"app={name}") if not p["metadata"].get("deletionTimestamp")]
    flz = lifecycle.lifecycle_finalizer(name)
    return (
        len(pods) == replicas
        and rolled_out(release.client.get(DEPLOYMENT, namespace, name))
        and all(
            flz in finalizers(p) and lifecycle.expected_finalizers(p) and p["spec"]["nodeName"] == NODE_NAME
            for p in pods
        )
    )


def _strategy(release: Release) -> str:
    return str(
        release.client.get(DEPLOYMENT, RELEASE_NS, "resourceconsist-manager")["spec"]["strategy"]["type"]
    )


def test_helm_upgrade_moves_an_install_into_sharding_and_back(
    release: Release, real_node_namespace: str
) -> None:
    """Leader election, then three shards and the webhook's own Deployment, then one leader again,
    each by `helm upgrade`: the manager's selector never changes (the earlier chart's upgrade into
    sharding failed on it and left a half-applied release), a change of mode replaces every
    replica before one of the other mode starts, and a controlled Deployment rolls under each.
    (No credentials Secret is named, so that this runs the same on the earlier chart.)"""
    ns = real_node_namespace
    values: dict[str, Any] = {"adapters": ["demo"], "credentials": {"secretName": ""}}
    release.install(values)
    _manager_pods_ready(release, "control-plane=resourceconsist-manager", 2)
    _workload(release, ns, "web", 2, {})
    wait_for(lambda: _guarded(release, ns, "web", 2), timeout=180, interval=0.5, message="web guarded")

    done = release.upgrade(_merge(values, {"sharding": {"enabled": True}, "replicaCount": 3}))
    assert done.returncode == 0, done.stdout + done.stderr + release.diagnose()
    assert _strategy(release) == "Recreate"
    manager = release.client.get(DEPLOYMENT, RELEASE_NS, "resourceconsist-manager")
    assert manager["spec"]["selector"]["matchLabels"] == {"control-plane": "resourceconsist-manager"}
    for pod in _manager_pods_ready(release, "control-plane=resourceconsist-manager", 3):
        assert "--sharding" in pod["spec"]["containers"][0]["args"]
    _manager_pods_ready(release, "control-plane=resourceconsist-webhook", 2)
    release.client.patch(
        DEPLOYMENT, ns, "web", {"spec": {"template": {"metadata": {"annotations": {"rev": "2"}}}}}
    )
    wait_for(
        lambda: _guarded(release, ns, "web", 2), timeout=180, interval=0.5, message="web rolled under shards"
    )

    done = release.upgrade(values)
    assert done.returncode == 0, done.stdout + done.stderr + release.diagnose()
    assert _strategy(release) == "Recreate"
    _manager_pods_ready(release, "control-plane=resourceconsist-manager", 2)
    assert release.client.get_or_none(DEPLOYMENT, RELEASE_NS, "resourceconsist-webhook") is None
    # The next upgrade in the same mode rolls, one replica at a time.
    done = release.upgrade(_merge(values, {"podAnnotations": {"rev": "3"}}))
    assert done.returncode == 0, done.stdout + done.stderr
    assert _strategy(release) == "RollingUpdate"
    release.client.patch(
        DEPLOYMENT, ns, "web", {"spec": {"template": {"metadata": {"annotations": {"rev": "3"}}}}}
    )
    wait_for(
        lambda: _guarded(release, ns, "web", 2),
        timeout=180,
        interval=0.5,
        message="web rolled under a leader",
    )
    release.client.delete(kube.SERVICE, ns, "web")
    done = release.uninstall()
    assert done.returncode == 0, done.stdout + done.stderr + release.diagnose()
    release.client.delete(DEPLOYMENT, ns, "web")
    wait_for(lambda: not release.pods(ns, "app=web"), timeout=120, message="web's pods gone")


def test_an_install_with_the_demo_adapter_starts_and_guards_its_pods(
    release: Release, real_node_namespace: str
) -> None:
    """`adapters: [demo]` needs no credentials: its Pods start (no Secret named), the webhook and
    the controller guard a controlled Deployment's pods."""
    release.install({"adapters": ["demo"]})
    for pod in _manager_pods_ready(release, "control-plane=resourceconsist-manager", 2):
        _assert_hardened(pod)
        assert "envFrom" not in pod["spec"]["containers"][0]
    ns = real_node_namespace
    _workload(release, ns, "shop", 2, {})

    def guarded() -> bool:
        pods = [p for p in release.pods(ns, "app=shop") if condition(p, "Ready") == "True"]
        flz = lifecycle.lifecycle_finalizer("shop")
        return len(pods) == 2 and all(
            flz in finalizers(p) and lifecycle.expected_finalizers(p) and p["spec"]["nodeName"] == NODE_NAME
            for p in pods
        )

    wait_for(guarded, timeout=180, interval=0.5, message="shop's pods admitted and guarded")
    release.client.delete(kube.SERVICE, ns, "shop")
    done = release.uninstall()
    assert done.returncode == 0, done.stdout + done.stderr + release.diagnose()
    release.client.delete(DEPLOYMENT, ns, "shop")
    wait_for(lambda: not release.pods(ns, "app=shop"), timeout=120, message="shop's pods gone")


def test_a_namespaced_install_controls_its_namespaces_only(release: Release, real_node_api: Any) -> None:
    """watchNamespaces: the manager's grants are a Role in each, and a controlled Service
    elsewhere is left alone (its pods are neither admitted with entries nor guarded)."""
    from kubernetes import client

    core = client.CoreV1Api(real_node_api)
    for name in ("rn-shop", "rn-other"):
        core.create_namespace({"metadata": {"name": name}})
    try:
        for name in ("rn-shop", "rn-other"):
            wait_for(lambda n=name: core.list_namespaced_service_account(n).items, timeout=30)  # type: ignore[misc]
        release.install({"adapters": ["demo"], "watchNamespaces": ["rn-shop"]})
        _manager_pods_ready(release, "control-plane=resourceconsist-manager", 2)
        _workload(release, "rn-shop", "web", 1, {})
        _workload(release, "rn-other", "web", 1, {})
        flz = lifecycle.lifecycle_finalizer("web")

        def shop_guarded() -> bool:
            pods = release.pods("rn-shop", "app=web")
            return len(pods) == 1 and flz in finalizers(pods[0]) and pods[0]["spec"]["nodeName"] == NODE_NAME

        wait_for(shop_guarded, timeout=180, interval=0.5, message="rn-shop's pod guarded")
        other = wait_for(
            lambda: [p for p in release.pods("rn-other", "app=web") if condition(p, "Ready") == "True"],
            timeout=120,
        )
        assert not finalizers(other[0]) and not lifecycle.expected_finalizers(other[0])
        # The check looks only where the manager watches: the Service in rn-other does not hold it.
        release.client.delete(kube.SERVICE, "rn-shop", "web")
        done = release.uninstall()
        assert done.returncode == 0, done.stdout + done.stderr + release.diagnose()
    finally:
        for name in ("rn-shop", "rn-other"):
            if release.client.get_or_none(kube.SERVICE, name, "web") is not None:
                release.client.delete(kube.SERVICE, name, "web")
            core.delete_namespace(name)


#: The wait drain's bound in the test below: what a pod waits when no manager answers.
DRAIN_BOUND = 20


def _live_pod(release: Release, namespace: str, name: str) -> KubeObject | None:
    pods = [p for p in release.pods(namespace, f"app={name}") if not p["metadata"].get("deletionTimestamp")]
    return pods[0] if len(pods) == 1 else None


def _sigterm_after_delete(release: Release, namespace: str, pod: str, logs: Path) -> float:
    """Delete ``pod``; the seconds until its test server got SIGTERM (its log outlives it), i.e.
    until the kubelet's preStop call to the drain waiter ended. The call answered (the waiter's
    200, "released" or "bound"): a failed hook, which the kubelet follows with SIGTERM at once, is
    an Event FailedPreStopHook on the pod, and there is none once the pod is gone."""
    deleted = time.time()
    release.client.delete(kube.POD, namespace, pod)

    def sigterm() -> float | None:
        return next((e["t"] for e in http_server_log(logs, pod) if e["event"] == "sigterm"), None)

    at = wait_for(sigterm, timeout=DRAIN_BOUND + 60, interval=0.2, message=f"{pod}'s SIGTERM")
    assert at is not None
    wait_for(
        lambda: release.client.get_or_none(kube.POD, namespace, pod) is None,
        timeout=60,
        message=f"{pod} gone",
    )
    events = release.client.list(kube.EVENT, namespace, field_selector=f"involvedObject.name={pod}")["items"]
    assert not [e for e in events if e.get("reason") == "FailedPreStopHook"], events
    return float(at) - deleted


def _waiter_endpoints(pod: KubeObject) -> list[str]:
    (waiter,) = [
        c for c in pod["spec"].get("initContainers") or [] if c["name"] == wire.DRAIN_WAITER_CONTAINER
    ]
    return [a.split("=", 1)[1] for a in waiter["args"] if a.startswith("--endpoint=")]


def test_the_wait_drain_through_the_chart_ends_a_gated_pod_s_prestop_on_the_managers_answer(
    release: Release, real_node_namespace: str, tmp_path: Path
) -> None:
    """drainWaiter.enabled (docs/zero-downtime.md, "A drain that waits for the provider"): both
    manager replicas serve the drain endpoint behind the chart's Service, the webhook gives a pod
    of an employer annotated drain-mode: wait the waiter sidecar from the manager's image, and the
    pod's preStop ends when the manager says the provider let go. This node has no cluster DNS, so
    the Service's name the chart gives by default cannot be reached from a pod: the first pod waits
    the whole bound (the contrast); with the Service's address given (drainWaiter.endpoints) the
    next one stops within seconds. (The NetworkPolicy rule is not exercised: the node's CNI
    enforces none.)"""
    ns = real_node_namespace
    logs = tmp_path / "server-logs"
    values: dict[str, Any] = {"adapters": ["demo"], "drainWaiter": {"enabled": True}}
    release.install(values)
    managers = _manager_pods_ready(release, "control-plane=resourceconsist-manager", 2)
    service = release.client.get(kube.SERVICE, RELEASE_NS, "resourceconsist-manager-drain")
    port = service["spec"]["ports"][0]["port"]
    assert port == 8082

    def endpoints() -> set[str] | None:
        slices = release.client.list(
            ENDPOINT_SLICE,
            RELEASE_NS,
            label_selector="kubernetes.io/service-name=resourceconsist-manager-drain",
        )["items"]
        ready = {
            address
            for found in slices
            for endpoint in found.get("endpoints") or []
            if (endpoint.get("conditions") or {}).get("ready")
            for address in endpoint["addresses"]
        }
        return ready if len(ready) == 2 else None

    # Both replicas, the leader and the standby, answer: the Service sends to both.
    assert endpoints() == {p["status"]["podIP"] for p in managers} or wait_for(
        endpoints, timeout=60, message="both managers behind the drain Service"
    ) == {p["status"]["podIP"] for p in managers}

    # The namespace opts in to the webhook's spec changes; the Service asks for the wait drain.
    release.client.patch(
        kube.NAMESPACE,
        None,
        ns,
        {"metadata": {"labels": {wire.READINESS_GATE_INJECT_LABEL: wire.READINESS_GATE_INJECT_VALUE}}},
    )
    annotations = {wire.DRAIN_SECONDS_ANNOTATION: str(DRAIN_BOUND), wire.DRAIN_MODE_ANNOTATION: "wait"}
    _workload(release, ns, "web", 1, {"annotations": annotations}, http_server_pod_spec(logs))
    wait_for(lambda: _guarded(release, ns, "web", 1), timeout=180, interval=0.5, message="web guarded")
    pod = _live_pod(release, ns, "web")
    assert pod is not None
    image = managers[0]["spec"]["containers"][0]["image"]
    (waiter,) = [c for c in pod["spec"]["initContainers"] if c["name"] == wire.DRAIN_WAITER_CONTAINER]
    assert waiter["image"] == image and waiter["restartPolicy"] == "Always"
    assert f"--bound={DRAIN_BOUND}" in waiter["args"]
    assert _waiter_endpoints(pod) == [f"http://resourceconsist-manager-drain.{RELEASE_NS}.svc:{port}"]
    hook = pod["spec"]["containers"][0]["lifecycle"]["preStop"]
    assert (
        hook["httpGet"]["path"] == wire.DRAIN_WAITER_PATH
        and hook["httpGet"]["port"] == wire.DRAIN_WAITER_PORT
    )

    # The name does not resolve here: the waiter never hears the managers and waits the bound.
    unheard = _sigterm_after_delete(release, ns, pod["metadata"]["name"], logs)
    log.info(
        "wait drain through the chart: SIGTERM %.2f s after the delete, unheard (bound %s s)",
        unheard,
        DRAIN_BOUND,
    )
    assert unheard >= DRAIN_BOUND - 0.5, unheard

    # The Service's cluster IP given instead: the webhook's next pods ask the managers there.
    ip = service["spec"]["clusterIP"]
    done = release.upgrade(_merge(values, {"drainWaiter": {"endpoints": [f"http://{ip}:{port}"]}}))
    assert done.returncode == 0, done.stdout + done.stderr + release.diagnose()
    _manager_pods_ready(release, "control-plane=resourceconsist-manager", 2)
    release.client.patch(
        DEPLOYMENT, ns, "web", {"spec": {"template": {"metadata": {"annotations": {"rev": "2"}}}}}
    )

    def rolled() -> KubeObject | None:
        found = _live_pod(release, ns, "web")
        if found is None or not _guarded(release, ns, "web", 1) or len(release.pods(ns, "app=web")) != 1:
            return None
        return found if _waiter_endpoints(found) == [f"http://{ip}:{port}"] else None

    pod = wait_for(
        rolled, timeout=DRAIN_BOUND + 180, interval=0.5, message="web rolled onto the Service's IP"
    )
    assert pod is not None
    heard = _sigterm_after_delete(release, ns, pod["metadata"]["name"], logs)
    # The demo provider lets go at once: the preStop ends on the managers' answer, far inside the bound.
    log.info(
        "wait drain through the chart: SIGTERM %.2f s after the delete, heard (bound %s s)",
        heard,
        DRAIN_BOUND,
    )
    assert heard < DRAIN_BOUND / 2, heard

    release.client.delete(kube.SERVICE, ns, "web")
    release.client.delete(DEPLOYMENT, ns, "web")
    wait_for(lambda: not release.pods(ns, "app=web"), timeout=120, message="web's pods gone")
    done = release.uninstall()
    assert done.returncode == 0, done.stdout + done.stderr + release.diagnose()
