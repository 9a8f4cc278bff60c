"""The testing kit drives a real kube-apiserver + etcd: objects, status, watches, finalizers,
conflicts, admission webhooks over TLS, and a teardown that leaves nothing behind."""

from __future__ import annotations

import json
import re
import signal
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from resourceconsist.cluster import kube
from resourceconsist.cluster.kube import KubeClient
from resourceconsist.experimental.demo import DemoAdapter, FakeProvider
from resourceconsist.options import ManagerOptions
from resourceconsist.runtime.manager import Manager
from resourceconsist.testing import (
    KUBERNETES_VERSION,
    Cluster,
    ControlPlaneBinariesMissing,
    LocalControlPlane,
    WaitTimeout,
    async_wait_for,
    wait_for,
)
from resourceconsist.testing.controlplane import process_alive

REPO = Path(__file__).resolve().parents[2]


def _pod(
    name: str, labels: dict[str, str] | None = None, finalizers: list[str] | None = None
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": labels or {}, "finalizers": finalizers or []},
        "spec": {"containers": [{"name": "app", "image": "nginx"}]},
    }


def test_kubernetes_version_matches_the_pinned_module() -> None:
    go_mod = (REPO / "hack" / "controlplane" / "go.mod").read_text()
    assert re.search(rf"^\s*k8s\.io/kubernetes v{re.escape(KUBERNETES_VERSION)}$", go_mod, re.M)


def test_missing_binaries_name_what_is_missing_and_both_ways_to_get_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "etcd").write_text("#!/bin/sh\n")
    (tmp_path / "etcd").chmod(0o755)
    monkeypatch.setenv("KUBEBUILDER_ASSETS", str(tmp_path))
    with pytest.raises(ControlPlaneBinariesMissing) as err:
        LocalControlPlane().start()
    message = str(err.value)
    assert "kube-apiserver not found" in message and "etcd not" not in message
    assert "hack/build-controlplane.sh" in message and "KUBEBUILDER_ASSETS" in message


def test_apiserver_reports_the_pinned_version(control_plane: LocalControlPlane) -> None:
    version = json.loads(control_plane.raw_get("/version"))
    assert version["gitVersion"] == f"v{KUBERNETES_VERSION}"


def test_service_and_pod_status_arrive_on_a_watch(kube_api: Any, namespace: str) -> None:
    core = client.CoreV1Api(kube_api)
    core.create_namespaced_service(
        namespace,
        {
            "metadata": {"name": "web", "labels": {"kusionstack.io/control": "true"}},
            "spec": {"selector": {"app": "web"}, "ports": [{"port": 80}]},
        },
    )
    created = core.create_namespaced_pod(namespace, _pod("web-0", {"app": "web"}))
    assert core.read_namespaced_service("web", namespace).spec.selector == {"app": "web"}

    seen: list[dict[str, Any]] = []
    w = watch.Watch()

    def watch_pods() -> None:
        for event in w.stream(
            core.list_namespaced_pod,
            namespace,
            resource_version=created.metadata.resource_version,
            timeout_seconds=30,
        ):
            pod = event["object"]
            conditions = {c.type: c.status for c in (pod.status.conditions or [])}
            seen.append({"type": event["type"], "ip": pod.status.pod_ip, "ready": conditions.get("Ready")})
            if pod.status.pod_ip:
                w.stop()

    watcher = threading.Thread(target=watch_pods, daemon=True)
    watcher.start()
    core.patch_namespaced_pod_status(
        "web-0",
        namespace,
        {
            "status": {
                "podIP": "10.1.0.7",
                "podIPs": [{"ip": "10.1.0.7"}],
                "conditions": [{"type": "Ready", "status": "True"}],
            }
        },
    )
    watcher.join(timeout=30)
    assert {"type": "MODIFIED", "ip": "10.1.0.7", "ready": "True"} in seen


def test_a_finalizer_holds_a_deleted_pod_until_it_goes(kube_api: Any, namespace: str) -> None:
    core = client.CoreV1Api(kube_api)
    core.create_namespaced_pod(namespace, _pod("held", finalizers=["example.com/hold"]))
    core.delete_namespaced_pod("held", namespace)
    held = core.read_namespaced_pod("held", namespace)
    assert held.metadata.deletion_timestamp is not None
    assert held.metadata.finalizers == ["example.com/hold"]

    core.patch_namespaced_pod("held", namespace, {"metadata": {"finalizers": None}})

    def gone() -> bool:
        try:
            core.read_namespaced_pod("held", namespace)
        except ApiException as err:
            return err.status == 404
        return False

    wait_for(gone, timeout=10, message="pod held to disappear")


def test_a_stale_resource_version_gets_409_conflict(kube_api: Any, namespace: str) -> None:
    core = client.CoreV1Api(kube_api)
    stale = core.create_namespaced_pod(namespace, _pod("p"))
    core.patch_namespaced_pod("p", namespace, {"metadata": {"labels": {"touched": "yes"}}})
    stale.metadata.labels = {"mine": "yes"}
    with pytest.raises(ApiException) as err:
        core.replace_namespaced_pod("p", namespace, stale)
    assert err.value.status == 409
    assert core.read_namespaced_pod("p", namespace).metadata.labels == {"touched": "yes"}


class _LabelStamper(BaseHTTPRequestHandler):
    """A minimal mutating webhook: stamps ``stamped-by=test-webhook`` on every pod it admits."""

    calls: list[str] = []

    def do_POST(self) -> None:
        review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        request = review["request"]
        type(self).calls.append(request["object"]["metadata"].get("name", ""))
        patch = [{"op": "add", "path": "/metadata/labels/stamped-by", "value": "test-webhook"}]
        import base64

        body = json.dumps(
            {
                "apiVersion": "admission.k8s.io/v1",
                "kind": "AdmissionReview",
                "response": {
                    "uid": request["uid"],
                    "allowed": True,
                    "patchType": "JSONPatch",
                    "patch": base64.b64encode(json.dumps(patch).encode()).decode(),
                },
            }
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        return


@pytest.fixture
def tls_webhook(control_plane: LocalControlPlane) -> Iterator[int]:
    cert, key = control_plane.webhook_certificate()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _LabelStamper)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(cert), str(key))
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def test_the_apiserver_calls_a_tls_webhook_on_loopback(
    control_plane: LocalControlPlane, kube_api: Any, namespace: str, tls_webhook: int
) -> None:
    core = client.CoreV1Api(kube_api)
    control_plane.install_webhook(
        "stamp-test",
        port=tls_webhook,
        path="/stamp",
        rules=[{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}],
        namespace_selector={"matchLabels": {"kubernetes.io/metadata.name": namespace}},
    )
    try:
        # The API server picks the configuration up asynchronously: create pods until one is stamped.
        counter = iter(range(1000))

        def stamped_pod() -> bool:
            pod = core.create_namespaced_pod(namespace, _pod(f"w-{next(counter)}", {"app": "w"}))
            return pod.metadata.labels.get("stamped-by") == "test-webhook"

        wait_for(stamped_pod, timeout=20, interval=0.2, message="a pod mutated by the TLS webhook")
        assert _LabelStamper.calls, "the webhook server saw no AdmissionReview"
    finally:
        client.AdmissionregistrationV1Api(kube_api).delete_mutating_webhook_configuration("stamp-test")


@pytest.mark.controlplane
def test_stop_leaves_no_process_and_no_directory() -> None:
    with pytest.raises(RuntimeError, match="boom"), LocalControlPlane() as cp:
        pids, directory = cp.pids, cp.dir
        assert len(pids) == 2 and all(process_alive(p) for p in pids)
        raise RuntimeError("boom")
    assert not any(process_alive(p) for p in pids)
    assert not directory.exists()


@pytest.mark.controlplane
def test_a_killed_owner_takes_its_control_plane_down_and_the_next_start_cleans_up() -> None:
    script = (
        "import sys, time\n"
        "from resourceconsist.testing import LocalControlPlane\n"
        "cp = LocalControlPlane(); cp.start()\n"
        "print(' '.join(map(str, cp.pids)), cp.dir, flush=True)\n"
        "time.sleep(600)\n"
    )
    owner = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert owner.stdout is not None
    *pid_words, directory = owner.stdout.readline().split()
    pids = [int(p) for p in pid_words]
    assert all(process_alive(p) for p in pids)
    owner.send_signal(signal.SIGKILL)
    owner.wait(timeout=10)
    wait_for(lambda: not any(process_alive(p) for p in pids), timeout=15, message="orphans to die")
    assert Path(directory).exists()  # nothing could clean up after SIGKILL ...
    with LocalControlPlane():
        pass
    assert not Path(directory).exists()  # ... so the next start removed it


@pytest.mark.controlplane
def test_a_control_plane_starts_from_the_etcd_data_another_one_kept(tmp_path: Path) -> None:
    seed = tmp_path / "seed"
    with LocalControlPlane() as first:
        kept = KubeClient.from_kubeconfig(str(first.kubeconfig))
        kept.create(kube.NAMESPACE, None, {"metadata": {"name": "kept"}})
        made = kept.create(kube.SECRET, "kept", {"metadata": {"name": "settings"}, "data": {"a": "MQ=="}})
        kept.close()
        first.stop(keep_etcd=seed)
    assert (seed / "member").is_dir()
    with LocalControlPlane(etcd_seed=seed) as second:
        again = KubeClient.from_kubeconfig(str(second.kubeconfig))
        found = again.get(kube.SECRET, "kept", "settings")
        assert found["data"] == {"a": "MQ=="}
        assert found["metadata"]["uid"] == made["metadata"]["uid"]
        # The seeded store takes writes as any other.
        again.patch(kube.SECRET, "kept", "settings", {"data": {"a": "Mg=="}})
        assert again.get(kube.SECRET, "kept", "settings")["data"] == {"a": "Mg=="}
        again.close()
    assert (seed / "member").is_dir()  # the seed itself is left as it was: each start copies it


@pytest.mark.controlplane
def test_an_audit_policy_of_ones_own_records_the_bodies_it_asks_for() -> None:
    """``audit_policy=``: Service patches at Request level (their bodies), the rest at Metadata."""
    policy = {
        "apiVersion": "audit.k8s.io/v1",
        "kind": "Policy",
        "omitStages": ["RequestReceived", "ResponseStarted"],
        "rules": [
            {"level": "Request", "verbs": ["patch"], "resources": [{"group": "", "resources": ["services"]}]},
            {"level": "Metadata"},
        ],
    }
    with LocalControlPlane(audit_policy=policy) as cp:
        api = KubeClient.from_kubeconfig(str(cp.kubeconfig))
        api.create(kube.NAMESPACE, None, {"metadata": {"name": "audited"}})
        api.create(kube.SERVICE, "audited", {"metadata": {"name": "web"}, "spec": {"ports": [{"port": 80}]}})
        api.patch(kube.SERVICE, "audited", "web", {"metadata": {"labels": {"shard": "a"}}})
        api.close()

        def seen() -> list[dict[str, Any]]:
            """The Service's create and patch, once both are logged (an empty list till then)."""
            events = [e for e in cp.audit_events() if (e.get("objectRef") or {}).get("name") == "web"]
            return events if len(events) >= 2 else []

        events = wait_for(seen, timeout=10, message="the Service's events")
    by_verb = {e["verb"]: e for e in events}
    assert by_verb["patch"]["requestObject"] == {"metadata": {"labels": {"shard": "a"}}}
    assert "requestObject" not in by_verb["create"]


def test_wait_for_returns_the_value_or_names_what_it_waited_for() -> None:
    values = iter([None, 0, "ready"])
    assert wait_for(lambda: next(values), timeout=5, interval=0) == "ready"
    with pytest.raises(WaitTimeout, match=r"the impossible.*last seen: False"):
        wait_for(lambda: False, timeout=0.2, interval=0.01, message="the impossible")


@pytest.mark.controlplane
async def test_a_running_controller_recovers_its_watches_across_an_apiserver_restart() -> None:
    """restart_apiserver() keeps the port and etcd; the manager's informers re-list and watch
    again by themselves, so a change made after the restart is acted on without a restart."""
    with LocalControlPlane() as cp:
        client = KubeClient.from_kubeconfig(str(cp.kubeconfig))
        client.create(kube.NAMESPACE, None, {"metadata": {"name": "restart"}})
        cluster = Cluster(client, "restart")
        provider = FakeProvider()
        manager = Manager(client, ManagerOptions(namespace="restart"))
        await manager.add(DemoAdapter(provider))
        await manager.start()
        try:
            await cluster.service("web")
            await cluster.pod("web-0", {"app": "web"})
            await cluster.set_status("web-0")
            await async_wait_for(lambda: _served(provider, "web-0"), timeout=30, message="web-0 served")
            pods = manager.informers.informer(kube.POD)
            relists = pods.relists
            port = cp.port

            cp.restart_apiserver()  # blocks this thread; the informers' threads see the outage

            assert cp.port == port
            await cluster.pod("web-1", {"app": "web"})
            await cluster.set_status("web-1")
            await async_wait_for(lambda: _served(provider, "web-1"), timeout=60, message="web-1 served")
            assert pods.relists > relists
        finally:
            await manager.stop(timeout=5)
            client.close()


def _served(provider: FakeProvider, pod: str) -> bool:
    server = provider.snapshot().get("restart/web", {}).get(pod)
    return server is not None and bool(server.traffic_on)
