"""The command line loads only what a command runs (docs/reference/options.md, "Import cost"):
importing it, ``--help``, ``adapters`` and a refused flag load none of the runtime (the manager,
aiohttp, prometheus_client, the Kubernetes client, cryptography, the adapter API); ``run`` itself
loads none of the official client's generated models and API classes, and no aiohttp while it
serves its probes and metrics (docs/benchmarks.md, "Memory"). Each check runs in a fresh
interpreter, since this one has imported everything already."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

from resourceconsist import wire
from resourceconsist.cluster import kube
from resourceconsist.rules import lifecycle
from resourceconsist.testing import Cluster, LocalControlPlane, finalizers, run_cli, wait_for
from resourceconsist.testing.controlplane import free_port

#: What only a running command may load.
RUNTIME = (
    "aiohttp",
    "prometheus_client",
    "kubernetes",
    "cryptography",
    "pydantic",
    # The SLB adapter's credentials library: imported only when an RRSA or ECS source is built.
    "alibabacloud_credentials",
    "resourceconsist.runtime.manager",
    "resourceconsist.webhook.server",
    "resourceconsist.adapter",
)

# Runs in the child interpreter: run the code given, then print which RUNTIME modules it loaded.
CHILD = r"""
import json, sys
runtime, code = json.loads(sys.argv[1])
exec(code)
print(json.dumps(sorted(m for m in runtime if m in sys.modules)))
"""


def _runtime_loaded_by(code: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps([RUNTIME, code])],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    loaded: list[str] = json.loads(done.stdout.splitlines()[-1])
    return loaded


def test_importing_the_cli_loads_no_runtime() -> None:
    assert _runtime_loaded_by("import resourceconsist.commands.cli") == []


def test_listing_the_adapters_loads_none_of_them() -> None:
    code = (
        "from resourceconsist.commands.cli import main\n"
        "main(['adapters'], standalone_mode=False)\n"
        "assert 'resourceconsist.experimental.demo' not in sys.modules\n"
    )
    assert _runtime_loaded_by(code) == []


def test_a_refused_flag_loads_no_runtime() -> None:
    # --lease-duration shorter than the default renew deadline: LeaderElectionOptions refuses it
    # while the flags are turned into options, before anything runs.
    code = (
        "import click\n"
        "from resourceconsist.commands.cli import main\n"
        "try:\n"
        "    main(['run', '--adapter', 'demo', '--leader-elect', '--lease-duration', '1'],"
        " standalone_mode=False)\n"
        "except click.UsageError as err:\n"
        "    assert '--lease-duration' in str(err), err\n"
        "else:\n"
        "    raise AssertionError('run accepted a lease shorter than its renew deadline')\n"
    )
    assert _runtime_loaded_by(code) == []


def test_python_m_resourceconsist_help_lists_the_commands() -> None:
    done = run_cli("--help")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("Usage: python -m resourceconsist"), done.stdout
    for command in ("adapters", "demo", "explain", "run", "webhook"):
        assert f"  {command} " in done.stdout, done.stdout


def test_run_loads_neither_the_official_client_nor_aiohttp(
    control_plane: LocalControlPlane, cluster: Cluster, tmp_path: Path
) -> None:
    # Its generated models and API classes, hundreds of modules, cost 17 MB and a quarter second
    # that ``run`` never needs: it reads its kubeconfig itself (resourceconsist.cluster.kubeconfig), sends
    # its own requests and reads plain JSON (docs/index.md, "Which cluster"). aiohttp, about
    # 9.5 MB, neither: the loop transport has its own client and the probes and metrics their
    # own server (resourceconsist.runtime.endpoints).
    health, metrics = free_port(), free_port()
    imports = tmp_path / "imports.txt"
    with imports.open("w") as stderr:
        process = subprocess.Popen(
            [
                sys.executable,
                "-X",
                "importtime",
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
                f"127.0.0.1:{metrics}",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
        try:
            # A whole pass: the Service, a Ready pod, and the pod's writes up to its finalizer.
            client, ns = cluster.client, cluster.namespace
            service = {
                "metadata": {"name": "web", "labels": {wire.CONTROL_LABEL: wire.CONTROL_LABEL_VALUE}},
                "spec": {"selector": {"app": "web"}, "ports": [{"port": 80}]},
            }
            client.create(kube.SERVICE, ns, service)
            pod = {
                "metadata": {"name": "web-0", "labels": {"app": "web"}},
                "spec": {"containers": [{"name": "app", "image": "nginx"}]},
            }
            client.create(kube.POD, ns, pod)
            status = {"podIP": "10.0.0.1", "conditions": [{"type": "Ready", "status": "True"}]}
            client.patch(kube.POD, ns, "web-0", {"status": status}, subresource="status")
            finalizer = lifecycle.lifecycle_finalizer("web")
            wait_for(
                lambda: finalizer in finalizers(client.get(kube.POD, ns, "web-0")),
                timeout=60,
                message="the run process guarding pod web-0",
            )
            # The endpoints answer (they are what would load aiohttp).
            for port, path, text in (
                (health, "/healthz", "ok"),
                (health, "/readyz", "ok"),
                (metrics, "/metrics", "controller_runtime_reconcile_total"),
            ):
                with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as answer:
                    assert answer.status == 200 and text in answer.read().decode(), path
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=30) == 0
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    loaded = [
        line.rsplit("|", 1)[1].strip()
        for line in imports.read_text().splitlines()
        if line.startswith("import time:")
    ]
    assert "resourceconsist.runtime.manager" in loaded and "resourceconsist.cluster.kubeconfig" in loaded, (
        "the import log is whole"
    )
    assert [m for m in loaded if m.partition(".")[0] == "kubernetes"] == []
    assert [m for m in loaded if m.partition(".")[0] == "aiohttp"] == []
