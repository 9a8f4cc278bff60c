"""LocalCluster: a working Kubernetes cluster on loopback, without containers.

``LocalControlPlane`` (etcd + kube-apiserver) plus a real kube-controller-manager and
kube-scheduler, and kwok simulating nodes and the kubelet's work on pods with the stages in
``kwok-stages.yaml``: Deployments roll, ReplicaSets make pods, the scheduler places them on
simulated nodes, pods get an IP and become Ready (honouring their readiness gates),
EndpointSlices follow, namespaces empty and go, the garbage collector collects. What is and
is not simulated is in docs/testing.md. Every process lives in the control plane's temporary
directory and dies with it, also when the owner is killed.
"""

from __future__ import annotations

import ipaddress
import json
import os
import ssl
import urllib.error
import urllib.request
from importlib import resources
from pathlib import Path
from typing import Any

from resourceconsist.testing.controlplane import CONTROL_PLANE_BINARIES, LocalControlPlane, free_port

#: The controllers kube-controller-manager runs (docs/testing.md names them for users).
CONTROLLERS = (
    "serviceaccount-token-controller",
    "serviceaccount-controller",
    "root-ca-certificate-publisher-controller",
    "namespace-controller",
    "garbage-collector-controller",
    "deployment-controller",
    "replicaset-controller",
    "statefulset-controller",
    "disruption-controller",
    "endpointslice-controller",
    "endpoints-controller",
)
#: The binaries a LocalCluster needs beside those of the control plane.
CLUSTER_BINARIES = ("kube-controller-manager", "kube-scheduler", "kwok")
#: kwok manages the nodes carrying this annotation: the ones LocalCluster creates.
KWOK_NODE_ANNOTATION = ("kwok.x-k8s.io/node", "fake")
#: Pod IPs come from this range (kwok's allocator), apart from the Service range.
POD_CIDR = "10.244.0.1/16"
#: Node InternalIPs (a pod's hostIP) come from this one.
NODE_IPS = ipaddress.ip_network("10.243.0.0/16")


def stages_path() -> Path:
    """The kwok Stage set shipped with the kit (see docs/testing.md)."""
    return Path(str(resources.files("resourceconsist.testing") / "kwok-stages.yaml"))


class LocalCluster(LocalControlPlane):
    """A working cluster: the control plane, controllers, scheduler and ``nodes`` kwok nodes.

    Use it as ``LocalControlPlane`` (``with LocalCluster(nodes=3) as c:``); ``node_names``
    lists the simulated nodes. ``start_timeout`` bounds each component's start.
    """

    binaries: tuple[str, ...] = CONTROL_PLANE_BINARIES + CLUSTER_BINARIES
    #: What kube-controller-manager runs (``--controllers``).
    controllers: tuple[str, ...] = CONTROLLERS

    def __init__(
        self,
        *,
        nodes: int = 3,
        start_timeout: float = 90.0,
        extra_apiserver_flags: dict[str, str] | None = None,
    ) -> None:
        if not 1 <= nodes <= 1000:
            raise ValueError(f"LocalCluster(nodes=...) takes 1 to 1000 nodes, got {nodes}")
        flags = {
            # That plugin taints every new node not-ready, and only the node-lifecycle
            # controller, which does not run here, would lift the taint.
            "disable-admission-plugins": "ServiceAccount,TaintNodesByCondition",
            **(extra_apiserver_flags or {}),
        }
        super().__init__(start_timeout=start_timeout, extra_apiserver_flags=flags)
        self.nodes = nodes

    @property
    def node_names(self) -> list[str]:
        return [f"kwok-node-{i}" for i in range(self.nodes)]

    def _start_more(self, binaries: dict[str, Path]) -> None:
        self._start_controller_manager(binaries["kube-controller-manager"])
        self._start_scheduler(binaries["kube-scheduler"])
        self._start_kwok(binaries["kwok"])
        self._create_nodes()
        self._wait_nodes_ready()
        self._wait_default_service_account()

    # -- components ----------------------------------------------------------------------

    def _common_flags(self, name: str, port: int) -> list[str]:
        d = self.dir
        return [
            f"--kubeconfig={self.kubeconfig}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            f"--cert-dir={d / name}",
            "--v=1",
        ]

    def _start_controller_manager(self, binary: Path) -> None:
        d = self.dir
        port = free_port()
        self._spawn(
            "kube-controller-manager",
            [
                str(binary),
                *self._common_flags("kube-controller-manager", port),
                f"--controllers={','.join(self.controllers)}",
                f"--service-account-private-key-file={d / 'sa.key'}",
                f"--root-ca-file={d / 'ca.crt'}",
                # A namespace whose cleanup failed part-way (an API server restart) is
                # retried after this period; the default, 5 minutes, outlasts a test.
                "--namespace-sync-period=10s",
            ],
        )
        self._wait_http(f"https://127.0.0.1:{port}/healthz", "kube-controller-manager", _insecure())

    def _start_scheduler(self, binary: Path) -> None:
        port = free_port()
        self._spawn("kube-scheduler", [str(binary), *self._common_flags("kube-scheduler", port)])
        self._wait_http(f"https://127.0.0.1:{port}/healthz", "kube-scheduler", _insecure())

    def _start_kwok(self, binary: Path) -> None:
        key, value = KWOK_NODE_ANNOTATION
        # kwok also reads ~/.kwok/kwok.yaml: a HOME of its own keeps the user's out.
        env = {**os.environ, "HOME": str(self.dir / "kwok-home")}
        self._spawn(
            "kwok",
            [
                str(binary),
                f"--kubeconfig={self.kubeconfig}",
                f"--config={stages_path()}",
                f"--manage-nodes-with-annotation-selector={key}={value}",
                f"--cidr={POD_CIDR}",
                "--node-lease-duration-seconds=40",
            ],
            env=env,
        )

    # -- nodes and readiness ---------------------------------------------------------------

    def _api(self, method: str, path: str, body: object | None = None) -> Any:
        """One admin call to the API server, before any client library is needed."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            f"{self.url}{path}",
            data=data,
            method=method,
            headers={"Content-Type": "application/json", "Accept": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10, context=self.ssl_context()) as resp:
            return json.loads(resp.read())

    def _create_nodes(self) -> None:
        key, value = KWOK_NODE_ANNOTATION
        for i, name in enumerate(self.node_names):
            # A Node keeps the status it is created with, as when a kubelet registers it.
            self._api(
                "POST",
                "/api/v1/nodes",
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {
                        "name": name,
                        "annotations": {key: value},
                        "labels": {"kubernetes.io/hostname": name, "type": "kwok"},
                    },
                    "status": {
                        "addresses": [
                            {"type": "InternalIP", "address": str(NODE_IPS[i + 1])},
                            {"type": "Hostname", "address": name},
                        ]
                    },
                },
            )

    def _wait_nodes_ready(self) -> None:
        def all_ready() -> bool:
            listing = self._api("GET", "/api/v1/nodes?labelSelector=type%3Dkwok")
            ready = {
                node["metadata"]["name"]
                for node in listing.get("items", [])
                for cond in (node.get("status") or {}).get("conditions") or []
                if cond["type"] == "Ready" and cond["status"] == "True"
            }
            return ready >= set(self.node_names)

        self._poll("kwok", all_ready)

    def _wait_default_service_account(self) -> None:
        # The controllers are running once the service-account controller has done its work.
        def exists() -> bool:
            try:
                self._api("GET", "/api/v1/namespaces/default/serviceaccounts/default")
            except urllib.error.HTTPError as err:
                if err.code == 404:
                    return False
                raise
            return True

        self._poll("kube-controller-manager", exists)


def _insecure() -> ssl.SSLContext:
    """The controller-manager and scheduler serve /healthz with a self-signed certificate."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx
