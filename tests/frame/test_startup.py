"""A start that fails cleanly (docs/observability.md, "When the start fails"), the way a cluster
runs the controller: `resourceconsist run` as its own process against the real API server.

- A start whose caches cannot fill within `--cache-sync-timeout` (a wrong token, a ServiceAccount
  without the Role, an address nobody listens on, a CA that did not sign the API server's
  certificate) exits 1 with one line naming the resource, the cause and what to do, no traceback;
  `/readyz` says the same meanwhile.
- SIGTERM and SIGINT stop it within a second, exit 0, while the caches sync, while it waits for
  the leader's Lease and while the webhook's certificate bootstrap waits on the API server.
- A port already taken (metrics, webhook) is one line too.
"""

from __future__ import annotations

import datetime
import os
import re
import signal
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from resourceconsist.cluster import certs, kube
from resourceconsist.cluster.kube import KubeClient
from resourceconsist.runtime.leaderelection import lease_time
from resourceconsist.testing import LocalControlPlane, run_cli, wait_for
from resourceconsist.testing.controlplane import free_port
from resourceconsist.testing.process import CommandProcess

#: ``--cache-sync-timeout`` of the starts that must fail.
SYNC_SECONDS = 4
#: The most a stop asked for during the start may take, signal to exit (the issue's second).
STOP_SECONDS = 1.0


def _env(**more: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")}
    return {**env, **more}


def _run_args(kubeconfig: Path, namespace: str, health_port: int, *more: str) -> list[str]:
    return [
        *("run", "--adapter", "demo", "--kubeconfig", str(kubeconfig), "--namespace", namespace),
        *("--health-probe-bind-address", f"127.0.0.1:{health_port}", "--metrics-bind-address", "0"),
        *more,
    ]


def _kubeconfig(control_plane: LocalControlPlane, path: Path, **cluster: Any) -> Path:
    """The control plane's admin kubeconfig at ``path``, its cluster's keys changed by ``cluster``."""
    config = yaml.safe_load(control_plane.kubeconfig.read_text())
    config["clusters"][0]["cluster"].update(cluster)
    path.write_text(yaml.safe_dump(config))
    return path


def _failed_start(kubeconfig: Path, namespace: str) -> str:
    """Run a start that cannot fill its caches; its one error line, after checking the exit code
    (1), that there is no traceback and that it took the cache sync timeout, not much more."""
    args = _run_args(kubeconfig, namespace, free_port(), "--cache-sync-timeout", str(SYNC_SECONDS))
    began = time.monotonic()
    done = run_cli(*args, timeout=120, env=_env())
    took = time.monotonic() - began
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    assert "Traceback" not in output, output
    errors = [line for line in done.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and done.stderr.rstrip().endswith(errors[0]), output
    # The deadline counts from the manager's start, after the interpreter's own start-up.
    assert SYNC_SECONDS <= took < SYNC_SECONDS + 20, f"{took:.1f}s"
    print(f"{took:.1f}s: {errors[0]}")
    return errors[0]


def _readyz(port: int) -> tuple[int, str]:
    """/readyz's status and body (0, "" while nothing answers)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as refused:
        return refused.code, refused.read().decode()
    except OSError:
        return 0, ""


def _stop_within_a_second(process: CommandProcess, sig: signal.Signals = signal.SIGTERM) -> float:
    """Send ``sig``; the process must exit 0 within ``STOP_SECONDS``. Returns the seconds it took."""
    assert process.process.poll() is None, f"the process ended before the signal:\n{process.output}"
    began = time.monotonic()
    process.process.send_signal(sig)
    try:
        code = process.process.wait(timeout=30)
    finally:
        process.stop()
    took = time.monotonic() - began
    assert code == 0, process.output
    assert "Traceback" not in process.output, process.output
    assert took < STOP_SECONDS, f"{sig.name} took {took:.2f}s to stop the process:\n{process.output}"
    print(f"{sig.name}: exit 0 after {took:.2f}s")
    return took


@pytest.fixture
def no_role(
    control_plane: LocalControlPlane, kube_client: KubeClient, namespace: str, tmp_path: Path
) -> Path:
    """A kubeconfig of a ServiceAccount of ``namespace`` with no Role at all (a namespaced install
    whose Role was not created)."""
    account = kube_client.resource("v1", "ServiceAccount")
    kube_client.create(account, namespace, {"metadata": {"name": "no-role"}})
    token = control_plane.service_account_token(namespace, "no-role")
    return control_plane.token_kubeconfig(token, tmp_path / "no-role.kubeconfig")


# -- a start that cannot fill its caches: one line, exit 1 ---------------------------------------


def test_a_wrong_token_fails_the_start_with_the_401_and_what_to_do(
    control_plane: LocalControlPlane, namespace: str, tmp_path: Path
) -> None:
    kubeconfig = control_plane.token_kubeconfig("not-a-token", tmp_path / "wrong-token")
    line = _failed_start(kubeconfig, namespace)
    assert re.match(
        rf"Error: cannot start: the cache of (pods|services) \(and 1 other\) did not sync within "
        rf"{SYNC_SECONDS}s \(--cache-sync-timeout\): the API server {control_plane.url} does not accept "
        r"the credentials \(401 Unauthorized\);",
        line,
    ), line
    assert "is wrong or expired: renew it" in line


def test_a_service_account_without_its_role_fails_the_start_naming_the_verb_and_resource(
    no_role: Path, namespace: str
) -> None:
    line = _failed_start(no_role, namespace)
    found = re.search(
        rf"the cache of (?P<resource>pods|services) \(and 1 other\) did not sync within {SYNC_SECONDS}s "
        rf"\(--cache-sync-timeout\): system:serviceaccount:{namespace}:no-role may not list "
        rf"(?P=resource) in namespace {namespace} \(403 Forbidden\); grant it list and watch on "
        r"(?P=resource) there \(a Role and RoleBinding; the chart's: docs/security.md\)$",
        line,
    )
    assert found, line


def test_an_address_nobody_listens_on_fails_the_start_as_unreachable(
    control_plane: LocalControlPlane, namespace: str, tmp_path: Path
) -> None:
    nowhere = f"https://127.0.0.1:{free_port()}"
    kubeconfig = _kubeconfig(control_plane, tmp_path / "nowhere", server=nowhere)
    line = _failed_start(kubeconfig, namespace)
    assert re.search(
        rf"did not sync within {SYNC_SECONDS}s \(--cache-sync-timeout\): cannot reach the API server "
        rf"{nowhere} \(connection refused\); check that it runs and that --kubeconfig and --context "
        r"name it$",
        line,
    ), line


def test_a_ca_that_did_not_sign_the_api_servers_certificate_fails_the_start_as_tls(
    control_plane: LocalControlPlane, namespace: str, tmp_path: Path
) -> None:
    other_ca = tmp_path / "other-ca.crt"
    other_ca.write_bytes(certs.make_ca("not-the-cluster-ca").cert_pem)
    kubeconfig = _kubeconfig(control_plane, tmp_path / "wrong-ca", **{"certificate-authority": str(other_ca)})
    line = _failed_start(kubeconfig, namespace)
    assert re.search(
        rf"did not sync within {SYNC_SECONDS}s \(--cache-sync-timeout\): TLS with the API server "
        rf"{control_plane.url} failed \(certificate verify failed: unable to get local issuer "
        r"certificate\); check the certificate authority",
        line,
    ), line


# -- a stop while the start is under way: exit 0 within a second ----------------------------------


def test_readyz_says_why_while_the_caches_cannot_fill_and_sigterm_stops_at_once(
    no_role: Path, namespace: str
) -> None:
    port = free_port()
    process = CommandProcess(_run_args(no_role, namespace, port), _env(), port)
    try:

        def says_why() -> bool:
            status, body = _readyz(port)
            return status == 503 and "403 Forbidden" in body

        wait_for(says_why, timeout=60, message="/readyz saying why it is not ready")
        status, body = _readyz(port)
        print(f"/readyz {status}:\n{body}")
        lines = body.splitlines()
        assert len(lines) == 2, body  # the Services' cache and the pods'
        for line in lines:
            assert re.match(
                r"cache of (pods|services) not synced: system:serviceaccount:.* may not list", line
            ), body
        _stop_within_a_second(process)
    finally:
        process.stop()


def test_sigint_stops_a_start_that_cannot_reach_the_api_server_at_once(
    control_plane: LocalControlPlane, namespace: str, tmp_path: Path
) -> None:
    nowhere = f"https://127.0.0.1:{free_port()}"
    kubeconfig = _kubeconfig(control_plane, tmp_path / "nowhere", server=nowhere)
    port = free_port()
    process = CommandProcess(_run_args(kubeconfig, namespace, port), _env(), port)
    try:
        wait_for(
            lambda: "cannot reach the API server" in _readyz(port)[1],
            timeout=60,
            message="/readyz saying the API server cannot be reached",
        )
        _stop_within_a_second(process, signal.SIGINT)
    finally:
        process.stop()


def test_sigterm_stops_a_replica_waiting_for_the_leaders_lease_at_once(
    control_plane: LocalControlPlane, kube_client: KubeClient, namespace: str
) -> None:
    now = lease_time(datetime.datetime.now(datetime.UTC))
    held = {
        "holderIdentity": "the-leader",
        "leaseDurationSeconds": 3600,
        "acquireTime": now,
        "renewTime": now,
    }
    kube_client.create(kube.LEASE, namespace, {"metadata": {"name": "held"}, "spec": held})
    port = free_port()
    args = _run_args(control_plane.kubeconfig, namespace, port, "--leader-elect")
    args += ["--leader-election-namespace", namespace, "--leader-election-id", "held"]
    process = CommandProcess(args, _env(), port)
    try:
        # Ready (its caches are in), and a standby: it waits for the Lease.
        wait_for(process.ready, timeout=60, message="the standby ready")
        _stop_within_a_second(process)
    finally:
        process.stop()
    lease = kube_client.get(kube.LEASE, namespace, "held")
    assert lease["spec"]["holderIdentity"] == "the-leader"


class SilentWebhook:
    """A TCP port that accepts the API server's admission calls and never answers them: the
    request that waits on it (the webhook's certificate Secret here) hangs for its timeout."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.server.getsockname()[1]
        self.called = threading.Event()
        self._held: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            self._held.append(conn)
            self.called.set()

    def close(self) -> None:
        self.server.close()
        for conn in self._held:
            conn.close()


@pytest.fixture
def secrets_held(control_plane: LocalControlPlane, namespace: str) -> Iterator[SilentWebhook]:
    """Every Secret written in ``namespace`` waits (up to 30 s) on a webhook that never answers."""
    silent = SilentWebhook()
    name = f"hold-secrets-{namespace}"
    control_plane.install_webhook(
        name,
        port=silent.port,
        path="/hold",
        rules=[
            {
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "operations": ["CREATE", "UPDATE"],
                "resources": ["secrets"],
            }
        ],
        mutating=False,
        namespace_selector={"matchLabels": {"kubernetes.io/metadata.name": namespace}},
        failure_policy="Ignore",
        timeout_seconds=30,
    )
    try:
        yield silent
    finally:
        silent.close()
        client = KubeClient.from_kubeconfig(str(control_plane.kubeconfig))
        try:
            client.delete(kube.VALIDATING_WEBHOOK_CONFIGURATION, None, name)
        finally:
            client.close()


def test_sigterm_stops_a_start_whose_certificate_bootstrap_waits_at_once(
    control_plane: LocalControlPlane, namespace: str, secrets_held: SilentWebhook, tmp_path: Path
) -> None:
    port = free_port()
    args = _run_args(control_plane.kubeconfig, namespace, port, "--webhook", "--webhook-port", "0")
    args += ["--webhook-host", "127.0.0.1", "--cert-dir", str(tmp_path / "certs")]
    process = CommandProcess(args, _env(POD_NAMESPACE=namespace), port)
    try:
        # The bootstrap's Secret is being written: the API server waits on the silent webhook.
        wait_for(
            secrets_held.called.is_set, timeout=60, message="the certificate bootstrap writing its Secret"
        )
        assert _readyz(port) == (503, "starting")
        _stop_within_a_second(process)
    finally:
        process.stop()


# -- a port already taken: one line, exit 1 -------------------------------------------------------


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A loopback port something else listens on."""
    with socket.create_server(("127.0.0.1", 0)) as taken:
        yield taken.getsockname()[1]


def test_a_metrics_port_in_use_is_one_line(
    control_plane: LocalControlPlane, namespace: str, taken_port: int
) -> None:
    args = _run_args(control_plane.kubeconfig, namespace, free_port())
    args[args.index("--metrics-bind-address") + 1] = f"127.0.0.1:{taken_port}"
    done = run_cli(*args, timeout=60, env=_env())
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.rstrip().splitlines()[-1] == (
        f"Error: cannot serve /metrics on 127.0.0.1:{taken_port}: address already in use; free the port "
        "or choose another with --metrics-bind-address"
    ), done.stderr


def test_a_webhook_port_in_use_is_one_line(
    control_plane: LocalControlPlane, namespace: str, taken_port: int, tmp_path: Path
) -> None:
    args = _run_args(control_plane.kubeconfig, namespace, free_port(), "--webhook")
    args += ["--webhook-host", "127.0.0.1", "--webhook-port", str(taken_port), "--cert-dir", str(tmp_path)]
    done = run_cli(*args, timeout=60, env=_env(POD_NAMESPACE=namespace))
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.rstrip().splitlines()[-1] == (
        f"Error: cannot serve the webhook on 127.0.0.1:{taken_port}: address already in use; free the "
        "port or choose another with --webhook-port (or --webhook-host)"
    ), done.stderr


# -- the event loop (--event-loop) -----------------------------------------------------------------


@pytest.mark.parametrize(("flags", "loop"), [((), "uvloop"), (("--event-loop", "asyncio"), "asyncio")])
def test_run_serves_on_uvloop_unless_asked_for_asyncio_and_sigterm_stops_it(
    control_plane: LocalControlPlane, namespace: str, flags: tuple[str, ...], loop: str
) -> None:
    """Ready on either loop (its caches filled over the frame's TLS connections, /readyz served),
    the first lines naming the loop that serves; SIGTERM stops it with exit 0."""
    port = free_port()
    process = CommandProcess(_run_args(control_plane.kubeconfig, namespace, port, *flags), _env(), port)
    try:
        wait_for(process.ready, timeout=60, message=f"run on {loop} ready")
        said = [line for line in process.lines if "event loop:" in line]
        assert len(said) == 1 and said[0].rstrip().endswith(f"event loop: {loop}"), process.output
        process.process.send_signal(signal.SIGTERM)
        assert process.process.wait(timeout=30) == 0, process.output
        assert "Traceback" not in process.output, process.output
    finally:
        process.stop()
