"""The settings of a manager: ``ManagerOptions``, with ``LeaderElectionOptions``,
``GarbageOptions``, ``ProviderBudgetOptions``, ``ShardingOptions`` and ``SecureMetricsOptions``
inside (docs/reference/options.md).

They live apart from what they configure and import only the standard library and the error
tree, so the command line takes its flags' defaults from them without importing the manager,
its HTTP server or the Kubernetes client (``resourceconsist --help`` stays light).
"""

from __future__ import annotations

import os
import re
import socket
import uuid
from dataclasses import dataclass, field
from typing import Final

from resourceconsist.errors import InvalidOptions, check_seconds


def _identity() -> str:
    return f"{os.environ.get('POD_NAME') or socket.gethostname()}_{uuid.uuid4().hex[:8]}"


#: A namespace's name (an RFC 1123 label), as the API server checks it.
_NAMESPACE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")

#: The default of ``ManagerOptions.full_pass_every``: an employer's memo is rebuilt at least this often.
DEFAULT_FULL_PASS_EVERY: Final = 300.0


@dataclass(frozen=True)
class LeaderElectionOptions:
    """Which Lease the replicas of a manager compete for, and how fast (controller-runtime's
    ``LeaderElectionID``, ``LeaseDuration``, ``RenewDeadline``, ``RetryPeriod``).

    The timings must satisfy lease duration > renew deadline > retry period > 0, else
    ``InvalidOptions`` says which; how to choose them: docs/concepts.md, "Leader election timings".
    """

    #: Name of the Lease (``resourceconsist run --leader-election-id``).
    name: str = "resourceconsist-manager"
    #: Namespace of the Lease; None: the pod's own (``$POD_NAMESPACE``), else ``resourceconsist``.
    namespace: str | None = None
    #: This replica's name in the Lease; by default ``$POD_NAME`` (else the host name) and a
    #: random suffix, so a restarted pod never mistakes its predecessor's lease for its own.
    identity: str = field(default_factory=_identity)
    #: Seconds a standby waits after the last renewal before it takes the Lease over: the
    #: longest a crashed leader leaves the controllers unattended.
    lease_duration: float = 15.0
    #: Seconds the leader keeps trying to renew before it steps down; shorter than the lease,
    #: so a leader cut off from the API server stops before anyone else may start.
    renew_deadline: float = 10.0
    #: Seconds between two attempts to acquire or renew.
    retry_period: float = 2.0

    def __post_init__(self) -> None:
        if not self.name:
            raise InvalidOptions("the Lease needs a name", "name")
        check_seconds("retry_period", self.retry_period)
        if not self.renew_deadline > self.retry_period:
            raise InvalidOptions(
                f"renew deadline ({self.renew_deadline:g}s) must be longer than the retry period "
                f"({self.retry_period:g}s), so the leader gets more than one try to renew before "
                "stepping down",
                "renew_deadline",
                "retry_period",
            )
        if not self.lease_duration > self.renew_deadline:
            raise InvalidOptions(
                f"lease duration ({self.lease_duration:g}s) must be longer than the renew deadline "
                f"({self.renew_deadline:g}s), so a leader that cannot renew steps down before a "
                "standby takes over",
                "lease_duration",
                "renew_deadline",
            )


#: What a name written into a label value may be: at most 63 characters, alphanumerics, ``-``, ``_``
#: and ``.``, starting and ending with an alphanumeric.
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
#: A ControllerRing's name: a DNS label (it ends the shard and drain label keys).
_RING_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def _shard_name() -> str:
    return os.environ.get("POD_NAME") or socket.gethostname()


@dataclass(frozen=True)
class ShardingOptions:
    """Active-active sharding (docs/scaling.md): every replica reconciles the employers assigned
    to it, announced by its own shard Lease, in kubernetes-controller-sharding's protocol.

    The timings of the shard Lease are leader election's (lease duration > renew deadline >
    retry period > 0); ``InvalidOptions`` names the field at fault.
    """

    #: The ControllerRing's name: it ends the shard and drain label keys and labels the Leases
    #: (``resourceconsist run --controller-ring``).
    controller_ring: str
    #: This replica's shard: the name of its Lease, its holder and the shard label's value. By
    #: default ``$POD_NAME``, else the host name: a restarted pod keeps its name and its share.
    shard_name: str = field(default_factory=_shard_name)
    #: Namespace of the shard Leases and the sharder's Lease; None: the pod's own
    #: (``$POD_NAMESPACE``), else ``resourceconsist``.
    namespace: str | None = None
    #: Seconds after the last renewal a shard counts as expired; its employers move away one
    #: more lease duration later (docs/scaling.md, "Shard states").
    lease_duration: float = 15.0
    #: Seconds a shard keeps trying to renew before it stops its controllers.
    renew_deadline: float = 10.0
    #: Seconds between two renewals.
    retry_period: float = 2.0
    #: Run the built-in sharder (one replica at a time, elected on its own Lease); False where
    #: kubernetes-controller-sharding's sharder assigns the employers.
    sharder: bool = True
    #: Seconds between two full resyncs of the sharder (between them it acts on events).
    sharder_resync: float = 60.0
    #: Release the shard Lease on a graceful stop, so the employers move at once
    #: (controller-runtime's ``LeaderElectionReleaseOnCancel``); False: they wait for it to expire.
    release_on_cancel: bool = True
    #: Each shard lists and watches only the pods whose employer label names one of its Services
    #: (or is shared), writing the label where the webhook did not (docs/scaling.md, "Pods
    #: selected by the API server"): the decoding of pod events divides among the replicas.
    #: Needs the webhook's ``--pod-employer-label`` and the admission policy that allows the label.
    pod_employer_label: bool = False
    #: How the built-in sharder places employers: ``"ring"``, the protocol's consistent-hash ring
    #: (kubernetes-controller-sharding's sharder places them the same), or ``"balanced"``: no shard
    #: holds more than 2 % above an even share (docs/scaling.md, "Balanced placement"). Every
    #: replica of a ring must run with the same.
    placement: str = "ring"
    #: Seconds the built-in sharder waits, when no employer is on an available shard yet (a
    #: cold start of the ring), for the shard Leases to stop coming: it places nothing until
    #: the youngest shard has held its Lease this long (and at most five times as long after
    #: the sharder started), so employers are placed over the shards that start together
    #: instead of moving after their first placement (docs/scaling.md, "The sharder"); 0: at
    #: once.
    sharder_settle: float = 3.0

    def __post_init__(self) -> None:
        if not _RING_NAME.match(self.controller_ring):
            raise InvalidOptions(
                f"controller ring {self.controller_ring!r} must be a DNS label (lower-case "
                "alphanumerics and '-', at most 63 characters): it ends the shard label's key",
                "controller_ring",
            )
        if not self.shard_name or not _LABEL_VALUE.match(self.shard_name):
            raise InvalidOptions(
                f"shard name {self.shard_name!r} must be a label value (alphanumerics, '-', '_', '.', "
                "at most 63 characters): it is the shard label's value; set it, or $POD_NAME",
                "shard_name",
            )
        check_seconds("sharder_resync", self.sharder_resync)
        check_seconds("sharder_settle", self.sharder_settle, zero=True)
        if self.placement not in ("ring", "balanced"):
            raise InvalidOptions(f"placement {self.placement!r} must be 'ring' or 'balanced'", "placement")
        # The same rules as leader election's, checked by the same code.
        self.lease_options()

    @property
    def sharder_lease(self) -> str:
        """The Lease the replicas compete for to run the sharder."""
        return f"{self.controller_ring}-sharder"

    def lease_options(self) -> LeaderElectionOptions:
        """The shard Lease as leader election's options: named after the shard and held by it."""
        return LeaderElectionOptions(
            name=self.shard_name,
            namespace=self.namespace,
            identity=self.shard_name,
            lease_duration=self.lease_duration,
            renew_deadline=self.renew_deadline,
            retry_period=self.retry_period,
        )

    def sharder_options(self) -> LeaderElectionOptions:
        """The sharder's election, with the shard Lease's timings."""
        return LeaderElectionOptions(
            name=self.sharder_lease,
            namespace=self.namespace,
            identity=_identity(),
            lease_duration=self.lease_duration,
            renew_deadline=self.renew_deadline,
            retry_period=self.retry_period,
        )


@dataclass(frozen=True)
class GarbageOptions:
    """When a controller looks for orphans (docs/lifecycle-hooks.md, "Orphans"); part of
    ``ManagerOptions``."""

    #: False: never look for orphans (``resourceconsist run --no-garbage``).
    enabled: bool = True
    #: Seconds between two passes, after the one at start-up; None: at start-up only.
    interval: float | None = 600.0
    #: Only report what a pass would delete (``--garbage-dry-run``).
    dry_run: bool = False
    #: How soon an owner whose collection is not finished (e.g. a drain) is tried again.
    retry: float = 5.0

    def __post_init__(self) -> None:
        check_seconds("interval", self.interval)
        check_seconds("retry", self.retry)


#: The default burst of a provider budget: requests a full bucket lets through at once.
DEFAULT_PROVIDER_BURST: Final = 10


@dataclass(frozen=True)
class ProviderBudgetOptions:
    """The rate and burst of every provider account's API budget (resourceconsist/flow/budget.py;
    docs/concepts.md, "The provider budget"); part of ``ManagerOptions``."""

    #: Provider requests a second per account; None: no client-side limit.
    rate: float | None = None
    #: Requests a full bucket lets through at once.
    burst: int = DEFAULT_PROVIDER_BURST
    #: The fraction of ``rate`` this process takes: 1 for a single leader; a sharded manager
    #: divides it by the ring's ready shards (docs/scaling.md, "The provider budget across shards").
    share: float = 1.0

    def __post_init__(self) -> None:
        if self.rate is not None and not 0 < self.rate < float("inf"):
            raise InvalidOptions(
                f"provider rate {self.rate!r} is not a positive number of requests a second; "
                "give e.g. 10, or leave it unset for no client-side limit",
                "rate",
            )
        if isinstance(self.burst, bool) or not isinstance(self.burst, int) or self.burst < 1:
            raise InvalidOptions(f"provider burst {self.burst!r} must be a whole number >= 1", "burst")
        if not 0 < self.share <= 1:
            raise InvalidOptions(
                f"provider budget share {self.share!r} must be above 0 and at most 1", "share"
            )

    @property
    def effective_rate(self) -> float | None:
        """The rate this process spends: ``rate`` times ``share``."""
        return None if self.rate is None else self.rate * self.share


#: The file names of a serving certificate and its key in a cert dir (controller-runtime's).
DEFAULT_CERT_NAME: Final = "tls.crt"
DEFAULT_KEY_NAME: Final = "tls.key"


@dataclass(frozen=True)
class SecureMetricsOptions:
    """``/metrics`` over HTTPS, for callers the API server vouches for (controller-runtime's
    ``SecureServing`` with its ``WithAuthenticationAndAuthorization`` filter; docs/observability.md,
    "Secure metrics"): each request's bearer token is checked with a TokenReview, and the user it
    names with a SubjectAccessReview for ``get`` on the non-resource URL ``/metrics``. No token:
    401; a token that may not: 403. The answers are kept for a while, so a scrape is not two API
    requests each time. The manager's ServiceAccount needs ``create`` on ``tokenreviews`` and
    ``subjectaccessreviews`` (docs/security.md); part of ``ManagerOptions``."""

    #: A directory holding the serving certificate (``cert_name``, ``key_name``), read again when
    #: it changes (``--metrics-cert-path``); None: a certificate made in memory at start,
    #: self-signed (scrapers skip verifying it, as kubebuilder's ServiceMonitor does).
    cert_path: str | None = None
    #: The certificate's file name in ``cert_path`` (``--metrics-cert-name``).
    cert_name: str = DEFAULT_CERT_NAME
    #: The key's file name in ``cert_path`` (``--metrics-cert-key``).
    key_name: str = DEFAULT_KEY_NAME
    #: Seconds a TokenReview's answer (who the token is, or that it is no one) is kept:
    #: controller-runtime's 1 minute.
    authentication_ttl: float = 60.0
    #: Seconds an allowing SubjectAccessReview is kept: controller-runtime's 5 minutes.
    allowed_ttl: float = 300.0
    #: Seconds a denying SubjectAccessReview is kept: controller-runtime's 30 seconds.
    denied_ttl: float = 30.0

    def __post_init__(self) -> None:
        for name in ("cert_name", "key_name"):
            value = getattr(self, name)
            if not value or "/" in value:
                raise InvalidOptions(
                    f"{name.replace('_', ' ')} {value!r} must be a file name in the cert path", name
                )
        for name in ("authentication_ttl", "allowed_ttl", "denied_ttl"):
            check_seconds(name, getattr(self, name), zero=True)

    def files(self) -> tuple[str, str] | None:
        """The certificate's and the key's paths; None without ``cert_path``."""
        if self.cert_path is None:
            return None
        return os.path.join(self.cert_path, self.cert_name), os.path.join(self.cert_path, self.key_name)


@dataclass(frozen=True)
class ManagerOptions:
    """What a ``Manager`` watches, serves and how it stops (controller-runtime's
    ``manager.Options``). Bad values raise ``InvalidOptions`` naming the field."""

    #: Watch only this namespace (namespaced kinds); None: all namespaces (unless ``namespaces``).
    namespace: str | None = None
    #: Watch only these namespaces (controller-runtime's ``Cache.DefaultNamespaces``;
    #: ``resourceconsist run --namespace a,b``); empty: all (unless ``namespace``). Exclusive
    #: with ``namespace``, which is the one-namespace shorthand.
    namespaces: tuple[str, ...] = ()
    #: Seconds between full resyncs of every informer cache; None: never (events only).
    resync_period: float | None = None
    #: Seconds after which an employer's next pass is a full one whatever changed, so state an
    #: adapter keeps in its memo can never drift for long (docs/concepts.md, "Work proportional
    #: to change"); 0: every pass is a full one.
    full_pass_every: float = DEFAULT_FULL_PASS_EVERY
    #: ``(host, port)`` of ``/metrics`` (controller-runtime's ``Metrics.BindAddress``; an empty
    #: host: every interface; port 0: any free port); None: not served. ``resourceconsist run``
    #: and ``webhook`` serve it on ``:8080`` (``--metrics-bind-address``; ``0`` turns it off).
    metrics_address: tuple[str, int] | None = None
    #: ``/metrics`` over HTTPS for the callers the API server vouches for (controller-runtime's
    #: ``SecureServing``; ``resourceconsist run --metrics-secure``); None: plain HTTP, open to
    #: whoever reaches the port. Needs ``metrics_address`` and a port of its own (not the probes').
    secure_metrics: SecureMetricsOptions | None = None
    #: ``(host, port)`` of ``/healthz`` and ``/readyz`` (controller-runtime's
    #: ``HealthProbeBindAddress``); None: not served. The CLI serves them on ``:8081``
    #: (``--health-probe-bind-address``). The same address and port as ``metrics_address``: one server.
    health_probe_address: tuple[str, int] | None = None
    #: ``(host, port)`` of the drain endpoint, where the drain waiters of pods whose employer asks
    #: for the ``wait`` drain ask whether a provider still routes to their pod (docs/zero-downtime.md,
    #: "A drain that waits for the provider"; ``resourceconsist run --drain-bind-address``); None:
    #: not served. Plain HTTP: it tells only whether a pod is released.
    drain_address: tuple[str, int] | None = None
    #: Seconds in-flight reconciles get to finish when the manager stops.
    shutdown_timeout: float = 30.0
    #: Seconds the caches get to fill (each its first list) once the manager starts, as
    #: controller-runtime's ``CacheSyncTimeout``: a start that cannot fill one in time fails,
    #: naming the resource, why and what to do (docs/observability.md, "When the start fails").
    cache_sync_timeout: float = 120.0
    #: Reconcile only while holding a Lease; None: always (a single replica).
    leader_election: LeaderElectionOptions | None = None
    #: The orphan-collection pass of every controller (docs/lifecycle-hooks.md, "Orphans").
    garbage: GarbageOptions = field(default_factory=GarbageOptions)
    #: The API budget of every provider account of the process (``--provider-rate``,
    #: ``--provider-burst``); by default no client-side limit.
    provider_budget: ProviderBudgetOptions = field(default_factory=ProviderBudgetOptions)
    #: Share the employers among active replicas (docs/scaling.md); excludes ``leader_election``.
    sharding: ShardingOptions | None = None
    #: Cache only the pods this label selector selects (``labelSelector`` syntax, e.g.
    #: ``kusionstack.io/control=true``), and those carrying the frame's marks whatever their labels
    #: (docs/concepts.md, "Pods the caches keep"); None: every pod of the watched namespaces.
    pod_label_selector: str | None = None
    #: Passes each controller runs at once (controller-runtime's ``MaxConcurrentReconciles``;
    #: ``resourceconsist run --max-concurrent-reconciles``); None: what the adapter asks for
    #: (``ReconcileOptions.get_max_concurrent``), else 5. Set, it wins over the adapter's.
    max_concurrent_reconciles: int | None = None
    #: Seconds a pass may run before it is cancelled (controller-runtime's
    #: ``ReconciliationTimeout``; ``resourceconsist run --reconcile-timeout``): its cancellation's
    #: deadline, which the frame and adapters check between steps; the pass is tried again with
    #: backoff and counted in ``controller_runtime_reconcile_timeouts_total``. None: no limit.
    reconcile_timeout: float | None = None

    def __post_init__(self) -> None:
        # A list is taken too; the options stay frozen and hashable.
        object.__setattr__(self, "namespaces", tuple(self.namespaces))
        if self.namespace is not None and self.namespaces:
            raise InvalidOptions(
                f"namespace {self.namespace!r} and namespaces {list(self.namespaces)} both given: "
                "give the one namespace as namespace, or every namespace as namespaces",
                "namespace",
                "namespaces",
            )
        given = ([] if self.namespace is None else [self.namespace]) + list(self.namespaces)
        for name in given:
            if not _NAMESPACE_NAME.fullmatch(name):
                raise InvalidOptions(
                    f"namespace {name!r} is not a namespace name (lower-case letters, digits and "
                    "'-', at most 63, starting and ending with a letter or digit)",
                    "namespace" if self.namespace is not None else "namespaces",
                )
        repeated = sorted({name for name in self.namespaces if self.namespaces.count(name) > 1})
        if repeated:
            raise InvalidOptions(f"namespaces lists {', '.join(repeated)} more than once", "namespaces")
        concurrency = self.max_concurrent_reconciles
        if concurrency is not None and (
            isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1
        ):
            raise InvalidOptions(
                f"max concurrent reconciles {concurrency!r} must be a whole number >= 1 (passes each "
                "controller runs at once), or unset for the adapter's own",
                "max_concurrent_reconciles",
            )
        check_seconds("resync_period", self.resync_period)
        check_seconds("reconcile_timeout", self.reconcile_timeout)
        check_seconds("full_pass_every", self.full_pass_every, zero=True)
        check_seconds("shutdown_timeout", self.shutdown_timeout, zero=True)
        check_seconds("cache_sync_timeout", self.cache_sync_timeout)
        for name in ("metrics_address", "health_probe_address", "drain_address"):
            address = getattr(self, name)
            if address is not None and not 0 <= address[1] <= 65535:
                raise InvalidOptions(
                    f"{name.replace('_', ' ')} {address[0]}:{address[1]} has no valid port (0 to 65535)",
                    name,
                )
        if self.sharding is not None and self.leader_election is not None:
            raise InvalidOptions(
                "sharding and leader election exclude each other: with sharding every replica "
                "reconciles its share; drop one",
                "sharding",
                "leader_election",
            )
        if self.secure_metrics is not None:
            if self.metrics_address is None:
                raise InvalidOptions(
                    "secure metrics need a metrics address to serve /metrics on",
                    "secure_metrics",
                    "metrics_address",
                )
            if _one_port(self.metrics_address, self.health_probe_address):
                raise InvalidOptions(
                    "secure metrics need a port of their own: the kubelet probes /healthz and /readyz "
                    "over plain HTTP without a token; give the health probe address another port",
                    "secure_metrics",
                    "health_probe_address",
                )

    @property
    def serves_metrics_and_probes_together(self) -> bool:
        """``/metrics`` and the probes on one server: both addresses name one port (port 0 asks
        each server for a free one of its own)."""
        return _one_port(self.metrics_address, self.health_probe_address)

    @property
    def watched_namespaces(self) -> tuple[str, ...] | None:
        """The namespaces watched, sorted; None: all."""
        if self.namespace is not None:
            return (self.namespace,)
        return tuple(sorted(self.namespaces)) or None


def _one_port(metrics: tuple[str, int] | None, probes: tuple[str, int] | None) -> bool:
    """Metrics and probes name the same port (port 0 asks each server for a free one of its own)."""
    return metrics is not None and metrics == probes and metrics[1] != 0
