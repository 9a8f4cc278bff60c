"""The ``resourceconsist`` command line.

- ``resourceconsist demo``: the walkthrough on an embedded control plane (see ``showcase``).
- ``resourceconsist run --adapter NAME ...``: run adapters' controllers (built-in,
  experimental, or third-party by entry point) against the current kubeconfig or the
  in-cluster config, with health/metrics endpoints and graceful shutdown on SIGTERM/SIGINT.
- ``resourceconsist adapters``: list the adapters this installation knows.
- ``resourceconsist handover --adapter NAME ...``: leave every pod in a state the Go original
  handles, before switching back to it (see ``handover``).
- ``resourceconsist --version`` / ``resourceconsist version``: the version and the git revision
  (resourceconsist/runtime/version.py).

Bad input exits non-zero with a message that says what is wrong and what to do.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import signal
import sys
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

import click

from resourceconsist.errors import InvalidOptions
from resourceconsist.options import (
    GarbageOptions,
    LeaderElectionOptions,
    ManagerOptions,
    ProviderBudgetOptions,
    SecureMetricsOptions,
    ShardingOptions,
)
from resourceconsist.runtime import logs
from resourceconsist.webhook.options import BootstrapOptions, DrainWaiterOptions, WebhookOptions

# Only the options and click at import: ``--help`` and flag parsing load no manager, HTTP server,
# Kubernetes client or adapter; each command imports what it runs (docs/reference/options.md).
if TYPE_CHECKING:
    import asyncio

    from resourceconsist.adapter import ReconcileAdapter, WebhookAdapter
    from resourceconsist.cluster.kube import KubeClient
    from resourceconsist.registry import AdapterRegistry
    from resourceconsist.runtime.manager import Manager, Runnable

log = logging.getLogger(__name__)

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])


def _all_adapters() -> AdapterRegistry:
    from resourceconsist.adapters import registry as builtin
    from resourceconsist.experimental import registry as experimental
    from resourceconsist.registry import combined

    return combined(builtin, experimental)


#: Where the chosen ``--log-level`` and ``--log-format`` wait in the context until a command runs.
_LOG_CHOICE = "resourceconsist.logging"


def _remember_log_flag(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    # Given before and after the subcommand, the later (the subcommand's) wins: it is parsed last.
    if value is not None and param.name is not None:
        ctx.meta.setdefault(_LOG_CHOICE, {})[param.name] = value
    return value


def _log_flags() -> list[click.Parameter]:
    """``--log-level`` and ``--log-format``, for the root and for every command."""
    return [
        click.Option(
            ["--log-level"],
            type=click.Choice(logs.LEVELS),
            default=None,
            expose_value=False,
            callback=_remember_log_flag,
            help="Least severe level logged (default: info).",
        ),
        click.Option(
            ["--log-format"],
            type=click.Choice(logs.FORMATS),
            default=None,
            expose_value=False,
            callback=_remember_log_flag,
            help="text (the default), or json: one object a line with zap's keys (docs/observability.md).",
        ),
    ]


class _LoggedGroup(click.Group):
    """A group whose every command takes the log flags too (also after the subcommand's name:
    ``resourceconsist run --log-level debug``) and sets logging up before it runs."""

    group_class = type  # its subgroups (``explain``) are logged groups too

    def add_command(self, cmd: click.Command, name: str | None = None) -> None:
        if not any(param.name == "log_level" for param in cmd.params):  # once, under any name
            cmd.params.extend(_log_flags())
            if not isinstance(cmd, click.Group) and cmd.callback is not None:
                cmd.callback = _logged(cmd.callback)
        super().add_command(cmd, name)


def _logged(callback: F) -> F:
    @functools.wraps(callback)
    def run(*args: Any, **kwargs: Any) -> Any:
        chosen = click.get_current_context().meta.get(_LOG_CHOICE, {})
        logs.setup(chosen.get("log_level", "info"), chosen.get("log_format", "text"))
        return callback(*args, **kwargs)

    return cast(F, run)


def _print_version(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    from resourceconsist.runtime.version import build_info

    click.echo(build_info().line())
    ctx.exit()


@click.group(cls=_LoggedGroup, params=_log_flags())
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_print_version,
    help="Show the version and the git revision, and exit.",
)
def main() -> None:
    """Keep external resources consistent with Kubernetes employers and employees."""


@main.command("version")
@click.option("--output", "-o", type=click.Choice(["text", "json"]), default="text", show_default=True)
def version(output: str) -> None:
    """The version, the git revision it was built from, and the Python it runs on."""
    import json

    from resourceconsist.runtime.version import build_info

    info = build_info()
    if output == "json":
        click.echo(json.dumps(dataclasses.asdict(info), sort_keys=True))
    else:
        click.echo(info.line())


@main.command()
@click.option(
    "--step-timeout", default=30.0, show_default=True, help="Seconds each step may take to converge."
)
@click.option(
    "--pace", type=float, default=None, help="Seconds to show each converged step (default: 2 on a terminal)."
)
@click.option(
    "--rollout/--no-rollout",
    default=True,
    show_default=True,
    help="Also roll a gated Deployment on an embedded working cluster.",
)
@click.option(
    "--latency", default=1.0, show_default=True, help="Seconds the rollout's provider takes per call."
)
def demo(step_timeout: float, pace: float | None, rollout: bool, latency: float) -> None:
    """Run the demo adapter on an embedded kube-apiserver + etcd and show it converge."""
    import asyncio

    from resourceconsist.commands.showcase import run_demo
    from resourceconsist.testing import ControlPlaneBinariesMissing

    try:
        ok = asyncio.run(run_demo(step_timeout=step_timeout, pace=pace, rollout=rollout, latency=latency))
    except ControlPlaneBinariesMissing as err:
        raise click.ClickException(str(err)) from err
    sys.exit(0 if ok else 1)


@main.group()
def explain() -> None:
    """Why a pod is not Ready or cannot be deleted, why an employer has not converged (docs/explain.md)."""


def _flag_group(*flags: Callable[[F], F]) -> Callable[[F], F]:
    """One decorator for several ``click.option`` decorators, in the order given."""

    def decorate(fn: F) -> F:
        for flag in reversed(flags):
            fn = flag(fn)
        return fn

    return decorate


#: Where every command that talks to a cluster finds it: controller-runtime's order, the one of
#: ``KubeClient.auto`` too (``kubeconfig.find_cluster``; docs/index.md, "Which cluster").
_cluster_flags = _flag_group(
    click.option(
        "--kubeconfig",
        default=None,
        help="Kubeconfig path; default: $KUBECONFIG, else the in-cluster config when running in a "
        "pod, else ~/.kube/config.",
    ),
    click.option(
        "--context",
        default=None,
        metavar="NAME",
        help="The kubeconfig's context to use (default: its current-context).",
    ),
)

_explain_options = _flag_group(
    click.option(
        "--adapter",
        "adapter_names",
        multiple=True,
        help="Adapter whose provider to consult (repeatable); without one, Kubernetes only.",
    ),
    _cluster_flags,
    click.option("--output", "-o", type=click.Choice(["text", "json"]), default="text", show_default=True),
)


def _explain(
    kind: str | None,
    ref: str,
    adapter_names: Sequence[str],
    kubeconfig: str | None,
    context: str | None,
    output: str,
) -> None:
    import asyncio

    from resourceconsist.cluster.kube import ApiError, is_unreachable
    from resourceconsist.commands.explain import ExplainError, NotFoundAnswer, run_explain, split_ref

    try:
        split_ref(ref)
    except ExplainError as err:
        raise click.UsageError(str(err)) from err
    adapters = _build(_all_adapters().controller, adapter_names)
    client = _kube_client(kubeconfig, context)
    try:
        click.echo(asyncio.run(run_explain(client, adapters, kind, ref, output)))
    except NotFoundAnswer as missing:
        # The answer still goes to stdout (scripts read "exists": false); the exit code says it,
        # as kubectl's does (docs/explain.md).
        click.echo(missing.text)
        raise SystemExit(1) from None
    except ExplainError as err:
        raise click.UsageError(str(err)) from err
    except ApiError as err:
        raise click.ClickException(f"the API server refused a read: {err}") from err
    except Exception as err:
        if not is_unreachable(err):
            raise
        raise click.ClickException(
            f"cannot reach the API server ({err}); check --kubeconfig and that the cluster is up"
        ) from err
    finally:
        client.close()


@explain.command("pod")
@click.argument("ref", metavar="NS/NAME")
@_explain_options
def explain_pod(
    ref: str, adapter_names: Sequence[str], kubeconfig: str | None, context: str | None, output: str
) -> None:
    """Why pod NS/NAME is not Ready, and what holds it from deletion."""
    _explain(None, ref, adapter_names, kubeconfig, context, output)


@explain.command("employer")
@click.argument("kind")
@click.argument("ref", metavar="NS/NAME")
@_explain_options
def explain_employer(
    kind: str,
    ref: str,
    adapter_names: Sequence[str],
    kubeconfig: str | None,
    context: str | None,
    output: str,
) -> None:
    """Why employer KIND NS/NAME (e.g. Service default/web) has not converged."""
    _explain(kind, ref, adapter_names, kubeconfig, context, output)


@main.command("adapters")
def list_adapters() -> None:
    """List the adapters this installation knows (built-in, experimental, third-party)."""
    registry = _all_adapters()
    for name in registry.names():
        entry = registry.entry(name)
        kinds = "+".join(k for k, f in (("controller", entry.controller), ("webhook", entry.webhook)) if f)
        flag = " (experimental, not for production)" if entry.experimental else ""
        click.echo(f"{name}\t{kinds}{flag}\t{entry.description}")


# -- common mistakes: one line saying what is wrong and what to do, exit code 2 -------------------


class _HostPort(click.ParamType):  # type: ignore[type-arg]
    """``host:port``, ``[v6]:port`` or ``:port`` (an empty host: every interface, IPv4 and IPv6);
    with ``off``, ``0`` too, which turns the endpoint off (None)."""

    name = "HOST:PORT"

    def __init__(self, off: bool = False) -> None:
        self.off = off

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> tuple[str, int] | None:
        if isinstance(value, tuple):
            return value
        if self.off and str(value) == "0":
            return None
        host, sep, port = str(value).rpartition(":")
        if not sep or not port.isdigit() or int(port) > 65535:
            off = "; 0 turns it off" if self.off else ""
            self.fail(f"{value!r} is not HOST:PORT; give e.g. :8081 or 127.0.0.1:8081{off}", param, ctx)
        return host.strip("[]"), int(port)


class _LabelSelector(click.ParamType):  # type: ignore[type-arg]
    """A ``labelSelector`` string (``kusionstack.io/control=true``), checked as the API server would."""

    name = "SELECTOR"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        from resourceconsist.rules.labels import InvalidSelector, parse_selector

        try:
            parse_selector(str(value))
        except InvalidSelector as err:
            self.fail(str(err), param, ctx)
        return str(value)


def _default(options: type[Any], name: str) -> Any:
    """The default of field ``name`` of an options dataclass: the flags take their defaults from
    the options (and ``--help`` shows them), so each default lives in one place."""
    (found,) = [f for f in dataclasses.fields(options) if f.name == name]
    if found.default_factory is not dataclasses.MISSING:
        return found.default_factory()
    return found.default


#: The flag that sets each options field, ``(options class, field): flag``; ``_field_flag`` fills it.
_FLAG_OF: dict[tuple[type[Any], str], str] = {}


def _field_flag(
    flag: str, options: type[Any], name: str, text: str, *names: str, **more: Any
) -> Callable[[F], F]:
    """The flag (help ``text``, parameter ``names``) that sets field ``name`` of ``options``;
    its default is the field's, which ``--help`` shows, unless ``more`` gives another."""
    _FLAG_OF[options, name] = flag
    more.setdefault("default", _default(options, name))
    more.setdefault("show_default", more["default"] is not None)
    return click.option(flag, *names, help=text, **more)


@contextlib.contextmanager
def _flags(*options: type[Any]) -> Iterator[None]:
    """Building ``options`` inside: an ``InvalidOptions`` becomes a usage error (exit code 2) that
    names the flags of the fields at fault."""
    try:
        yield
    except InvalidOptions as err:
        flags = [_FLAG_OF[o, f] for f in err.fields for o in options if (o, f) in _FLAG_OF]
        raise click.UsageError(f"{err}; adjust {'/'.join(flags)}" if flags else str(err)) from err


def _kube_client(kubeconfig: str | None, context: str | None) -> KubeClient:
    """The client of the cluster ``kubeconfig.find_cluster`` chooses (--kubeconfig, else
    $KUBECONFIG, else in-cluster, else ~/.kube/config: controller-runtime's order, the one of
    ``KubeClient.auto`` too), at ``context`` of its kubeconfig; a bad choice is one line."""
    import yaml

    from resourceconsist.cluster.kube import KubeClient
    from resourceconsist.cluster.kubeconfig import KubeConfigError, find_cluster

    try:
        found = find_cluster(kubeconfig, context)
    except KubeConfigError as err:
        raise click.UsageError(str(err)) from err
    source = found.origin
    if found.kubeconfig is None:
        try:
            return KubeClient.in_cluster()
        except KubeConfigError as err:
            raise click.UsageError(
                f"in-cluster config ($KUBERNETES_SERVICE_HOST is set) is not usable: {err}; "
                "pass --kubeconfig PATH or set $KUBECONFIG"
            ) from err
    kubeconfig = found.kubeconfig
    paths = [path for path in kubeconfig.split(os.pathsep) if path]
    existing = [path for path in paths if Path(path).expanduser().is_file()]
    if not existing:
        raise click.UsageError(
            f"kubeconfig {' and '.join(paths) or repr(kubeconfig)} (from {source}) does not exist; "
            "pass an existing file with --kubeconfig or set $KUBECONFIG"
        )
    for path in existing:
        try:
            loaded = yaml.safe_load(Path(path).expanduser().read_bytes())
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
            raise click.UsageError(
                f"kubeconfig {path} (from {source}) is not valid YAML{where}; "
                "pass a kubeconfig file with --kubeconfig or set $KUBECONFIG"
            ) from err
        except OSError as err:
            raise click.UsageError(
                f"kubeconfig {path} (from {source}) cannot be read: {err.strerror}"
            ) from err
        if loaded is not None and not isinstance(loaded, dict):
            raise click.UsageError(
                f"kubeconfig {path} (from {source}) is YAML but not a kubeconfig (no clusters, users, "
                "contexts); pass a kubeconfig file with --kubeconfig or set $KUBECONFIG"
            )
    try:
        return KubeClient.from_kubeconfig(kubeconfig, context)
    except KubeConfigError as err:
        raise click.UsageError(f"{err} (kubeconfig from {source})") from err


def _check_webhook_prerequisites(client: KubeClient, options: WebhookOptions) -> None:
    """What the webhook needs before it starts: the namespace of its certificate Secret (when
    it bootstraps), or the certificate files (when it does not)."""
    from resourceconsist import wire
    from resourceconsist.cluster import kube
    from resourceconsist.webhook.bootstrap import TLS_CERT_FILE, TLS_KEY_FILE

    if options.bootstrap is None:
        cert_dir = options.cert_dir
        missing = [name for name in (TLS_CERT_FILE, TLS_KEY_FILE) if not (cert_dir / name).is_file()]
        if missing:
            raise click.UsageError(
                f"--no-bootstrap-certs: no {' or '.join(missing)} in {cert_dir}; put the serving "
                "certificate there (--cert-dir), or drop --no-bootstrap-certs to make one"
            )
        return
    namespace = kube.pod_namespace(options.bootstrap.namespace)
    try:
        client.get(kube.NAMESPACE, None, namespace)
    except kube.NotFound as err:
        raise click.UsageError(
            f"namespace {namespace} does not exist (the webhook keeps its certificate Secret "
            f"{wire.WEBHOOK_CERT_SECRET} there); set POD_NAMESPACE to an existing namespace or "
            f"create {namespace}"
        ) from err


#: Flags shared by ``run --webhook`` and ``webhook``: ``WebhookOptions`` and its
#: ``BootstrapOptions`` (docs/reference/options.md).
_webhook_flags = _flag_group(
    _field_flag("--webhook-port", WebhookOptions, "port", "HTTPS port of the admission webhook."),
    _field_flag("--webhook-host", WebhookOptions, "host", "Address to bind (default: all)."),
    _field_flag(
        "--cert-dir", WebhookOptions, "cert_dir", "Where tls.crt/tls.key are written (bootstrap) or read."
    ),
    _field_flag("--webhook-service", BootstrapOptions, "service_name", "Service fronting the webhook."),
    click.option(
        "--bootstrap-certs/--no-bootstrap-certs",
        default=_default(WebhookOptions, "bootstrap") is not None,
        show_default=True,
        help="Make and keep the self-signed certificates (Secret resourceconsist-webhook-certs).",
    ),
    _field_flag(
        "--webhook-cert-host",
        BootstrapOptions,
        "extra_hosts",
        "Extra DNS name or IP for the bootstrapped certificate (repeatable).",
        "webhook_cert_hosts",
        multiple=True,
        show_default=False,
    ),
    _field_flag(
        "--webhook-url",
        BootstrapOptions,
        "webhook_url",
        "Register a URL-based MutatingWebhookConfiguration pointing here, e.g. "
        "https://127.0.0.1:9443, for a webhook outside the cluster (docs/webhook.md).",
    ),
    click.option(
        "--drain-waiter-image",
        default=None,
        metavar="IMAGE",
        help="The image of the drain waiter sidecar given to pods whose employer asks for the wait "
        'drain (the manager\'s own; docs/zero-downtime.md, "A drain that waits for the provider"); '
        "without it they get the preStop sleep.",
    ),
    click.option(
        "--drain-waiter-endpoint",
        "drain_waiter_endpoints",
        multiple=True,
        metavar="URL",
        help="A manager's drain endpoint as pods reach it (run --drain-bind-address), e.g. "
        "http://resourceconsist-drain.resourceconsist.svc:8082 (repeatable); with --drain-waiter-image.",
    ),
)


def _webhook_options(flags: Mapping[str, Any]) -> WebhookOptions:
    """The ``WebhookOptions`` the parsed webhook flags say (``_webhook_flags``)."""
    url, bootstrap = flags["webhook_url"], flags["bootstrap_certs"]
    if url is not None and not bootstrap:
        raise click.UsageError(
            "--webhook-url registers the bootstrapped CA with the API server; drop --no-bootstrap-certs"
        )
    image, endpoints = flags["drain_waiter_image"], flags["drain_waiter_endpoints"]
    if endpoints and image is None:
        raise click.UsageError(
            "--drain-waiter-endpoint configures the drain waiter: add --drain-waiter-image"
        )
    with _flags(WebhookOptions, BootstrapOptions, DrainWaiterOptions):
        return WebhookOptions(
            host=flags["webhook_host"],
            port=flags["webhook_port"],
            cert_dir=Path(flags["cert_dir"]),
            drain_waiter=DrainWaiterOptions(image=image, endpoints=endpoints) if image is not None else None,
            bootstrap=BootstrapOptions(
                service_name=flags["webhook_service"],
                extra_hosts=flags["webhook_cert_hosts"],
                webhook_url=url,
            )
            if bootstrap
            else None,
        )


#: ``run``'s ``LeaderElectionOptions`` (docs/concepts.md, "Leader election timings").
_leader_election_flags = _flag_group(
    click.option(
        "--leader-elect/--no-leader-elect", default=False, help="Reconcile only while holding a Lease."
    ),
    _field_flag(
        "--leader-election-namespace",
        LeaderElectionOptions,
        "namespace",
        "Namespace of the Lease (default: $POD_NAMESPACE or resourceconsist).",
    ),
    _field_flag("--leader-election-id", LeaderElectionOptions, "name", "Name of the Lease."),
    _field_flag(
        "--lease-duration",
        LeaderElectionOptions,
        "lease_duration",
        "Seconds a standby waits after the leader's last renewal before taking over.",
    ),
    _field_flag(
        "--renew-deadline",
        LeaderElectionOptions,
        "renew_deadline",
        "Seconds the leader tries to renew before stepping down (< --lease-duration).",
    ),
    _field_flag(
        "--retry-period",
        LeaderElectionOptions,
        "retry_period",
        "Seconds between attempts to acquire or renew the Lease (< --renew-deadline).",
    ),
)


#: ``run``'s ``ShardingOptions`` (docs/scaling.md); the shard Lease's namespace and timings are
#: leader election's flags.
_sharding_flags = _flag_group(
    click.option(
        "--sharding/--no-sharding",
        default=False,
        help="Share the employers among active replicas (docs/scaling.md); excludes --leader-elect.",
    ),
    _field_flag(
        "--controller-ring",
        ShardingOptions,
        "controller_ring",
        "Name of the ring: ends the shard and drain label keys.",
        default="resourceconsist",
    ),
    _field_flag(
        "--shard-name",
        ShardingOptions,
        "shard_name",
        "This replica's shard: its Lease's name and the shard label's value.",
        default=None,
        show_default="$POD_NAME, else the host name",
    ),
    click.option(
        "--sharder/--no-sharder",
        default=True,
        help="Run the built-in sharder (one replica at a time); --no-sharder where another assigns.",
    ),
    click.option(
        "--pod-employer-label/--no-pod-employer-label",
        default=False,
        help="With --sharding: watch only the pods labelled for this shard's Services, writing the "
        "label where the webhook did not (docs/scaling.md).",
    ),
    click.option(
        "--shard-placement",
        type=click.Choice(["ring", "balanced"]),
        default="ring",
        show_default=True,
        help="How the built-in sharder places employers: the protocol's hash ring, or balanced "
        "(no shard more than 2% above an even share; every replica must agree; docs/scaling.md).",
    ),
)


#: The event loops ``run`` and ``webhook`` can serve on (``--event-loop``), the default first; the
#: benchmarks and the tests choose among the same (docs/reference/options.md, "The event loop").
EVENT_LOOPS = ("uvloop", "asyncio")


def _event_loop_flag(_ctx: click.Context, _param: click.Parameter, value: str) -> str:
    """``--event-loop``, checked while the flags are parsed: uvloop where it cannot be imported is
    a usage error naming the way out, before anything starts."""
    if value != "uvloop":
        return value
    try:
        import uvloop  # noqa: F401  (imported here to be checked; ``loop_factory`` uses it)
    except ImportError as err:
        if isinstance(err, ModuleNotFoundError) and err.name == "uvloop":
            # A dependency on every platform uvloop supports; elsewhere, or in an install without it.
            raise click.BadParameter(
                "uvloop is not installed here; install it, or pass --event-loop asyncio"
            ) from None
        # Installed, but built for another Python, or a library or module it needs is missing.
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise click.BadParameter(
            f"uvloop is installed but cannot be imported ({first}); reinstall it for this Python, "
            "or pass --event-loop asyncio"
        ) from None
    return value


#: The CLI serves metrics and health probes by default (the manifests scrape and probe them),
#: where controller-runtime does; a ``Manager`` built in Python does not.
_METRICS_ADDRESS, _PROBE_ADDRESS = ":8080", ":8081"

#: Where ``run`` and ``webhook`` serve ``/metrics``, ``/healthz`` and ``/readyz``
#: (controller-runtime's flags; docs/observability.md), and how long their start waits for caches.
_serving_flags = _flag_group(
    _field_flag(
        "--metrics-bind-address",
        ManagerOptions,
        "metrics_address",
        "host:port or :port of /metrics; 0: off.",
        default=_METRICS_ADDRESS,
        type=_HostPort(off=True),
    ),
    click.option(
        "--metrics-secure/--no-metrics-secure",
        default=False,
        show_default=True,
        help="Serve /metrics over HTTPS to callers whose bearer token the API server reviews "
        "(TokenReview) and allows to get /metrics (SubjectAccessReview); docs/observability.md.",
    ),
    _field_flag(
        "--metrics-cert-path",
        SecureMetricsOptions,
        "cert_path",
        "Directory of the metrics serving certificate (read again when it changes); default: a "
        "self-signed one made at start. With --metrics-secure.",
        show_default="self-signed",
    ),
    _field_flag(
        "--metrics-cert-name",
        SecureMetricsOptions,
        "cert_name",
        "The certificate's file name in --metrics-cert-path.",
    ),
    _field_flag(
        "--metrics-cert-key",
        SecureMetricsOptions,
        "key_name",
        "The key's file name in --metrics-cert-path.",
    ),
    _field_flag(
        "--health-probe-bind-address",
        ManagerOptions,
        "health_probe_address",
        "host:port or :port of /healthz and /readyz; 0: off.",
        default=_PROBE_ADDRESS,
        type=_HostPort(off=True),
    ),
    # How long the start may wait for the caches (docs/observability.md, "When the start fails").
    _field_flag(
        "--cache-sync-timeout",
        ManagerOptions,
        "cache_sync_timeout",
        "Seconds the caches get to fill at start-up; a start that cannot fill one exits 1 with "
        "one line saying which, why and what to do.",
        type=float,
    ),
    # Not an options field: a Manager built in Python runs on its caller's loop.
    click.option(
        "--event-loop",
        type=click.Choice(EVENT_LOOPS),
        default=EVENT_LOOPS[0],
        show_default=True,
        callback=_event_loop_flag,
        help="The event loop the process runs on: uvloop's (a few per cent less CPU, "
        'docs/benchmarks.md) or the standard library\'s (docs/reference/options.md, "The event loop").',
    ),
)


def _secure_metrics(flags: Mapping[str, Any]) -> SecureMetricsOptions | None:
    """The ``SecureMetricsOptions`` of ``--metrics-secure`` and its certificate flags."""
    given = {
        "cert_path": flags["metrics_cert_path"],
        "cert_name": flags["metrics_cert_name"],
        "key_name": flags["metrics_cert_key"],
    }
    if not flags["metrics_secure"]:
        changed = [
            _FLAG_OF[SecureMetricsOptions, f]
            for f, v in given.items()
            if v != _default(SecureMetricsOptions, f)
        ]
        if changed:
            raise click.UsageError(
                f"{'/'.join(changed)} name the certificate of secure metrics; add --metrics-secure"
            )
        return None
    with _flags(SecureMetricsOptions):
        return SecureMetricsOptions(**given)


def _serving_options(flags: Mapping[str, Any]) -> ManagerOptions:
    """``ManagerOptions`` with the fields the parsed ``_serving_flags`` say (where ``run`` and
    ``webhook`` serve, whether ``/metrics`` is secure, and how long their start may wait for the
    caches; the others at their defaults)."""
    secure = _secure_metrics(flags)
    if secure is not None and flags["metrics_bind_address"] is None:
        raise click.UsageError("--metrics-secure serves /metrics: give --metrics-bind-address, not 0")
    with _flags(ManagerOptions):
        return ManagerOptions(
            metrics_address=flags["metrics_bind_address"],
            health_probe_address=flags["health_probe_bind_address"],
            cache_sync_timeout=flags["cache_sync_timeout"],
            secure_metrics=secure,
        )


#: The namespaces watched (``ManagerOptions.namespace`` or ``namespaces``), of ``run`` and ``webhook``.
_namespace_flag = _field_flag(
    "--namespace",
    ManagerOptions,
    "namespace",
    "Watch only this namespace; several: repeat the flag or separate them with commas (default: all).",
    multiple=True,
    default=(),
    show_default=False,
)

#: ``run``'s ``ManagerOptions`` and ``GarbageOptions`` (docs/reference/options.md).
_manager_flags = _flag_group(
    _namespace_flag,
    _field_flag(
        "--resync-seconds",
        ManagerOptions,
        "resync_period",
        "Seconds between full resyncs of the caches (0: off).",
        type=float,
        show_default="off",
    ),
    _field_flag(
        "--full-pass-every",
        ManagerOptions,
        "full_pass_every",
        "Seconds after which an employer's next pass rebuilds what the adapter keeps, whatever "
        "changed (docs/concepts.md); 0: every pass.",
        type=float,
    ),
    _field_flag(
        "--pod-label-selector",
        ManagerOptions,
        "pod_label_selector",
        "Cache only the pods this label selector selects (e.g. kusionstack.io/control=true), and "
        "those carrying the frame's finalizers, entries or gates (docs/concepts.md, \"Pods the "
        'caches keep"); default: every pod.',
        type=_LabelSelector(),
        show_default="every pod",
    ),
    _field_flag(
        "--shutdown-timeout",
        ManagerOptions,
        "shutdown_timeout",
        "Seconds in-flight reconciles get on shutdown.",
    ),
    _field_flag(
        "--drain-bind-address",
        ManagerOptions,
        "drain_address",
        "host:port or :port of the drain endpoint the drain waiters ask (docs/zero-downtime.md, "
        '"A drain that waits for the provider"); 0: off.',
        type=_HostPort(off=True),
        show_default="off",
    ),
    _field_flag(
        "--max-concurrent-reconciles",
        ManagerOptions,
        "max_concurrent_reconciles",
        "Passes each controller runs at once (controller-runtime's MaxConcurrentReconciles); "
        "default: the adapter's own, else 5.",
        type=int,
        show_default="the adapter's, else 5",
    ),
    _field_flag(
        "--reconcile-timeout",
        ManagerOptions,
        "reconcile_timeout",
        "Seconds a pass may run before it is cancelled and tried again "
        "(controller-runtime's ReconciliationTimeout); 0: no limit.",
        type=float,
        show_default="no limit",
    ),
    _field_flag(
        "--garbage-interval",
        GarbageOptions,
        "interval",
        "Seconds between passes collecting provider items whose employer is gone "
        "(docs/lifecycle-hooks.md); 0: at start-up only.",
    ),
    click.option("--no-garbage", is_flag=True, help="Never collect orphaned provider items."),
    click.option("--garbage-dry-run", is_flag=True, help="Only report the orphans a pass would collect."),
    _field_flag(
        "--provider-rate",
        ProviderBudgetOptions,
        "rate",
        "Provider API requests a second per account, shared by every controller; drains and "
        'deregistrations go first (docs/concepts.md, "The provider budget"); 0: no limit.',
        type=float,
        show_default="no limit",
    ),
    _field_flag(
        "--provider-burst",
        ProviderBudgetOptions,
        "burst",
        "Provider API requests that may pass at once under --provider-rate.",
        type=int,
    ),
)


_FLAG_OF[ManagerOptions, "namespaces"] = "--namespace"
_FLAG_OF[DrainWaiterOptions, "image"] = "--drain-waiter-image"
_FLAG_OF[DrainWaiterOptions, "endpoints"] = "--drain-waiter-endpoint"
_FLAG_OF[ManagerOptions, "secure_metrics"] = "--metrics-secure"


def _namespaces(given: Sequence[str]) -> dict[str, Any]:
    """``ManagerOptions``' ``namespace`` (one) or ``namespaces`` (several) of every
    ``--namespace`` (each a name or a comma-separated list)."""
    names = tuple(name.strip() for value in given for name in value.split(","))
    if "" in names:
        raise click.BadParameter(
            f"{','.join(given)!r} holds an empty namespace name: give names separated by commas, "
            "e.g. --namespace shop,payments",
            param_hint="--namespace",
        )
    return {"namespace": names[0]} if len(names) == 1 else {"namespaces": names}


def _manager_options(flags: Mapping[str, Any]) -> ManagerOptions:
    """The ``ManagerOptions`` the parsed flags of ``run`` say (``_manager_flags``,
    ``_leader_election_flags`` and ``_sharding_flags``)."""
    if flags["garbage_interval"] < 0:
        raise click.BadParameter("must be 0 (start-up only) or more seconds", param_hint="--garbage-interval")
    # The Lease's namespace and timings: the leader's, or (with sharding) each shard's.
    lease: dict[str, Any] = {
        "namespace": flags["leader_election_namespace"],
        "lease_duration": flags["lease_duration"],
        "renew_deadline": flags["renew_deadline"],
        "retry_period": flags["retry_period"],
    }
    election = None
    if flags["leader_elect"]:
        with _flags(LeaderElectionOptions):
            election = LeaderElectionOptions(name=flags["leader_election_id"], **lease)
    sharding = None
    if flags["sharding"]:
        if flags["leader_elect"]:
            raise click.UsageError(
                "--sharding and --leader-elect exclude each other: with sharding every replica "
                "reconciles its share; drop one"
            )
        with _flags(ShardingOptions, LeaderElectionOptions):
            sharding = ShardingOptions(
                controller_ring=flags["controller_ring"],
                **({"shard_name": flags["shard_name"]} if flags["shard_name"] else {}),
                sharder=flags["sharder"],
                pod_employer_label=flags["pod_employer_label"],
                placement=flags["shard_placement"],
                **lease,
            )
    watched = _namespaces(flags["namespace"])
    with _flags(ManagerOptions, GarbageOptions, ProviderBudgetOptions):
        return dataclasses.replace(
            _serving_options(flags),
            **watched,
            resync_period=flags["resync_seconds"] or None,
            full_pass_every=flags["full_pass_every"],
            pod_label_selector=flags["pod_label_selector"],
            shutdown_timeout=flags["shutdown_timeout"],
            drain_address=flags["drain_bind_address"],
            max_concurrent_reconciles=flags["max_concurrent_reconciles"],
            reconcile_timeout=flags["reconcile_timeout"] or None,
            leader_election=election,
            sharding=sharding,
            garbage=GarbageOptions(
                enabled=not flags["no_garbage"],
                interval=flags["garbage_interval"] or None,
                dry_run=flags["garbage_dry_run"],
            ),
            provider_budget=ProviderBudgetOptions(
                rate=flags["provider_rate"] or None,
                burst=flags["provider_burst"],
            ),
        )


#: ``run``'s settings of the ``alibabacloudslb`` adapter. Adapters read their settings from the
#: environment (registry.py); these flags set the adapter's variables for the adapters this
#: command builds (docs/alibabacloudslb.md, "Tags and the garbage search").
_SLB_ADAPTER = "alibabacloudslb"
_slb_flags = _flag_group(
    click.option(
        "--slb-cluster-name",
        default=None,
        metavar="NAME",
        help="alibabacloudslb: this cluster's name, tagged on every VServer group it creates "
        "(sets ALIYUN_SLB_CLUSTER_NAME; required for manage mode).",
    ),
    click.option(
        "--slb-load-balancer",
        "slb_load_balancers",
        multiple=True,
        metavar="ID",
        help="alibabacloudslb: look for orphaned VServer groups only on this load balancer (and those "
        "live Services name) instead of the whole region (repeatable; sets ALIYUN_SLB_LOAD_BALANCERS).",
    ),
)


def _adapter_environ(adapter_names: Sequence[str], flags: Mapping[str, Any]) -> Mapping[str, str]:
    """The environment the adapters are built from: the process's, with the adapter flags' variables."""
    cluster, lbs = flags["slb_cluster_name"], flags["slb_load_balancers"]
    if cluster is None and not lbs:
        return os.environ
    if _SLB_ADAPTER not in adapter_names:
        flag = "--slb-cluster-name" if cluster is not None else "--slb-load-balancer"
        raise click.UsageError(
            f"{flag} is a setting of the {_SLB_ADAPTER} adapter; add --adapter {_SLB_ADAPTER}"
        )
    from resourceconsist.adapters.alibabacloudslb.settings import CLUSTER_NAME_ENV, LOAD_BALANCERS_ENV

    environ = dict(os.environ)
    if cluster is not None:
        environ[CLUSTER_NAME_ENV] = cluster
    if lbs:
        environ[LOAD_BALANCERS_ENV] = ",".join(lbs)
    return environ


@main.command()
@click.option("--adapter", "adapter_names", multiple=True, required=True, help="Adapter to run (repeatable).")
@_cluster_flags
@click.option(
    "--webhook/--no-webhook", "with_webhook", default=False, help="Also serve the adapters' webhooks."
)
@_manager_flags
@_serving_flags
@_leader_election_flags
@_sharding_flags
@_webhook_flags
@_slb_flags
def run(
    adapter_names: Sequence[str],
    kubeconfig: str | None,
    context: str | None,
    with_webhook: bool,
    **flags: Any,
) -> None:
    """Run the named adapters' controllers (with --webhook, their webhooks too) in one manager."""
    _log_start("run", adapter_names)
    manager_options = _manager_options(flags)
    if with_webhook and manager_options.sharding is not None:
        # A shard caches only its own employers; the webhook must see every one of a new pod's.
        raise click.UsageError(
            "--webhook cannot ride on a sharded replica (its cache holds only its share of the "
            "employers); serve it with `resourceconsist webhook` (docs/scaling.md)"
        )
    webhook_options = _webhook_options(flags)
    registry = _all_adapters()
    environ = _adapter_environ(adapter_names, flags)
    adapters = _build(lambda name: registry.controller(name, environ), adapter_names)
    webhooks = _build(registry.webhook, adapter_names) if with_webhook else []
    _serve(
        _run((kubeconfig, context), adapters, webhooks, manager_options, webhook_options), flags["event_loop"]
    )


def _webhook_manager_options(flags: Mapping[str, Any]) -> ManagerOptions:
    """The ``ManagerOptions`` of the manager without controllers the ``webhook`` command serves
    on: the namespaces its caches hold, and where metrics and probes are served."""
    watched = _namespaces(flags["namespace"])
    with _flags(ManagerOptions):
        return dataclasses.replace(_serving_options(flags), **watched)


@main.command()
@click.option(
    "--adapter", "adapter_names", multiple=True, required=True, help="Adapter whose webhook to serve."
)
@_cluster_flags
@_namespace_flag
@_serving_flags
@_webhook_flags
@click.option(
    "--pod-employer-label/--no-pod-employer-label",
    default=_default(WebhookOptions, "pod_employer_label"),
    show_default=True,
    help="Stamp the employer label on new pods (their Service's name, or Shared), for the shards "
    'of run --sharding --pod-employer-label (docs/scaling.md, "Pods selected by the API server").',
)
def webhook(adapter_names: Sequence[str], kubeconfig: str | None, context: str | None, **flags: Any) -> None:
    """Serve the named adapters' admission webhooks (no controllers).

    Kubeconfig: --kubeconfig, else $KUBECONFIG, else the in-cluster config when running in a
    pod, else ~/.kube/config.
    """
    _log_start("webhook", adapter_names)
    options = dataclasses.replace(_webhook_options(flags), pod_employer_label=flags["pod_employer_label"])
    manager_options = _webhook_manager_options(flags)
    webhooks = _build(_all_adapters().webhook, adapter_names)
    # The webhook rides on a manager without controllers: its informers, metrics, probes and
    # graceful stop.
    _serve(_run((kubeconfig, context), [], webhooks, manager_options, options), flags["event_loop"])


@main.command("drain-waiter")
@click.option(
    "--port",
    type=click.IntRange(1, 65535),
    default=_default(DrainWaiterOptions, "port"),
    show_default=True,
    help="Port the containers' preStop hooks call, on every address of the pod.",
)
@click.option(
    "--bound",
    type=click.FloatRange(min=0, max=3600),
    required=True,
    help="Seconds a hook waits at most: the employer's drain time.",
)
@click.option(
    "--endpoint",
    "endpoints",
    multiple=True,
    required=True,
    metavar="URL",
    help="A manager's drain endpoint (run --drain-bind-address), e.g. http://10.0.0.5:8082 (repeatable).",
)
def drain_waiter(port: int, bound: float, endpoints: Sequence[str]) -> None:
    """The drain waiter sidecar: answers each container's preStop hook once a manager says no
    provider routes to this pod any more, or after --bound seconds (docs/zero-downtime.md, "A
    drain that waits for the provider"). Its pod is named by $POD_NAMESPACE, $POD_NAME and
    $POD_UID, which the webhook sets from the downward API."""
    from resourceconsist.commands.drainwaiter import Waiter, serve

    found = {name: os.environ.get(name, "") for name in ("POD_NAMESPACE", "POD_NAME", "POD_UID")}
    missing = [name for name in ("POD_NAMESPACE", "POD_NAME") if not found[name]]
    if missing:
        raise click.UsageError(
            f"{' and '.join(missing)} not set: the drain waiter runs in the pod it waits for, "
            "which the webhook's sidecar names from the downward API"
        )
    waiter = Waiter(found["POD_NAMESPACE"], found["POD_NAME"], found["POD_UID"], tuple(endpoints), bound)
    serve(waiter, port)


@main.command()
@click.option(
    "--adapter",
    "adapter_names",
    multiple=True,
    required=True,
    help="Adapter the controller ran (repeatable).",
)
@_cluster_flags
@_namespace_flag
@click.option("--dry-run", is_flag=True, help="Only report what the hand-over would do.")
@_field_flag(
    "--leader-election-namespace",
    LeaderElectionOptions,
    "namespace",
    "Namespace of the controller's Lease (default: $POD_NAMESPACE or resourceconsist).",
)
@_field_flag("--leader-election-id", LeaderElectionOptions, "name", "Name of the controller's Lease.")
def handover(
    adapter_names: Sequence[str],
    kubeconfig: str | None,
    context: str | None,
    namespace: Sequence[str],
    dry_run: bool,
    leader_election_namespace: str | None,
    leader_election_id: str,
) -> None:
    """Hand the pods over to the Go original: the guard becomes the lifecycle finalizer where
    the provider holds the pod, and goes where it holds nothing (docs/wire-contract.md,
    "Switching back to the Go original"). Stop the controller first: this holds its Lease.

    Exit status: 0 every pod handed over, 3 some pods keep the guard (listed; run again once
    their cause is fixed), 1 nothing done (the controller still runs, an API error).
    """
    import asyncio

    from resourceconsist.cluster.kube import ApiError, is_unreachable
    from resourceconsist.commands.handover import HandoverError, hand_over

    with _flags(LeaderElectionOptions):
        lease = LeaderElectionOptions(name=leader_election_id, namespace=leader_election_namespace)
    # The namespaces as ``run`` takes and checks them (``ManagerOptions``).
    with _flags(ManagerOptions):
        namespaces = ManagerOptions(**_namespaces(namespace)).watched_namespaces if namespace else None
    adapters = _build(_all_adapters().controller, adapter_names)
    client = _kube_client(kubeconfig, context)
    try:
        report = asyncio.run(hand_over(client, adapters, lease, namespaces=namespaces, dry_run=dry_run))
    except (HandoverError, ApiError) as err:
        raise click.ClickException(str(err)) from err
    except Exception as err:
        if not is_unreachable(err):
            raise
        raise click.ClickException(f"cannot reach the API server ({err}); check --kubeconfig") from err
    finally:
        client.close()
    for line in report.lines():
        click.echo(line)
    sys.exit(0 if report.complete else 3)


def _log_start(command: str, adapter_names: Sequence[str]) -> None:
    """The first line a serving command logs: what runs (version, revision, Python), and which
    adapters; the version and revision as fields of their own in JSON."""
    from resourceconsist.runtime.version import build_info

    info = build_info()
    log.info(
        "%s %s: adapters %s",
        info.line(),
        command,
        ", ".join(adapter_names),
        extra={"version": info.version, "revision": info.revision},
    )


def _build(factory: Callable[[str], T], names: Sequence[str]) -> list[T]:
    """Build every named adapter before starting anything; bad names or settings exit with a message."""
    from resourceconsist.registry import UnknownAdapterError

    try:
        return [factory(name) for name in names]
    except UnknownAdapterError as err:
        raise click.UsageError(str(err)) from err
    except Exception as err:
        # Factories fail at start-up on bad settings (e.g. missing credentials); say which.
        raise click.ClickException(f"cannot start adapter: {err}") from err


def _serve(running: Coroutine[Any, Any, None], event_loop: str) -> None:
    """Run ``running`` (``_run``: the manager until SIGTERM or SIGINT, exit 0, also while it still
    starts) on the event loop ``--event-loop`` names; a start that fails is one line and exit 1
    (docs/observability.md, "When the start fails")."""
    import asyncio

    from resourceconsist.cluster.cache import CacheSyncTimeout
    from resourceconsist.runtime.manager import CannotServe

    try:
        with asyncio.Runner(loop_factory=loop_factory(event_loop)) as runner:
            runner.run(running)
    except CacheSyncTimeout as err:
        also = f" (and {err.others} other{'s' if err.others > 1 else ''})" if err.others else ""
        raise click.ClickException(
            f"cannot start: the cache of {err.resource.plural}{also} did not sync within "
            f"{err.seconds:g}s (--cache-sync-timeout): {err.because}"
        ) from None
    except CannotServe as err:
        flags = " and ".join(_FLAG_OF[ManagerOptions, field] for field in err.fields)
        raise click.ClickException(f"{err}; free the port or choose another with {flags}") from None


def loop_factory(event_loop: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """What makes the loop ``--event-loop`` names, for ``asyncio.Runner``: uvloop's, or None for
    the standard library's (docs/reference/options.md, "The event loop")."""
    if event_loop == "asyncio":
        return None
    import uvloop  # there: checked with the flags (_event_loop_flag)

    return uvloop.new_event_loop


async def _run(
    cluster: tuple[str | None, str | None],
    adapters: Sequence[ReconcileAdapter],
    webhooks: Sequence[WebhookAdapter],
    manager_options: ManagerOptions,
    webhook_options: WebhookOptions,
) -> None:
    import asyncio

    from resourceconsist.flow.cancellation import DaemonThreadExecutor
    from resourceconsist.runtime.manager import Manager

    loop = asyncio.get_running_loop()
    # First of all: from here on a signal stops the process at once, whatever the start waits
    # for, and no thread it leaves in a request holds the exit (the manager's own executor).
    loop.set_default_executor(DaemonThreadExecutor(name="resourceconsist-io"))
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    # Which loop serves (--event-loop): the package that made it, "uvloop" or "asyncio".
    log.info("event loop: %s", type(loop).__module__.partition(".")[0])
    # Everything the manager runs with, resolved from flags and defaults (no secret among them).
    log.debug("manager options: %s", manager_options)
    client = _kube_client(*cluster)
    try:
        if webhooks:
            checking = asyncio.ensure_future(
                asyncio.to_thread(_check_webhook_prerequisites, client, webhook_options)
            )
            if not await _unless_stopped(checking, stop):
                return
        manager = Manager(client, manager_options)
        for adapter in adapters:
            await manager.add(adapter)
        if webhooks:
            manager.add_runnable(_webhook_runnable(manager, webhooks, webhook_options))
        await manager.run(stop)
    except Exception as err:
        from resourceconsist.cluster import diagnosis
        from resourceconsist.cluster.cache import CacheSyncTimeout
        from resourceconsist.cluster.kube import ApiError, is_unreachable

        if isinstance(err, CacheSyncTimeout) or not (isinstance(err, ApiError) or is_unreachable(err)):
            raise
        # A request of the start refused or unanswered: why, in one line.
        raise click.ClickException(f"cannot start: {diagnosis.explain(err, client.url)}") from None
    finally:
        client.close()


async def _unless_stopped(work: asyncio.Future[Any], stop: asyncio.Event) -> bool:
    """Wait for ``work`` unless ``stop`` is set first (then ``work`` is abandoned); whether it ran."""
    import asyncio

    stopped: asyncio.Future[Any] = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({work, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
    if not work.done():
        work.cancel()
        return False
    work.result()
    return True


def _webhook_runnable(
    manager: Manager, webhooks: Sequence[WebhookAdapter], options: WebhookOptions
) -> Runnable:
    """The webhook server as a manager runnable sharing the manager's informer caches."""
    from resourceconsist.runtime.manager import Runnable
    from resourceconsist.webhook import WebhookServer, serve

    server: list[WebhookServer] = []

    async def start() -> None:
        import errno

        from resourceconsist.cluster import diagnosis
        from resourceconsist.cluster.kube import ApiError, is_unreachable

        client = manager.client
        try:
            server.append(
                await serve(
                    webhooks, options, client=client, informers=manager.informers, metrics=manager.metrics
                )
            )
        except (ApiError, OSError) as err:
            if isinstance(err, ApiError) or is_unreachable(err):
                raise click.ClickException(
                    f"cannot start the webhook's certificate bootstrap: {diagnosis.explain(err, client.url)}"
                ) from None
            if err.errno not in (errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES):
                raise
            where = f"{options.host or '*'}:{options.port}"
            raise click.ClickException(
                f"cannot serve the webhook on {where}: {os.strerror(err.errno).lower()}; free the "
                "port or choose another with --webhook-port (or --webhook-host)"
            ) from None

    async def stop() -> None:
        if server:
            await server.pop().stop()

    return Runnable("webhook", start, stop)


@main.command("uninstall-check")
@_cluster_flags
@click.option(
    "--namespace",
    multiple=True,
    help="Namespaces the manager watches (repeatable, or comma-separated); default: every namespace.",
)
@click.option(
    "--wait-seconds",
    type=click.FloatRange(min=0),
    default=60.0,
    show_default=True,
    help="How long pods still carrying the manager's finalizers are given to be released.",
)
def uninstall_check(
    kubeconfig: str | None, context: str | None, namespace: Sequence[str], wait_seconds: float
) -> None:
    """Exit 0 when the manager may be uninstalled: no controlled Service left, no pod held by its
    finalizers (the chart's pre-delete hook; docs/install.md, "Uninstalling"). Else exit 1 with
    one line naming what holds it. Only reads."""
    from resourceconsist.cluster.kube import ApiError
    from resourceconsist.commands.uninstall import check

    namespaces = [n for value in namespace for n in value.split(",") if n.strip()]
    client = _kube_client(kubeconfig, context)
    try:
        refused = check(client, [n.strip() for n in namespaces], wait_seconds=wait_seconds)
    except ApiError as err:
        raise click.ClickException(f"the API server refused a read: {err}") from err
    finally:
        client.close()
    if refused is not None:
        click.echo(refused, err=True)
        sys.exit(1)
    click.echo("no controlled Service and no pod held by the manager: it may be uninstalled")
