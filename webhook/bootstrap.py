"""Certificate bootstrap: a self-signed CA and a serving certificate for the webhook, shared by
every replica through one Secret, trusted by the API server through the configurations' caBundle.

``ensure_webhook_certificates`` is idempotent and safe to run from several replicas at once:

1. Read Secret ``resourceconsist-webhook-certs`` in the namespace (keys ``ca.key ca.crt tls.key
   tls.crt``; ``ca.crt`` may hold two CAs during a CA rotation, the signing one first). A valid
   one is kept: both pairs parse and match, the CA is a CA, the serving certificate is signed by
   a CA of ``ca.crt``, covers the webhook's DNS names and has not expired. When a renewal is due
   (two thirds of a certificate's life, on ``BootstrapOptions.clock``), one rotation step is
   taken per pass (``next_certificates``; docs/webhook.md, "Certificates and their rotation").
2. None there: generate and *create* it. Create is atomic in the API, so when replicas race one
   wins; the others get 409 AlreadyExists, read the winner's Secret and use it.
3. One there but not valid: regenerate and *update* it with the read resourceVersion as a
   precondition; on 409 Conflict another replica got there first, so read again and re-check.
   A still-valid CA is kept, so the caBundle stays the same when only the serving cert changes.
4. Put ``ca.crt`` (every CA in it) as the caBundle into every webhook entry of the mutating and validating
   configurations that exist (update with resourceVersion precondition, retried on conflict;
   nothing is written when they already carry it).
5. Write ``tls.crt``/``tls.key`` into the cert dir (atomically, and only when they differ), where
   the server's certificate reloader picks them up.

What it makes, for which Service, and how often a running server re-checks: ``BootstrapOptions``
(``options``), part of ``WebhookOptions`` (docs/reference/options.md). The function blocks; async
callers run it in the frame's own threads (``asyncio.to_thread``), never in the adapters' pool,
so a hung provider cannot hold the certificates back (``resourceconsist.flow.cancellation``).

Outside the cluster (a laptop, CI), ``register_url_webhooks`` writes the mutating configuration
with ``clientConfig.url`` entries pointing at the local server instead of the Service
(docs/webhook.md, "Running the webhook outside the cluster").
"""

from __future__ import annotations

import base64
import binascii
import datetime
import logging
import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from resourceconsist import wire
from resourceconsist.cluster import certs, kube
from resourceconsist.cluster.kube import Conflict, KubeClient, KubeObject, Resource
from resourceconsist.errors import ResourceConsistError
from resourceconsist.webhook.adapter import webhook_path
from resourceconsist.webhook.options import RENEW_AT_FRACTION, BootstrapOptions

log = logging.getLogger(__name__)

#: Files the serving certificate is written to, in the cert dir.
TLS_CERT_FILE: Final = "tls.crt"
TLS_KEY_FILE: Final = "tls.key"

_CA_KEY, _CA_CRT, _TLS_KEY, _TLS_CRT = wire.WEBHOOK_CERT_KEYS
_ATTEMPTS = 8
_MANAGED_BY = {"app.kubernetes.io/managed-by": "resourceconsist"}


class BootstrapError(ResourceConsistError, RuntimeError):
    """The certificates could not be ensured (the API kept conflicting, or refused)."""


@dataclass(frozen=True)
class WebhookCertificates:
    """The signing CA, the serving certificate, and during a CA rotation the other CAs the API
    server must still trust (docs/webhook.md, "Certificates and their rotation")."""

    #: The CA whose key is ``ca.key``: it signs new serving certificates.
    ca: certs.KeyPair
    serving: certs.KeyPair
    #: PEM certificates of older CAs kept trusted meanwhile (empty outside a rotation).
    previous_cas: tuple[bytes, ...] = ()

    @property
    def ca_pem(self) -> bytes:
        """``ca.crt``: the signing CA first, then the older ones, as one PEM bundle."""
        return self.ca.cert_pem + b"".join(self.previous_cas)

    @property
    def ca_bundle(self) -> str:
        """``ca.crt`` base64-encoded, as ``clientConfig.caBundle`` holds it."""
        return base64.b64encode(self.ca_pem).decode()

    def secret_data(self) -> dict[str, str]:
        raw = {
            _CA_KEY: self.ca.key_pem,
            _CA_CRT: self.ca_pem,
            _TLS_KEY: self.serving.key_pem,
            _TLS_CRT: self.serving.cert_pem,
        }
        return {k: base64.b64encode(v).decode() for k, v in raw.items()}


SecretAction = Literal["reused", "created", "adopted", "regenerated"]


@dataclass(frozen=True)
class BootstrapResult:
    """What one bootstrap found and did."""

    certificates: WebhookCertificates
    #: reused: a valid Secret was there; created: this call created it; adopted: another
    #: replica created or fixed it concurrently; regenerated: this call replaced an invalid one.
    secret_action: SecretAction
    secret_resource_version: str
    #: Configurations whose caBundle this call wrote (empty when they already had it).
    patched_configurations: tuple[str, ...]
    cert_file: Path
    key_file: Path
    files_written: bool


# -- checking a Secret ---------------------------------------------------------------------


def _pem(data: Mapping[str, Any], key: str) -> bytes:
    value = data.get(key)
    if not value:
        raise ValueError(f"key {key} is missing")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as err:
        raise ValueError(f"key {key} is not base64") from err


def _public_der(key: Any) -> bytes:
    return bytes(
        key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    )


def _check_pair(cert_pem: bytes, key_pem: bytes, what: str) -> tuple[x509.Certificate, Any]:
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
    except ValueError as err:
        raise ValueError(f"{what} certificate does not parse") from err
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError) as err:
        raise ValueError(f"{what} key does not parse") from err
    if _public_der(cert.public_key()) != _public_der(key.public_key()):
        raise ValueError(f"{what} key does not match its certificate")
    return cert, key


def _check_validity(cert: x509.Certificate, what: str, now: datetime.datetime) -> None:
    if cert.not_valid_before_utc > now:
        raise ValueError(f"{what} certificate is not valid yet")
    if cert.not_valid_after_utc <= now:
        raise ValueError(f"{what} certificate expired at {cert.not_valid_after_utc:%Y-%m-%d %H:%M}Z")


def renewal_due(
    cert: x509.Certificate, now: datetime.datetime, renew_before: datetime.timedelta | None
) -> bool:
    """Whether ``cert`` is to be renewed at ``now``: ``renew_before`` its end, else once two
    thirds of its life have passed (docs/webhook.md, "Certificates and their rotation")."""
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    if renew_before is not None:
        return now >= end - renew_before
    return now >= start + (end - start) * RENEW_AT_FRACTION


def _issued_at(cert: x509.Certificate) -> datetime.datetime:
    return cert.not_valid_before_utc + certs.BACKDATE


def _ca_certificates(pem: bytes) -> list[x509.Certificate]:
    try:
        found = x509.load_pem_x509_certificates(pem)
    except ValueError as err:
        raise ValueError("CA certificate does not parse") from err
    for cert in found:
        try:
            constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
        except x509.ExtensionNotFound:
            raise ValueError("CA certificate has no basic constraints") from None
        if not constraints.ca:
            raise ValueError("CA certificate is not a CA")
    return found


def _pem_of(cert: x509.Certificate) -> bytes:
    return bytes(cert.public_bytes(serialization.Encoding.PEM))


def _signing_ca(
    data: Mapping[str, Any], now: datetime.datetime
) -> tuple[certs.KeyPair, list[x509.Certificate]]:
    """The CA that ``ca.key`` belongs to, and the other CAs of ``ca.crt`` still valid at ``now``;
    ``ValueError`` when the key matches none or its CA cannot sign (expired, not EC)."""
    bundle = _ca_certificates(_pem(data, _CA_CRT))
    key_pem = _pem(data, _CA_KEY)
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError) as err:
        raise ValueError("CA key does not parse") from err
    mine = [c for c in bundle if _public_der(c.public_key()) == _public_der(key.public_key())]
    if not mine:
        raise ValueError("CA key does not match its certificate")
    _check_validity(mine[0], "CA", now)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        # certs.make_signed signs with EC CA keys only (a Go-made Secret holds RSA keys).
        raise ValueError("CA key is not an EC key")
    others = [c for c in bundle if c is not mine[0] and c.not_valid_after_utc > now]
    return certs.KeyPair(_pem_of(mine[0]), key_pem), others


def check_secret_data(
    data: Mapping[str, Any],
    hosts: Sequence[str],
    *,
    now: datetime.datetime | None = None,
) -> WebhookCertificates:
    """The certificates in a Secret's ``data`` if they can serve ``hosts`` at ``now``; else
    ``ValueError`` saying why not. The serving certificate may be signed by the signing CA or,
    during a CA rotation, by an older CA still in ``ca.crt``."""
    now = now or datetime.datetime.now(datetime.UTC)
    ca, others = _signing_ca(data, now)
    serving = certs.KeyPair(_pem(data, _TLS_CRT), _pem(data, _TLS_KEY))
    leaf, _ = _check_pair(serving.cert_pem, serving.key_pem, "serving")
    for issuer in (ca.certificate(), *others):
        try:
            leaf.verify_directly_issued_by(issuer)
        except (ValueError, TypeError, InvalidSignature):
            continue
        break
    else:
        raise ValueError("serving certificate is not signed by the CA")
    _check_validity(leaf, "serving", now)
    if not certs.cert_matches_hosts(serving.cert_pem, tuple(hosts)):
        raise ValueError(f"serving certificate does not cover {', '.join(hosts)}")
    return WebhookCertificates(ca, serving, tuple(_pem_of(c) for c in others))


def _signed_by(serving: certs.KeyPair, ca: certs.KeyPair) -> bool:
    try:
        serving.certificate().verify_directly_issued_by(ca.certificate())
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def generate_certificates(
    hosts: Sequence[str],
    ca: certs.KeyPair | None = None,
    *,
    options: BootstrapOptions | None = None,
    previous_cas: tuple[bytes, ...] = (),
) -> WebhookCertificates:
    """A serving certificate for ``hosts`` signed by ``ca`` (a new self-signed CA if None), with
    the lifetimes of ``options``; ``previous_cas`` stay trusted beside it."""
    if not hosts:
        raise ValueError("the serving certificate needs at least one host")
    options = options or BootstrapOptions()
    ca = ca or certs.make_ca("resourceconsist-webhook-ca", validity=options.ca_validity)
    serving = certs.make_signed(ca, hosts[0], hosts=tuple(hosts), validity=options.serving_validity)
    return WebhookCertificates(ca, serving, previous_cas)


def next_certificates(
    current: WebhookCertificates,
    hosts: Sequence[str],
    options: BootstrapOptions,
    now: datetime.datetime,
    bundle_everywhere: Callable[[str], bool],
) -> tuple[WebhookCertificates, str] | None:
    """The one rotation step due at ``now`` for valid certificates, and why; None: nothing.

    One step per pass, in this order (docs/webhook.md, "Certificates and their rotation"):
    a new CA next to the signing one when that is due (the serving certificate stays); the
    serving certificate reissued by the new CA once every configuration carries the bundle and
    ``ca_overlap`` passed since the new CA was made; the serving certificate renewed by the same
    CA when it is due; older CAs dropped ``ca_overlap`` after the serving certificate was issued
    by the newest one.
    """
    ca_cert, serving_cert = current.ca.certificate(), current.serving.certificate()
    serving_by_signer = _signed_by(current.serving, current.ca)
    if renewal_due(ca_cert, now, options.renew_before) and serving_by_signer:
        new_ca = certs.make_ca("resourceconsist-webhook-ca", validity=options.ca_validity)
        rotated = WebhookCertificates(new_ca, current.serving, (current.ca.cert_pem, *current.previous_cas))
        return rotated, "CA renewal: new CA added to the trusted bundle"
    if not serving_by_signer:
        if now < _issued_at(ca_cert) + options.ca_overlap or not bundle_everywhere(current.ca_bundle):
            return None
        reissued = generate_certificates(
            hosts, current.ca, options=options, previous_cas=current.previous_cas
        )
        return reissued, "CA renewal: serving certificate reissued by the new CA"
    if renewal_due(serving_cert, now, options.renew_before):
        renewed = generate_certificates(hosts, current.ca, options=options, previous_cas=current.previous_cas)
        return renewed, "serving certificate renewal"
    if current.previous_cas and now >= _issued_at(serving_cert) + options.ca_overlap:
        return WebhookCertificates(current.ca, current.serving), "CA renewal: old CA dropped from the bundle"
    return None


# -- the Secret ---------------------------------------------------------------------------


def _rv(obj: KubeObject) -> str:
    return str(obj.get("metadata", {}).get("resourceVersion", ""))


def _for_update(obj: KubeObject) -> KubeObject:
    """A copy fit for PUT: resourceVersion kept as the precondition, managedFields left out
    (absent in an update means unchanged)."""
    body = dict(obj)
    body["metadata"] = {k: v for k, v in obj.get("metadata", {}).items() if k != "managedFields"}
    return body


def ensure_secret(
    client: KubeClient,
    namespace: str,
    hosts: Sequence[str],
    options: BootstrapOptions | None = None,
    *,
    bundle_everywhere: Callable[[str], bool] = lambda _bundle: True,
) -> tuple[WebhookCertificates, SecretAction, str]:
    """Reuse, create, regenerate or rotate the cert Secret; see the module docstring."""
    options = options or BootstrapOptions()
    name = wire.WEBHOOK_CERT_SECRET
    raced = False
    for _ in range(_ATTEMPTS):
        now = options.now()
        secret = client.get_or_none(kube.SECRET, namespace, name)
        if secret is None:
            fresh = generate_certificates(hosts, options=options)
            body: KubeObject = {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": name, "namespace": namespace, "labels": dict(_MANAGED_BY)},
                "data": fresh.secret_data(),
            }
            try:
                created = client.create(kube.SECRET, namespace, body)
            except Conflict:  # AlreadyExists: another replica won the race; use its Secret.
                raced = True
                continue
            log.info("webhook cert Secret %s/%s created", namespace, name)
            return fresh, "created", _rv(created)
        data = secret.get("data") or {}
        try:
            found = check_secret_data(data, hosts, now=now)
        except ValueError as why:
            reason = str(why)
            try:
                keep_ca, others = _signing_ca(data, now)
            except ValueError:
                keep_ca, others = None, []
            # Still-valid older CAs stay trusted: another replica may serve a certificate they signed.
            fresh = generate_certificates(
                hosts, keep_ca, options=options, previous_cas=tuple(_pem_of(c) for c in others)
            )
            what = f"regenerated ({reason}; CA {'kept' if keep_ca else 'new'})"
        else:
            step = next_certificates(found, hosts, options, now, bundle_everywhere)
            if step is None:
                return found, ("adopted" if raced else "reused"), _rv(secret)
            fresh, what = step
        body = _for_update(secret)
        body["data"] = fresh.secret_data()
        body.pop("stringData", None)
        try:
            updated = client.replace(kube.SECRET, namespace, name, body)
        except Conflict:  # Someone changed it since we read it: read again and re-check.
            raced = True
            continue
        log.info("webhook cert Secret %s/%s: %s", namespace, name, what)
        return fresh, "regenerated", _rv(updated)
    raise BootstrapError(f"Secret {namespace}/{name} kept changing under us ({_ATTEMPTS} attempts)")


# -- caBundle -------------------------------------------------------------------------------

_CONFIGURATIONS: Final = (
    (kube.MUTATING_WEBHOOK_CONFIGURATION, wire.MUTATING_WEBHOOK_CONFIGURATION),
    (kube.VALIDATING_WEBHOOK_CONFIGURATION, wire.VALIDATING_WEBHOOK_CONFIGURATION),
)


def _configurations_carry(
    client: KubeClient, ca_bundle: str, configurations: Sequence[tuple[Resource, str]] = _CONFIGURATIONS
) -> bool:
    """Whether every webhook entry of the configurations that exist has ``ca_bundle``."""
    for resource, name in configurations:
        config = client.get_or_none(resource, None, name)
        for entry in (config or {}).get("webhooks") or []:
            if (entry.get("clientConfig") or {}).get("caBundle") != ca_bundle:
                return False
    return True


def ensure_ca_bundle(
    client: KubeClient,
    ca_bundle: str,
    configurations: Sequence[tuple[Resource, str]] = _CONFIGURATIONS,
) -> tuple[str, ...]:
    """Set ``caBundle`` of every webhook entry in the configurations that exist; returns the
    names of those written (none when all already carry it)."""
    written: list[str] = []
    for resource, name in configurations:
        for _ in range(_ATTEMPTS):
            config = client.get_or_none(resource, None, name)
            if config is None:
                log.debug("%s %s does not exist; no caBundle to fill", resource.kind, name)
                break
            changed = False
            for entry in config.get("webhooks") or []:
                client_config = entry.setdefault("clientConfig", {})
                if client_config.get("caBundle") != ca_bundle:
                    client_config["caBundle"] = ca_bundle
                    changed = True
            if not changed:
                break
            try:
                client.replace(resource, None, name, _for_update(config))
            except Conflict:
                continue
            log.info("caBundle of %s %s set", resource.kind, name)
            written.append(name)
            break
        else:
            raise BootstrapError(f"{resource.kind} {name} kept changing under us ({_ATTEMPTS} attempts)")
    return tuple(written)


def url_webhook_entry(adapter_name: str, base_url: str, ca_bundle: str) -> dict[str, Any]:
    """The webhook entry for one adapter reached at ``base_url`` (``https://host:port``): the
    same rules and policies as ``config/webhook/webhook.yaml``, with a URL instead of a Service."""
    return {
        "name": f"{adapter_name}.pods.resourceconsist.kusionstack.io",
        "admissionReviewVersions": ["v1"],
        "clientConfig": {"url": base_url.rstrip("/") + webhook_path(adapter_name), "caBundle": ca_bundle},
        "rules": [
            {
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "operations": ["CREATE"],
                "resources": ["pods"],
                "scope": "Namespaced",
            }
        ],
        "objectSelector": {"matchLabels": {wire.CONTROL_LABEL: wire.CONTROL_LABEL_VALUE}},
        "matchPolicy": "Equivalent",
        "reinvocationPolicy": "IfNeeded",
        "sideEffects": "None",
        "failurePolicy": "Fail",
        "timeoutSeconds": 10,
    }


def register_url_webhooks(
    client: KubeClient,
    base_url: str,
    adapter_names: Sequence[str],
    ca_bundle: str,
    *,
    name: str = wire.MUTATING_WEBHOOK_CONFIGURATION,
) -> bool:
    """Create or update the MutatingWebhookConfiguration ``name`` so that it holds exactly one
    URL entry per adapter; True when it was written (nothing is written when it matches)."""
    webhooks = [url_webhook_entry(adapter, base_url, ca_bundle) for adapter in sorted(adapter_names)]
    resource = kube.MUTATING_WEBHOOK_CONFIGURATION
    for _ in range(_ATTEMPTS):
        current = client.get_or_none(resource, None, name)
        body: KubeObject = {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": name, "labels": dict(_MANAGED_BY)},
            "webhooks": webhooks,
        }
        try:
            if current is None:
                client.create(resource, None, body)
            elif _url_entries(current) == _url_entries(body):
                return False
            else:
                body["metadata"]["resourceVersion"] = _rv(current)
                client.replace(resource, None, name, body)
        except Conflict:  # created or changed by someone else meanwhile: look again
            continue
        log.info("MutatingWebhookConfiguration %s points at %s", name, base_url)
        return True
    raise BootstrapError(f"MutatingWebhookConfiguration {name} kept changing under us ({_ATTEMPTS} attempts)")


def _url_entries(config: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    entries = []
    for webhook in config.get("webhooks") or []:
        client_config = webhook.get("clientConfig") or {}
        url, ca_bundle = client_config.get("url"), client_config.get("caBundle")
        entries.append((str(webhook.get("name")), str(url), str(ca_bundle)))
    return entries


# -- files ---------------------------------------------------------------------------------


def _write_atomically(path: Path, data: bytes, mode: int) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_cert_files(cert_dir: Path | str, serving: certs.KeyPair) -> tuple[Path, Path, bool]:
    """Write ``tls.crt``/``tls.key`` unless they already hold ``serving``; returns the paths and
    whether anything was written. Each file is replaced atomically, so a reader never sees a
    torn file."""
    directory = Path(cert_dir)
    directory.mkdir(parents=True, exist_ok=True)
    cert_file, key_file = directory / TLS_CERT_FILE, directory / TLS_KEY_FILE
    wrote = False
    for path, data, mode in ((key_file, serving.key_pem, 0o600), (cert_file, serving.cert_pem, 0o644)):
        try:
            same = path.read_bytes() == data
        except FileNotFoundError:
            same = False
        if not same:
            _write_atomically(path, data, mode)
            wrote = True
    return cert_file, key_file, wrote


# -- all of it -------------------------------------------------------------------------------


def ensure_webhook_certificates(
    client: KubeClient, cert_dir: Path | str, options: BootstrapOptions | None = None
) -> BootstrapResult:
    """Ensure the Secret, the caBundles and the cert files in ``cert_dir`` as ``options`` say
    (default ``BootstrapOptions()``; the steps: the module docstring)."""
    options = options if options is not None else BootstrapOptions()
    ns = kube.pod_namespace(options.namespace)
    found, action, rv = ensure_secret(
        client,
        ns,
        options.hosts(ns),
        options,
        bundle_everywhere=lambda bundle: _configurations_carry(client, bundle),
    )
    patched = ensure_ca_bundle(client, found.ca_bundle)
    cert_file, key_file, wrote = write_cert_files(cert_dir, found.serving)
    log.info(
        "webhook certificates ensured: Secret %s/%s %s, caBundle written to %s, cert files %s",
        ns,
        wire.WEBHOOK_CERT_SECRET,
        action,
        ", ".join(patched) or "nothing (already set)",
        "written" if wrote else "unchanged",
    )
    return BootstrapResult(found, action, rv, patched, cert_file, key_file, wrote)
