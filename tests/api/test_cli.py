"""The command line as a person (and CI) uses it: the demo converges on a fresh embedded control
plane; ``run`` refuses unknown adapter names with the list of known ones."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from resourceconsist import wire
from resourceconsist.adapters.alibabacloudslb.credentials import SLB_ACCESS_KEY_ENV, SLB_ACCESS_SECRET_ENV
from resourceconsist.cluster import kube
from resourceconsist.testing import Cluster, finalizers, free_port, run_cli, wait_for


def _without_cloud_credentials() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("ALIYUN_", "ALIBABA_CLOUD_"))}


@pytest.mark.controlplane  # the demo starts its own embedded control plane
def test_demo_runs_to_completion_and_shows_convergence() -> None:
    done = run_cli("demo")
    assert done.returncode == 0, done.stdout + done.stderr
    steps = [line for line in done.stdout.splitlines() if line.startswith("converged: ")]
    assert len(steps) == 8, done.stdout  # 6 on the control plane, 2 of the rolling update
    assert "demo converged" in done.stdout
    assert "real server" in done.stdout  # the provider's table was shown
    assert "serving backends" in done.stdout  # and the rollout's, from the provider's side


def test_run_with_an_unknown_adapter_lists_the_known_names() -> None:
    done = run_cli("run", "--adapter", "nosuch", timeout=60)
    assert done.returncode == 2
    assert "no adapter named 'nosuch'" in done.stderr
    assert "demo" in done.stderr


def test_adapters_lists_demo_as_experimental() -> None:
    done = run_cli("adapters", timeout=60)
    assert done.returncode == 0
    assert any(line.startswith("demo\t") and "experimental" in line for line in done.stdout.splitlines())


def test_run_serves_controllers_webhook_and_health_then_stops_on_sigterm(
    control_plane: Any, cluster: Cluster, tmp_path: Path
) -> None:
    import signal
    import ssl
    import urllib.request

    health, hook = free_port(), free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "resourceconsist",
            "run",
            "--adapter",
            "demo",
            "--kubeconfig",
            str(control_plane.kubeconfig),
            "--namespace",
            cluster.namespace,
            "--health-probe-bind-address",
            f"127.0.0.1:{health}",
            "--metrics-bind-address",
            f"127.0.0.1:{health}",
            "--webhook",
            "--webhook-port",
            str(hook),
            "--webhook-host",
            "127.0.0.1",
            "--cert-dir",
            str(tmp_path),
            "--webhook-service",
            "rc",
        ],
        env={**os.environ, "POD_NAMESPACE": cluster.namespace},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:

        def ready() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{health}/readyz", timeout=2) as resp:
                    return resp.status == 200
            except OSError:
                return False

        wait_for(ready, timeout=30, message="/readyz of the manager")
        cluster.client.create(
            kube.SERVICE,
            cluster.namespace,
            {
                "metadata": {"name": "svc", "labels": {wire.CONTROL_LABEL: "true"}},
                "spec": {"selector": {"app": "svc"}, "ports": [{"port": 80}]},
            },
        )
        wait_for(
            lambda: (
                wire.CLEAN_FINALIZER in finalizers(cluster.client.get(kube.SERVICE, cluster.namespace, "svc"))
            ),
            timeout=30,
            message="the demo controller adding its clean finalizer",
        )
        secret = cluster.client.get(kube.SECRET, cluster.namespace, wire.WEBHOOK_CERT_SECRET)
        assert sorted(secret["data"]) == sorted(wire.WEBHOOK_CERT_KEYS)
        import base64

        # Trust the bootstrapped CA; the serving cert names rc.<ns>.svc, not 127.0.0.1.
        context = ssl.create_default_context(cadata=base64.b64decode(secret["data"]["ca.crt"]).decode())
        context.check_hostname = False
        with urllib.request.urlopen(f"https://127.0.0.1:{hook}/healthz", timeout=5, context=context) as resp:
            assert resp.status == 200
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{health}/metrics", timeout=5).read().decode()
        assert 'resourceconsist_reconcile_total{controller="demo-controller",outcome="success"}' in metrics

        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    output = process.stdout.read() if process.stdout else ""
    assert "manager stopped" in output


def test_a_third_party_adapter_registered_by_entry_point_is_found(tmp_path: Path) -> None:
    (tmp_path / "theirs_adapter.py").write_text(
        "from resourceconsist.experimental.demo import DemoAdapter\n"
        "def register(registry):\n"
        "    registry.register('theirs', controller=lambda env: DemoAdapter(name='theirs'))\n"
    )
    dist = tmp_path / "theirs_adapter-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: theirs-adapter\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[resourceconsist.adapters]\ntheirs = theirs_adapter:register\n")
    done = run_cli("adapters", timeout=60, env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    assert any(line.startswith("theirs\tcontroller\t") for line in done.stdout.splitlines()), done.stdout


def test_run_alibabacloudslb_without_credentials_names_the_variables() -> None:
    done = run_cli("run", "--adapter", "alibabacloudslb", timeout=60, env=_without_cloud_credentials())
    assert done.returncode != 0
    for variable in (SLB_ACCESS_KEY_ENV, SLB_ACCESS_SECRET_ENV):
        assert variable in done.stderr, done.stderr


def test_run_alibabacloudslb_never_echoes_a_partial_secret() -> None:
    env = {**_without_cloud_credentials(), SLB_ACCESS_SECRET_ENV: "s3cr3t-value-that-must-not-leak"}
    done = run_cli("run", "--adapter", "alibabacloudslb", timeout=60, env=env)
    assert done.returncode != 0
    assert SLB_ACCESS_KEY_ENV in done.stderr
    assert "s3cr3t-value-that-must-not-leak" not in done.stdout + done.stderr


# -- common mistakes: one line naming the cause and the fix, exit code 2, no traceback ----------


def _env(**changes: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")}
    for key, value in changes.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def _error_line(done: subprocess.CompletedProcess[str]) -> str:
    """The one ``Error:`` line of a usage error; fails on a traceback or another exit code."""
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 2, done.stderr
    (line,) = [line for line in done.stderr.splitlines() if line.startswith("Error:")]
    return line


def test_a_missing_kubeconfig_path_is_named_with_the_options_that_set_it(tmp_path: Path) -> None:
    missing = tmp_path / "nope" / "config"
    line = _error_line(run_cli("webhook", "--adapter", "demo", "--kubeconfig", str(missing), env=_env()))
    assert f"kubeconfig {missing} (from --kubeconfig) does not exist" in line
    assert "--kubeconfig" in line and "$KUBECONFIG" in line


def test_a_missing_kubeconfig_from_the_environment_names_kubeconfig(tmp_path: Path) -> None:
    missing = tmp_path / "gone"
    line = _error_line(run_cli("webhook", "--adapter", "demo", env=_env(KUBECONFIG=str(missing))))
    assert f"kubeconfig {missing} (from $KUBECONFIG) does not exist" in line


def test_no_kubeconfig_at_all_says_where_it_looked(tmp_path: Path) -> None:
    line = _error_line(run_cli("run", "--adapter", "demo", env=_env(HOME=str(tmp_path))))
    assert "no kubeconfig" in line
    assert str(tmp_path / ".kube" / "config") in line
    assert "--kubeconfig" in line and "$KUBECONFIG" in line


def test_in_a_pod_the_in_cluster_config_wins_over_a_home_kubeconfig(tmp_path: Path) -> None:
    # controller-runtime's order (docs/index.md, "Which cluster"): a kubeconfig file in the
    # image's home must not take the place of the pod's own ServiceAccount.
    (tmp_path / ".kube").mkdir()
    (tmp_path / ".kube" / "config").write_text("apiVersion: v1\nclusters: []\ncontexts: []\nusers: []\n")
    env = _env(HOME=str(tmp_path), KUBERNETES_SERVICE_HOST="127.0.0.1", KUBERNETES_SERVICE_PORT="1")
    line = _error_line(run_cli("run", "--adapter", "demo", env=env))
    assert "in-cluster config ($KUBERNETES_SERVICE_HOST is set) is not usable" in line
    assert "--kubeconfig" in line and "$KUBECONFIG" in line


def _commands(group: Any, prefix: str = "") -> dict[str, Any]:
    """Every command under ``group`` by its full name (``explain pod``)."""
    import click

    found: dict[str, Any] = {}
    for name, command in group.commands.items():
        full = f"{prefix}{name}"
        if isinstance(command, click.Group):
            found.update(_commands(command, f"{full} "))
        else:
            found[full] = command
    return found


def test_every_command_that_reads_a_kubeconfig_takes_a_context() -> None:
    from resourceconsist.commands.cli import main

    reading = {
        name
        for name, command in _commands(main).items()
        if any(param.name == "kubeconfig" for param in command.params)
    }
    assert {"run", "webhook", "explain pod", "explain employer", "handover"} <= reading
    for name in reading:
        params = {param.name for param in _commands(main)[name].params}
        assert "context" in params, f"{name} reads a kubeconfig but takes no --context"


def test_a_kubeconfig_without_a_current_context_gives_advice_that_works(
    control_plane: Any, tmp_path: Path
) -> None:
    import yaml

    config = yaml.safe_load(control_plane.kubeconfig.read_text())
    del config["current-context"]
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(yaml.safe_dump(config))
    explain = ["explain", "pod", "default/no-such-pod", "--kubeconfig", str(kubeconfig)]
    line = _error_line(run_cli(*explain, timeout=60, env=_env()))
    assert "sets no current-context (it has: local); pass --context local" in line, line
    # What it advises, done: the command reads the cluster (and says the pod does not exist).
    done = run_cli(*explain, "--context", "local", timeout=60, env=_env())
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert "no-such-pod" in done.stdout


def test_a_context_in_a_pod_without_a_kubeconfig_is_refused_rather_than_ignored(tmp_path: Path) -> None:
    env = _env(HOME=str(tmp_path), KUBERNETES_SERVICE_HOST="127.0.0.1", KUBERNETES_SERVICE_PORT="1")
    line = _error_line(run_cli("run", "--adapter", "demo", "--context", "prod", env=env))
    assert "--context prod names a kubeconfig's context" in line and "--kubeconfig PATH" in line


def test_a_garbage_kubeconfig_is_one_line_without_a_yaml_traceback(tmp_path: Path) -> None:
    garbage = tmp_path / "config"
    garbage.write_text("apiVersion: v1\nclusters: [\n  {name: : :\n")
    line = _error_line(run_cli("webhook", "--adapter", "demo", "--kubeconfig", str(garbage), env=_env()))
    assert f"kubeconfig {garbage} (from --kubeconfig) is not valid YAML at line" in line
    not_a_kubeconfig = tmp_path / "list"
    not_a_kubeconfig.write_text("- just\n- a list\n")
    line = _error_line(
        run_cli("webhook", "--adapter", "demo", "--kubeconfig", str(not_a_kubeconfig), env=_env())
    )
    assert "is YAML but not a kubeconfig" in line


def test_a_health_probe_address_that_is_not_host_port_is_refused(tmp_path: Path) -> None:
    args = ("run", "--adapter", "demo", "--health-probe-bind-address", "not-an-address")
    line = _error_line(run_cli(*args, env=_env()))
    assert "--health-probe-bind-address" in line
    assert "'not-an-address' is not HOST:PORT" in line and "127.0.0.1:8081" in line


def test_a_negative_garbage_interval_is_refused(tmp_path: Path) -> None:
    line = _error_line(run_cli("run", "--adapter", "demo", "--garbage-interval", "-5", env=_env()))
    assert "--garbage-interval" in line and "0 (start-up only)" in line


def test_run_webhook_in_a_namespace_that_does_not_exist_hints_pod_namespace(
    control_plane: Any, tmp_path: Path
) -> None:
    args = ["run", "--adapter", "demo", "--webhook", "--kubeconfig", str(control_plane.kubeconfig)]
    args += ["--cert-dir", str(tmp_path), "--health-probe-bind-address", "127.0.0.1:0"]
    args += ["--metrics-bind-address", "0", "--webhook-port", "0"]
    line = _error_line(run_cli(*args, timeout=60, env=_env(POD_NAMESPACE="no-such-namespace-rc")))
    assert "namespace no-such-namespace-rc does not exist" in line
    assert "POD_NAMESPACE" in line


def test_webhook_without_bootstrap_and_an_empty_cert_dir_names_the_missing_files(
    control_plane: Any, tmp_path: Path
) -> None:
    args = ["webhook", "--adapter", "demo", "--no-bootstrap-certs", "--cert-dir", str(tmp_path)]
    line = _error_line(run_cli(*args, "--kubeconfig", str(control_plane.kubeconfig), timeout=60, env=_env()))
    assert f"no tls.crt or tls.key in {tmp_path}" in line
    assert "--no-bootstrap-certs" in line


def test_a_webhook_url_that_is_not_https_is_refused() -> None:
    line = _error_line(
        run_cli("webhook", "--adapter", "demo", "--webhook-url", "http://127.0.0.1:9443", env=_env())
    )
    assert "'http://127.0.0.1:9443' is not an https:// URL" in line


@pytest.mark.parametrize("command", [("webhook",), ("run",), ("explain", "pod"), ("explain", "employer")])
def test_every_command_states_the_one_kubeconfig_precedence(command: tuple[str, ...]) -> None:
    # One order in code, --help and docs/index.md ("Which cluster"): controller-runtime's.
    done = run_cli(*command, "--help", timeout=60)
    assert done.returncode == 0
    text = " ".join(done.stdout.split())
    assert (
        "default: $KUBECONFIG, else the in-cluster config when running in a pod, else ~/.kube/config" in text
    )
