"""What an operator sees under faults (docs/concepts.md, "What an operator sees under faults").

``/metrics`` of a running manager, scraped over HTTP: provider calls, retries and errors by
operation and code (the SLB adapter against the stateful emulator with throttling injected),
409 conflicts, informer re-lists and leadership. Logs: a provider error that a retry fixes is no
WARNING or ERROR line (the SDK's own included); retries exhausted is one WARNING; an API-server
outage (a loopback proxy in front of the real API server, cut and restored) is one WARNING when
it starts and one INFO when it ends, with no traceback per reconcile in between.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from resourceconsist.adapter import Employer, ReconcileContext
from resourceconsist.adapters.alibabacloudslb import MODE_ANNOTATION, SERVER_ID_ANNOTATION, SLBAdapter
from resourceconsist.adapters.alibabacloudslb.config import LOAD_BALANCER_ID_LABEL
from resourceconsist.adapters.alibabacloudslb.emulator import SLBEmulator
from resourceconsist.adapters.alibabacloudslb.slbclient import RetryPolicy, SLBClient, SLBError
from resourceconsist.cluster import kube
from resourceconsist.cluster.kube import KubeClient, KubeObject
from resourceconsist.experimental.demo import DemoAdapter, FakeProvider
from resourceconsist.options import GarbageOptions, ManagerOptions
from resourceconsist.rules import lifecycle
from resourceconsist.runtime.manager import Manager
from resourceconsist.testing import Cluster, LocalControlPlane, async_wait_for, finalizers

KEY_ID = "LTAI5tMetricsKeyId9X1"
SECRET = "Metrics/Secret+Value=3W"


def _scrape(manager: Manager) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample on the manager's /metrics, by (name, sorted labels)."""
    url = f"http://127.0.0.1:{manager.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def _total(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    return sum(
        value
        for (sample, sample_labels), value in samples.items()
        if sample == name and set(labels.items()) <= set(sample_labels)
    )


@pytest.fixture
def slb() -> Iterator[SLBEmulator]:
    with SLBEmulator(access_key_id=KEY_ID, access_key_secret=SECRET, seed=5) as emulator:
        yield emulator


async def test_metrics_show_provider_calls_retries_errors_conflicts_and_leadership(
    cluster: Cluster, slb: SLBEmulator, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    lb = slb.add_load_balancer()
    retry = RetryPolicy(max_attempts=8, base_delay_seconds=0.01, max_delay_seconds=0.05, max_total_seconds=10)
    client = SLBClient(slb.credentials(), retry=retry)
    # No garbage pass: its search of the region's load balancers (docs/alibabacloudslb.md) would
    # take the throttled reads meant for the Service's pass.
    manager = Manager(
        cluster.client,
        ManagerOptions(
            namespace=cluster.namespace,
            metrics_address=("127.0.0.1", 0),
            garbage=GarbageOptions(enabled=False),
        ),
    )
    adapter = SLBAdapter(client, cluster_name="metrics")
    await manager.add(adapter)
    await manager.start()
    try:
        # Each of the next three reads of the group list is throttled, then succeeds.
        slb.fail_next("DescribeVServerGroups", times=3, code="Throttling")
        await cluster.service(
            "web", labels={LOAD_BALANCER_ID_LABEL: lb}, annotations={MODE_ANNOTATION: "manage"}
        )
        await cluster.pod(
            "web-0", {"app": "web"}, readiness_gate=True, annotations={SERVER_ID_ANNOTATION: "eni-1"}
        )
        await cluster.set_status("web-0", ready=True, service_ready=True)

        def backend_registered() -> bool:
            groups = slb.vserver_groups(lb)
            return bool(groups) and bool(slb.backends(groups[0].id))

        await async_wait_for(backend_registered, timeout=60, message="the pod registered as a backend")
        samples = await asyncio.to_thread(_scrape, manager)
        ours = {"controller": adapter.get_controller_name(), "provider": "alibabacloudslb"}
        assert _total(samples, "resourceconsist_provider_calls_total", **ours, code="ok") >= 3
        assert (
            _total(
                samples,
                "resourceconsist_provider_calls_total",
                **ours,
                operation="AddVServerGroupBackendServers",
            )
            >= 1
        )
        assert (
            _total(
                samples,
                "resourceconsist_provider_errors_total",
                **ours,
                operation="DescribeVServerGroups",
                code="Throttling",
            )
            == 3
        )
        assert (
            _total(
                samples,
                "resourceconsist_provider_retries_total",
                **ours,
                operation="DescribeVServerGroups",
                code="Throttling",
            )
            == 3
        )
        assert _total(samples, "resourceconsist_provider_failures_total") == 0
        assert _total(samples, "resourceconsist_leader") == 1
        assert ("resourceconsist_unguarded_routing_pods", ()) not in samples  # left to the reconcile

        # A write that meets a concurrent one (a stale copy) is a 409, counted.
        before = _total(samples, "resourceconsist_kube_conflicts_total", resource="services")
        stale = await cluster.get(kube.SERVICE, "web")
        assert stale is not None
        await cluster.patch(kube.SERVICE, "web", {"metadata": {"labels": {"poke": "1"}}})
        await cluster.call(
            manager.client.patch_optimistic,
            kube.SERVICE,
            cluster.namespace,
            "web",
            lambda obj: {"metadata": {"annotations": {"touched": "yes"}}},
            current=stale,
        )
        samples = await asyncio.to_thread(_scrape, manager)
        # (The controller's own writes, racing the test's, may meet conflicts of their own too.)
        assert _total(samples, "resourceconsist_kube_conflicts_total", resource="services") > before
    finally:
        await manager.stop(timeout=5)
        client.close()
    # The three throttled reads were fixed by retries: not one WARNING or ERROR line about them.
    noisy = [r for r in caplog.records if r.levelno >= logging.WARNING and "Throttling" in r.getMessage()]
    assert noisy == [], [r.getMessage() for r in noisy]


def test_exhausted_retries_are_one_warning_and_the_sdk_logs_no_error(
    slb: SLBEmulator, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    lb = slb.add_load_balancer()
    slb.fail_next("DescribeVServerGroups", times=3, code="ServiceUnavailable", status=503)
    retry = RetryPolicy(max_attempts=3, base_delay_seconds=0.01, max_delay_seconds=0.02, max_total_seconds=5)
    with SLBClient(slb.credentials(), retry=retry) as client:
        with pytest.raises(SLBError):
            client.describe_vserver_groups(lb)
        client.describe_vserver_groups(lb)  # fine again
    loud = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(loud) == 1, [r.getMessage() for r in loud]
    assert loud[0].name.endswith("slbclient")
    assert "DescribeVServerGroups failed after 3 attempt(s)" in loud[0].getMessage()
    assert "ServiceUnavailable" in loud[0].getMessage()
    assert not [r for r in caplog.records if r.name.startswith("aliyunsdkcore")]


# ---- an API-server outage ------------------------------------------------------------------------


class GatedDemo(DemoAdapter):
    """A demo whose provider read waits at a gate the test opens (to land a pass in an outage)."""

    def __init__(self, provider: FakeProvider) -> None:
        super().__init__(provider)
        self.entered = threading.Event()
        self.gate = threading.Event()

    def get_expected_employer(self, ctx: ReconcileContext, employer: KubeObject) -> list[Employer]:
        self.entered.set()
        self.gate.wait(60)
        return super().get_expected_employer(ctx, employer)


class _Proxy:
    """A loopback TCP proxy to the API server that the test can cut and restore.

    It runs its own event loop in its own thread: the manager under test must not be able to
    stall it (nor it the manager).
    """

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="api-proxy", daemon=True)
        self._thread.start()
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    def _run(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(30)

    async def start(self) -> None:
        await asyncio.to_thread(self._run, self._start())

    async def cut(self) -> None:
        await asyncio.to_thread(self._run, self._cut())

    def close(self) -> None:
        self._run(self._shutdown())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    async def _shutdown(self) -> None:
        await self._cut()
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)

    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port, reuse_address=True)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def _cut(self) -> None:
        if self._server is None:
            return
        self._server.close()
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()
        await self._server.wait_closed()
        self._server = None

    async def _serve(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            client_writer.transport.abort()
            return
        self._writers.update({client_writer, upstream_writer})

        async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError, asyncio.CancelledError):
                while data := await reader.read(65536):
                    writer.write(data)
                    await writer.drain()
            writer.transport.abort()
            self._writers.discard(writer)

        # A cancelled connection handler makes asyncio log an error of its own: end quietly.
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(pipe(client_reader, upstream_writer), pipe(upstream_reader, client_writer))


async def test_an_api_server_outage_logs_once_when_it_starts_and_once_when_it_ends(
    cluster: Cluster, control_plane: LocalControlPlane, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    proxy = _Proxy(control_plane.port)
    await proxy.start()
    config = yaml.safe_load(control_plane.kubeconfig.read_text())
    config["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{proxy.port}"
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(config))
    client = KubeClient.from_kubeconfig(str(kubeconfig), name="API server")
    provider = FakeProvider()
    adapter = GatedDemo(provider)
    # A short resync makes the controller reconcile the Service again and again, outage or not.
    manager = Manager(
        client,
        ManagerOptions(namespace=cluster.namespace, resync_period=0.3, metrics_address=("127.0.0.1", 0)),
    )
    controller = await manager.add(adapter)
    await cluster.pod("p", {"app": "svc"})
    await cluster.set_status("p")
    await manager.start()
    try:
        await cluster.service("svc")
        await async_wait_for(adapter.entered.is_set, timeout=30, message="a pass reaching the provider")
        relists_before = _total(
            await asyncio.to_thread(_scrape, manager), "resourceconsist_informer_relists_total"
        )
        caplog.clear()
        # The pass goes on in the outage: its writes (the pod's finalizer, its entry) fail, and
        # every resync tries again.
        await proxy.cut()
        adapter.gate.set()
        reconciles = controller.reconciles
        await async_wait_for(
            lambda: client.reachability.down and controller.reconciles >= reconciles + 5,
            timeout=30,
            message="reconciles going on against the unreachable API server",
        )
        await proxy.start()

        async def pod_guarded() -> bool:
            pod = await cluster.get(kube.POD, "p")
            return pod is not None and lifecycle.lifecycle_finalizer("svc") in finalizers(pod)

        await async_wait_for(pod_guarded, timeout=60, message="the controller catching up after the outage")

        async def relisted() -> bool:
            samples = await asyncio.to_thread(_scrape, manager)
            return _total(samples, "resourceconsist_informer_relists_total") > relists_before

        await async_wait_for(relisted, timeout=60, message="the informers' re-lists on /metrics")
    finally:
        adapter.gate.set()
        await manager.stop(timeout=5)
        client.close()
        await asyncio.to_thread(proxy.close)
    messages = [(r.levelname, r.name, r.getMessage()) for r in caplog.records]
    down = [m for m in messages if "unreachable" in m[2] and m[0] == "WARNING"]
    back = [m for m in messages if "reachable again" in m[2]]
    assert len(down) == 1, messages
    assert down[0][1] == "resourceconsist.cluster.transport"
    assert len(back) == 1, messages
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged during the outage"
    # Nothing else warns once per retry: not urllib3's retries, the informers, the controller,
    # the reconcile's per-pass failure line, the event recorder.
    others = [m for m in messages if m[0] in ("WARNING", "ERROR") and m not in down]
    assert not others, others
