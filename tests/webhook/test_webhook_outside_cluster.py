"""The webhook run outside the cluster, as on a laptop or in CI (docs/webhook.md): the CLI
bootstraps a certificate that also covers the local address, registers a URL-based
MutatingWebhookConfiguration, and the real kube-apiserver calls the webhook through it."""

from __future__ import annotations

import base64
import contextlib
import itertools
import os
import signal
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from resourceconsist import wire
from resourceconsist.cluster import certs, kube
from resourceconsist.cluster.kube import ApiError, KubeClient
from resourceconsist.rules import lifecycle
from resourceconsist.testing import CLI, LocalControlPlane, free_port, wait_for

CONTROLLED = {wire.CONTROL_LABEL: wire.CONTROL_LABEL_VALUE}


@pytest.fixture
def kc(control_plane: LocalControlPlane) -> Iterator[KubeClient]:
    client = KubeClient.from_kubeconfig(str(control_plane.kubeconfig))
    yield client
    client.close()


def test_the_apiserver_calls_a_local_webhook_through_a_url_configuration(
    control_plane: LocalControlPlane, kc: KubeClient, namespace: str, tmp_path: Path
) -> None:
    port = free_port()
    url = f"https://127.0.0.1:{port}"
    command = [*CLI, "webhook", "--adapter", "demo"]
    command += ["--kubeconfig", str(control_plane.kubeconfig), "--cert-dir", str(tmp_path)]
    command += ["--webhook-host", "127.0.0.1", "--webhook-port", str(port), "--webhook-url", url]
    command += ["--webhook-cert-host", "localhost", "--webhook-cert-host", "dev.example.test"]
    # Its own metrics port, no probe port: the defaults (:8080, :8081) may be taken on this machine.
    metrics = free_port()
    command += ["--metrics-bind-address", f"127.0.0.1:{metrics}", "--health-probe-bind-address", "0"]
    process = subprocess.Popen(
        command,
        env={**os.environ, wire.POD_NAMESPACE_ENV: namespace},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:

        def registered() -> dict[str, Any] | None:
            config = kc.get_or_none(
                kube.MUTATING_WEBHOOK_CONFIGURATION, None, wire.MUTATING_WEBHOOK_CONFIGURATION
            )
            assert process.poll() is None, process.stdout.read() if process.stdout else ""
            return config

        config = wait_for(registered, timeout=60, message="the URL-based configuration")
        assert config is not None
        (entry,) = config["webhooks"]
        assert entry["clientConfig"]["url"] == f"{url}/mutating-demo"
        assert "service" not in entry["clientConfig"]
        assert entry["objectSelector"] == {"matchLabels": CONTROLLED}
        secret = kc.get(kube.SECRET, namespace, wire.WEBHOOK_CERT_SECRET)
        assert entry["clientConfig"]["caBundle"] == secret["data"]["ca.crt"]
        serving = base64.b64decode(secret["data"]["tls.crt"])
        assert certs.cert_matches_hosts(serving, ("127.0.0.1", "localhost", "dev.example.test"))
        assert (tmp_path / "tls.crt").read_bytes() == serving

        kc.create(
            kube.SERVICE,
            namespace,
            {
                "metadata": {"name": "web", "labels": CONTROLLED},
                "spec": {"selector": {"app": "web"}, "ports": [{"port": 80}]},
            },
        )
        names = (f"web-{i}" for i in itertools.count())
        expected = {f"Service/{namespace}/web": lifecycle.lifecycle_finalizer("web")}

        def pod_gets_its_entry() -> bool:
            pod = {
                "metadata": {"name": next(names), "labels": {**CONTROLLED, "app": "web"}},
                "spec": {"containers": [{"name": "c", "image": "x"}]},
            }
            try:
                created = kc.create(kube.POD, namespace, pod)
            except ApiError:  # the API server may still be picking up the configuration
                return False
            return lifecycle.expected_finalizers(created) == expected

        # The API server reads configurations and the webhook fills its cache asynchronously:
        # new pods are created until one arrives mutated by the webhook through the URL.
        wait_for(pod_gets_its_entry, timeout=60, interval=0.5, message="a pod mutated through the URL")
        # The webhook command serves controller-runtime's webhook series (docs/observability.md).
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=5) as response:
            exposition = response.read().decode()
        counted = sum(
            sample.value
            for family in text_string_to_metric_families(exposition)
            for sample in family.samples
            if sample.name == "controller_runtime_webhook_requests_total"
            and sample.labels == {"webhook": "/mutating-demo", "code": "200"}
        )
        assert counted >= 1, exposition

        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        # failurePolicy Fail: left behind, it would refuse every controlled pod of later tests.
        with contextlib.suppress(kube.NotFound):
            kc.delete(kube.MUTATING_WEBHOOK_CONFIGURATION, None, wire.MUTATING_WEBHOOK_CONFIGURATION)
