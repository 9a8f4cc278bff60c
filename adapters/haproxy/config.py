"""What the ``haproxy`` adapter reads on Services and pods, and how it names its servers.

A Service is this adapter's when it carries ``kusionstack.io/control: "true"`` and the annotation
``BACKEND_ANNOTATION`` naming an HAProxy backend. Each pod it serves becomes one server of that
backend on every instance, named ``rc:<namespace>:<service>:<pod>`` (``server_name``): the name
says whose it is, so the adapter finds its servers in any backend (a Service that moved to another
backend, a Service that is gone) and never touches a server it did not name (the configuration's
own servers, another tool's). HAProxy allows letters, digits and ``. _ : -`` in names; Kubernetes
names use a subset, so the four parts never run into each other.

Every parser raises ``HAProxyConfigError`` naming the object, the annotation and the value at
fault, so a typo is a Warning event on the Service, never wrong servers (docs/haproxy.md).
"""

from __future__ import annotations

from typing import Final, NamedTuple

from resourceconsist import wire
from resourceconsist.cluster.kube import KubeObject
from resourceconsist.errors import ResourceConsistError
from resourceconsist.rules import gates

from .. import podbackend
from .runtime import NAME_RE, OPTION_TOKEN_RE

#: Service annotation: the HAProxy backend its pods are servers of (declared in HAProxy's
#: configuration, with a dynamic ``balance`` algorithm: roundrobin, leastconn, random, first).
BACKEND_ANNOTATION: Final = "resource-consist.kusionstack.io/haproxy-backend"
#: Service annotation: ``manage`` (default: the adapter adds and removes the pods' servers) or
#: ``observe`` (someone else does, e.g. ``server-template`` with DNS discovery; the adapter only
#: reads, and guards each pod until no server at its IP may route to it).
MODE_ANNOTATION: Final = "resource-consist.kusionstack.io/haproxy-mode"
MODES: Final = ("manage", "observe")
#: Service annotation: the servers' port, a number or a container port name; default: the
#: ``targetPort`` of the Service's only port.
PORT_ANNOTATION: Final = "resource-consist.kusionstack.io/haproxy-backend-port"
#: Pod, else Service annotation: the server's weight, 0..256 (HAProxy's range); default 1,
#: HAProxy's own default.
WEIGHT_ANNOTATION: Final = "resource-consist.kusionstack.io/haproxy-weight"
DEFAULT_WEIGHT: Final = 1
MAX_WEIGHT: Final = 256
#: Service annotation: the options of the ``add server`` line (HAProxy's server keywords, of
#: ``SERVER_OPTIONS`` only); default ``check``: HAProxy's own health checks decide what serves.
OPTIONS_ANNOTATION: Final = "resource-consist.kusionstack.io/haproxy-server-options"
DEFAULT_OPTIONS: Final = ("check",)
#: Seconds a leaving server's established connections get to end when the Service names no
#: drain time (``resource-consist.kusionstack.io/drain-seconds``): a drain ends earlier as soon
#: as the server has no session left on any instance.
DEFAULT_DRAIN_SECONDS: Final = 30.0

#: The prefix of every server name the adapter writes.
SERVER_PREFIX: Final = "rc:"

#: The server keywords the options annotation may use, with how many values each takes. Those
#: reading files on the HAProxy host (``crt``, ``ca-file``, ``source``, ...) or steering the
#: server's identity (``id``, ``track``) are left out: a Service's author must not reach them.
SERVER_OPTIONS: Final[dict[str, int]] = {
    "check": 0,
    "no-check": 0,
    "inter": 1,
    "fastinter": 1,
    "downinter": 1,
    "rise": 1,
    "fall": 1,
    "slowstart": 1,
    "maxconn": 1,
    "maxqueue": 1,
    "minconn": 1,
    "observe": 1,
    "on-error": 1,
    "error-limit": 1,
    "check-ssl": 0,
    "check-sni": 1,
    "check-alpn": 1,
    "check-proto": 1,
    "check-send-proxy": 0,
    "ssl": 0,
    "verify": 1,
    "sni": 1,
    "alpn": 1,
    "proto": 1,
    "send-proxy": 0,
    "send-proxy-v2": 0,
    "pool-max-conn": 1,
    "pool-purge-delay": 1,
    "ws": 1,
}


class HAProxyConfigError(ResourceConsistError, ValueError):
    """A label, annotation or setting the adapter cannot act on; the message says what to fix."""


def _where(obj: KubeObject) -> str:
    return podbackend.where(obj)


def backend_of(service: KubeObject) -> str:
    """The backend the Service names; empty when it names none."""
    return podbackend.annotation(service, BACKEND_ANNOTATION) or ""


def is_haproxy_service(service: KubeObject | None) -> bool:
    """Controlled (``kusionstack.io/control: "true"``) and naming a backend."""
    if service is None:
        return False
    labels = (service.get("metadata") or {}).get("labels") or {}
    return labels.get(wire.CONTROL_LABEL) == wire.CONTROL_LABEL_VALUE and bool(backend_of(service))


def checked_backend(service: KubeObject) -> str:
    """The Service's backend; ``HAProxyConfigError`` when it has characters HAProxy refuses."""
    backend = backend_of(service)
    if backend and not NAME_RE.match(backend):
        raise HAProxyConfigError(
            f"{_where(service)}: annotation {BACKEND_ANNOTATION}={backend!r} is not an HAProxy "
            "backend name (letters, digits, '.', '_', ':', '-')"
        )
    return backend


def observed(service: KubeObject) -> bool:
    """Whether the Service's mode is ``observe``."""
    value = (podbackend.annotation(service, MODE_ANNOTATION) or "manage").lower()
    if value not in MODES:
        raise HAProxyConfigError(
            f"{_where(service)}: annotation {MODE_ANNOTATION}={value!r} is neither 'manage' nor 'observe'"
        )
    return value == "observe"


def server_options(service: KubeObject) -> tuple[str, ...]:
    """The options of the Service's ``add server`` lines, checked against ``SERVER_OPTIONS``."""
    value = podbackend.annotation(service, OPTIONS_ANNOTATION)
    if value is None:
        return DEFAULT_OPTIONS
    tokens = value.split()
    index = 0
    while index < len(tokens):
        keyword = tokens[index]
        arity = SERVER_OPTIONS.get(keyword)
        if arity is None:
            raise HAProxyConfigError(
                f"{_where(service)}: annotation {OPTIONS_ANNOTATION}: {keyword!r} is not a server "
                f"option this adapter passes on (it takes: {', '.join(sorted(SERVER_OPTIONS))})"
            )
        values = tokens[index + 1 : index + 1 + arity]
        if len(values) != arity or not all(OPTION_TOKEN_RE.match(v) for v in values):
            raise HAProxyConfigError(
                f"{_where(service)}: annotation {OPTIONS_ANNOTATION}: {keyword!r} needs {arity} value(s) "
                "of letters, digits and . _ : , / ( ) + = @ -"
            )
        index += 1 + arity
    return tuple(tokens)


def health_checked(options: tuple[str, ...]) -> bool:
    """Whether servers added with ``options`` run HAProxy's health checks."""
    return "check" in options and "no-check" not in options


def drain_seconds(service: KubeObject) -> float:
    """The Service's drain time (``resource-consist.kusionstack.io/drain-seconds``, the one the
    webhook turns into a ``preStop`` sleep), else ``DEFAULT_DRAIN_SECONDS``."""
    try:
        seconds = gates.drain_seconds(service)
    except gates.InvalidAnnotation as err:
        raise HAProxyConfigError(f"{_where(service)}: {err}") from None
    return DEFAULT_DRAIN_SECONDS if seconds is None else float(seconds)


def backend_port(service: KubeObject, pod: KubeObject) -> int | None:
    """The servers' port for ``pod`` (``podbackend.backend_port`` with ``PORT_ANNOTATION``)."""
    try:
        return podbackend.backend_port(service, pod, PORT_ANNOTATION)
    except podbackend.BackendSettingError as err:
        raise HAProxyConfigError(str(err)) from None


def server_weight(service: KubeObject, pod: KubeObject) -> int:
    """The pod's weight annotation, else the Service's, else 1."""
    try:
        return podbackend.backend_weight(service, pod, WEIGHT_ANNOTATION, MAX_WEIGHT, DEFAULT_WEIGHT)
    except podbackend.BackendSettingError as err:
        raise HAProxyConfigError(str(err)) from None


class ServerOwner(NamedTuple):
    """Whose a server is, from its name."""

    namespace: str
    service: str
    pod: str


def server_name(namespace: str, service: str, pod: str) -> str:
    """``rc:<namespace>:<service>:<pod>``: the name of the server of ``pod`` for the Service."""
    return f"{SERVER_PREFIX}{namespace}:{service}:{pod}"


def owner_of(server: str) -> ServerOwner | None:
    """The Service and pod a server name of ours names; None for any other server."""
    if not server.startswith(SERVER_PREFIX):
        return None
    parts = server[len(SERVER_PREFIX) :].split(":")
    if len(parts) != 3 or not all(parts):
        return None
    return ServerOwner(*parts)
