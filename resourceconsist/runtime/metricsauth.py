"""Secure metrics: who may read ``/metrics``, asked of the API server, and the TLS it is served with.

controller-runtime's ``filters.WithAuthenticationAndAuthorization``, in the frame's terms
(docs/observability.md, "Secure metrics"): a request's bearer token goes to the API server in a
TokenReview (who is it?), the user it names in a SubjectAccessReview (may they ``get`` the
non-resource URL of the request, ``/metrics``?). No token, or one the API server does not know:
401. A user who may not: 403. The API server unreachable or refusing the review: 500, and
nothing is kept. The answers are kept as controller-runtime keeps them (``SecureMetricsOptions``:
a TokenReview's for 1 minute, an allowing SubjectAccessReview's for 5, a denying one's for 30
seconds), so a scrape every 30 seconds costs the API server two requests every few minutes, not
two a scrape. Tokens are kept only as their SHA-256, and the caches hold a bounded number of
answers (the oldest go first), so a flood of made-up tokens cannot grow the process.

The serving certificate is the files of a cert dir, followed as they change (the certificate
watcher of resourceconsist/cluster/certwatcher.py, counted in ``certwatcher_*``), or, without
one, made in memory at start.

No library fits: the Kubernetes Python client has no delegating authenticator or authorizer,
and a proxy in front (kube-rbac-proxy) is the separate container kubebuilder dropped for this
filter.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import socket
import ssl
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Generic, TypeVar

from resourceconsist.cluster import kube
from resourceconsist.cluster.certwatcher import CertificateReloader, self_signed_context
from resourceconsist.cluster.kube import KubeClient
from resourceconsist.errors import ResourceConsistError
from resourceconsist.options import SecureMetricsOptions

log = logging.getLogger(__name__)

TOKEN_REVIEW: Final = kube.Resource(
    "authentication.k8s.io", "v1", "TokenReview", "tokenreviews", namespaced=False
)
SUBJECT_ACCESS_REVIEW: Final = kube.Resource(
    "authorization.k8s.io", "v1", "SubjectAccessReview", "subjectaccessreviews", namespaced=False
)
#: Seconds a review may take (controller-runtime's TokenAccessReviewTimeout).
REVIEW_TIMEOUT: Final = 10.0
#: Answers each cache keeps at most.
MAX_CACHED: Final = 4096

K = TypeVar("K")
V = TypeVar("V")


class _Expiring(Generic[K, V]):
    """At most ``MAX_CACHED`` answers, each until its own expiry; the oldest go first."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._items: OrderedDict[K, tuple[float, V]] = OrderedDict()

    def get(self, key: K) -> tuple[bool, V | None]:
        found = self._items.get(key)
        if found is None:
            return False, None
        if found[0] <= self._clock():
            del self._items[key]
            return False, None
        return True, found[1]

    def put(self, key: K, value: V, ttl: float) -> None:
        if ttl <= 0:
            return
        self._items[key] = (self._clock() + ttl, value)
        self._items.move_to_end(key)
        while len(self._items) > MAX_CACHED:
            self._items.popitem(last=False)


@dataclass(frozen=True)
class User:
    """Who a token is, as the TokenReview said (``status.user``)."""

    name: str
    uid: str
    groups: tuple[str, ...]
    extra: tuple[tuple[str, tuple[str, ...]], ...]


class ReviewFailed(ResourceConsistError):
    """The API server did not answer a review (unreachable, refused, too slow)."""


class MetricsAuthorizer:
    """Decides a request to ``/metrics`` with the API server's TokenReview and
    SubjectAccessReview, keeping their answers for a while (``SecureMetricsOptions``)."""

    def __init__(
        self,
        client: KubeClient,
        options: SecureMetricsOptions,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.options = options
        self._tokens: _Expiring[str, User | None] = _Expiring(clock)
        self._decisions: _Expiring[tuple[User, str, str], tuple[bool, str]] = _Expiring(clock)
        #: Reviews sent to the API server so far, by kind (for tests and the docs' figures).
        self.reviews = {"TokenReview": 0, "SubjectAccessReview": 0}

    async def authenticate(self, token: str) -> User | None:
        """The user ``token`` is, or None when the API server does not know it."""
        key = hashlib.sha256(token.encode()).hexdigest()
        known, user = self._tokens.get(key)
        if known:
            return user
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}}
        status = await self._review(TOKEN_REVIEW, body)
        user = _user_of(status) if status.get("authenticated") else None
        self._tokens.put(key, user, self.options.authentication_ttl)
        return user

    async def authorize(self, user: User, verb: str, path: str) -> tuple[bool, str]:
        """Whether ``user`` may ``verb`` the non-resource URL ``path``, and the API server's reason."""
        key = (user, verb, path)
        known, decision = self._decisions.get(key)
        if known and decision is not None:
            return decision
        spec: dict[str, Any] = {
            "user": user.name,
            "groups": list(user.groups),
            "nonResourceAttributes": {"path": path, "verb": verb},
        }
        if user.uid:
            spec["uid"] = user.uid
        if user.extra:
            spec["extra"] = {name: list(values) for name, values in user.extra}
        body = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec}
        status = await self._review(SUBJECT_ACCESS_REVIEW, body)
        allowed = bool(status.get("allowed")) and not status.get("denied")
        decision = (allowed, str(status.get("reason") or status.get("evaluationError") or ""))
        ttl = self.options.allowed_ttl if allowed else self.options.denied_ttl
        self._decisions.put(key, decision, ttl)
        return decision

    async def _review(self, resource: kube.Resource, body: Mapping[str, Any]) -> Mapping[str, Any]:
        self.reviews[resource.kind] += 1
        try:
            answer = await asyncio.wait_for(
                asyncio.to_thread(self.client.create, resource, None, body), timeout=REVIEW_TIMEOUT
            )
        except Exception as err:
            raise ReviewFailed(f"{resource.kind}: {err}") from err
        status = answer.get("status") or {}
        return status if isinstance(status, Mapping) else {}

    async def decide(self, authorization: str | None, method: str, path: str) -> tuple[int, str]:
        """The HTTP status for a request with the ``Authorization`` header ``authorization``
        (200: serve it) and, when refused, the text to answer."""
        scheme, _, token = (authorization or "").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return 401, "Unauthorized"
        try:
            user = await self.authenticate(token)
        except ReviewFailed as err:
            log.error("metrics: authentication failed: %s", err)
            return 500, "Authentication failed"
        if user is None:
            return 401, "Unauthorized"
        try:
            allowed, reason = await self.authorize(user, method.lower(), path)
        except ReviewFailed as err:
            log.error("metrics: authorization for user %s failed: %s", user.name, err)
            return 500, f"Authorization for user {user.name} failed"
        if not allowed:
            log.debug("metrics: authorization denied for user %s: %s", user.name, reason)
            return 403, f"Authorization denied for user {user.name}"
        return 200, ""


def _user_of(status: Mapping[str, Any]) -> User:
    user = status.get("user") or {}
    extra = user.get("extra") or {}
    return User(
        name=str(user.get("username") or ""),
        uid=str(user.get("uid") or ""),
        groups=tuple(str(g) for g in user.get("groups") or ()),
        extra=tuple(sorted((str(k), tuple(str(v) for v in values or ())) for k, values in extra.items())),
    )


def serving_context(
    options: SecureMetricsOptions, on_read: Callable[[bool], None] | None = None
) -> tuple[ssl.SSLContext, CertificateReloader | None]:
    """The metrics endpoint's TLS: the cert dir's files, loaded now and followed by the returned
    reloader (start it on the loop, stop it with the server), or a certificate made now."""
    files = options.files()
    if files is None:
        host = socket.gethostname()
        hosts = tuple(dict.fromkeys(("localhost", "127.0.0.1", "::1", host)))
        return self_signed_context(f"{host}-metrics", hosts), None
    reloader = CertificateReloader(files[0], files[1], name="metrics", on_read=on_read)
    reloader.load()  # raises when the files hold no certificate: the manager does not start
    return reloader.listener_context, reloader
