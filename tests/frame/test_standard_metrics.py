"""controller-runtime's standard series on ``/metrics`` (docs/observability.md), scraped from a
real manager during a real reconcile: the demo adapter, a controlled Service and its pods on the
real API server, and the webhook admitting those pods when the real API server calls it over TLS.

Each series is there with controller-runtime's label names; every counter and histogram count
grows during the reconcile (scraped before and after); every request the Kubernetes client sends,
watches included, is in ``rest_client_requests_total``; and every metric the sample Grafana
dashboard (docs/grafana/resourceconsist-dashboard.json) queries was seen in that scrape.

The dashboard's "Provider budget" and "Sharding" rows read series a process shows only once it
spends a provider budget and runs sharded: their queries are checked against the scrape of a
sharded replica running the SLB adapter, through the real SDK, against the SLB emulator, under a
provider rate.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import re
import urllib.error
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from resourceconsist import wire
from resourceconsist.adapters.alibabacloudslb import (
    MODE_ANNOTATION,
    SERVER_ID_ANNOTATION,
    SLBAdapter,
    vserver_group_name,
)
from resourceconsist.adapters.alibabacloudslb.config import LOAD_BALANCER_ID_LABEL
from resourceconsist.adapters.alibabacloudslb.emulator import SLBEmulator
from resourceconsist.adapters.alibabacloudslb.slbclient import RetryPolicy, SLBClient
from resourceconsist.cluster import kube
from resourceconsist.cluster.kube import ApiError
from resourceconsist.experimental.demo import DemoAdapter, FakeProvider
from resourceconsist.flow import budget
from resourceconsist.options import (
    LeaderElectionOptions,
    ManagerOptions,
    ProviderBudgetOptions,
    ShardingOptions,
)
from resourceconsist.rules import lifecycle
from resourceconsist.runtime.manager import Manager
from resourceconsist.testing import Cluster, async_wait_for, finalizers
from resourceconsist.testing.controlplane import free_port
from resourceconsist.webhook import BootstrapOptions, ControlledServiceAdapter, WebhookOptions, serve

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana" / "resourceconsist-dashboard.json"
CONTROLLED = {wire.CONTROL_LABEL: wire.CONTROL_LABEL_VALUE}

#: Each standard series and controller-runtime's label names for it (``le`` of buckets aside).
LABELS: dict[str, set[str]] = {
    "controller_runtime_reconcile_total": {"controller", "result"},
    "controller_runtime_reconcile_errors_total": {"controller"},
    "controller_runtime_terminal_reconcile_errors_total": {"controller"},
    "controller_runtime_reconcile_panics_total": {"controller"},
    "controller_runtime_reconcile_timeouts_total": {"controller"},
    "controller_runtime_reconcile_time_seconds_count": {"controller"},
    "controller_runtime_active_workers": {"controller"},
    "controller_runtime_max_concurrent_reconciles": {"controller"},
    "workqueue_depth": {"name", "controller", "priority"},
    "workqueue_adds_total": {"name", "controller"},
    "workqueue_queue_duration_seconds_count": {"name", "controller"},
    "workqueue_work_duration_seconds_count": {"name", "controller"},
    "workqueue_unfinished_work_seconds": {"name", "controller"},
    "workqueue_longest_running_processor_seconds": {"name", "controller"},
    "workqueue_retries_total": {"name", "controller"},
    "rest_client_requests_total": {"code", "method", "host"},
    "rest_client_request_duration_seconds_count": {"verb", "host"},
    "controller_runtime_webhook_requests_total": {"webhook", "code"},
    "controller_runtime_webhook_latency_seconds_count": {"webhook"},
    "controller_runtime_webhook_requests_in_flight": {"webhook"},
    "leader_election_master_status": {"name"},
    "leader_election_slowpath_total": {"name"},
    "certwatcher_read_certificate_total": set(),
    "certwatcher_read_certificate_errors_total": set(),
    "resourceconsist_build_info": {"version", "revision", "python_version"},
    "process_resident_memory_bytes": set(),
    "process_cpu_seconds_total": set(),
    "python_gc_objects_collected_total": {"generation"},
}

#: What a reconcile that fails and succeeds, without a bug, a timeout or a terminal error, a
#: Lease nobody else writes and the webhook's good certificate leave at 0 (each has a test that
#: makes it move: tests/frame/test_reconcile_series.py, test_leaderelection.py,
#: tests/webhook/test_webhook_tls.py).
STILL = {
    "leader_election_slowpath_total",
    "controller_runtime_terminal_reconcile_errors_total",
    "controller_runtime_reconcile_panics_total",
    "controller_runtime_reconcile_timeouts_total",
    "certwatcher_read_certificate_errors_total",
}
#: The counters and histogram counts a reconcile with one provider failure makes grow (the
#: process's CPU and its garbage collections grow at their own pace, the webhook's certificate
#: is read at start and then every poll).
GROWING = [
    name
    for name in LABELS
    if name.endswith(("_total", "_count"))
    and not name.startswith(("process_", "python_", "certwatcher_"))
    and name not in STILL
]

Samples = dict[str, list[tuple[dict[str, str], float]]]


def _get(port: int | None, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, ""


def _scrape(port: int | None) -> Samples:
    """Every sample on ``/metrics``, by sample name."""
    status, text = _get(port, "/metrics")
    assert status == 200, status
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return samples


def _total(samples: Samples, series: str, **labels: str) -> float:
    return sum(v for found, v in samples.get(series, []) if labels.items() <= found.items())


# -- the dashboard's PromQL ----------------------------------------------------------------------

#: What an identifier in PromQL may be that is no metric: aggregation and binary keywords.
_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless"}
_KEYWORDS |= {"offset", "inf", "nan"}


def promql_metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: identifiers that are not a function or
    aggregation (followed by ``(``), not a keyword, a label (in ``{...}``, ``by (...)``, ...), a
    string, a duration or a number."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings may hold anything
    text = re.sub(r"\{[^}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)  # ranges and subqueries
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        name = match.group(0)
        preceding = text[match.start() - 1] if match.start() else " "
        if preceding.isdigit() or preceding == ".":  # 1e3, 0.99
            continue
        if re.match(r"\s*\(", text[match.end() :]) or name.lower() in _KEYWORDS:
            continue
        names.add(name)
    return names


def dashboard_rows() -> dict[str | None, list[str]]:
    """Every PromQL expression of the dashboard by the title of the row its panel is under
    (``None``: the panels above the first row, and the variables' queries, where
    ``label_values(<metric selector>, label)`` gives its selector)."""
    dashboard = json.loads(DASHBOARD.read_text())
    rows: dict[str | None, list[str]] = {None: []}
    row: str | None = None
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            row = panel["title"]
            rows.setdefault(row, [])
            continue
        rows[row].extend(target["expr"] for target in panel["targets"])
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            found = re.fullmatch(r"label_values\((.*),\s*\w+\)", variable["query"]["query"])
            assert found, variable["query"]
            rows[None].append(found.group(1))
    return rows


def dashboard_queries() -> list[str]:
    """Every PromQL expression of the dashboard, whatever its row."""
    return [query for queries in dashboard_rows().values() for query in queries]


def metric_names(queries: list[str]) -> set[str]:
    return {name for query in queries for name in promql_metric_names(query)}


#: The rows whose series a sharded replica spending a provider budget shows (the second scrape).
BUDGET_AND_SHARDING_ROWS = ("Provider budget", "Sharding")


def test_promql_metric_names_finds_metrics_and_nothing_else() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (controller, le) (rate(a_seconds_bucket{controller=~"x|y"}'
        "[$__rate_interval]))) / on (pod) group_left b_total offset 5m > 1e3 and c"
    )
    assert promql_metric_names(expr) == {"a_seconds_bucket", "b_total", "c"}
    assert promql_metric_names('max by (pod) (up{job="by (x)"})') == {"up"}


def test_every_dashboard_query_names_a_metric() -> None:
    queries = dashboard_queries()
    assert len(queries) >= 20
    for query in queries:
        assert promql_metric_names(query), query


def test_every_dashboard_row_is_checked_by_a_scrape() -> None:
    # A row no scrape below reads could query series no process exports.
    rows = dashboard_rows()
    assert set(rows) == {None, *BUDGET_AND_SHARDING_ROWS}
    assert all(rows[row] for row in BUDGET_AND_SHARDING_ROWS)


# -- the scrape ------------------------------------------------------------------------------------


async def test_a_reconcile_and_an_admission_show_in_controller_runtimes_series(
    cluster: Cluster, tmp_path: Path
) -> None:
    provider = FakeProvider()
    adapter = DemoAdapter(provider)
    controller_name = adapter.get_controller_name()
    manager = Manager(
        cluster.client,
        ManagerOptions(
            namespace=cluster.namespace,
            metrics_address=("127.0.0.1", 0),
            health_probe_address=("127.0.0.1", 0),
            # A Lease, as the chart runs it: client-go's leader-election series.
            leader_election=LeaderElectionOptions(namespace=cluster.namespace, name="standard-series"),
        ),
    )
    await manager.add(adapter)
    port = free_port()
    options = WebhookOptions(
        host="127.0.0.1",
        port=port,
        cert_dir=tmp_path,
        bootstrap=BootstrapOptions(namespace=cluster.namespace, webhook_url=f"https://127.0.0.1:{port}"),
    )
    await manager.start()
    server = await serve(
        [ControlledServiceAdapter("demo")],
        options,
        client=manager.client,
        informers=manager.informers,
        metrics=manager.metrics,
    )
    try:
        await async_wait_for(
            lambda: manager.ready() and server.ready and manager.leading, timeout=60, message="ready, leading"
        )
        # Metrics and probes each on their own port, as controller-runtime serves them.
        assert manager.metrics_port != manager.health_port
        assert (await asyncio.to_thread(_get, manager.health_port, "/readyz"))[0] == 200
        assert (await asyncio.to_thread(_get, manager.health_port, "/metrics"))[0] == 404
        assert (await asyncio.to_thread(_get, manager.metrics_port, "/healthz"))[0] == 404
        before = await asyncio.to_thread(_scrape, manager.metrics_port)
        # Started at 0 by every controller: a rate() sees its first reconcile.
        for result in ("success", "error", "requeue", "requeue_after"):
            assert _total(before, "controller_runtime_reconcile_total", result=result) == 0
        assert _total(before, "controller_runtime_max_concurrent_reconciles", controller=controller_name) == 5

        # One provider failure: an error result, a rate-limited retry, then convergence.
        provider.fail_next("create_vip")
        await cluster.service("web")
        names = (f"web-{i}" for i in itertools.count())
        admitted: list[str] = []
        entry = {f"Service/{cluster.namespace}/web": lifecycle.lifecycle_finalizer("web")}

        async def admitted_by_the_webhook() -> bool:
            name = next(names)
            try:
                pod = await cluster.pod(name, {**CONTROLLED, "app": "web"})
            except ApiError:  # the API server may still be reading the new configuration
                return False
            if lifecycle.expected_finalizers(pod) != entry:
                return False
            admitted.append(name)
            return len(admitted) == 2

        await async_wait_for(
            admitted_by_the_webhook, timeout=60, interval=0.5, message="two pods mutated by the webhook"
        )
        for name in admitted:
            await cluster.set_status(name, ready=True)

        async def guarded() -> bool:
            pods = [await cluster.get(kube.POD, name) for name in admitted]
            return all(entry[f"Service/{cluster.namespace}/web"] in finalizers(pod) for pod in pods)

        await async_wait_for(guarded, timeout=60, message="the lifecycle finalizer on both pods")

        async def settled() -> Samples | None:
            samples = await asyncio.to_thread(_scrape, manager.metrics_port)
            # Every request the client sent (watches included) has been answered and counted;
            # the test's own requests ride on the same client, so they count as well.
            sent = sum(manager.client.requests.values())
            counted = _total(samples, "rest_client_requests_total")
            busy = _total(samples, "controller_runtime_active_workers")
            queued = _total(samples, "workqueue_depth")
            return samples if counted == sent and busy == 0 and queued == 0 else None

        after = await async_wait_for(settled, timeout=60, message="the client's requests all counted")
    finally:
        await server.stop()
        await manager.stop(timeout=5)
        # failurePolicy Fail: left behind, it would refuse every controlled pod of later tests.
        with contextlib.suppress(kube.NotFound):
            await cluster.call(
                cluster.client.delete,
                kube.MUTATING_WEBHOOK_CONFIGURATION,
                None,
                wire.MUTATING_WEBHOOK_CONFIGURATION,
            )

    for name, labels in LABELS.items():
        assert after.get(name), f"{name} is not on /metrics"
        for found, _ in after[name]:
            assert set(found) - {"le"} == labels, (name, found)
    for name in GROWING:
        assert _total(after, name) > _total(before, name), f"{name} did not grow during the reconcile"
    for name in STILL:
        assert _total(after, name) == 0, name
    assert _total(after, "certwatcher_read_certificate_total") >= 1  # the webhook's, loaded
    # As the Go client: no *_created series (prometheus_client's, for counters and histograms).
    created = sorted(name for name in after if name.endswith("_created"))
    assert not created, f"*_created series on /metrics: {created}"
    ((build, one),) = after["resourceconsist_build_info"]
    assert one == 1 and build["version"] == "0.1.0" and build["revision"] != ""
    ours = {"controller": controller_name}
    assert _total(after, "controller_runtime_reconcile_total", **ours, result="success") >= 1
    assert _total(after, "controller_runtime_reconcile_total", **ours, result="error") >= 1
    assert _total(after, "controller_runtime_reconcile_errors_total", **ours) >= 1
    assert _total(after, "workqueue_retries_total", name=controller_name, controller=controller_name) >= 1
    # Reads, watches and writes, each by method and answer code, for the API server's host.
    host = manager.client.host
    assert host and all(found["host"] == host for found, _ in after["rest_client_requests_total"])
    assert _total(after, "rest_client_requests_total", method="GET", code="200") > 0
    assert _total(after, "rest_client_requests_total", method="POST", code="201") > 0
    assert _total(after, "rest_client_requests_total", method="PATCH", code="200") > 0
    assert manager.client.requests["watch"] > 0
    webhook = {"webhook": "/mutating-demo"}
    assert _total(after, "controller_runtime_webhook_requests_total", **webhook, code="200") >= 2
    assert _total(after, "controller_runtime_webhook_requests_in_flight", **webhook) == 0
    assert _total(after, "process_resident_memory_bytes") > 10_000_000

    # The sample dashboard queries nothing that was not on /metrics.
    unseen = metric_names(dashboard_rows()[None]) - set(after)
    assert not unseen, f"the dashboard queries series the manager does not export: {sorted(unseen)}"


async def test_a_sharded_replica_spending_a_provider_budget_shows_the_budget_and_sharding_rows(
    cluster: Cluster,
) -> None:
    """One replica of a ring, running the built-in sharder, whose SLB adapter registers a pod
    under a provider rate: every series of the dashboard's budget and sharding rows is on its
    ``/metrics``, with what it did."""
    sharding = ShardingOptions(
        controller_ring="dashboard",
        shard_name="dashboard-0",
        namespace=cluster.namespace,
        lease_duration=6.0,
        renew_deadline=4.0,
        retry_period=0.5,
        sharder_resync=2.0,
    )
    rate = ProviderBudgetOptions(rate=50.0, burst=5)
    retry = RetryPolicy(max_attempts=8, base_delay_seconds=0.01, max_delay_seconds=0.05, max_total_seconds=10)
    with SLBEmulator(seed=7) as slb:
        client = SLBClient(slb.credentials(), retry=retry)
        manager = Manager(
            cluster.client,
            ManagerOptions(
                namespace=cluster.namespace,
                sharding=sharding,
                provider_budget=rate,
                metrics_address=("127.0.0.1", 0),
                health_probe_address=("127.0.0.1", 0),
            ),
        )
        await manager.add(SLBAdapter(client, cluster_name="dashboard-tests"))
        lb = slb.add_load_balancer()
        service = await cluster.service(
            "web", labels={LOAD_BALANCER_ID_LABEL: lb}, annotations={MODE_ANNOTATION: "manage"}
        )
        await cluster.pod(
            "web-0", {"app": "web"}, readiness_gate=True, annotations={SERVER_ID_ANNOTATION: "eni-1"}
        )
        await cluster.set_status("web-0", ready=True, service_ready=True)
        await manager.start()
        try:

            def registered() -> bool:
                group = next(
                    (g for g in slb.vserver_groups(lb) if g.name == vserver_group_name(service)), None
                )
                return group is not None and len(slb.backends(group.id)) == 1

            await async_wait_for(registered, timeout=60, message="the pod registered by the sharded replica")
            account = {"account": client.budget.account}

            async def seen() -> Samples | None:
                samples = await asyncio.to_thread(_scrape, manager.metrics_port)
                done = (
                    _total(samples, "resourceconsist_provider_budget_granted_total", **account) > 0
                    and _total(samples, "resourceconsist_sharder_moves_total", move="assign") >= 1
                    and _total(samples, "resourceconsist_sharder_shards", state="ready") == 1
                )
                return samples if done else None

            after = await async_wait_for(
                seen, timeout=60, message="the budget's grants and the sharder's move"
            )
        finally:
            await manager.stop(timeout=5)
            client.close()
            budget.configure(ProviderBudgetOptions())  # the rest of the process runs without a rate
    # A replica no longer running the sharder shows no ring (a stale one would read as live).
    assert (
        manager.metrics.registry.get_sample_value("resourceconsist_sharder_shards", {"state": "ready"})
        is None
    )

    # The rate the manager set is the one the account spends (alone on the ring: all of it).
    assert _total(after, "resourceconsist_provider_budget_rate", **account) == rate.rate
    # Registering the pod was a registration; the queue is shown for every priority (its value is
    # whatever the adapter's reads had waiting at the scrape).
    assert _total(after, "resourceconsist_provider_budget_granted_total", **account, priority="register") >= 1
    queued = {
        found["priority"]
        for found, _ in after["resourceconsist_provider_budget_queued"]
        if found.items() >= account.items()
    }
    assert queued == {"remove_traffic", "delete", "register", "read"}
    assert _total(after, "resourceconsist_sharder_shards", state="dead") == 0
    assert _total(after, "resourceconsist_shard_drains_total") == 0

    rows = dashboard_rows()
    queried = metric_names([query for row in BUDGET_AND_SHARDING_ROWS for query in rows[row]])
    unseen = queried - set(after)
    assert not unseen, (
        f"the budget and sharding rows query series the replica does not export: {sorted(unseen)}"
    )
