"""The options objects (docs/reference/options.md): each refuses a value it cannot work with in a
message that names it, none can be changed once built, ``Manager`` takes its options whole, and
the command line builds them from its flags, with their defaults."""

from __future__ import annotations

import dataclasses
import datetime
import sys
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner
from kubernetes import client as k8s

from resourceconsist.cluster.kube import KubeClient
from resourceconsist.commands import cli
from resourceconsist.errors import InvalidOptions
from resourceconsist.experimental.demo import DemoAdapter
from resourceconsist.options import (
    GarbageOptions,
    LeaderElectionOptions,
    ManagerOptions,
    ProviderBudgetOptions,
)
from resourceconsist.runtime.manager import Manager
from resourceconsist.testing.controlplane import free_port
from resourceconsist.webhook import BootstrapOptions, ConnectionLimits, WebhookOptions

# -- validation ------------------------------------------------------------------------------


def test_a_renew_deadline_not_shorter_than_the_lease_is_refused_naming_both() -> None:
    with pytest.raises(
        InvalidOptions, match=r"lease duration \(10s\) must be longer than the renew deadline \(10s\)"
    ) as err:
        LeaderElectionOptions(lease_duration=10, renew_deadline=10)
    assert err.value.fields == ("lease_duration", "renew_deadline")
    with pytest.raises(
        InvalidOptions, match=r"renew deadline \(2s\) must be longer than the retry period \(3s\)"
    ):
        LeaderElectionOptions(renew_deadline=2, retry_period=3)
    with pytest.raises(InvalidOptions, match=r"retry period must be more than 0 seconds \(got 0\)"):
        LeaderElectionOptions(retry_period=0)


#: A bad value of each kind, and what the refusal says: (options class, the value, its message).
BAD_VALUES: list[tuple[type[Any], dict[str, Any], str]] = [
    (ManagerOptions, {"shutdown_timeout": -1}, "shutdown timeout must be 0 or more seconds (got -1)"),
    (ManagerOptions, {"resync_period": 0}, "resync period must be more than 0 seconds (got 0)"),
    (ManagerOptions, {"full_pass_every": -1}, "full pass every must be 0 or more seconds (got -1)"),
    (ManagerOptions, {"health_probe_address": ("127.0.0.1", 70000)}, "has no valid port (0 to 65535)"),
    (ManagerOptions, {"metrics_address": ("", -1)}, "metrics address :-1 has no valid port"),
    (GarbageOptions, {"interval": -5}, "interval must be more than 0 seconds (got -5)"),
    (GarbageOptions, {"retry": 0}, "retry must be more than 0 seconds (got 0)"),
    (WebhookOptions, {"port": -1}, "port must be 0 to 65535 (got -1)"),
    (WebhookOptions, {"adapter_timeout": -0.5}, "adapter timeout must be more than 0 seconds (got -0.5)"),
    (WebhookOptions, {"shutdown_timeout": -1}, "shutdown timeout must be 0 or more seconds (got -1)"),
    (WebhookOptions, {"max_body_bytes": 0}, "max body bytes must be at least 1 (got 0)"),
    (BootstrapOptions, {"service_name": ""}, "the webhook Service needs a name"),
    (BootstrapOptions, {"interval": -600}, "interval must be more than 0 seconds (got -600)"),
    (BootstrapOptions, {"renew_before": datetime.timedelta(days=-1)}, "renew before must not be negative"),
    (BootstrapOptions, {"webhook_url": "http://127.0.0.1:9443"}, "is not an https:// URL with a host"),
    (BootstrapOptions, {"serving_validity": datetime.timedelta(0)}, "serving_validity must be positive"),
    (
        BootstrapOptions,
        {"serving_validity": datetime.timedelta(days=400), "ca_validity": datetime.timedelta(days=365)},
        "the serving certificate cannot outlive its CA",
    ),
    (
        BootstrapOptions,
        {"interval": 3600, "ca_overlap": datetime.timedelta(minutes=30)},
        "ca_overlap (0:30:00) must be longer than the re-check interval (3600s)",
    ),
    (ManagerOptions, {"namespaces": ("shop", "Shop")}, "namespace 'Shop' is not a namespace name"),
    (ManagerOptions, {"namespaces": ("shop", "web", "shop")}, "namespaces lists shop more than once"),
    (
        ManagerOptions,
        {"max_concurrent_reconciles": 0},
        "max concurrent reconciles 0 must be a whole number >= 1",
    ),
    (ConnectionLimits, {"idle_timeout": 0}, "idle timeout must be more than 0 seconds (got 0)"),
    (ConnectionLimits, {"max_connections": 0}, "max connections must be at least 1 (got 0)"),
]


@pytest.mark.parametrize(("options", "value", "message"), BAD_VALUES)
def test_a_bad_value_is_refused_with_the_field_and_what_is_wrong(
    options: type[Any], value: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidOptions) as err:
        options(**value)
    assert message in str(err.value)
    assert err.value.fields == tuple(value)
    assert isinstance(err.value, ValueError)  # what a caller that knows no InvalidOptions catches


def test_zero_and_none_mean_what_the_fields_say() -> None:
    assert ManagerOptions(shutdown_timeout=0).shutdown_timeout == 0  # stop without waiting
    assert GarbageOptions(interval=None).interval is None  # at start-up only
    assert WebhookOptions(port=0).port == 0  # any free port
    assert BootstrapOptions(interval=None).interval is None  # at start only


@pytest.mark.parametrize(
    "options",
    [
        ManagerOptions(),
        LeaderElectionOptions(),
        GarbageOptions(),
        WebhookOptions(),
        BootstrapOptions(),
        ConnectionLimits(),
    ],
    ids=lambda o: type(o).__name__,
)
def test_options_cannot_be_changed_once_built(options: Any) -> None:
    first = dataclasses.fields(options)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(options, first, getattr(options, first))
    assert hash(options) == hash(dataclasses.replace(options))  # hashable: safe to share and keep


def test_a_changed_copy_is_checked_again() -> None:
    options = LeaderElectionOptions()
    with pytest.raises(InvalidOptions, match="lease duration"):
        dataclasses.replace(options, lease_duration=options.renew_deadline)


def test_hosts_and_directories_are_normalised() -> None:
    bootstrap = BootstrapOptions(
        service_name="hook",
        extra_hosts=["localhost", "127.0.0.1"],  # type: ignore[arg-type]  # a list will do
        webhook_url="https://127.0.0.1:9443",
    )
    assert bootstrap.extra_hosts == ("localhost", "127.0.0.1")
    # The Service's names, the extra hosts, the URL's host: each once, in that order.
    assert bootstrap.hosts("ns") == ("hook.ns.svc", "hook.ns.svc.cluster.local", "localhost", "127.0.0.1")
    assert WebhookOptions(cert_dir="/certs").cert_dir == Path("/certs")  # type: ignore[arg-type]


def test_every_replica_gets_its_own_identity() -> None:
    assert LeaderElectionOptions().identity != LeaderElectionOptions().identity


# -- Manager ---------------------------------------------------------------------------------


def _client() -> KubeClient:
    return KubeClient(api_client=None)  # never used: nothing starts


def test_a_manager_built_from_options_alone_warns_of_nothing() -> None:
    client = _client()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert Manager(client).options == ManagerOptions()
        assert Manager(client, ManagerOptions(namespace="shop")).options.namespace == "shop"


# -- the command line builds them from its flags -------------------------------------------


def _flags(command: click.Command, *argv: str) -> Mapping[str, Any]:
    """The flags ``command`` parses from ``argv``: click's own parsing, nothing run."""
    with command.make_context(command.name or "", ["--adapter", "demo", *argv]) as ctx:
        return dict(ctx.params)


def test_without_flags_the_cli_builds_the_options_defaults() -> None:
    flags = _flags(cli.run)
    # The one default of its own: the CLI serves metrics and health probes where controller-runtime
    # does (":8080", ":8081": every interface), a Manager in Python not.
    serving = ManagerOptions(metrics_address=("", 8080), health_probe_address=("", 8081))
    assert cli._manager_options(flags) == serving
    assert cli._webhook_options(flags) == WebhookOptions()
    assert cli._webhook_options(_flags(cli.webhook)) == WebhookOptions()


def test_the_cli_builds_each_option_from_its_flag() -> None:
    flags = _flags(
        cli.run,
        *("--namespace", "shop", "--health-probe-bind-address", "127.0.0.1:9090", "--resync-seconds", "60"),
        *("--shutdown-timeout", "12", "--garbage-interval", "0", "--garbage-dry-run"),
        *("--cache-sync-timeout", "30"),
        *("--leader-elect", "--leader-election-namespace", "ops", "--leader-election-id", "shop-lease"),
        *("--lease-duration", "30", "--renew-deadline", "20", "--retry-period", "4"),
        *("--webhook-host", "127.0.0.1", "--webhook-port", "8443", "--cert-dir", "/certs"),
        *("--webhook-service", "shop-hook", "--webhook-cert-host", "localhost"),
        *("--webhook-url", "https://127.0.0.1:8443"),
    )
    manager = cli._manager_options(flags)
    election = manager.leader_election
    assert election is not None
    assert manager == ManagerOptions(
        namespace="shop",
        resync_period=60,
        metrics_address=("", 8080),
        health_probe_address=("127.0.0.1", 9090),
        shutdown_timeout=12,
        cache_sync_timeout=30,
        leader_election=LeaderElectionOptions(
            name="shop-lease",
            namespace="ops",
            identity=election.identity,
            lease_duration=30,
            renew_deadline=20,
            retry_period=4,
        ),
        garbage=GarbageOptions(interval=None, dry_run=True),
    )
    assert cli._webhook_options(flags) == WebhookOptions(
        host="127.0.0.1",
        port=8443,
        cert_dir=Path("/certs"),
        bootstrap=BootstrapOptions(
            service_name="shop-hook", extra_hosts=("localhost",), webhook_url="https://127.0.0.1:8443"
        ),
    )
    assert cli._manager_options(_flags(cli.run, "--no-garbage")).garbage == GarbageOptions(enabled=False)
    assert cli._webhook_options(_flags(cli.webhook, "--no-bootstrap-certs")).bootstrap is None


def test_the_provider_budget_flags_set_its_rate_and_burst() -> None:
    """0 (the default) is no client-side limit; the burst applies once a rate is set."""
    assert cli._manager_options(_flags(cli.run)).provider_budget == ProviderBudgetOptions()
    assert cli._manager_options(_flags(cli.run, "--provider-rate", "0")).provider_budget.rate is None
    flags = _flags(cli.run, "--provider-rate", "12.5", "--provider-burst", "4")
    assert cli._manager_options(flags).provider_budget == ProviderBudgetOptions(rate=12.5, burst=4)


def test_namespaces_come_from_repeated_or_comma_separated_flags() -> None:
    for argv in (("--namespace", "shop,web"), ("--namespace", "shop", "--namespace", "web")):
        manager = cli._manager_options(_flags(cli.run, *argv))
        assert manager == ManagerOptions(
            namespaces=("shop", "web"), metrics_address=("", 8080), health_probe_address=("", 8081)
        )
        assert manager.watched_namespaces == ("shop", "web")
    # The webhook command's caches hold the same namespaces (its employers' lookups).
    webhook = cli._webhook_manager_options(_flags(cli.webhook, "--namespace", "shop", "--namespace", "web"))
    assert webhook.watched_namespaces == ("shop", "web")
    assert cli._webhook_manager_options(_flags(cli.webhook)).watched_namespaces is None
    one = cli._manager_options(_flags(cli.run, "--namespace", "shop"))
    assert one.namespace == "shop" and one.namespaces == () and one.watched_namespaces == ("shop",)
    assert ManagerOptions().watched_namespaces is None
    # The factory watches what the options say: a Manager's caches hold these namespaces only.
    several = Manager(_client(), ManagerOptions(namespaces=("web", "shop")))
    assert several.informers.namespaces == ("shop", "web")
    assert Manager(_client()).informers.namespaces is None


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--namespace", "shop,"), "'shop,' holds an empty namespace name"),
        (("--namespace", "shop,Web"), "namespace 'Web' is not a namespace name"),
        (("--namespace", "shop", "--namespace", "shop"), "namespaces lists shop more than once"),
    ],
)
def test_a_bad_namespace_list_is_a_usage_error_naming_the_flag(argv: tuple[str, ...], message: str) -> None:
    with pytest.raises(click.UsageError) as err:
        cli._manager_options(_flags(cli.run, *argv))
    assert message in err.value.message
    assert "--namespace" in err.value.message or err.value.param_hint == "--namespace"


def test_one_namespace_and_a_list_together_are_refused() -> None:
    with pytest.raises(InvalidOptions, match="both given") as err:
        ManagerOptions(namespace="shop", namespaces=("web",))
    assert err.value.fields == ("namespace", "namespaces")


def test_help_shows_the_defaults_of_the_options() -> None:
    from click.testing import CliRunner

    text = " ".join(CliRunner().invoke(cli.main, ["run", "--help"], terminal_width=200).output.split())

    def shown(flag: str) -> str:
        """The help of ``flag``: from it to the next flag."""
        return text.split(f" {flag} ", 1)[1].split(" --", 1)[0]

    election, webhook = LeaderElectionOptions(), WebhookOptions()
    assert f"[default: {election.lease_duration}]" in shown("--lease-duration")
    assert f"[default: {election.name}]" in shown("--leader-election-id")
    assert f"[default: {ManagerOptions().shutdown_timeout}]" in shown("--shutdown-timeout")
    assert f"[default: {GarbageOptions().interval}]" in shown("--garbage-interval")
    assert f"[default: {webhook.port}]" in shown("--webhook-port")
    assert f"[default: {webhook.cert_dir}]" in shown("--cert-dir")
    assert webhook.bootstrap is not None
    assert f"[default: {webhook.bootstrap.service_name}]" in shown("--webhook-service")


@pytest.mark.parametrize(
    ("argv", "flag", "message"),
    [
        (
            ("--leader-elect", "--lease-duration", "5", "--renew-deadline", "8"),
            "--lease-duration/--renew-deadline",
            "lease duration (5s)",
        ),
        (("--shutdown-timeout", "-1"), "--shutdown-timeout", "shutdown timeout must be 0 or more seconds"),
        (
            ("--cache-sync-timeout", "0"),
            "--cache-sync-timeout",
            "cache sync timeout must be more than 0 seconds",
        ),
        (("--resync-seconds", "-3"), "--resync-seconds", "resync period must be more than 0 seconds"),
        (("--full-pass-every", "-1"), "--full-pass-every", "full pass every must be 0 or more seconds"),
        (("--webhook-port", "70000"), "--webhook-port", "port must be 0 to 65535"),
        (("--webhook-url", "http://127.0.0.1:9443"), "--webhook-url", "is not an https:// URL"),
        (("--provider-rate", "-2"), "--provider-rate", "provider rate -2.0 is not a positive number"),
        (("--provider-burst", "0"), "--provider-burst", "provider burst 0 must be a whole number >= 1"),
        (
            ("--max-concurrent-reconciles", "0"),
            "--max-concurrent-reconciles",
            "max concurrent reconciles 0 must be a whole number >= 1",
        ),
    ],
)
def test_a_bad_flag_is_a_usage_error_naming_the_flag(argv: tuple[str, ...], flag: str, message: str) -> None:
    flags = _flags(cli.run, *argv)
    with pytest.raises(click.UsageError) as err:
        cli._manager_options(flags)
        cli._webhook_options(flags)
    assert message in err.value.message
    assert err.value.message.endswith(f"; adjust {flag}")


# -- where metrics and probes are served (docs/observability.md, "Flags") -------------------


def test_the_standard_bind_flags_set_the_metrics_and_probe_addresses() -> None:
    flags = _flags(
        cli.run, "--metrics-bind-address", "127.0.0.1:9090", "--health-probe-bind-address", ":9091"
    )
    options = cli._manager_options(flags)
    assert (options.metrics_address, options.health_probe_address) == (("127.0.0.1", 9090), ("", 9091))
    # "0" turns an endpoint off, as controller-runtime's "0" does; a v6 host keeps its colons.
    off = cli._manager_options(_flags(cli.run, "--metrics-bind-address", "0"))
    assert (off.metrics_address, off.health_probe_address) == (None, ("", 8081))
    v6 = cli._manager_options(_flags(cli.run, "--health-probe-bind-address", "[::1]:8081"))
    assert v6.health_probe_address == ("::1", 8081)
    # The webhook command serves them too.
    webhook = _flags(cli.webhook, "--metrics-bind-address", ":7070", "--health-probe-bind-address", "0")
    assert cli._serving_options(webhook) == ManagerOptions(
        metrics_address=("", 7070), health_probe_address=None
    )


async def test_the_full_pass_interval_reaches_every_controllers_reconciler() -> None:
    # docs/concepts.md, "Work proportional to change": the flag, then the option, then the pass.
    options = cli._manager_options(_flags(cli.run, "--full-pass-every", "0"))
    assert options.full_pass_every == 0
    assert ManagerOptions().full_pass_every == 300.0
    configuration = k8s.Configuration()
    configuration.host = f"http://127.0.0.1:{free_port()}"  # never asked: the manager is not started
    client = KubeClient(k8s.ApiClient(configuration))
    try:
        manager = Manager(client, options)
        controller = await manager.add(DemoAdapter())
        assert controller.reconciler.full_pass_every == 0
    finally:
        client.close()


class _AskingDemo(DemoAdapter):
    """The demo adapter asking for its own number of workers (``ReconcileOptions``)."""

    def get_max_concurrent(self) -> int:
        return 2

    def get_rate_limiter(self) -> Any:
        from resourceconsist.runtime.workqueue import default_controller_rate_limiter

        return default_controller_rate_limiter()


async def test_max_concurrent_reconciles_sets_every_controllers_workers() -> None:
    """`--max-concurrent-reconciles` (controller-runtime's MaxConcurrentReconciles, the chart's
    `controller.maxConcurrentReconciles`): unset, each controller runs what its adapter asks for,
    else 5; set, every controller runs that many, the adapter's ask overridden."""
    assert cli._manager_options(_flags(cli.run)).max_concurrent_reconciles is None
    options = cli._manager_options(_flags(cli.run, "--max-concurrent-reconciles", "12"))
    assert options.max_concurrent_reconciles == 12
    configuration = k8s.Configuration()
    configuration.host = f"http://127.0.0.1:{free_port()}"  # never asked: the managers are not started
    client = KubeClient(k8s.ApiClient(configuration))
    try:
        default = Manager(client, ManagerOptions())
        assert (await default.add(DemoAdapter())).max_concurrent == 5
        assert (await default.add(_AskingDemo(name="asking"))).max_concurrent == 2
        set_ = Manager(client, options)
        for adapter in (DemoAdapter(), _AskingDemo(name="asking")):
            controller = await set_.add(adapter)
            assert controller.max_concurrent == 12
            # What controller-runtime's gauge reports.
            series = {"controller": controller.name}
            gauge = set_.metrics.registry.get_sample_value(
                "controller_runtime_max_concurrent_reconciles", series
            )
            assert gauge == 12
    finally:
        client.close()


# -- the event loop (docs/reference/options.md, "The event loop") ----------------------------


@pytest.mark.parametrize("command", ["run", "webhook"])
def test_uvloop_missing_is_a_usage_error_naming_the_asyncio_flag(
    command: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # as where it is not installed: import fails
    done = CliRunner().invoke(cli.main, [command, "--adapter", "demo"])
    assert done.exit_code == 2, done.output
    said = "Invalid value for '--event-loop': uvloop is not installed here; install it, or pass "
    said += "--event-loop asyncio"
    assert said in done.output


@pytest.mark.parametrize("command", ["run", "webhook"])
def test_uvloop_installed_but_broken_is_a_usage_error_saying_why(
    command: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """An install whose uvloop cannot be imported (built for another Python, a library missing)
    is told so in one line, not with an ImportError's traceback at start."""
    broken = tmp_path / "uvloop"
    broken.mkdir()
    (broken / "__init__.py").write_text(
        'raise ImportError("loop.cpython-311-x86_64-linux-gnu.so: undefined symbol: _PyGen_Send")\n'
    )
    monkeypatch.delitem(sys.modules, "uvloop", raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    done = CliRunner().invoke(cli.main, [command, "--adapter", "demo"])
    assert done.exit_code == 2, done.output
    said = "Invalid value for '--event-loop': uvloop is installed but cannot be imported "
    said += "(loop.cpython-311-x86_64-linux-gnu.so: undefined symbol: _PyGen_Send); reinstall it for "
    said += "this Python, or pass --event-loop asyncio"
    assert said in " ".join(done.output.split()), done.output
    assert "Traceback" not in done.output
