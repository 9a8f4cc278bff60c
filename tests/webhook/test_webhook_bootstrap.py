"""Certificate bootstrap and the shipped manifests against the real kube-apiserver: one Secret
and one caBundle across restarts and concurrent replicas, regeneration only when needed, the
manifests' names and path equal to what the code creates and serves, the RBAC sufficient, and
the whole chain (manifest + bootstrap + ``serve``) admitting a real pod over TLS."""

from __future__ import annotations

import asyncio
import base64
import datetime
import itertools
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from resourceconsist import wire
from resourceconsist.adapters.alibabacloudslb import webhook_adapter as slb_webhook_adapter
from resourceconsist.adapters.alibabacloudslb.config import LOAD_BALANCER_ID_LABEL
from resourceconsist.cluster import certs, kube
from resourceconsist.cluster.kube import ApiError, KubeClient, KubeObject
from resourceconsist.flow.cancellation import call_adapter
from resourceconsist.rules import lifecycle
from resourceconsist.testing import LocalControlPlane, async_wait_for
from resourceconsist.webhook import (
    DEFAULT_ADAPTER_TIMEOUT,
    DEFAULT_PORT,
    DEFAULT_SERVICE_NAME,
    AdmissionDecision,
    BootstrapOptions,
    BootstrapResult,
    WebhookOptions,
    ensure_webhook_certificates,
    serve,
    service_hosts,
)

REPO = Path(__file__).resolve().parents[2]
MANIFESTS = REPO / "config" / "webhook"
#: Matches no object: the test configurations must never send anything anywhere.
NEVER = {"matchLabels": {"resourceconsist.test/never": "true"}}


@pytest.fixture
def kc(control_plane: LocalControlPlane) -> KubeClient:
    return KubeClient.from_kubeconfig(str(control_plane.kubeconfig))


def _entry(name: str) -> dict[str, Any]:
    return {
        "name": f"{name}.resourceconsist.test",
        "clientConfig": {"url": "https://127.0.0.1:1/never"},
        "rules": [
            {"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}
        ],
        "objectSelector": NEVER,
        "admissionReviewVersions": ["v1"],
        "sideEffects": "None",
        "failurePolicy": "Ignore",
    }


@pytest.fixture
def configurations(kc: KubeClient) -> Iterator[None]:
    """The two configurations the bootstrap fills, the mutating one with two webhook entries."""
    made = [
        (kube.MUTATING_WEBHOOK_CONFIGURATION, wire.MUTATING_WEBHOOK_CONFIGURATION, ["a", "b"]),
        (kube.VALIDATING_WEBHOOK_CONFIGURATION, wire.VALIDATING_WEBHOOK_CONFIGURATION, ["c"]),
    ]
    for resource, name, entries in made:
        kc.create(
            resource,
            None,
            {
                "apiVersion": resource.api_version,
                "kind": resource.kind,
                "metadata": {"name": name},
                "webhooks": [_entry(e) for e in entries],
            },
        )
    try:
        yield
    finally:
        for resource, name, _ in made:
            kc.delete(resource, None, name)


def _bundles(kc: KubeClient) -> list[str]:
    found = []
    for resource, name in (
        (kube.MUTATING_WEBHOOK_CONFIGURATION, wire.MUTATING_WEBHOOK_CONFIGURATION),
        (kube.VALIDATING_WEBHOOK_CONFIGURATION, wire.VALIDATING_WEBHOOK_CONFIGURATION),
    ):
        config = kc.get(resource, None, name)
        found += [w["clientConfig"].get("caBundle", "") for w in config["webhooks"]]
    return found


def _secret(kc: KubeClient, namespace: str) -> KubeObject:
    return kc.get(kube.SECRET, namespace, wire.WEBHOOK_CERT_SECRET)


def _decoded(secret: KubeObject) -> dict[str, bytes]:
    return {k: base64.b64decode(v) for k, v in secret["data"].items()}


def test_bootstrap_twice_gives_the_same_secret_and_ca_bundle(
    kc: KubeClient, namespace: str, configurations: None, tmp_path: Path
) -> None:
    first = ensure_webhook_certificates(
        kc, tmp_path / "a", BootstrapOptions(namespace=namespace, service_name="wh")
    )
    assert first.secret_action == "created"
    assert set(first.patched_configurations) == {
        wire.MUTATING_WEBHOOK_CONFIGURATION,
        wire.VALIDATING_WEBHOOK_CONFIGURATION,
    }
    secret = _secret(kc, namespace)
    data = _decoded(secret)
    assert sorted(data) == sorted(wire.WEBHOOK_CERT_KEYS)
    ca_bundle = base64.b64encode(data["ca.crt"]).decode()
    assert _bundles(kc) == [ca_bundle] * 3  # every entry of both configurations
    assert certs.cert_matches_hosts(data["tls.crt"], service_hosts("wh", namespace))
    assert first.cert_file.read_bytes() == data["tls.crt"]
    assert first.key_file.read_bytes() == data["tls.key"]
    assert first.key_file.stat().st_mode & 0o077 == 0

    # A restart: nothing is written anywhere.
    writes_before = kc.requests["post"] + kc.requests["put"]
    again = ensure_webhook_certificates(
        kc, tmp_path / "a", BootstrapOptions(namespace=namespace, service_name="wh")
    )
    assert again.secret_action == "reused"
    assert again.patched_configurations == ()
    assert not again.files_written
    assert kc.requests["post"] + kc.requests["put"] == writes_before
    assert _secret(kc, namespace)["metadata"]["resourceVersion"] == secret["metadata"]["resourceVersion"]
    assert _bundles(kc) == [ca_bundle] * 3
    assert again.certificates == first.certificates

    # Another replica, with its own cert dir, reuses the Secret and writes the same files.
    other = ensure_webhook_certificates(
        kc, tmp_path / "b", BootstrapOptions(namespace=namespace, service_name="wh")
    )
    assert other.secret_action == "reused"
    assert other.cert_file.read_bytes() == first.cert_file.read_bytes()


def test_concurrent_replicas_agree_on_one_secret(kc: KubeClient, namespace: str, tmp_path: Path) -> None:
    def replica(i: int) -> BootstrapResult:
        return ensure_webhook_certificates(
            kc, tmp_path / str(i), BootstrapOptions(namespace=namespace, service_name="wh")
        )

    with ThreadPoolExecutor(6) as pool:
        results = list(pool.map(replica, range(6)))
    actions = [r.secret_action for r in results]
    assert actions.count("created") == 1, actions
    assert set(actions) <= {"created", "adopted", "reused"}
    data = _decoded(_secret(kc, namespace))
    for result in results:
        assert result.certificates.ca.cert_pem == data["ca.crt"]
        assert result.cert_file.read_bytes() == data["tls.crt"]

    # Concurrent replicas that find it invalid: one regenerates (keeping the CA), the others
    # lose the resourceVersion race, re-read and use its result.
    secret = _secret(kc, namespace)
    secret["data"]["tls.crt"] = base64.b64encode(b"not a certificate").decode()
    kc.replace(kube.SECRET, namespace, wire.WEBHOOK_CERT_SECRET, secret)
    with ThreadPoolExecutor(6) as pool:
        results = list(pool.map(replica, range(6)))
    actions = [r.secret_action for r in results]
    assert actions.count("regenerated") == 1, actions
    fixed = _decoded(_secret(kc, namespace))
    assert fixed["ca.crt"] == data["ca.crt"]  # the CA was still good: the caBundle stays
    assert fixed["tls.crt"] != data["tls.crt"]
    for result in results:
        assert result.cert_file.read_bytes() == fixed["tls.crt"]


def test_regenerates_only_when_invalid_expiring_or_not_covering_the_names(
    kc: KubeClient, namespace: str, tmp_path: Path
) -> None:
    first = ensure_webhook_certificates(
        kc, tmp_path, BootstrapOptions(namespace=namespace, service_name="wh")
    )
    rv = first.secret_resource_version

    # A renamed Service: a new serving certificate for the new names, from the same CA.
    renamed = ensure_webhook_certificates(
        kc, tmp_path, BootstrapOptions(namespace=namespace, service_name="other")
    )
    assert renamed.secret_action == "regenerated"
    assert renamed.certificates.ca == first.certificates.ca
    assert certs.cert_matches_hosts(renamed.certificates.serving.cert_pem, service_hosts("other", namespace))
    assert renamed.files_written and renamed.secret_resource_version != rv

    # About to expire (here: everything expires within the renewal window): new CA too.
    expiring = ensure_webhook_certificates(
        kc,
        tmp_path,
        BootstrapOptions(
            namespace=namespace, service_name="other", renew_before=datetime.timedelta(days=365 * 20)
        ),
    )
    assert expiring.secret_action == "regenerated"
    assert expiring.certificates.ca != renamed.certificates.ca

    # A key that does not match its certificate, and a missing key: regenerated.
    for damage in ("swap", "drop"):
        secret = _secret(kc, namespace)
        if damage == "swap":
            secret["data"]["tls.key"] = base64.b64encode(certs.make_ca("x").key_pem).decode()
        else:
            del secret["data"]["ca.key"]
        kc.replace(kube.SECRET, namespace, wire.WEBHOOK_CERT_SECRET, secret)
        fixed = ensure_webhook_certificates(
            kc, tmp_path, BootstrapOptions(namespace=namespace, service_name="other")
        )
        assert fixed.secret_action == "regenerated", damage
        assert sorted(_secret(kc, namespace)["data"]) == sorted(wire.WEBHOOK_CERT_KEYS)


def _go_made_secret_data(dns_name: str) -> dict[str, str]:
    """What the Go controller stored: RSA keys in PKCS#1 PEM, a serving certificate for one name."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)

    def build(
        subject: str, key: rsa.RSAPrivateKey, issuer: str, signer: rsa.RSAPrivateKey, ca: bool
    ) -> bytes:
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=1))
            .not_valid_after(now + datetime.timedelta(days=365))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if not ca:
            builder = builder.add_extension(x509.SubjectAlternativeName([x509.DNSName(dns_name)]), False)
        return builder.sign(signer, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)

    def pem(key: rsa.RSAPrivateKey) -> bytes:
        return key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )

    ca_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    leaf_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    raw = {
        "ca.key": pem(ca_key),
        "ca.crt": build("self-signed-k8s-cert", ca_key, "self-signed-k8s-cert", ca_key, True),
        "tls.key": pem(leaf_key),
        "tls.crt": build(dns_name, leaf_key, "self-signed-k8s-cert", ca_key, False),
    }
    return {k: base64.b64encode(v).decode() for k, v in raw.items()}


def test_a_secret_left_by_the_go_controller_is_replaced(
    kc: KubeClient, namespace: str, tmp_path: Path
) -> None:
    go_data = _go_made_secret_data(f"{DEFAULT_SERVICE_NAME}.{namespace}.svc")
    kc.create(kube.SECRET, namespace, {"metadata": {"name": wire.WEBHOOK_CERT_SECRET}, "data": go_data})
    result = ensure_webhook_certificates(kc, tmp_path, BootstrapOptions(namespace=namespace))
    assert result.secret_action == "regenerated"  # one DNS name only: not enough
    data = _decoded(_secret(kc, namespace))
    assert data["ca.crt"] != base64.b64decode(go_data["ca.crt"])  # RSA CA: replaced too
    assert certs.cert_matches_hosts(data["tls.crt"], service_hosts(DEFAULT_SERVICE_NAME, namespace))
    assert (
        ensure_webhook_certificates(kc, tmp_path, BootstrapOptions(namespace=namespace)).secret_action
        == "reused"
    )


def test_the_namespace_comes_from_pod_namespace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(wire.POD_NAMESPACE_ENV, raising=False)
    assert kube.pod_namespace() == wire.DEFAULT_NAMESPACE == "resourceconsist"
    monkeypatch.setenv(wire.POD_NAMESPACE_ENV, "elsewhere")
    assert kube.pod_namespace() == "elsewhere"
    assert kube.pod_namespace("given") == "given"
    assert service_hosts("svc", "ns") == ("svc.ns.svc", "svc.ns.svc.cluster.local")


# -- the manifests ----------------------------------------------------------------------------


def _manifests() -> dict[tuple[str, str], dict[str, Any]]:
    docs: dict[tuple[str, str], dict[str, Any]] = {}
    for path in sorted(MANIFESTS.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") != "Kustomization":
                docs[(doc["kind"], doc["metadata"]["name"])] = doc
    return docs


async def test_the_manifests_match_what_the_code_creates_and_serves(
    control_plane: LocalControlPlane, kc: KubeClient, tmp_path: Path
) -> None:
    docs = _manifests()
    config = docs[("MutatingWebhookConfiguration", wire.MUTATING_WEBHOOK_CONFIGURATION)]
    (hook,) = config["webhooks"]
    service_ref = hook["clientConfig"]["service"]
    service = docs[("Service", service_ref["name"])]
    assert service_ref["name"] == DEFAULT_SERVICE_NAME
    assert service_ref["namespace"] == service["metadata"]["namespace"] == wire.DEFAULT_NAMESPACE
    (port,) = service["spec"]["ports"]
    assert port["port"] == service_ref.get("port", 443) and port["targetPort"] == DEFAULT_PORT
    assert hook["objectSelector"] == {"matchLabels": {wire.CONTROL_LABEL: wire.CONTROL_LABEL_VALUE}}
    assert hook["rules"] == [
        {
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "operations": ["CREATE"],
            "resources": ["pods"],
            "scope": "Namespaced",
        }
    ]
    assert hook["sideEffects"] == "None" and hook["admissionReviewVersions"] == ["v1"]
    assert hook["failurePolicy"] == "Fail"
    assert DEFAULT_ADAPTER_TIMEOUT < hook["timeoutSeconds"] <= 30
    assert "caBundle" not in hook["clientConfig"]  # the bootstrap fills it

    # The Secret and configurations the RBAC grants are the ones the code uses.
    role = docs[("Role", "resourceconsist-webhook-certs")]
    assert role["metadata"]["namespace"] == wire.DEFAULT_NAMESPACE
    assert [wire.WEBHOOK_CERT_SECRET] in [r.get("resourceNames") for r in role["rules"]]
    cluster_role = docs[("ClusterRole", "resourceconsist-webhook")]
    granted = {n for r in cluster_role["rules"] for n in r.get("resourceNames", [])}
    assert granted == {wire.MUTATING_WEBHOOK_CONFIGURATION, wire.VALIDATING_WEBHOOK_CONFIGURATION}

    # The path is the one the server registers for the built-in adapter: a review posted
    # there gets a real answer.
    adapter = slb_webhook_adapter()
    cert, key = control_plane.webhook_certificate()
    (tmp_path / "tls.crt").write_bytes(cert.read_bytes())
    (tmp_path / "tls.key").write_bytes(key.read_bytes())
    options = WebhookOptions(host="127.0.0.1", port=0, cert_dir=tmp_path, bootstrap=None)
    server = await serve([adapter], options, client=kc)
    try:
        assert server.paths == (hook["clientConfig"]["service"]["path"],)
    finally:
        await server.stop()

    # The API server accepts every manifest as it is shipped.
    api = control_plane.api_client()
    admission = k8s.AdmissionregistrationV1Api(api)
    await asyncio.to_thread(admission.create_mutating_webhook_configuration, config, dry_run="All")
    rbac = k8s.RbacAuthorizationV1Api(api)
    await asyncio.to_thread(rbac.create_cluster_role, cluster_role, dry_run="All")


async def test_manifest_bootstrap_and_serve_admit_a_real_pod_with_least_privilege(
    control_plane: LocalControlPlane, kc: KubeClient, namespace: str, tmp_path: Path
) -> None:
    """The shipped RBAC, bound to a service account in ``namespace``, is enough for ``serve``
    to bootstrap; the shipped configuration (pointed at this process instead of the Service,
    and kept to this namespace) then sends pods to the path the server registers."""
    docs = _manifests()
    api = control_plane.api_client()
    core, rbac = k8s.CoreV1Api(api), k8s.RbacAuthorizationV1Api(api)
    suffix = namespace
    sa = "resourceconsist-manager"
    core.create_namespaced_service_account(namespace, {"metadata": {"name": sa}})
    subject = [{"kind": "ServiceAccount", "name": sa, "namespace": namespace}]
    role = docs[("Role", "resourceconsist-webhook-certs")]
    rbac.create_namespaced_role(namespace, {**role, "metadata": {"name": role["metadata"]["name"]}})
    binding = docs[("RoleBinding", "resourceconsist-webhook-certs")]
    rbac.create_namespaced_role_binding(
        namespace, {**binding, "metadata": {"name": "b"}, "subjects": subject}
    )
    cluster_role = docs[("ClusterRole", "resourceconsist-webhook")]
    cluster_role = {**cluster_role, "metadata": {"name": f"rc-webhook-{suffix}"}}
    rbac.create_cluster_role(cluster_role)
    cluster_binding = docs[("ClusterRoleBinding", "resourceconsist-webhook")]
    rbac.create_cluster_role_binding(
        {
            **cluster_binding,
            "metadata": {"name": f"rc-webhook-{suffix}"},
            "roleRef": {**cluster_binding["roleRef"], "name": cluster_role["metadata"]["name"]},
            "subjects": subject,
        }
    )
    token = core.create_namespaced_service_account_token(sa, namespace, {"spec": {"expirationSeconds": 3600}})
    configuration = k8s.Configuration()
    configuration.host = control_plane.url
    configuration.ssl_ca_cert = str(control_plane.dir / "ca.crt")
    configuration.api_key = {"authorization": token.status.token}
    configuration.api_key_prefix = {"authorization": "Bearer"}
    as_manager = KubeClient(k8s.ApiClient(configuration), name="manager")
    with pytest.raises(ApiError) as forbidden:  # really the service account, not admin
        as_manager.list(kube.SECRET, namespace)
    assert forbidden.value.status == 403

    config = docs[("MutatingWebhookConfiguration", wire.MUTATING_WEBHOOK_CONFIGURATION)]
    (hook,) = config["webhooks"]
    path = hook["clientConfig"]["service"]["path"]
    decisions: list[AdmissionDecision] = []
    server = await serve(
        [slb_webhook_adapter()],
        WebhookOptions(
            host="127.0.0.1",
            port=0,
            cert_dir=tmp_path,
            bootstrap=BootstrapOptions(namespace=namespace, extra_hosts=("127.0.0.1",)),
        ),
        client=as_manager,
        observer=decisions.append,
    )
    try:
        assert server.last_bootstrap is not None and server.last_bootstrap.secret_action == "created"
        await server.wait_ready(timeout=30)
        # The shipped configuration, reaching this process by URL, limited to this namespace.
        local = {
            **hook,
            "clientConfig": {"url": f"https://127.0.0.1:{server.port}{path}"},
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
        }
        await call_adapter(
            kc.create, kube.MUTATING_WEBHOOK_CONFIGURATION, None, {**config, "webhooks": [local]}
        )
        try:
            # The periodic re-check (run now) puts the caBundle into the new configuration.
            result = await server.run_bootstrap()
            assert result.secret_action == "reused"
            assert result.patched_configurations == (wire.MUTATING_WEBHOOK_CONFIGURATION,)

            labels = {wire.CONTROL_LABEL: wire.CONTROL_LABEL_VALUE, "app": "shop"}
            await call_adapter(
                kc.create,
                kube.SERVICE,
                namespace,
                {
                    "metadata": {
                        "name": "shop",
                        "labels": {**labels, LOAD_BALANCER_ID_LABEL: "lb-1"},
                    },
                    "spec": {"selector": {"app": "shop"}, "ports": [{"port": 80}]},
                },
            )
            pods = itertools.count()

            async def admitted() -> KubeObject | None:
                name = f"shop-{next(pods)}"
                pod = await call_adapter(
                    kc.create,
                    kube.POD,
                    namespace,
                    {
                        "metadata": {"name": name, "labels": labels},
                        "spec": {"containers": [{"name": "c", "image": "x"}]},
                    },
                )
                return pod if lifecycle.expected_finalizers(pod) else None

            pod = await async_wait_for(
                admitted, timeout=30, interval=0.2, message="a pod admitted by the webhook"
            )
            assert lifecycle.expected_finalizers(pod) == {
                f"Service/{namespace}/shop": lifecycle.lifecycle_finalizer("shop")
            }
            assert any(d.path == path and d.patch for d in decisions)
        finally:
            await asyncio.to_thread(
                kc.delete, kube.MUTATING_WEBHOOK_CONFIGURATION, None, wire.MUTATING_WEBHOOK_CONFIGURATION
            )
    finally:
        await server.stop()
        for name in (f"rc-webhook-{suffix}",):
            rbac.delete_cluster_role_binding(name)
            rbac.delete_cluster_role(name)
