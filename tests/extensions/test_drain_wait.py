"""The drain that waits for the provider (docs/zero-downtime.md, "A drain that waits for the
provider"): the webhook's spec mutation for an employer that asks for it, the managers' drain
endpoint on a real API server, and the drain waiter as its own process, asking that endpoint, a
dead one and one that never answers (a frozen manager).

On a real node, with real containers, HAProxy and traffic: tests/extensions/test_traffic_realnode.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from resourceconsist import wire
from resourceconsist.cluster import kube
from resourceconsist.cluster.kube import KubeClient
from resourceconsist.errors import InvalidOptions
from resourceconsist.options import ManagerOptions
from resourceconsist.rules import gates, lifecycle
from resourceconsist.runtime.manager import Manager
from resourceconsist.testing import CLI, LocalControlPlane, async_wait_for, run_cli, wait_for
from resourceconsist.testing.controlplane import free_port
from resourceconsist.webhook import EmployerRef
from resourceconsist.webhook.adapter import spec_drain_mode
from resourceconsist.webhook.admission import WAITER_RESOURCES, spec_mutation
from resourceconsist.webhook.options import DrainWaiterOptions

WAITER = DrainWaiterOptions(image="localhost/resourceconsist:0.1.0", endpoints=("http://10.0.0.5:8082",))


def _pod(containers: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": "ns"}, "spec": {"containers": containers, **spec}}


def _ref(name: str, drain: int, mode: str) -> EmployerRef:
    return EmployerRef("Service", "ns", name, readiness_gate=True, drain_seconds=drain, drain_mode=mode)


# -- the webhook --------------------------------------------------------------------------------------


def test_a_waiting_employer_gives_its_pods_the_waiter_sidecar_and_a_prestop_that_asks_it() -> None:
    own = {"preStop": {"exec": {"command": ["drain.sh"]}}}
    pod = _pod([{"name": "app"}, {"name": "side", "lifecycle": own}], terminationGracePeriodSeconds=10)
    ops = spec_mutation(pod, [_ref("web", 20, "wait"), _ref("api", 5, "sleep")], WAITER)
    hook = {"httpGet": {"path": "/wait", "port": wire.DRAIN_WAITER_PORT, "scheme": "HTTP"}}
    assert {"op": "add", "path": "/spec/containers/0/lifecycle", "value": {"preStop": hook}} in ops
    assert not any(op["path"].startswith("/spec/containers/1") for op in ops)  # its own hook stays
    # The grace period grows by the longest drain time, the waiter's bound.
    assert {"op": "replace", "path": "/spec/terminationGracePeriodSeconds", "value": 30} in ops
    (added,) = [op for op in ops if op["path"] == "/spec/initContainers"]
    (sidecar,) = added["value"]
    assert sidecar["name"] == wire.DRAIN_WAITER_CONTAINER
    assert sidecar["image"] == WAITER.image
    # A native sidecar: it starts before the containers and is stopped after them.
    assert sidecar["restartPolicy"] == "Always"
    assert sidecar["args"] == [
        "drain-waiter",
        f"--port={wire.DRAIN_WAITER_PORT}",
        "--bound=20",
        "--endpoint=http://10.0.0.5:8082",
    ]
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in sidecar["env"]}
    assert env == {
        "POD_NAMESPACE": "metadata.namespace",
        "POD_NAME": "metadata.name",
        "POD_UID": "metadata.uid",
    }
    assert sidecar["resources"] == WAITER_RESOURCES
    assert sidecar["securityContext"]["runAsNonRoot"] is True
    assert sidecar["securityContext"]["readOnlyRootFilesystem"] is True


def test_the_waiter_joins_init_containers_already_there_and_is_never_added_twice() -> None:
    init = [{"name": "migrate"}]
    ops = spec_mutation(_pod([{"name": "app"}], initContainers=init), [_ref("web", 20, "wait")], WAITER)
    (added,) = [op for op in ops if op["path"].startswith("/spec/initContainers")]
    assert added["path"] == "/spec/initContainers/-"
    assert added["value"]["name"] == wire.DRAIN_WAITER_CONTAINER
    present = [{"name": wire.DRAIN_WAITER_CONTAINER}]
    ops = spec_mutation(_pod([{"name": "app"}], initContainers=present), [_ref("web", 20, "wait")], WAITER)
    assert not any(op["path"].startswith("/spec/initContainers") for op in ops)


def test_without_a_waiter_the_wait_drain_sleeps_and_says_why(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="resourceconsist.webhook")
    ops = spec_mutation(_pod([{"name": "app"}]), [_ref("web", 20, "wait")], None)
    assert {
        "op": "add",
        "path": "/spec/containers/0/lifecycle",
        "value": {"preStop": {"sleep": {"seconds": 20}}},
    } in ops
    assert not any(op["path"].startswith("/spec/initContainers") for op in ops)
    assert "the webhook has no drain waiter" in caplog.text
    # Sleep-mode employers never get the waiter, configured or not.
    ops = spec_mutation(_pod([{"name": "app"}]), [_ref("web", 20, "sleep")], WAITER)
    assert not any(op["path"].startswith("/spec/initContainers") for op in ops)


def test_the_drain_mode_is_sleep_or_wait_and_a_typo_never_refuses_a_pod() -> None:
    def service(value: str | None) -> dict[str, Any]:
        annotations = {} if value is None else {wire.DRAIN_MODE_ANNOTATION: value}
        return {"metadata": {"name": "web", "namespace": "ns", "annotations": annotations}}

    assert gates.drain_mode(service(None)) == "sleep"
    assert gates.drain_mode(service(" Wait ")) == "wait"
    with pytest.raises(gates.InvalidAnnotation, match="write 'sleep' or 'wait'"):
        gates.drain_mode(service("poll"))
    assert spec_drain_mode(service("poll")) == "sleep"


@pytest.mark.parametrize(
    ("endpoints", "image", "field"),
    [
        ((), "img", "endpoints"),
        (("ftp://x",), "img", "endpoints"),
        (("http://x/api",), "img", "endpoints"),
        (("http://x:1",), " ", "image"),
    ],
)
def test_a_waiter_without_a_usable_endpoint_or_image_is_refused_naming_the_field(
    endpoints: tuple[str, ...], image: str, field: str
) -> None:
    with pytest.raises(InvalidOptions) as refused:
        DrainWaiterOptions(image=image, endpoints=endpoints)
    assert refused.value.fields == (field,)


def test_the_command_line_asks_for_the_image_with_the_endpoints_and_the_pod_s_names() -> None:
    done = run_cli("webhook", "--adapter", "haproxy", "--drain-waiter-endpoint", "http://x:1")
    assert done.returncode == 2 and "add --drain-waiter-image" in done.stderr
    env = {k: v for k, v in os.environ.items() if not k.startswith("POD_")}
    done = run_cli("drain-waiter", "--bound", "5", "--endpoint", "http://x:1", env=env)
    assert done.returncode == 2 and "POD_NAMESPACE and POD_NAME not set" in done.stderr


# -- the endpoint and the waiter on a real API server ----------------------------------------------


@contextlib.asynccontextmanager
async def _manager(control_plane: LocalControlPlane, **options: Any) -> AsyncIterator[tuple[Manager, str]]:
    client = KubeClient.from_kubeconfig(str(control_plane.kubeconfig))
    manager = Manager(client, ManagerOptions(drain_address=("127.0.0.1", 0), **options))
    await manager.start()
    try:
        yield manager, f"http://127.0.0.1:{manager.drain_port}"
    finally:
        await manager.stop(timeout=5)
        client.close()


def _ask(endpoint: str, query: str, timeout: float = 15) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(f"{endpoint}{wire.DRAIN_RELEASED_PATH}?{query}", timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


HOLDS = [lifecycle.guard_finalizer("web"), lifecycle.lifecycle_finalizer("api"), "example.com/other"]


async def _held_pod(client: KubeClient, namespace: str, name: str = "p") -> dict[str, Any]:
    body = {
        "metadata": {"name": name, "finalizers": HOLDS},
        "spec": {"containers": [{"name": "c", "image": "x"}]},
    }
    return await asyncio.to_thread(client.create, kube.POD, namespace, body)


async def _release(client: KubeClient, namespace: str, name: str, keep: list[str]) -> None:
    await asyncio.to_thread(client.patch, kube.POD, namespace, name, {"metadata": {"finalizers": keep}})


async def test_the_endpoint_says_released_once_no_employer_finalizer_holds_the_pod(
    control_plane: LocalControlPlane, namespace: str
) -> None:
    async with _manager(control_plane) as (manager, endpoint):
        pod = await _held_pod(manager.client, namespace)
        uid = pod["metadata"]["uid"]

        async def answer(query: str, timeout: float = 15) -> tuple[int, Any]:
            return await asyncio.to_thread(_ask, endpoint, query, timeout)

        def synced() -> bool:
            return _ask(endpoint, f"namespace={namespace}&pod=p")[0] == 200

        await async_wait_for(lambda: asyncio.to_thread(synced), timeout=30, message="the pod cache")
        status, body = await answer(f"namespace={namespace}&pod=p&uid={uid}")
        assert status == 200 and body == {"released": False, "holding": HOLDS[:2]}
        # A question that waits is answered as soon as the finalizers go, not at its end.
        asked = time.monotonic()
        waiting = asyncio.ensure_future(answer(f"namespace={namespace}&pod=p&uid={uid}&wait=8"))
        await asyncio.sleep(0.5)
        assert not waiting.done()
        await _release(manager.client, namespace, "p", ["example.com/other"])
        status, body = await waiting
        assert status == 200 and body == {"released": True, "holding": []}
        assert time.monotonic() - asked < 4
        # Another pod of the same name (another uid) or none: the one asked about is gone.
        assert (await answer(f"namespace={namespace}&pod=p&uid=another"))[1]["released"] is True
        assert (await answer(f"namespace={namespace}&pod=nobody"))[1] == {"released": True, "holding": []}
        # Not yet released, a waiting question ends with "no" after its wait.
        await _held_pod(manager.client, namespace, "q")
        await async_wait_for(
            lambda: asyncio.to_thread(
                lambda: _ask(endpoint, f"namespace={namespace}&pod=q")[1]["released"] is False
            ),
            timeout=10,
            message="q cached",
        )
        asked = time.monotonic()
        status, body = await answer(f"namespace={namespace}&pod=q&wait=1.5")
        assert body["released"] is False and 1.4 < time.monotonic() - asked < 5
        status, text = await answer("pod=q")
        assert status == 400 and "namespace=" in text
        await _release(manager.client, namespace, "q", [])


async def test_a_namespace_the_manager_does_not_watch_is_left_to_others(
    control_plane: LocalControlPlane, namespace: str
) -> None:
    async with _manager(control_plane, namespace=namespace) as (_, endpoint):
        status, text = await asyncio.to_thread(_ask, endpoint, "namespace=elsewhere&pod=p")
        assert status == 404 and "does not watch namespace elsewhere" in text


@pytest.fixture
def hanging_endpoint() -> Iterator[str]:
    """An endpoint that takes connections and never answers: a frozen (SIGSTOPped) manager."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"


def _waiter(port: int, bound: float, endpoints: list[str], namespace: str, pod: str) -> subprocess.Popen[str]:
    env = {**os.environ, "POD_NAMESPACE": namespace, "POD_NAME": pod, "POD_UID": ""}
    args = ["drain-waiter", f"--port={port}", f"--bound={bound}", *(f"--endpoint={e}" for e in endpoints)]
    return subprocess.Popen(
        [*CLI, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def _hook(port: int, timeout: float = 60) -> tuple[str, float]:
    """What the kubelet's preStop httpGet does: GET /wait, and how long the answer took."""
    started = time.monotonic()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{wire.DRAIN_WAITER_PATH}", timeout=timeout) as r:
        return r.read().decode().strip(), time.monotonic() - started


def _listening(port: int) -> bool:
    with contextlib.suppress(OSError), urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1):
        return True
    return False


async def test_the_waiter_answers_the_hook_once_a_manager_says_released_whatever_the_others_do(
    control_plane: LocalControlPlane, namespace: str, hanging_endpoint: str
) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    async with _manager(control_plane) as (manager, endpoint):
        await _held_pod(manager.client, namespace)
        await async_wait_for(
            lambda: asyncio.to_thread(lambda: _ask(endpoint, f"namespace={namespace}&pod=p")[0] == 200),
            timeout=30,
            message="the pod cache",
        )
        port = free_port()
        waiter = _waiter(port, 60, [hanging_endpoint, dead, endpoint], namespace, "p")
        try:
            await async_wait_for(
                lambda: asyncio.to_thread(_listening, port), timeout=30, message="the waiter"
            )
            hook = asyncio.ensure_future(asyncio.to_thread(_hook, port))
            await asyncio.sleep(2)
            assert not hook.done(), "answered while the finalizers still held the pod"
            released = time.monotonic()
            await _release(manager.client, namespace, "p", ["example.com/other"])
            said, _ = await hook
            assert said == "released"
            # Within a second of the release, though one endpoint hangs and one is down.
            assert time.monotonic() - released < 2
        finally:
            waiter.terminate()
            out, _ = waiter.communicate(timeout=10)
        events = [json.loads(line)["event"] for line in out.splitlines() if line.startswith("{")]
        assert events[0] == "listening" and "released" in events and events[-1] == "exit"


def test_with_no_manager_answering_the_hook_waits_the_bound_and_no_less(hanging_endpoint: str) -> None:
    port = free_port()
    dead = f"http://127.0.0.1:{free_port()}"
    waiter = _waiter(port, 3, [hanging_endpoint, dead], "ns", "p")
    try:
        wait_for(lambda: _listening(port), timeout=30, message="the waiter")
        said, took = _hook(port)
        assert said == "bound"
        assert 3 <= took < 4.5
    finally:
        waiter.terminate()
        waiter.communicate(timeout=10)


def test_sigterm_stops_the_waiter_at_once_while_a_hook_waits(hanging_endpoint: str) -> None:
    # The pod's containers are gone (a native sidecar is stopped after them); a hook still asking
    # a frozen manager, on its threads, must not hold the waiter until the grace period ends.
    port = free_port()
    waiter = _waiter(port, 60, [hanging_endpoint], "ns", "p")
    events: list[str] = []

    def read() -> None:
        assert waiter.stdout is not None
        events.extend(json.loads(line)["event"] for line in waiter.stdout if line.startswith("{"))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        wait_for(lambda: _listening(port), timeout=30, message="the waiter")
        cut: list[OSError] = []

        def hook() -> None:
            try:
                _hook(port)
            except OSError as err:  # the waiter leaves without answering: the hook is cut
                cut.append(err)

        asking = threading.Thread(target=hook, daemon=True)
        asking.start()
        wait_for(lambda: "waiting" in events, timeout=10, message="the hook's wait")
        signalled = time.monotonic()
        waiter.send_signal(signal.SIGTERM)
        assert waiter.wait(10) == 0
        assert time.monotonic() - signalled < 3
    finally:
        if waiter.poll() is None:
            waiter.kill()
            waiter.wait(10)
    reader.join(10)
    asking.join(10)
    assert events == ["listening", "waiting", "exit"]
    assert len(cut) == 1, "the hook's connection closed with the waiter"
