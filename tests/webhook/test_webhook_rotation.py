"""Certificates that really rotate: the real kube-apiserver keeps admitting pods through the
webhook over TLS while the bootstrap renews the serving certificate and then the CA, with both CAs
in caBundle around the CA change (docs/webhook.md, "Certificates and their rotation").

The bootstrap's clock (``BootstrapOptions.clock``) decides when a renewal runs; the certificates
always carry real validity times, so the API server checks them as it would in production. The
Secret starts as an old installation left it: a CA made 1100 days ago, a serving certificate made
250 days ago (two thirds of a year have passed: its renewal is due)."""

from __future__ import annotations

import asyncio
import base64
import datetime
import itertools
import socket
import ssl
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

from resourceconsist import wire
from resourceconsist.adapters.alibabacloudslb import webhook_adapter as slb_webhook_adapter
from resourceconsist.adapters.alibabacloudslb.config import LOAD_BALANCER_ID_LABEL
from resourceconsist.cluster import certs, kube
from resourceconsist.cluster.kube import KubeClient, KubeObject
from resourceconsist.flow.cancellation import call_adapter
from resourceconsist.rules import lifecycle
from resourceconsist.testing import LocalControlPlane, async_wait_for
from resourceconsist.webhook import BootstrapOptions, BootstrapResult, WebhookOptions, serve, service_hosts
from resourceconsist.webhook.bootstrap import WebhookCertificates

DAY = datetime.timedelta(days=1)
NEVER = {"matchLabels": {"resourceconsist.test/never": "true"}}


def _served_certificate(port: int) -> bytes:
    """The DER certificate the webhook listener presents to a new connection."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return der


def _der(pem: bytes) -> bytes:
    return bytes(x509.load_pem_x509_certificate(pem).public_bytes(_DER))


_DER = Encoding.DER


def _bundle_certs(kc: KubeClient) -> list[list[bytes]]:
    """The CA certificates (DER) in every webhook entry's caBundle of both configurations."""
    found = []
    for resource, name in (
        (kube.MUTATING_WEBHOOK_CONFIGURATION, wire.MUTATING_WEBHOOK_CONFIGURATION),
        (kube.VALIDATING_WEBHOOK_CONFIGURATION, wire.VALIDATING_WEBHOOK_CONFIGURATION),
    ):
        for entry in kc.get(resource, None, name)["webhooks"]:
            pem = base64.b64decode(entry["clientConfig"]["caBundle"])
            found.append([bytes(c.public_bytes(_DER)) for c in x509.load_pem_x509_certificates(pem)])
    return found


async def test_pods_are_admitted_through_a_serving_renewal_and_a_ca_renewal(
    control_plane: LocalControlPlane, namespace: str, tmp_path: Path
) -> None:
    kc = KubeClient.from_kubeconfig(str(control_plane.kubeconfig))
    real_now = datetime.datetime.now(datetime.UTC)
    hosts = (*service_hosts("rc", namespace), "127.0.0.1")
    old_ca = certs.make_ca("resourceconsist-webhook-ca", validity=5 * 365 * DAY, now=real_now - 1100 * DAY)
    old_serving = certs.make_signed(
        old_ca, hosts[0], hosts=hosts, validity=365 * DAY, now=real_now - 250 * DAY
    )
    initial = WebhookCertificates(old_ca, old_serving)
    kc.create(
        kube.SECRET,
        namespace,
        {"metadata": {"name": wire.WEBHOOK_CERT_SECRET}, "data": initial.secret_data()},
    )

    offset = [datetime.timedelta(0)]

    def clock() -> datetime.datetime:
        return datetime.datetime.now(datetime.UTC) + offset[0]

    bootstrap = BootstrapOptions(
        namespace=namespace, service_name="rc", extra_hosts=("127.0.0.1",), interval=None, clock=clock
    )
    server = await serve(
        [slb_webhook_adapter()],
        WebhookOptions(
            host="127.0.0.1", port=0, cert_dir=tmp_path, bootstrap=bootstrap, cert_reload_interval=0.2
        ),
        client=kc,
    )
    labels = {wire.CONTROL_LABEL: wire.CONTROL_LABEL_VALUE, "app": "shop"}
    refused: list[str] = []
    admitted: list[str] = []
    stop = asyncio.Event()
    try:
        first = server.last_bootstrap
        assert first is not None and first.secret_action == "regenerated"  # the due serving renewal
        assert first.certificates.ca == old_ca and first.certificates.serving != old_serving
        path = server.paths[0]
        url_entry = {
            "name": "shop.pods.resourceconsist.test",
            "admissionReviewVersions": ["v1"],
            "clientConfig": {
                "url": f"https://127.0.0.1:{server.port}{path}",
                "caBundle": first.certificates.ca_bundle,
            },
            "rules": [
                {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}
            ],
            "objectSelector": {"matchLabels": {wire.CONTROL_LABEL: wire.CONTROL_LABEL_VALUE}},
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
            "sideEffects": "None",
            "failurePolicy": "Fail",
            "timeoutSeconds": 10,
        }
        never_entry = {
            **url_entry,
            "name": "never.pods.resourceconsist.test",
            "objectSelector": NEVER,
            "failurePolicy": "Ignore",
        }
        kc.create(
            kube.MUTATING_WEBHOOK_CONFIGURATION,
            None,
            {"metadata": {"name": wire.MUTATING_WEBHOOK_CONFIGURATION}, "webhooks": [url_entry]},
        )
        kc.create(
            kube.VALIDATING_WEBHOOK_CONFIGURATION,
            None,
            {"metadata": {"name": wire.VALIDATING_WEBHOOK_CONFIGURATION}, "webhooks": [never_entry]},
        )
        kc.create(
            kube.SERVICE,
            namespace,
            {
                "metadata": {"name": "shop", "labels": {**labels, LOAD_BALANCER_ID_LABEL: "lb-1"}},
                "spec": {"selector": {"app": "shop"}, "ports": [{"port": 80}]},
            },
        )
        numbers = itertools.count()

        async def admit_one() -> KubeObject | None:
            name = f"shop-{next(numbers)}"
            try:
                pod = await call_adapter(
                    kc.create,
                    kube.POD,
                    namespace,
                    {
                        "metadata": {"name": name, "labels": labels},
                        "spec": {"containers": [{"name": "c", "image": "x"}]},
                    },
                )
            except Exception as err:  # a refused admission: the API server could not reach us
                refused.append(f"{name}: {err}")
                return None
            if lifecycle.expected_finalizers(pod):
                admitted.append(name)
                return pod
            return None

        # The API server's informer may need a moment for the new configuration and Service.
        await async_wait_for(
            admit_one, timeout=30, interval=0.2, message="a first pod admitted by the webhook"
        )
        refused.clear()

        async def admit_continuously() -> None:
            while not stop.is_set():
                pod = await admit_one()
                if pod is None and not refused:
                    refused.append("a pod created without the webhook's entry")
                await asyncio.sleep(0.05)

        admitting = asyncio.create_task(admit_continuously())

        async def serves(certificates: WebhookCertificates) -> bool:
            want = _der(certificates.serving.cert_pem)
            return await asyncio.to_thread(_served_certificate, server.port) == want

        async def admitted_beyond(count: int) -> bool:
            return len(admitted) >= count + 3

        async def step(days: float, hours: float = 0.0) -> BootstrapResult:
            offset[0] = days * DAY + datetime.timedelta(hours=hours)
            result = await server.run_bootstrap()
            await async_wait_for(
                lambda: serves(result.certificates), timeout=30, message="the new certificate served"
            )
            seen = len(admitted)
            await async_wait_for(
                lambda: admitted_beyond(seen), timeout=60, message="pods admitted after the step"
            )
            return result

        # The renewed serving certificate (from the start-up pass) carries real times: a year.
        renewed = first.certificates.serving.certificate()
        assert renewed.not_valid_after_utc - renewed.not_valid_before_utc >= 364 * DAY
        assert abs(renewed.not_valid_before_utc + certs.BACKDATE - real_now) < datetime.timedelta(minutes=10)
        await async_wait_for(
            lambda: serves(first.certificates), timeout=30, message="the renewed certificate served"
        )

        # 120 days later the CA is past two thirds of its five years: a new CA joins the bundle,
        # the serving certificate stays (signed by the old CA, which is still trusted).
        added = await step(120)
        assert added.secret_action == "regenerated"
        assert added.certificates.ca != old_ca and added.certificates.previous_cas == (old_ca.cert_pem,)
        assert added.certificates.serving == first.certificates.serving
        both = [_der(added.certificates.ca.cert_pem), _der(old_ca.cert_pem)]
        assert _bundle_certs(kc) == [both, both]
        stored = base64.b64decode(kc.get(kube.SECRET, namespace, wire.WEBHOOK_CERT_SECRET)["data"]["ca.crt"])
        assert len(x509.load_pem_x509_certificates(stored)) == 2

        # The new CA was made just now (real time): from here the clock runs from the present.
        # Before the overlap has passed nothing more happens.
        assert (await step(0, hours=0.5)).secret_action == "reused"

        # After it, every configuration carrying both: the serving certificate is reissued by the new CA.
        reissued = await step(0, hours=1.5)
        assert reissued.certificates.serving != first.certificates.serving
        reissued.certificates.serving.certificate().verify_directly_issued_by(
            added.certificates.ca.certificate()
        )
        assert _bundle_certs(kc) == [both, both]

        # Once the old serving certificate can no longer be in use, the old CA goes.
        dropped = await step(0, hours=3)
        assert dropped.certificates.previous_cas == ()
        assert _bundle_certs(kc) == [[both[0]], [both[0]]]
        assert (await step(0, hours=4)).secret_action == "reused"

        stop.set()
        await admitting
        assert refused == []
        ca = added.certificates.ca.certificate()
        assert ca.not_valid_after_utc - ca.not_valid_before_utc >= 5 * 365 * DAY - datetime.timedelta(
            minutes=1
        )
    finally:
        stop.set()
        await server.stop()
        for resource, name in (
            (kube.MUTATING_WEBHOOK_CONFIGURATION, wire.MUTATING_WEBHOOK_CONFIGURATION),
            (kube.VALIDATING_WEBHOOK_CONFIGURATION, wire.VALIDATING_WEBHOOK_CONFIGURATION),
        ):
            if kc.get_or_none(resource, None, name) is not None:
                kc.delete(resource, None, name)
    print(f"admitted {len(admitted)} pods through both renewals, none refused")
