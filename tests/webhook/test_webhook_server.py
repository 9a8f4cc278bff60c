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
import shutil
import socket
import ssl
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from kubernetes import client as k8s

from resourceconsist import certs, kube, lifecycle, wire
from resourceconsist.adapters.alibabacloudslb import webhook_adapter as slb_webhook_adapter
from resourceconsist.adapters.alibabacloudslb.config import LOAD_BALANCER_ID_LABEL
from resourceconsist.cache import CacheReader, InformerFactory
from resourceconsist.cancellation import call_adapter
from resourceconsist.kube import ApiError, KubeClient, KubeObject
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


@pytest.fixture
async def webhook(control_plane: LocalControlPlane, kc: KubeClient, tmp_path: Path) -> AsyncIterator[Webhook]:
    assert control_plane.ca is not None
    cert, key = control_plane.webhook_certificate()
    # Private copies: the cert-reload test rewrites them.
    cert_file, key_file = tmp_path / "tls.crt", tmp_path / "tls.key"
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
            cert_dir=tmp_path,
            bootstrap=None,
            adapter_timeout=1.0,
            cert_reload_interval=0.05,
        ),
        informers=InformerFactory(kc),
        own_informers=True,
        observer=decisions.append,
    )
    await server.start()
    try:
        await server.wait_ready(timeout=30)
        yield Webhook(server, decisions, control_plane.ca)
    finally:
        await server.stop()


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
    async with session.post(
        webhook.url(path), data=body, headers={"Content-Type": content_type}, ssl=webhook.client_context()
    ) as resp:
        return resp.status, await resp.json(content_type=None)


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


def _mutations(seed: int, count: int) -> list[bytes]:
    """``count`` random mutations of a valid AdmissionReview (seeded, so a failure replays):
    values swapped for other types, keys dropped or added, the JSON truncated or bytes flipped."""
    import random

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

    def paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        found = [prefix]
        if isinstance(node, dict):
            for key, value in node.items():
                found += paths(value, (*prefix, key))
        elif isinstance(node, list):
            for index, value in enumerate(node):
                found += paths(value, (*prefix, index))
        return found

    bodies: list[bytes] = []
    for _ in range(count):
        review = _review_body(_pod("p", {"app": "x"}, {"note": "n"}))
        review["request"]["oldObject"] = _pod("old", {})
        target = rng.choice(paths(review)[1:])
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
