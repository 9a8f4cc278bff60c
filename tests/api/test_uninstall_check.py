"""`resourceconsist uninstall-check` (the chart's pre-delete hook; docs/install.md, "Uninstalling")
on a real API server: it refuses, in one line naming them, while controlled Services exist or
while pods still carry the manager's finalizers after its wait, looks only in the namespaces it is
given, and lets the uninstall go once nothing holds it."""

from __future__ import annotations

import os
import time

from resourceconsist import wire
from resourceconsist.cluster import kube
from resourceconsist.cluster.kube import KubeClient
from resourceconsist.rules import lifecycle
from resourceconsist.testing import LocalControlPlane, run_cli


def _check(control_plane: LocalControlPlane, *args: str) -> tuple[int, str]:
    env = {**os.environ, "KUBECONFIG": str(control_plane.kubeconfig)}
    done = run_cli("uninstall-check", *args, env=env, timeout=60)
    return done.returncode, (done.stderr.strip().splitlines() or [""])[-1]


def test_it_refuses_while_a_controlled_service_exists_and_names_it(
    control_plane: LocalControlPlane, kube_client: KubeClient, namespace: str
) -> None:
    labels = {wire.CONTROL_LABEL: wire.CONTROL_LABEL_VALUE}
    kube_client.create(
        kube.SERVICE,
        namespace,
        {"metadata": {"name": "web", "labels": labels}, "spec": {"ports": [{"port": 80}]}},
    )
    started = time.monotonic()
    code, said = _check(control_plane, "--namespace", namespace, "--wait-seconds", "30")
    # At once: waiting cannot make a Service go away.
    assert code == 1 and time.monotonic() - started < 20
    assert said.startswith(
        f"uninstall refused: 1 controlled Service(s) still exist ({namespace}/web): delete"
    )
    # Another namespace is not held by it.
    code, _ = _check(control_plane, "--namespace", "kube-public", "--wait-seconds", "0")
    assert code == 0
    kube_client.delete(kube.SERVICE, namespace, "web")
    code, _ = _check(control_plane, "--namespace", namespace, "--wait-seconds", "0")
    assert code == 0


def test_it_gives_held_pods_its_wait_then_names_them(
    control_plane: LocalControlPlane, kube_client: KubeClient, namespace: str
) -> None:
    held = lifecycle.guard_finalizer("web")
    pod = {
        "metadata": {"name": "web-0", "finalizers": [held, "example.com/other"]},
        "spec": {"containers": [{"name": "c", "image": "x"}]},
    }
    kube_client.create(kube.POD, namespace, pod)
    started = time.monotonic()
    code, said = _check(control_plane, "--namespace", namespace, "--wait-seconds", "2")
    assert code == 1 and time.monotonic() - started >= 2
    assert said.startswith(
        f"uninstall refused: 1 pod(s) still carry the manager's finalizers after 2 s ({namespace}/web-0)"
    )
    # Released (as the manager does once the pod is deregistered): the uninstall may go; a
    # finalizer that is not the manager's never holds it.
    kube_client.patch(kube.POD, namespace, "web-0", {"metadata": {"finalizers": ["example.com/other"]}})
    code, _ = _check(control_plane, "--namespace", namespace, "--wait-seconds", "0")
    assert code == 0
    kube_client.patch(kube.POD, namespace, "web-0", {"metadata": {"finalizers": None}})
