"""Why a request to the API server failed, in one line that says what to do.

A process that cannot start (a cache that cannot fill, the webhook's certificate bootstrap)
stops with one such line, and ``/readyz`` answers with it meanwhile (docs/observability.md,
"When the start fails"). The causes told apart are the ones an install meets: an API server that
cannot be reached, TLS that fails (a wrong CA), credentials it refuses (401), a request RBAC
refuses (403, naming the user, the verb and the resource missing), and any other answer.
"""

from __future__ import annotations

import re
import ssl
from collections.abc import Iterator

from resourceconsist.cluster.kube import ApiError, is_unreachable

#: The message of a 403 the API server's RBAC authorizer writes.
_FORBIDDEN = re.compile(
    r'User "(?P<user>[^"]+)" cannot (?P<verb>\S+) resource "(?P<resource>[^"]+)"'
    r'(?: in API group "(?P<group>[^"]*)")?'
    r'(?: in the namespace "(?P<namespace>[^"]+)"| at the cluster scope)?'
)


def explain(err: BaseException, host: str = "") -> str:
    """``err`` (a request's failure) as ``<cause>; <what to do>``, one line; ``host`` is the API
    server's address, named in the line."""
    server = f"the API server {host}" if host else "the API server"
    if isinstance(err, ApiError):
        return _answered(err, server)
    tls = _find(err, (ssl.SSLError, ssl.CertificateError))
    if tls is not None:
        return (
            f"TLS with {server} failed ({_tls_detail(tls)}); check the certificate authority (and "
            "tls-server-name) the kubeconfig's cluster names, or --context"
        )
    if is_unreachable(err):
        return (
            f"cannot reach {server} ({_connection_detail(err)}); check that it runs and that "
            "--kubeconfig and --context name it"
        )
    return f"{type(err).__name__}: {_first_line(err)}"


def _answered(err: ApiError, server: str) -> str:
    if err.status == 401:
        return (
            f"{server} does not accept the credentials (401 Unauthorized); the token or client "
            "certificate of the kubeconfig's user (or the pod's ServiceAccount token) is wrong or "
            "expired: renew it"
        )
    if err.status == 403:
        found = _FORBIDDEN.search(err.message)
        if found is None:
            return f"{server} refused: {_first_line(err)} (403 Forbidden); grant what it names"
        user, verb, resource = found["user"], found["verb"], found["resource"]
        group = f" (API group {found['group']})" if found["group"] else ""
        where = f"in namespace {found['namespace']}" if found["namespace"] else "cluster-wide"
        binding = "a Role and RoleBinding" if found["namespace"] else "a ClusterRole and ClusterRoleBinding"
        # A cache lists, then watches: granted list alone, it would fail next on watch.
        verbs = "list and watch" if verb == "list" else verb
        return (
            f"{user} may not {verb} {resource}{group} {where} (403 Forbidden); grant it {verbs} on "
            f"{resource} there ({binding}; the chart's: docs/security.md)"
        )
    return f"{server} answered {err.status} {err.reason}: {_first_line(err)}"


def _causes(err: BaseException) -> Iterator[BaseException]:
    """``err`` and what it wraps: urllib3's ``reason``, aiohttp's ``os_error`` and
    ``certificate_error``, the exception chain and exceptions among the arguments."""
    seen: set[int] = set()
    todo = [err]
    while todo:
        current = todo.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        for name in ("reason", "os_error", "certificate_error"):
            wrapped = getattr(current, name, None)
            if isinstance(wrapped, BaseException):
                todo.append(wrapped)
        todo.extend(a for a in current.args if isinstance(a, BaseException))
        todo.extend(e for e in (current.__cause__, current.__context__) if e is not None)


def _find(err: BaseException, kinds: tuple[type[BaseException], ...]) -> BaseException | None:
    return next((e for e in _causes(err) if isinstance(e, kinds)), None)


def _tls_detail(err: BaseException) -> str:
    verify = getattr(err, "verify_message", None)
    if verify:
        return f"certificate verify failed: {verify}"
    reason = getattr(err, "reason", None)
    return str(reason).replace("_", " ").lower() if isinstance(reason, str) else _first_line(err)


def _connection_detail(err: BaseException) -> str:
    for cause in _causes(err):
        if isinstance(cause, TimeoutError) or type(cause).__name__ in (
            "ConnectTimeoutError",
            "ReadTimeoutError",
        ):
            return "no answer in time"
        if isinstance(cause, OSError) and cause.strerror:
            return cause.strerror.lower()
    return _first_line(err)


def _first_line(err: BaseException) -> str:
    text = (err.message if isinstance(err, ApiError) else str(err)) or type(err).__name__
    return re.sub(r"^\[Errno -?\d+\] ", "", text.splitlines()[0])[:300]
