"""Secure metrics on a real manager and the real API server (docs/observability.md, "Secure
metrics"): ``/metrics`` over HTTPS answers 200 to a ServiceAccount token whose user may ``get``
the non-resource URL ``/metrics``, 403 to one whose user may not, 401 without a token or with one
the API server does not know; the TokenReview and SubjectAccessReview answers are kept (a second
scrape sends no review), a denial for less long than an allowance; the probes stay plain HTTP on
their own port. With a cert dir, the endpoint serves the files' certificate and follows a
rotation, counted in the certificate watcher's series. As controller-runtime's filter, on the
manager's own client (here the admin's: tests/api/test_privilege.py runs it as the chart's
ServiceAccount, with the chart's grants).
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509

from resourceconsist.cluster import certs
from resourceconsist.cluster.kube import KubeClient
from resourceconsist.options import ManagerOptions, SecureMetricsOptions
from resourceconsist.runtime.metricsauth import MetricsAuthorizer
from resourceconsist.testing import Cluster, LocalControlPlane, async_wait_for


def _insecure() -> ssl.SSLContext:
    """As kubebuilder's ServiceMonitor scrapes a self-signed endpoint: TLS, no verification."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def _get(
    port: int, path: str = "/metrics", token: str | None = None, scheme: str = "https"
) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    request = urllib.request.Request(f"{scheme}://127.0.0.1:{port}{path}", headers=headers)
    try:
        with urllib.request.urlopen(
            request, timeout=15, context=_insecure() if scheme == "https" else None
        ) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def _served_certificate(port: int) -> x509.Certificate:
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        _insecure().wrap_socket(raw) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der)


@pytest.fixture
def readers(
    control_plane: LocalControlPlane, kube_client: KubeClient, cluster: Cluster
) -> Iterator[dict[str, str]]:
    """Tokens of two ServiceAccounts of the test's namespace: ``reader``, bound to a ClusterRole
    that may ``get`` ``/metrics`` (kubebuilder's metrics-reader), and ``nobody``, bound to none."""
    ns = cluster.namespace
    account = kube_client.resource("v1", "ServiceAccount")
    role = kube_client.resource("rbac.authorization.k8s.io/v1", "ClusterRole")
    binding = kube_client.resource("rbac.authorization.k8s.io/v1", "ClusterRoleBinding")
    name = f"{ns}-metrics-reader"
    for sa in ("reader", "nobody"):
        kube_client.create(account, ns, {"metadata": {"name": sa}})
    kube_client.create(
        role,
        None,
        {"metadata": {"name": name}, "rules": [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]},
    )
    kube_client.create(
        binding,
        None,
        {
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": ns}],
        },
    )
    try:
        yield {sa: control_plane.service_account_token(ns, sa) for sa in ("reader", "nobody")}
    finally:
        kube_client.delete(binding, None, name)
        kube_client.delete(role, None, name)


def _reviews(client: KubeClient) -> tuple[int, int]:
    sent = client.requests_by_resource
    return sent["post tokenreviews"], sent["post subjectaccessreviews"]


async def test_only_a_token_that_may_get_metrics_reads_them(
    cluster: Cluster, readers: dict[str, str], run_manager: Any
) -> None:
    async with run_manager(
        metrics_address=("127.0.0.1", 0),
        health_probe_address=("127.0.0.1", 0),
        secure_metrics=SecureMetricsOptions(),
    ) as manager:
        port, client = manager.metrics_port, manager.client
        assert port is not None and manager.health_port is not None
        # The probes: plain HTTP, no token, on their own port (the kubelet's httpGet).
        assert (await asyncio.to_thread(_get, manager.health_port, "/readyz", None, "http"))[0] in (200, 503)

        status, text = await asyncio.to_thread(_get, port, "/metrics", readers["reader"])
        assert status == 200 and "controller_runtime_" in text and "resourceconsist_build_info" in text
        status, text = await asyncio.to_thread(_get, port, "/metrics", readers["nobody"])
        assert status == 403, text
        assert "Authorization denied for user system:serviceaccount:" in text
        assert (await asyncio.to_thread(_get, port, "/metrics", None))[0] == 401
        assert (await asyncio.to_thread(_get, port, "/metrics", "not-a-token"))[0] == 401
        # Plain HTTP is not served on the TLS port.
        assert (await asyncio.to_thread(_probe_plain, port)) is False

        # The answers are kept: scraping again sends no review.
        before = _reviews(client)
        for token in (readers["reader"], readers["nobody"], "not-a-token"):
            await asyncio.to_thread(_get, port, "/metrics", token)
        assert _reviews(client) == before


def _probe_plain(port: int) -> bool:
    """Whether the port answers plain HTTP."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5):
            return True
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False


async def test_kept_answers_expire_a_denial_sooner_than_an_allowance(
    kube_client: KubeClient, readers: dict[str, str]
) -> None:
    """The authorizer itself on a clock the test moves: a TokenReview's answer lasts a minute, a
    denying SubjectAccessReview 30 seconds, an allowing one 5 minutes (controller-runtime's)."""
    now = [1000.0]
    authorizer = MetricsAuthorizer(kube_client, SecureMetricsOptions(), clock=lambda: now[0])
    assert await authorizer.decide(f"Bearer {readers['reader']}", "GET", "/metrics") == (200, "")
    assert (await authorizer.decide(f"Bearer {readers['nobody']}", "GET", "/metrics"))[0] == 403
    assert authorizer.reviews == {"TokenReview": 2, "SubjectAccessReview": 2}
    now[0] += 31  # the denial is gone; the tokens and the allowance are kept
    await authorizer.decide(f"Bearer {readers['reader']}", "GET", "/metrics")
    await authorizer.decide(f"Bearer {readers['nobody']}", "GET", "/metrics")
    assert authorizer.reviews == {"TokenReview": 2, "SubjectAccessReview": 3}
    now[0] += 30  # 61 s: who each token is, asked again; the allowance still kept
    await authorizer.decide(f"Bearer {readers['reader']}", "GET", "/metrics")
    assert authorizer.reviews == {"TokenReview": 3, "SubjectAccessReview": 3}
    now[0] += 240  # 301 s: the allowance asked again
    await authorizer.decide(f"Bearer {readers['reader']}", "GET", "/metrics")
    assert authorizer.reviews == {"TokenReview": 4, "SubjectAccessReview": 4}
    # Another verb or path is another question.
    assert (await authorizer.decide(f"Bearer {readers['reader']}", "POST", "/metrics"))[0] == 403


async def test_a_cert_dir_is_served_and_followed_as_it_rotates(
    cluster: Cluster, readers: dict[str, str], run_manager: Any, tmp_path: Path
) -> None:
    ca = certs.make_ca("metrics-ca")

    def write(name: str) -> x509.Certificate:
        pair = certs.make_signed(ca, name, hosts=("127.0.0.1",))
        (tmp_path / "metrics.crt").write_bytes(pair.cert_pem)
        (tmp_path / "metrics.key").write_bytes(pair.key_pem)
        return pair.certificate()

    first = write("metrics-one")
    secure = SecureMetricsOptions(cert_path=str(tmp_path), cert_name="metrics.crt", key_name="metrics.key")
    async with run_manager(
        metrics_address=("127.0.0.1", 0), health_probe_address=("127.0.0.1", 0), secure_metrics=secure
    ) as manager:
        port = manager.metrics_port
        assert port is not None
        assert (await asyncio.to_thread(_served_certificate, port)).serial_number == first.serial_number
        assert (await asyncio.to_thread(_get, port, "/metrics", readers["reader"]))[0] == 200
        reads = manager.metrics.registry.get_sample_value("certwatcher_read_certificate_total") or 0
        assert reads >= 1
        second = write("metrics-two")

        async def rotated() -> bool:
            served = await asyncio.to_thread(_served_certificate, port)
            return served.serial_number == second.serial_number

        await async_wait_for(rotated, timeout=30, message="the rotated certificate served")
        assert (manager.metrics.registry.get_sample_value("certwatcher_read_certificate_total") or 0) > reads
        assert manager.metrics.registry.get_sample_value("certwatcher_read_certificate_errors_total") == 0


def test_secure_metrics_need_their_own_port() -> None:
    from resourceconsist.errors import InvalidOptions

    with pytest.raises(InvalidOptions, match="a port of their own") as refused:
        ManagerOptions(
            metrics_address=("", 8080), health_probe_address=("", 8080), secure_metrics=SecureMetricsOptions()
        )
    assert refused.value.fields == ("secure_metrics", "health_probe_address")
    with pytest.raises(InvalidOptions, match="a metrics address"):
        ManagerOptions(secure_metrics=SecureMetricsOptions())
    with pytest.raises(InvalidOptions, match="file name"):
        SecureMetricsOptions(cert_path="/certs", cert_name="a/tls.crt")
