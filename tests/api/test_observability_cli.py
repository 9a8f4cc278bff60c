"""The command line as a platform team runs it (docs/observability.md): controller-runtime's
``--metrics-bind-address`` and ``--health-probe-bind-address`` on every command that serves, the
log flags before or after the subcommand, and JSON log lines with zap's keys carrying the
controller, the employer and the reconcileID of the pass that wrote them, after a first line
that says what runs; ``--version`` and ``version``."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import urllib.error
import urllib.request
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

from resourceconsist import wire
from resourceconsist.cluster import kube
from resourceconsist.runtime.version import build_info
from resourceconsist.testing import CLI, Cluster, finalizers, free_port, run_cli, wait_for


@pytest.mark.parametrize("command", ["run", "webhook"])
def test_every_serving_command_shows_the_standard_flags(command: str) -> None:
    done = run_cli(command, "--help", columns=200)
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())
    assert "--metrics-bind-address HOST:PORT host:port or :port of /metrics; 0: off. [default: :8080]" in text
    assert "--health-probe-bind-address HOST:PORT host:port or :port of /healthz and /readyz" in text
    assert "[default: :8081]" in text
    assert "--log-level [debug|info|warning|error]" in text
    assert "--log-format [text|json]" in text
    assert "--health-address" not in text  # the deprecated one-port flag of before 0.1.0 is gone


@pytest.mark.parametrize(
    "argv",
    [
        ("--log-level", "debug", "--log-format", "json", "adapters"),
        ("adapters", "--log-level", "debug", "--log-format", "json"),
        ("--log-level", "error", "adapters", "--log-level", "debug"),
    ],
)
def test_the_log_flags_work_before_and_after_the_subcommand(argv: tuple[str, ...]) -> None:
    done = run_cli(*argv, columns=200)
    assert done.returncode == 0, done.stderr
    assert "demo\t" in done.stdout


def _commit(revision: str) -> str:
    """The commit of a revision: a checkout's may be ``-dirty`` in one process and not in the
    next, while files are edited."""
    return revision.removesuffix("-dirty")


def _status(port: int, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as response:
            return int(response.status)
    except urllib.error.HTTPError as err:
        return err.code
    except OSError:
        return 0


def test_run_serves_metrics_and_probes_apart_and_logs_json(control_plane: Any, cluster: Cluster) -> None:
    metrics, probes = free_port(), free_port()
    process = subprocess.Popen(
        [
            *(*CLI, "--log-level", "info"),
            *("run", "--adapter", "demo", "--kubeconfig", str(control_plane.kubeconfig)),
            *("--namespace", cluster.namespace, "--metrics-bind-address", f"127.0.0.1:{metrics}"),
            *("--health-probe-bind-address", f"127.0.0.1:{probes}"),
            # After the subcommand, and it wins over the root's --log-level info.
            *("--log-level", "debug", "--log-format", "json"),
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_for(lambda: _status(probes, "/readyz") == 200, timeout=60, message="/readyz on the probe port")
        assert _status(probes, "/metrics") == 404
        assert _status(metrics, "/healthz") == 404
        asyncio.run(cluster.service("svc"))
        wait_for(
            lambda: wire.CLEAN_FINALIZER in finalizers(asyncio.run(cluster.get(kube.SERVICE, "svc"))),
            timeout=60,
            message="the demo controller adding its clean finalizer",
        )
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=5) as response:
            text = response.read().decode()
        assert 'controller_runtime_reconcile_total{controller="demo-controller",result="success"}' in text
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    lines = [line for line in (process.stdout.read() if process.stdout else "").splitlines() if line]
    entries = [json.loads(line) for line in lines]  # every line is one JSON object
    for entry in entries:
        assert {"level", "ts", "logger", "caller", "msg"} <= set(entry), entry
        assert isinstance(entry["ts"], float)
    # The first line says what runs (resourceconsist/runtime/version.py).
    info = build_info()
    commit = _commit(info.revision)
    assert entries[0]["msg"].startswith(f"resourceconsist {info.version} (revision {commit}")
    assert (entries[0]["version"], _commit(entries[0]["revision"])) == (info.version, commit)
    assert info.version == metadata.version("resourceconsist") and info.revision != "unknown"
    debug = [e for e in entries if e["level"] == "debug" and e["msg"].startswith("manager options: ")]
    assert debug, "the subcommand's --log-level debug lost"
    (finalized,) = [e for e in entries if e["msg"].endswith(": added clean finalizer")]
    assert finalized["controller"] == "demo-controller"
    assert (finalized["namespace"], finalized["name"]) == (cluster.namespace, "svc")
    assert (finalized["controllerKind"], finalized["controllerGroup"]) == ("Service", "")
    assert finalized["reconcileID"]
    assert finalized["logger"] == "resourceconsist.reconcile"
    # zap's short caller: directory/file (the clean finalizer is the finalizers step's)
    assert finalized["caller"].startswith("reconcile/finalizers.py:")
    assert any(e["msg"] == "manager stopped" for e in entries)


def test_version_says_the_version_and_the_revision() -> None:
    """The version is the package metadata's; the revision the one baked at build time, or, in
    a checkout (an editable install, as here), the checkout's commit."""
    info = build_info()
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True, cwd=Path(__file__).parent
    ).stdout.strip()
    assert _commit(info.revision) == head
    flag = run_cli("--version")
    assert flag.returncode == 0, flag.stderr
    assert flag.stdout.strip().replace("-dirty,", ",") == (
        f"resourceconsist {info.version} (revision {head}, Python {info.python_version})"
    )
    answer = json.loads(run_cli("version", "-o", "json").stdout)
    assert set(answer) == {"version", "revision", "python_version"}
    assert (answer["version"], _commit(answer["revision"]), answer["python_version"]) == (
        metadata.version("resourceconsist"),
        head,
        info.python_version,
    )
