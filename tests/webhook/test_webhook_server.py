"""The webhook server against the real kube-apiserver, which calls it over TLS: pods arrive with
their employers' entries, dry runs and unlabelled pods are left alone, bad input gets a 400 or
a denial and the server keeps serving, adapters that fail or hang are answered in time, and a
replaced certificate is served to new connections."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import logging
import random
import re
import shutil
import socket
import ssl
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from kubernetes import client as k8s

from resourceconsist import wire
from resourceconsist.adapters.alibabacloudslb import webhook_adapter as slb_webhook_adapter
from resourceconsist.adapters.alibabacloudslb.config import LOAD_BALANCER_ID_LABEL
from resourceconsist.cluster import certs, kube
from resourceconsist.cluster.cache import CacheReader, InformerFactory
from resourceconsist.cluster.kube import ApiError, KubeClient, KubeObject
from resourceconsist.flow.cancellation import call_adapter
from resourceconsist.rules import lifecycle
from resourceconsist.testing import LocalControlPlane, async_wait_for
from resourceconsist.webhook import (
    AdmissionDecision,
    ControlledServiceAdapter,
    EmployerRef,
    WebhookOptions,
    WebhookServer,
)

POD_CREATE = [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}]
CONTROLLED = {wire.CONTROL_LABEL: wire.CONTROL_LABEL_VALUE}


class FailingAdapter:
    """A webhook adapter whose lookup fails, as one talking to a broken provider would."""

    name = "broken"

    def get_employers_by_employee(self, employee: KubeObject, reader: CacheReader) -> list[EmployerRef]:
        raise RuntimeError("provider unreachable")


class HangingAdapter:
    """An async webhook adapter that never answers."""

    name = "hanging"

    def __init__(self) -> None:
        self.never = asyncio.Event()

    async def get_employers_by_employee(self, employee: KubeObject, reader: CacheReader) -> list[EmployerRef]:
        await self.never.wait()
        return []


class FixedAdapter:
    """A blocking (plain-function) adapter naming one fixed employer."""

    name = "fixed"

    def get_employers_by_employee(self, employee: KubeObject, reader: CacheReader) -> list[EmployerRef]:
        return [EmployerRef("Service", employee["metadata"]["namespace"], "fixed")]


@pytest.fixture
def kc(control_plane: LocalControlPlane) -> KubeClient:
    return KubeClient.from_kubeconfig(str(control_plane.kubeconfig))


class Webhook:
    """A started WebhookServer with the decisions it made."""

    def __init__(self, server: WebhookServer, decisions: list[AdmissionDecision], ca: certs.KeyPair) -> None:
        self.server = server
        self.decisions = decisions
        self.ca = ca

    def seen(self, name: str) -> list[AdmissionDecision]:
        return [d for d in self.decisions if d.name == name]

    def client_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cadata=self.ca.cert_pem.decode())
        return ctx

    def url(self, path: str) -> str:
        return f"https://127.0.0.1:{self.server.port}{path}"


@contextlib.asynccontextmanager
async def _started(
    control_plane: LocalControlPlane, directory: Path, informers: InformerFactory
) -> AsyncIterator[Webhook]:
    """A WebhookServer of the test adapters on ``informers``, its certificate in ``directory``."""
    assert control_plane.ca is not None
    cert, key = control_plane.webhook_certificate()
    # Private copies: the cert-reload test rewrites them.
    cert_file, key_file = directory / "tls.crt", directory / "tls.key"
    shutil.copy(cert, cert_file)
    shutil.copy(key, key_file)
    decisions: list[AdmissionDecision] = []
    server = WebhookServer(
        [
            ControlledServiceAdapter("generic"),
            slb_webhook_adapter(),
            FailingAdapter(),
            HangingAdapter(),
            FixedAdapter(),
        ],
        WebhookOptions(
            host="127.0.0.1",
            port=0,
            cert_dir=directory,
            bootstrap=None,
            adapter_timeout=1.0,
            cert_reload_interval=0.05,
        ),
        informers=informers,
        own_informers=True,
        observer=decisions.append,
    )
    await server.start()
    try:
        await server.wait_ready(timeout=30)
        yield Webhook(server, decisions, control_plane.ca)
    finally:
        await server.stop()


@pytest.fixture
async def webhook(control_plane: LocalControlPlane, kc: KubeClient, tmp_path: Path) -> AsyncIterator[Webhook]:
    async with _started(control_plane, tmp_path, InformerFactory(kc)) as started:
        yield started


def _pod(name: str, labels: dict[str, str], annotations: dict[str, str] | None = None) -> KubeObject:
    meta: dict[str, Any] = {"name": name, "labels": labels}
    if annotations is not None:
        meta["annotations"] = annotations
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {"containers": [{"name": "c", "image": "x"}]},
    }


def _service(name: str, selector: dict[str, str], labels: dict[str, str]) -> KubeObject:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "labels": labels},
        "spec": {"selector": selector, "ports": [{"port": 80}]},
    }


@contextlib.asynccontextmanager
async def _install(
    control_plane: LocalControlPlane, kc: KubeClient, webhook: Webhook, namespace: str, path: str
) -> AsyncIterator[str]:
    """Register ``path`` with the API server for controlled pods in ``namespace``, wait until
    the API server calls it (it reads configurations asynchronously), remove it afterwards."""
    name = f"rc-test-{namespace}-{path.rsplit('-', 1)[-1]}"
    await asyncio.to_thread(
        control_plane.install_webhook,
        name,
        port=webhook.server.port,
        path=path,
        rules=POD_CREATE,
        object_selector={"matchLabels": CONTROLLED},
        namespace_selector={"matchLabels": {"kubernetes.io/metadata.name": namespace}},
    )
    probes = itertools.count()

    async def called() -> bool:
        probe = f"probe-{next(probes)}"
        # An adapter that denies makes the create fail; the recorded decision proves the call.
        with contextlib.suppress(ApiError):
            await call_adapter(kc.create, kube.POD, namespace, _pod(probe, {**CONTROLLED, "probe": "yes"}))
        return bool(webhook.seen(probe))

    try:
        await async_wait_for(called, timeout=30, interval=0.2, message=f"the API server to call {path}")
        yield name
    finally:
        await asyncio.to_thread(kc.delete, kube.MUTATING_WEBHOOK_CONFIGURATION, None, name)


async def test_apiserver_calls_us_and_pods_arrive_with_their_employers_entries(
    control_plane: LocalControlPlane, kc: KubeClient, webhook: Webhook, namespace: str
) -> None:
    for svc in (
        _service("web", {"app": "web"}, CONTROLLED),
        _service("web-canary", {"app": "web", "track": "canary"}, CONTROLLED),
        _service("uncontrolled", {"app": "web"}, {}),
        _service("other", {"app": "db"}, CONTROLLED),
    ):
        await call_adapter(kc.create, kube.SERVICE, namespace, svc)
    reader = webhook.server.reader
    labels = {**CONTROLLED, "app": "web", "track": "canary"}
    await async_wait_for(
        lambda: len(reader.services_selecting({"metadata": {"namespace": namespace, "labels": labels}})) == 3,
        timeout=10,
        message="the Service cache to hold the three Services selecting the pod",
    )
    async with _install(control_plane, kc, webhook, namespace, "/mutating-generic"):
        # Two controlled Services select it: both entries, nothing for the others.
        created = await call_adapter(kc.create, kube.POD, namespace, _pod("web-0", labels))
        entries = lifecycle.expected_finalizers(created)
        assert entries == {
            f"Service/{namespace}/web": lifecycle.lifecycle_finalizer("web"),
            f"Service/{namespace}/web-canary": lifecycle.lifecycle_finalizer("web-canary"),
        }
        (decision,) = webhook.seen("web-0")
        assert decision.allowed and decision.operation == "CREATE" and decision.namespace == namespace

        # An entry already on the pod is kept, and the stored value is, byte for byte, the one
        # lifecycle (the controller's implementation) computes for the same employers.
        foreign = {"Widget/elsewhere/x": "example.com/keep-me"}
        submitted = _pod(
            "web-1",
            labels,
            {
                wire.AVAILABLE_CONDITIONS_ANNOTATION: json.dumps({"expectedFinalizers": foreign}),
                "note": "kept",
            },
        )
        created = await call_adapter(kc.create, kube.POD, namespace, submitted)
        stored = created["metadata"]["annotations"]
        expected = lifecycle.updated_available_conditions(
            submitted,
            add={e.expected_finalizer_key: e.lifecycle_finalizer for e in webhook.seen("web-1")[0].employers},
        )
        assert stored[wire.AVAILABLE_CONDITIONS_ANNOTATION] == expected
        assert lifecycle.expected_finalizers(created)["Widget/elsewhere/x"] == "example.com/keep-me"
        assert stored["note"] == "kept"

        # generateName: the pod has no name yet when we see it; the entries still arrive.
        generated = await call_adapter(
            kc.create,
            kube.POD,
            namespace,
            {**_pod("", labels), "metadata": {"generateName": "gen-", "labels": labels}},
        )
        assert len(lifecycle.expected_finalizers(generated)) == 2
        assert webhook.seen("gen-*")

        # Without the control label the API server does not send the pod to us at all.
        # (Create returns after admission, so a call would already be recorded.)
        plain = await call_adapter(
            kc.create, kube.POD, namespace, _pod("plain", {"app": "web", "track": "canary"})
        )
        assert webhook.seen("plain") == []
        assert wire.AVAILABLE_CONDITIONS_ANNOTATION not in (plain["metadata"].get("annotations") or {})

        # A dry run is sent (sideEffects: None) and deliberately left untouched.
        core = k8s.CoreV1Api(control_plane.api_client())
        dry = await asyncio.to_thread(
            lambda: core.api_client.sanitize_for_serialization(
                core.create_namespaced_pod(namespace, _pod("dry", labels), dry_run="All")
            )
        )
        assert wire.AVAILABLE_CONDITIONS_ANNOTATION not in (dry["metadata"].get("annotations") or {})
        (dry_decision,) = webhook.seen("dry")
        assert dry_decision.dry_run and dry_decision.allowed and not dry_decision.patch
        assert await call_adapter(kc.get_or_none, kube.POD, namespace, "dry") is None


async def test_the_slb_adapter_keeps_services_that_name_a_load_balancer(
    kc: KubeClient, webhook: Webhook, namespace: str
) -> None:
    with_lb = {**CONTROLLED, LOAD_BALANCER_ID_LABEL: "lb-1"}
    await call_adapter(kc.create, kube.SERVICE, namespace, _service("slb", {"app": "a"}, with_lb))
    await call_adapter(kc.create, kube.SERVICE, namespace, _service("plain", {"app": "a"}, CONTROLLED))
    await call_adapter(
        kc.create,
        kube.SERVICE,
        namespace,
        _service("uncontrolled-slb", {"app": "a"}, {LOAD_BALANCER_ID_LABEL: "x"}),
    )
    reader = webhook.server.reader
    pod = {"metadata": {"namespace": namespace, "labels": {"app": "a"}}}
    await async_wait_for(
        lambda: len(reader.services_selecting(pod)) == 3, timeout=10, message="3 Services cached"
    )
    assert slb_webhook_adapter().get_employers_by_employee(pod, reader) == [
        EmployerRef("Service", namespace, "slb")
    ]
    assert ControlledServiceAdapter("generic").get_employers_by_employee(pod, reader) == [
        EmployerRef("Service", namespace, "plain"),
        EmployerRef("Service", namespace, "slb"),
    ]


async def test_an_adapter_error_denies_the_pod_with_the_cause(
    control_plane: LocalControlPlane, kc: KubeClient, webhook: Webhook, namespace: str
) -> None:
    async with _install(control_plane, kc, webhook, namespace, "/mutating-broken"):
        with pytest.raises(ApiError) as err:
            await call_adapter(kc.create, kube.POD, namespace, _pod("victim", CONTROLLED))
        assert "provider unreachable" in err.value.message
        assert "webhook adapter broken failed" in err.value.message
        (decision,) = webhook.seen("victim")
        assert not decision.allowed and decision.code == 500


# -- raw HTTP ---------------------------------------------------------------------------------


def _review_body(obj: Any = None, **request: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "uid": "uid-1",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "operation": "CREATE",
        "namespace": "ns",
        "object": obj if obj is not None else _pod("p", {"app": "x"}),
    }
    base.update(request)
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": base}


async def _post(
    session: aiohttp.ClientSession,
    webhook: Webhook,
    path: str,
    body: bytes,
    content_type: str = "application/json",
) -> tuple[int, Any]:
    """The status and the JSON answer (its text when it is not JSON, e.g. aiohttp's 500 page)."""
    async with session.post(
        webhook.url(path), data=body, headers={"Content-Type": content_type}, ssl=webhook.client_context()
    ) as resp:
        text = await resp.text()
        try:
            return resp.status, json.loads(text)
        except ValueError:
            return resp.status, text


async def _good_request_succeeds(session: aiohttp.ClientSession, webhook: Webhook) -> None:
    status, review = await _post(session, webhook, "/mutating-fixed", json.dumps(_review_body()).encode())
    assert status == 200 and review["response"]["allowed"] is True
    patch = json.loads(base64.b64decode(review["response"]["patch"]))
    assert patch[0]["value"][wire.AVAILABLE_CONDITIONS_ANNOTATION].startswith('{"expectedFinalizers":')


async def test_bad_input_gets_400_or_a_denial_and_the_server_keeps_serving(webhook: Webhook) -> None:
    bad_bodies: Sequence[tuple[str, bytes, str, str]] = [
        ("garbage", b"\x00\xff\xfe not json at all", "application/json", "not JSON"),
        (
            "wrong apiVersion",
            json.dumps({**_review_body(), "apiVersion": "admission.k8s.io/v1beta1"}).encode(),
            "application/json",
            "apiVersion",
        ),
        (
            "no request",
            b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}',
            "application/json",
            "request",
        ),
        ("no uid", json.dumps(_review_body(uid="")).encode(), "application/json", "uid"),
        ("huge", b"[" + b"0," * (4 * 1024 * 1024) + b"0]", "application/json", "exceeds the limit"),
        ("form", b"a=b", "application/x-www-form-urlencoded", "Content-Type"),
    ]
    async with aiohttp.ClientSession() as session:
        await _good_request_succeeds(session, webhook)
        for what, body, content_type, message in bad_bodies:
            status, answer = await _post(session, webhook, "/mutating-fixed", body, content_type)
            assert status == 400, what
            assert answer["kind"] == "Status" and answer["code"] == 400, what
            assert message in answer["message"], (what, answer["message"])
            await _good_request_succeeds(session, webhook)

        # A pod that does not parse, or a malformed annotation: denied with the reason.
        for what, obj, message in [
            ("metadata not an object", {"metadata": "nope"}, "not a valid Pod"),
            ("labels not strings", {"metadata": {"name": "p", "labels": {"a": 1}}}, "not a valid Pod"),
            (
                "malformed annotation",
                _pod("p", {}, {wire.AVAILABLE_CONDITIONS_ANNOTATION: "{not json"}),
                "not valid",
            ),
        ]:
            status, review = await _post(
                session, webhook, "/mutating-fixed", json.dumps(_review_body(obj)).encode()
            )
            assert status == 200, what
            response = review["response"]
            assert response["uid"] == "uid-1" and response["allowed"] is False, what
            assert response["status"]["code"] == 400 and message in response["status"]["message"], what
            await _good_request_succeeds(session, webhook)

        # Too large without a Content-Length (chunked): cut off while reading.
        async def chunks() -> AsyncIterator[bytes]:
            for _ in range(8):
                yield b" " * (1024 * 1024)

        async with session.post(
            webhook.url("/mutating-fixed"),
            data=chunks(),
            headers={"Content-Type": "application/json"},
            ssl=webhook.client_context(),
        ) as resp:
            assert resp.status == 400
            assert "exceeds the limit" in (await resp.json())["message"]
        await _good_request_succeeds(session, webhook)

        # An unknown path: 404 with a Status naming what is served.
        status, answer = await _post(session, webhook, "/mutating-nope", json.dumps(_review_body()).encode())
        assert status == 404 and "/mutating-generic" in answer["message"]
        assert webhook.server.bad_requests == len(bad_bodies) + 2


async def test_other_kinds_operations_and_dry_runs_pass_untouched(webhook: Webhook) -> None:
    cases = {
        "service": _review_body(
            {"metadata": {"name": "s"}}, kind={"group": "", "version": "v1", "kind": "Service"}
        ),
        "update": _review_body(operation="UPDATE", oldObject=_pod("p", {})),
        "delete": _review_body(operation="DELETE", object=None),
        "status": _review_body(subResource="status"),
        "dry-run": _review_body(dryRun=True),
    }
    async with aiohttp.ClientSession() as session:
        for what, body in cases.items():
            status, review = await _post(session, webhook, "/mutating-fixed", json.dumps(body).encode())
            assert status == 200, what
            assert review["response"] == {"uid": "uid-1", "allowed": True}, what


async def test_a_hanging_adapter_is_answered_within_the_timeout(webhook: Webhook) -> None:
    async with aiohttp.ClientSession() as session:
        # The API server's own ?timeout= bounds the call too (80% of it).
        started = asyncio.get_running_loop().time()
        status, review = await _post(
            session, webhook, "/mutating-hanging?timeout=1s", json.dumps(_review_body()).encode()
        )
        assert asyncio.get_running_loop().time() - started < 1.0
        assert status == 200 and review["response"]["allowed"] is False
        assert review["response"]["status"]["code"] == 504
        assert "within 0.8s" in review["response"]["status"]["message"]
        await _good_request_succeeds(session, webhook)


async def test_health_and_readiness(webhook: Webhook) -> None:
    async with aiohttp.ClientSession() as session:
        for path in ("/healthz", "/readyz"):
            async with session.get(webhook.url(path), ssl=webhook.client_context()) as resp:
                assert resp.status == 200 and await resp.text() == "ok"
    assert webhook.server.paths == (
        "/mutating-alibabacloudslb",
        "/mutating-broken",
        "/mutating-fixed",
        "/mutating-generic",
        "/mutating-hanging",
    )


# -- TLS ---------------------------------------------------------------------------------------


def _peer_certificate(
    port: int, ca: certs.KeyPair, *, tls12_only: bool = False, ec_only: bool = False
) -> bytes | None:
    """A new TLS connection's server certificate (DER); no SNI, as for an IP address. With
    ``ec_only`` the client accepts ECDSA certificates only; None when the handshake fails."""
    ctx = ssl.create_default_context(cadata=ca.cert_pem.decode())
    ctx.check_hostname = False
    if tls12_only or ec_only:
        ctx.maximum_version = ssl.TLSVersion.TLSv1_2
    if ec_only:
        ctx.set_ciphers("ECDHE-ECDSA-AES128-GCM-SHA256")
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        try:
            tls = ctx.wrap_socket(raw)
        except ssl.SSLError:
            return None
        with tls:
            der = tls.getpeercert(binary_form=True)
            assert der is not None
            return der


def _rsa_signed(ca: certs.KeyPair) -> certs.KeyPair:
    """An RSA serving certificate for 127.0.0.1 signed by ``ca`` (certs makes EC keys only)."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec, rsa
    from cryptography.x509.oid import NameOID

    ca_key = serialization.load_pem_private_key(ca.key_pem, password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "webhook-rsa")]))
        .issuer_name(ca.certificate().subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False
        )
        .sign(ca_key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return certs.KeyPair(cert.public_bytes(serialization.Encoding.PEM), key_pem)


def _der(pair: certs.KeyPair) -> bytes:
    from cryptography.hazmat.primitives.serialization import Encoding

    return pair.certificate().public_bytes(Encoding.DER)


async def test_replaced_certificate_files_are_served_to_new_connections(
    control_plane: LocalControlPlane, webhook: Webhook
) -> None:
    assert control_plane.ca is not None
    tls = webhook.server.tls
    assert tls.listener_context.minimum_version == ssl.TLSVersion.TLSv1_2
    first = tls.cert_file.read_bytes()
    port = webhook.server.port
    seen = await asyncio.to_thread(_peer_certificate, port, webhook.ca)
    assert seen == _der(certs.KeyPair(first, b""))
    assert await asyncio.to_thread(_peer_certificate, port, webhook.ca, tls12_only=True) == seen
    assert await asyncio.to_thread(_peer_certificate, port, webhook.ca, ec_only=True) == seen

    # Rotated to a new pair, half-written first: the new key with the old certificate does
    # not load, so the old certificate keeps being served.
    fresh = certs.make_signed(control_plane.ca, "webhook-rotated", hosts=("127.0.0.1", "localhost"))
    tls.key_file.write_bytes(fresh.key_pem)
    assert await asyncio.to_thread(tls.load) is False
    assert await asyncio.to_thread(_peer_certificate, port, webhook.ca) == seen

    tls.cert_file.write_bytes(fresh.cert_pem)
    await async_wait_for(
        lambda: asyncio.to_thread(lambda: _peer_certificate(port, webhook.ca) == _der(fresh)),
        timeout=10,
        message="a new connection to see the rotated certificate",
    )

    # Then to an RSA pair (say, from another issuer): only the new one is served, never the
    # previous EC certificate next to it.
    rsa_pair = _rsa_signed(control_plane.ca)
    tls.key_file.write_bytes(rsa_pair.key_pem)
    tls.cert_file.write_bytes(rsa_pair.cert_pem)
    await async_wait_for(
        lambda: asyncio.to_thread(lambda: _peer_certificate(port, webhook.ca) == _der(rsa_pair)),
        timeout=10,
        message="a new connection to see the RSA certificate",
    )
    assert await asyncio.to_thread(_peer_certificate, port, webhook.ca, ec_only=True) is None

    # And the API server's kind of client keeps working across the rotation.
    async with aiohttp.ClientSession() as session:
        await _good_request_succeeds(session, webhook)


# -- fuzzing -----------------------------------------------------------------------------------


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path in a JSON document, the document's own (``()``) first."""
    found = [prefix]
    if isinstance(node, dict):
        for key, value in node.items():
            found += _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            found += _paths(value, (*prefix, index))
    return found


def _mutations(seed: int, count: int) -> list[bytes]:
    """``count`` random mutations of a valid AdmissionReview (seeded, so a failure replays):
    values swapped for other types, keys dropped or added, the JSON truncated or bytes flipped."""
    rng = random.Random(seed)
    odd_values: list[Any] = [
        None,
        0,
        -1,
        2**70,
        1.5,
        True,
        "",
        "x" * 10_000,
        "\u0000\ud7ff",
        [],
        [None],
        {},
        {"a": {"b": {"c": []}}},
    ]

    bodies: list[bytes] = []
    for _ in range(count):
        review = _review_body(_pod("p", {"app": "x"}, {"note": "n"}))
        review["request"]["oldObject"] = _pod("old", {})
        target = rng.choice(_paths(review)[1:])
        parent: Any = review
        for step in target[:-1]:
            parent = parent[step]
        action = rng.randrange(5)
        if action == 0:
            parent[target[-1]] = rng.choice(odd_values)
        elif action == 1 and isinstance(parent, dict):
            del parent[target[-1]]
        elif action == 2 and isinstance(parent, dict):
            parent[rng.choice(["extra", "", "kind", "uid", "metadata"])] = rng.choice(odd_values)
        raw = json.dumps(review).encode()
        if action == 3:
            raw = raw[: rng.randrange(len(raw))]
        elif action == 4:
            flipped = bytearray(raw)
            for _ in range(rng.randint(1, 8)):
                flipped[rng.randrange(len(flipped))] = rng.randrange(256)
            raw = bytes(flipped)
        bodies.append(raw)
    return bodies


def _no_op_or_refusal(status: int, answer: Any, what: str) -> None:
    """A 400 Status, or a 200 review that allows without a patch or denies with code 400."""
    assert status in (200, 400), (what, status, answer)
    if status == 400:
        assert answer["kind"] == "Status" and answer["code"] == 400, what
        return
    response = answer["response"]
    if response["allowed"]:
        assert "patch" not in response, what
    else:
        assert response["status"]["code"] == 400, (what, response)


async def test_fuzzed_reviews_get_400s_or_no_op_answers_and_the_server_keeps_serving(
    webhook: Webhook,
) -> None:
    valid = _review_body()
    named: list[tuple[str, bytes]] = [
        ("garbage", bytes(range(256)) * 4),
        ("empty", b""),
        ("10 MB", b'{"apiVersion":"admission.k8s.io/v1","pad":"' + b"x" * (10 * 1024 * 1024) + b'"}'),
        ("wrong apiVersion", json.dumps({**valid, "apiVersion": "admission.k8s.io/v2"}).encode()),
        ("missing request", json.dumps({k: v for k, v in valid.items() if k != "request"}).encode()),
        ("wrong kind", json.dumps({**valid, "kind": "Pod"}).encode()),
        ("JSON null", b"null"),
        ("JSON list", b"[1,2,3]"),
    ]
    named += [(f"mutation {i} (seed 12)", body) for i, body in enumerate(_mutations(12, 300))]
    async with aiohttp.ClientSession() as session:
        for start in range(0, len(named), 25):
            for what, body in named[start : start + 25]:
                # /mutating-generic: no Service selects anything in namespace "ns", so a review
                # that is valid after all is allowed without a patch.
                status, answer = await _post(session, webhook, "/mutating-generic", body)
                _no_op_or_refusal(status, answer, what)
            await _good_request_succeeds(session, webhook)


# -- bad input on the injection paths ------------------------------------------------------------
#
# The reviews below reach the readiness-gate and preStop injection: their namespace is opted in
# and a controlled Service there selects the pod and asks for its gate and a drain time, so a
# valid review gets the entry, the gate and the hooks (docs/zero-downtime.md). A malformed one
# must be denied with code 400 naming the field, never admitted without them.

DRAIN = 7
AVAILABLE = wire.AVAILABLE_CONDITIONS_ANNOTATION
FOREIGN_ENTRY = {"Widget/elsewhere/x": "example.com/keep-me"}


@pytest.fixture
async def opted_in(kc: KubeClient, webhook: Webhook, namespace: str) -> str:
    """``namespace`` labelled for injection, with the controlled Service ``web`` selecting
    ``app: web`` that asks for its readiness gate and a drain time, once the webhook's caches
    hold both."""
    inject = {wire.READINESS_GATE_INJECT_LABEL: wire.READINESS_GATE_INJECT_VALUE}
    await call_adapter(kc.patch, kube.NAMESPACE, None, namespace, {"metadata": {"labels": inject}})
    service = _service("web", {"app": "web"}, CONTROLLED)
    service["metadata"]["annotations"] = {
        wire.READINESS_GATE_ANNOTATION: "true",
        wire.DRAIN_SECONDS_ANNOTATION: str(DRAIN),
    }
    await call_adapter(kc.create, kube.SERVICE, namespace, service)
    probe: KubeObject = {"metadata": {"namespace": namespace, "labels": {"app": "web"}}}
    employers = ControlledServiceAdapter("generic").get_employers_by_employee
    await async_wait_for(
        lambda: (
            employers(probe, webhook.server.reader) == [EmployerRef("Service", namespace, "web")]
            and employers(probe, webhook.server.reader)[0].readiness_gate
        ),
        timeout=30,
        message="the webhook's caches to hold the opted-in namespace and the Service",
    )
    return namespace


def _guarded_pod(namespace: str) -> KubeObject:
    """A pod the Service ``web`` selects, with something already in every place the webhook
    writes to: a foreign entry, a gate of its own, one container with its own preStop hook, one
    with an empty lifecycle, one with none, and a grace period."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "p",
            "namespace": namespace,
            "labels": {**CONTROLLED, "app": "web"},
            "annotations": {"note": "n", AVAILABLE: json.dumps({"expectedFinalizers": FOREIGN_ENTRY})},
        },
        "spec": {
            "readinessGates": [{"conditionType": "example.com/warm"}],
            "containers": [
                {"name": "a", "image": "x"},
                {"name": "b", "image": "x", "lifecycle": {"preStop": {"exec": {"command": ["drain"]}}}},
                {"name": "c", "image": "x", "lifecycle": {}},
            ],
            "terminationGracePeriodSeconds": 10,
        },
    }


def _pointer(path: str) -> list[str]:
    assert path.startswith("/"), path
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _apply_patch(obj: KubeObject, patch: list[dict[str, Any]]) -> KubeObject:
    """Apply a JSONPatch as strictly as RFC 6902 says for the two operations the webhook uses:
    ``add`` needs an existing parent (an object, or a list with an index or ``-``), ``replace``
    an existing member. An invalid patch fails the assertion, as the API server would refuse it."""
    out = json.loads(json.dumps(obj))
    for op in patch:
        *parents, last = _pointer(op["path"])
        node: Any = out
        for step in parents:
            node = node[int(step)] if isinstance(node, list) else node[step]
        assert op["op"] in ("add", "replace"), op
        if isinstance(node, list):
            assert op["op"] == "add" and last == "-", op
            node.append(op["value"])
        else:
            assert isinstance(node, dict), (op, node)
            assert op["op"] == "add" or last in node, op
            node[last] = op["value"]
    return out


def _assert_guarded(pod: KubeObject, employers: Sequence[EmployerRef], what: str) -> None:
    """The admitted pod carries what each employer asks: its entry (foreign ones kept), its gate,
    and a preStop hook in every container with the grace period raised by the drain time."""
    entries = lifecycle.expected_finalizers(pod)
    for employer in employers:
        assert entries.get(employer.expected_finalizer_key) == employer.lifecycle_finalizer, what
        if employer.readiness_gate:
            assert employer.gate in lifecycle.readiness_gates(pod), what
    drain = max((e.drain_seconds or 0 for e in employers), default=0)
    if drain:
        for container in pod["spec"].get("containers") or []:
            assert (container.get("lifecycle") or {}).get("preStop") is not None, (what, container)


def _as_dict(node: Any, key: str) -> dict[str, Any]:
    found = node.get(key) if isinstance(node, dict) else None
    return found if isinstance(found, dict) else {}


def _selected(body: bytes, namespace: str) -> bool:
    """Whether this body is a pod CREATE the Service ``web`` selects, to be answered with its
    guard (an oracle written from the review, independent of what the webhook decided)."""
    try:
        review = json.loads(body)
    except ValueError:
        return False
    request = _as_dict(review, "request")
    kind = _as_dict(request, "kind")
    meta = _as_dict(_as_dict(request, "object"), "metadata")
    ns = request.get("namespace") or meta.get("namespace")
    return (
        kind.get("kind") == "Pod"
        and not kind.get("group")
        and request.get("operation") == "CREATE"
        and not request.get("dryRun")
        and not request.get("subResource")
        and _as_dict(meta, "labels").get("app") == "web"
        and ns == namespace
    )


_NAMES_A_FIELD = re.compile(r"^request\.object (is missing|is not a valid Pod: \S)")


def _refused_or_guarded(
    status: int, answer: Any, body: bytes, decisions: list[AdmissionDecision], namespace: str, what: str
) -> None:
    """A 400 Status; or a 200 review that denies with code 400 naming a field, or allows with a
    patch that applies and carries the guard of every employer (none left out when the Service
    selects the pod)."""
    assert status in (200, 400), (what, status, answer)
    if status == 400:
        assert answer["kind"] == "Status" and answer["code"] == 400 and answer["message"], (what, answer)
        return
    response = answer["response"]
    decision = decisions[-1]
    assert response["uid"] == decision.uid, what
    if not response["allowed"]:
        assert response["status"]["code"] == 400, (what, response)
        assert _NAMES_A_FIELD.match(response["status"]["message"]), (what, response)
        return
    if _selected(body, namespace):
        assert EmployerRef("Service", namespace, "web") in decision.employers, (what, decision)
    if not decision.employers:
        assert "patch" not in response, (what, response)
        return
    assert response["patchType"] == "JSONPatch", what
    patch = json.loads(base64.b64decode(response["patch"]))
    pod = _apply_patch(json.loads(body)["request"]["object"], patch)
    _assert_guarded(pod, decision.employers, what)


async def test_a_valid_review_in_an_opted_in_namespace_gets_the_entry_the_gate_and_the_hooks(
    webhook: Webhook, opted_in: str
) -> None:
    obj = _guarded_pod(opted_in)
    body = json.dumps(_review_body(obj, namespace=opted_in)).encode()
    async with aiohttp.ClientSession() as session:
        status, review = await _post(session, webhook, "/mutating-generic", body)
    assert status == 200 and review["response"]["allowed"] is True
    pod = _apply_patch(obj, json.loads(base64.b64decode(review["response"]["patch"])))
    gate = lifecycle.readiness_gate("web")
    assert lifecycle.expected_finalizers(pod) == {
        **FOREIGN_ENTRY,
        f"Service/{opted_in}/web": lifecycle.lifecycle_finalizer("web"),
    }
    assert lifecycle.readiness_gates(pod) == ["example.com/warm", gate]
    a, b, c = pod["spec"]["containers"]
    assert a["lifecycle"] == c["lifecycle"] == {"preStop": {"sleep": {"seconds": DRAIN}}}
    assert b["lifecycle"] == obj["spec"]["containers"][1]["lifecycle"]  # its own hook stays
    assert pod["spec"]["terminationGracePeriodSeconds"] == 10 + DRAIN


def _set(path: str | tuple[str, ...], value: Any) -> Callable[[KubeObject], None]:
    """Set the pod's field at a dotted path (list indexes as numbers), or at the path of
    ``path``'s parts, to ``value``."""

    def change(pod: KubeObject) -> None:
        *parents, last = path.split(".") if isinstance(path, str) else path
        node: Any = pod
        for step in parents:
            node = node[int(step)] if isinstance(node, list) else node[step]
        node[int(last) if isinstance(node, list) else last] = value

    return change


def _drop(path: str) -> Callable[[KubeObject], None]:
    def change(pod: KubeObject) -> None:
        *parents, last = path.split(".")
        node: Any = pod
        for step in parents:
            node = node[step]
        del node[last]

    return change


def _annotation(value: str) -> Callable[[KubeObject], None]:
    def change(pod: KubeObject) -> None:
        pod["metadata"]["annotations"][AVAILABLE] = value

    return change


_ANNOTATION_PATH = f'metadata.annotations["{AVAILABLE}"]'

#: The known bad shapes of a pod: (what, how, the path the denial names).
BAD_PODS: list[tuple[str, Callable[[KubeObject], None], str]] = [
    ("readinessGates [1]", _set("spec.readinessGates", [1]), "spec.readinessGates[0]"),
    ("readinessGates 'x'", _set("spec.readinessGates", "x"), "spec.readinessGates"),
    ("readinessGates an object", _set("spec.readinessGates", {"conditionType": "a"}), "spec.readinessGates"),
    ("readinessGates [null]", _set("spec.readinessGates", [None]), "spec.readinessGates[0]"),
    (
        "a gate without conditionType",
        _set("spec.readinessGates", [{}]),
        "spec.readinessGates[0].conditionType",
    ),
    (
        "an empty conditionType",
        _set("spec.readinessGates.0.conditionType", ""),
        "spec.readinessGates[0].conditionType",
    ),
    (
        "a numeric conditionType",
        _set("spec.readinessGates.0.conditionType", 1),
        "spec.readinessGates[0].conditionType",
    ),
    ("containers 'x'", _set("spec.containers", "x"), "spec.containers"),
    ("containers [1]", _set("spec.containers", [1]), "spec.containers[0]"),
    ("a second container null", _set("spec.containers.1", None), "spec.containers[1]"),
    ("lifecycle 'x'", _set("spec.containers.0.lifecycle", "x"), "spec.containers[0].lifecycle"),
    ("lifecycle []", _set("spec.containers.2.lifecycle", []), "spec.containers[2].lifecycle"),
    (
        "preStop 'sleep'",
        _set("spec.containers.2.lifecycle.preStop", "sleep"),
        "spec.containers[2].lifecycle.preStop",
    ),
    ("preStop [1]", _set("spec.containers.1.lifecycle.preStop", [1]), "spec.containers[1].lifecycle.preStop"),
    ("grace '30'", _set("spec.terminationGracePeriodSeconds", "30"), "spec.terminationGracePeriodSeconds"),
    ("grace 1.5", _set("spec.terminationGracePeriodSeconds", 1.5), "spec.terminationGracePeriodSeconds"),
    ("grace true", _set("spec.terminationGracePeriodSeconds", True), "spec.terminationGracePeriodSeconds"),
    ("grace 2**70", _set("spec.terminationGracePeriodSeconds", 2**70), "spec.terminationGracePeriodSeconds"),
    ("spec []", _set("spec", []), "spec"),
    ("no spec", _drop("spec"), "spec"),
    ("metadata 'x'", _set("metadata", "x"), "metadata"),
    ("no metadata", _drop("metadata"), "metadata"),
    ("labels ['app']", _set("metadata.labels", ["app"]), "metadata.labels"),
    ("a numeric label", _set("metadata.labels.app", 1), "metadata.labels.app"),
    (
        "a null control label",
        _set(("metadata", "labels", wire.CONTROL_LABEL), None),
        f'metadata.labels["{wire.CONTROL_LABEL}"]',
    ),
    ("annotations 'x'", _set("metadata.annotations", "x"), "metadata.annotations"),
    ("a null annotation", _set("metadata.annotations.note", None), "metadata.annotations.note"),
    ("namespace 1", _set("metadata.namespace", 1), "metadata.namespace"),
    ("name {}", _set("metadata.name", {}), "metadata.name"),
    ("generateName []", _set("metadata.generateName", []), "metadata.generateName"),
    ("annotation not JSON", _annotation("{not json"), _ANNOTATION_PATH),
    ("annotation a list", _annotation('["a"]'), _ANNOTATION_PATH),
    ("annotation entries not strings", _annotation('{"expectedFinalizers": {"k": 1}}'), _ANNOTATION_PATH),
    ("annotation entries a list", _annotation('{"expectedFinalizers": []}'), _ANNOTATION_PATH),
    (
        "annotation escaping a lone surrogate",
        _annotation('{"expectedFinalizers": {"\\ud800": "f"}}'),
        _ANNOTATION_PATH,
    ),
]


async def test_each_known_bad_shape_of_a_pod_is_denied_with_400_naming_its_field(
    webhook: Webhook, opted_in: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="resourceconsist.webhook")
    async with aiohttp.ClientSession() as session:
        for what, change, path in BAD_PODS:
            obj = _guarded_pod(opted_in)
            change(obj)
            caplog.clear()
            body = json.dumps(_review_body(obj, namespace=opted_in)).encode()
            status, review = await _post(session, webhook, "/mutating-generic", body)
            assert status == 200, (what, status, review)
            response = review["response"]
            assert response["allowed"] is False and "patch" not in response, what
            assert response["status"]["code"] == 400 and response["status"]["reason"] == "BadRequest", what
            message = response["status"]["message"]
            assert message.startswith(f"request.object is not a valid Pod: {path}: "), (what, message)
            # One line for the operator, with the field; no traceback, nothing at ERROR.
            (record,) = [r for r in caplog.records if r.name == "resourceconsist.webhook"]
            assert record.levelno == logging.WARNING and record.exc_info is None, what
            assert path in record.getMessage() and "\n" not in record.getMessage(), what
            assert not [r for r in caplog.records if r.levelno >= logging.ERROR], what
        # A pod CREATE without its pod says so.
        body = json.dumps(_review_body(namespace=opted_in, object=None)).encode()
        status, review = await _post(session, webhook, "/mutating-generic", body)
        assert status == 200 and review["response"]["status"]["code"] == 400
        assert (
            review["response"]["status"]["message"]
            == "request.object is missing: a pod CREATE carries the pod"
        )
        # And the server still mutates a good pod after all of them.
        status, review = await _post(
            session,
            webhook,
            "/mutating-generic",
            json.dumps(_review_body(_guarded_pod(opted_in), namespace=opted_in)).encode(),
        )
        assert status == 200 and review["response"]["allowed"] is True and review["response"]["patch"]


def _envelope(change: Callable[[dict[str, Any]], None]) -> bytes:
    review = _review_body()
    change(review)
    return json.dumps(review).encode()


def _in_request(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda review: review["request"].__setitem__(key, value)


#: The known bad shapes of an AdmissionReview: (what, body, what the 400's message says).
BAD_ENVELOPES: list[tuple[str, bytes, str]] = [
    ("not JSON", b'{"apiVersion": ', "the body is not JSON"),
    ("a list", b"[1]", "the body: must be an object"),
    ("null", b"null", "the body: must be an object"),
    ("a string", b'"AdmissionReview"', "the body: must be an object"),
    ("wrong apiVersion", _envelope(lambda r: r.__setitem__("apiVersion", "v1")), "apiVersion: must be"),
    ("wrong kind", _envelope(lambda r: r.__setitem__("kind", "Pod")), "kind: must be"),
    ("no request", _envelope(lambda r: r.pop("request")), "request: is missing"),
    ("request a list", _envelope(lambda r: r.__setitem__("request", [])), "request: must be an object"),
    ("no uid", _envelope(lambda r: r["request"].pop("uid")), "request.uid: is missing"),
    ("uid a number", _envelope(_in_request("uid", 1)), "request.uid: must be a string"),
    ("empty uid", _envelope(_in_request("uid", "")), "request.uid: must not be empty"),
    ("kind a string", _envelope(_in_request("kind", "Pod")), "request.kind: must be an object"),
    ("kind without kind", _envelope(_in_request("kind", {"version": "v1"})), "request.kind.kind: is missing"),
    ("operation PATCH", _envelope(_in_request("operation", "PATCH")), "request.operation: must be"),
    ("object a string", _envelope(_in_request("object", "pod")), "request.object: must be an object"),
    ("object a list", _envelope(_in_request("object", [])), "request.object: must be an object"),
    ("dryRun 'yes'", _envelope(_in_request("dryRun", "yes")), "request.dryRun: must be true or false"),
    ("dryRun 1", _envelope(_in_request("dryRun", 1)), "request.dryRun: must be true or false"),
    ("namespace a number", _envelope(_in_request("namespace", 1)), "request.namespace: must be a string"),
    (
        "subResource null",
        _envelope(_in_request("subResource", None)),
        "request.subResource: must be a string",
    ),
]


async def test_each_known_bad_shape_of_a_review_gets_400_with_a_status_naming_it(webhook: Webhook) -> None:
    async with aiohttp.ClientSession() as session:
        for what, body, message in BAD_ENVELOPES:
            status, answer = await _post(session, webhook, "/mutating-generic", body)
            assert status == 400, (what, status, answer)
            assert answer["kind"] == "Status" and answer["apiVersion"] == "v1", what
            assert answer["code"] == 400 and answer["reason"] == "BadRequest", what
            assert message in answer["message"], (what, answer["message"])
        await _good_request_succeeds(session, webhook)


#: Values the fuzz puts where the pod had something else: other types, and the shapes of the
#: fields next to it (a gate where a container was, a hook where a gate was).
ODD_VALUES: list[Any] = [
    None,
    0,
    -1,
    1.5,
    2**70,
    True,
    "",
    "x",
    "x" * 5000,
    "\u00e9\u2028",
    [],
    [1],
    ["x"],
    [None],
    [{}],
    {},
    {"conditionType": 1},
    {"conditionType": ""},
    {"preStop": "x"},
    {"preStop": None},
    {"lifecycle": []},
    {"sleep": {"seconds": "7"}},
    {"a": {"b": {"c": []}}},
]
KEYS = ["extra", "", "conditionType", "lifecycle", "preStop", "readinessGates", "containers", "labels"]


def _injection_mutations(seed: int, count: int, namespace: str) -> list[bytes]:
    """``count`` seeded mutations of a review that reaches the injection, one to three changes
    each, mostly inside the pod: a value swapped for an odd one or for another part of the
    pod, a key dropped or added, an item appended; now and then the JSON truncated."""
    rng = random.Random(seed)
    bodies: list[bytes] = []
    for _ in range(count):
        review: Any = _review_body(_guarded_pod(namespace), namespace=namespace)
        for _ in range(rng.randint(1, 3)):
            obj = _as_dict(review, "request").get("object")
            root = obj if isinstance(obj, dict) and rng.random() < 0.85 else review
            everywhere = _paths(root)
            if len(everywhere) < 2:
                break
            target = rng.choice(everywhere[1:])
            parent = root
            for step in target[:-1]:
                parent = parent[step]
            key, action = target[-1], rng.randrange(5)
            if action == 0:
                parent[key] = json.loads(json.dumps(rng.choice(ODD_VALUES)))
            elif action == 1:
                del parent[key]
            elif action == 2 and isinstance(parent[key], dict):
                parent[key][rng.choice(KEYS)] = json.loads(json.dumps(rng.choice(ODD_VALUES)))
            elif action == 2 and isinstance(parent[key], list):
                parent[key].append(json.loads(json.dumps(rng.choice(ODD_VALUES))))
            else:
                # Another part of the same document in its place: shapes the webhook reads elsewhere.
                source: Any = root
                for step in rng.choice(everywhere):
                    source = source[step]
                parent[key] = json.loads(json.dumps(source))
        raw = json.dumps(review).encode()
        if rng.random() < 0.03:
            raw = raw[: rng.randrange(len(raw))]
        bodies.append(raw)
    return bodies


@pytest.mark.parametrize("seed", [18, 1803])
async def test_fuzzed_reviews_on_the_injection_paths_are_refused_or_guarded_never_a_5xx(
    webhook: Webhook, opted_in: str, seed: int
) -> None:
    bodies = _injection_mutations(seed, 1000, opted_in)
    answers: dict[str, int] = {}
    async with aiohttp.ClientSession() as session:
        for i, body in enumerate(bodies):
            what = f"mutation {i} (seed {seed}): {body[:300]!r}"
            status, answer = await _post(session, webhook, "/mutating-generic", body)
            _refused_or_guarded(status, answer, body, webhook.decisions, opted_in, what)
            if status == 400:
                outcome = "400"
            elif not answer["response"]["allowed"]:
                outcome = "denied"
            else:
                outcome = "patched" if "patch" in answer["response"] else "untouched"
            answers[outcome] = answers.get(outcome, 0) + 1
        await _good_request_succeeds(session, webhook)
    # The fuzz reached every kind of answer, the injection included, not only the envelope check.
    assert answers.keys() == {"400", "denied", "patched", "untouched"}, answers
    assert answers["denied"] >= 100 and answers["patched"] >= 100, answers


async def test_the_api_server_refuses_a_pod_with_a_malformed_readiness_gate_with_the_webhooks_message(
    control_plane: LocalControlPlane, kc: KubeClient, webhook: Webhook, opted_in: str
) -> None:
    async with _install(control_plane, kc, webhook, opted_in, "/mutating-generic"):
        good = _guarded_pod(opted_in)
        good["metadata"]["name"] = "good"
        created = await call_adapter(kc.create, kube.POD, opted_in, good)
        assert lifecycle.readiness_gate("web") in lifecycle.readiness_gates(created)
        assert created["spec"]["containers"][0]["lifecycle"]["preStop"] == {"sleep": {"seconds": DRAIN}}

        # The API server decodes the pod before it calls the webhook, so only shapes Go can
        # decode reach it: a gate without its condition type is one.
        bad = _guarded_pod(opted_in)
        bad["metadata"]["name"] = "bad"
        bad["spec"]["readinessGates"] = [{}]
        with pytest.raises(ApiError) as err:
            await call_adapter(kc.create, kube.POD, opted_in, bad)
        assert (
            "request.object is not a valid Pod: spec.readinessGates[0].conditionType: must not be empty"
            in err.value.message
        ), err.value.message
        (decision,) = webhook.seen("bad")
        assert not decision.allowed and decision.code == 400
        assert await call_adapter(kc.get_or_none, kube.POD, opted_in, "bad") is None


class MistypedAdapter:
    """An (untyped) adapter whose employer names its drain time as a string."""

    name = "mistyped"

    def get_employers_by_employee(self, employee: KubeObject, reader: CacheReader) -> list[EmployerRef]:
        mistyped: Any = "7"
        return [EmployerRef("Service", "ns", "web", drain_seconds=mistyped)]


async def test_an_unexpected_error_is_answered_with_a_denial_and_its_cause_not_a_500_page(
    webhook: Webhook, caplog: pytest.LogCaptureFixture
) -> None:
    path = webhook.server.add_adapter(MistypedAdapter())
    try:
        async with aiohttp.ClientSession() as session:
            status, review = await _post(session, webhook, path, json.dumps(_review_body()).encode())
            assert status == 200, (status, review)
            response = review["response"]
            assert response["allowed"] is False and response["status"]["code"] == 500
            assert response["status"]["message"].startswith(
                "webhook adapter mistyped: the webhook failed unexpectedly on this request (TypeError: "
            )
            # A bug, unlike bad input, is logged with its traceback.
            (record,) = [r for r in caplog.records if r.levelno >= logging.ERROR]
            assert record.exc_info is not None and "uid=uid-1" in record.getMessage()
            await _good_request_succeeds(session, webhook)
    finally:
        webhook.server.remove_adapter("mistyped")


async def test_a_webhook_caching_some_namespaces_leaves_a_pod_of_another_untouched(
    control_plane: LocalControlPlane, kc: KubeClient, opted_in: str, tmp_path: Path
) -> None:
    """A manager of a list of namespaces (docs/security.md, "A namespaced install") shares its
    caches with its webhook: a pod of a namespace outside the list, sent to it anyway (a
    namespaceSelector of the operator's own), finds no employer and is admitted untouched, while
    a pod of a watched namespace gets its entry from the same server."""
    watched = f"t-{uuid.uuid4().hex[:10]}"
    await call_adapter(kc.create, kube.NAMESPACE, None, {"metadata": {"name": watched}})
    await call_adapter(kc.create, kube.SERVICE, watched, _service("web", {"app": "web"}, CONTROLLED))
    async with (
        _started(control_plane, tmp_path, InformerFactory(kc, namespaces=(watched,))) as webhook,
        aiohttp.ClientSession() as session,
    ):

        async def entry_in_watched() -> bool:
            body = json.dumps(_review_body(_guarded_pod(watched), namespace=watched)).encode()
            status, review = await _post(session, webhook, "/mutating-generic", body)
            assert status == 200 and review["response"]["allowed"] is True
            if "patch" not in review["response"]:
                return False
            pod = _apply_patch(
                _guarded_pod(watched), json.loads(base64.b64decode(review["response"]["patch"]))
            )
            return f"Service/{watched}/web" in lifecycle.expected_finalizers(pod)

        await async_wait_for(entry_in_watched, timeout=30, message="the watched namespace's pod: its entry")
        # Its Service is in the API server, not in these caches.
        assert webhook.server.reader.get(kube.SERVICE, opted_in, "web") is None
        body = json.dumps(_review_body(_guarded_pod(opted_in), namespace=opted_in)).encode()
        status, review = await _post(session, webhook, "/mutating-generic", body)
    assert status == 200 and review["response"]["allowed"] is True
    assert "patch" not in review["response"], review["response"]
