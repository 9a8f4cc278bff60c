"""The example third-party adapter (examples/nginx-upstream) as a user gets it: pip-installed
as its own distribution, found by name through its entry point, run by the command line
against the real control plane."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from resourceconsist.cluster import kube
from resourceconsist.rules import lifecycle
from resourceconsist.testing import (
    Cluster,
    LocalControlPlane,
    async_wait_for,
    finalizers,
    free_port,
    run_cli,
    wait_for,
)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "nginx-upstream"


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example installed with pip into a directory of its own; the test venv stays untouched."""
    target = tmp_path_factory.mktemp("site")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--target",
            str(target),
            str(EXAMPLE),
        ],
        check=True,
        timeout=300,
    )
    return target


def _env(site: Path | None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "NGINX_UPSTREAM_DIR"}
    if site is not None:
        env["PYTHONPATH"] = str(site)
    return {**env, "COLUMNS": "120", **extra}


def test_the_installed_example_is_listed_by_name(installed: Path) -> None:
    listed = run_cli("adapters", env=_env(installed))
    assert listed.returncode == 0, listed.stderr
    assert any(line.startswith("nginx-upstream\tcontroller+webhook\t") for line in listed.stdout.splitlines())
    before = run_cli("adapters", env=_env(None))
    assert "nginx-upstream" not in before.stdout, "listed without the package: the test proves nothing"


def test_the_installed_example_without_its_directory_says_what_to_set(installed: Path) -> None:
    done = run_cli("run", "--adapter", "nginx-upstream", env=_env(installed))
    assert done.returncode != 0
    assert "NGINX_UPSTREAM_DIR" in done.stderr and "Traceback" not in done.stderr, done.stderr


@pytest.fixture
def upstreams(tmp_path: Path) -> Path:
    directory = tmp_path / "upstreams"
    directory.mkdir()
    return directory


@pytest.fixture
def running_example(
    installed: Path, control_plane: LocalControlPlane, cluster: Cluster, upstreams: Path
) -> Iterator[subprocess.Popen[str]]:
    """``resourceconsist run --adapter nginx-upstream`` on the test namespace, until SIGTERM."""
    health = free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "resourceconsist",
            "run",
            "--adapter",
            "nginx-upstream",
            "--kubeconfig",
            str(control_plane.kubeconfig),
            "--namespace",
            cluster.namespace,
            "--health-probe-bind-address",
            f"127.0.0.1:{health}",
            "--metrics-bind-address",
            "0",
        ],
        env=_env(installed, NGINX_UPSTREAM_DIR=str(upstreams)),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )

    def ready() -> bool:
        assert process.poll() is None, process.stdout.read() if process.stdout else ""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{health}/readyz", timeout=2) as resp:
                return resp.status == 200
        except OSError:
            return False

    try:
        wait_for(ready, timeout=30, message="/readyz of the example's manager")
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


async def test_the_installed_example_runs_by_name_and_guards_its_pod(
    running_example: subprocess.Popen[str], cluster: Cluster, upstreams: Path
) -> None:
    conf = upstreams / f"{cluster.namespace}_web.conf"
    guard = lifecycle.lifecycle_finalizer("web")
    await cluster.service("web")
    await cluster.pod("web-0", {"app": "web"})
    await cluster.set_status("web-0", ready=True)
    ip = cluster.ip_of("web-0")

    def file_says(line: str) -> bool:
        return conf.exists() and line in conf.read_text().splitlines()

    await async_wait_for(lambda: file_says(f"    server {ip};  # web-0"), timeout=30, message="web-0 served")

    async def guarded() -> bool:
        return guard in finalizers(await cluster.get(kube.POD, "web-0"))

    await async_wait_for(guarded, timeout=30, message="web-0 carrying the lifecycle finalizer")

    await cluster.set_status("web-0", ready=False)
    await async_wait_for(lambda: file_says(f"    server {ip} down;  # web-0"), timeout=30, message="drained")

    async def released() -> bool:
        return guard not in finalizers(await cluster.get(kube.POD, "web-0"))

    await async_wait_for(released, timeout=30, message="the finalizer of a drained pod released")

    await cluster.delete(kube.SERVICE, "web")

    async def service_gone() -> bool:
        return await cluster.get(kube.SERVICE, "web") is None

    await async_wait_for(service_gone, timeout=30, message="the Service released by the example")
    assert not conf.exists(), "the upstream file must go with its Service"
    running_example.send_signal(signal.SIGTERM)
    assert running_example.wait(timeout=30) == 0
