"""A real node leaves its host as it found it (docs/testing.md, "A real node"): started and
stopped twice in one process, with a Pod and a Service each time, the host's processes, mounts,
network links, iptables rules, the kubelet's kernel settings, cgroups and listening sockets are
what they were before; a start after a killed run removes what that run left, or names in one
line what it cannot remove; and a host that cannot run a node says what is missing in one line.

These tests start nodes of their own, so they run before the session's node starts (the host
runs one at a time; tests/conftest.py orders them first).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from resourceconsist.cluster import kube
from resourceconsist.cluster.kube import KubeClient
from resourceconsist.testing import RealNodeCluster, condition, default_assets_dir, wait_for
from resourceconsist.testing.hoststate import HostState, mount_points
from resourceconsist.testing.realnode import (
    BRIDGE,
    NODE_NAME,
    NODE_ROOT,
    NODE_STATE,
    PAUSE_IMAGE,
)

pytestmark = [pytest.mark.realnode, pytest.mark.controlplane]


@pytest.fixture
def images(real_node_images: list[Path]) -> list[Path]:
    """The node's images made (the suite's ``real_node_images``); these tests import none beyond
    the pause image, whose busybox serves their Pods."""
    return real_node_images


#: A Pod that runs on the pause image alone: its busybox serves HTTP (nothing to import).
_BUSYBOX_POD = {
    "containers": [
        {
            "name": "httpd",
            "image": PAUSE_IMAGE,
            "imagePullPolicy": "Never",
            "command": ["/bin/busybox", "httpd", "-f", "-p", "8080", "-h", "/"],
        }
    ],
    "terminationGracePeriodSeconds": 1,
}


def _serve(cluster: RealNodeCluster, name: str) -> None:
    """A Pod behind a Service (kube-proxy's rules for it), running."""
    client = KubeClient.from_kubeconfig(str(cluster.kubeconfig))
    try:
        wait_for(
            lambda: client.get_or_none(client.resource("v1", "ServiceAccount"), "default", "default"),
            timeout=30,
        )
        pod = {"metadata": {"name": name, "labels": {"app": name}}, "spec": _BUSYBOX_POD}
        client.create(kube.POD, "default", pod)
        ports = [{"port": 80, "targetPort": 8080}]
        service = {"metadata": {"name": name}, "spec": {"selector": {"app": name}, "ports": ports}}
        client.create(kube.SERVICE, "default", service)

        def ready() -> bool:
            found = client.get(kube.POD, "default", name)
            return condition(found, "Ready") == "True" and found["spec"]["nodeName"] == NODE_NAME

        wait_for(ready, timeout=60, message=f"pod {name} Ready")
    finally:
        client.close()


#: A kernel setting the kubelet always sets (to ``1``), whatever its configuration.
_OVERCOMMIT = Path("/proc/sys/vm/overcommit_memory")


@pytest.fixture
def kernel_setting_the_node_changes() -> Iterator[None]:
    """``vm.overcommit_memory`` at a value the kubelet will change, put back after: a host that
    already holds every value the node sets (one that ran a kubelet before, or is a node itself)
    would otherwise give the snapshot's kernel settings nothing to see."""
    original = _OVERCOMMIT.read_text().strip()
    _OVERCOMMIT.write_text("0" if original == "1" else original)
    assert _OVERCOMMIT.read_text().strip() != "1", "this host ignores writes to vm.overcommit_memory"
    try:
        yield
    finally:
        _OVERCOMMIT.write_text(original)


@pytest.fixture
def swept_host() -> None:
    """The host without what an earlier killed run left (a session killed with its node, a
    restarted machine): ``before`` below is the host as it is without any node, which is what
    a stop must give back. The next start would sweep those leftovers too, and the comparison
    would then count their removal as a change."""
    RealNodeCluster().sweep_leftovers()
    assert not NODE_ROOT.exists() and not NODE_STATE.exists()


@pytest.mark.usefixtures("swept_host", "kernel_setting_the_node_changes")
def test_two_starts_and_stops_leave_the_host_as_it_was(images: list[Path]) -> None:
    before = HostState.capture()
    for round_ in range(2):
        with RealNodeCluster() as cluster:
            _serve(cluster, f"web-{round_}")
            during = HostState.capture()
            # The snapshot sees the node: its bridge, a Pod's veth, kube-proxy's rules, the
            # kubelet's kernel settings, the Pods' cgroups (so the comparison below can fail).
            changed = {line.split(":", 1)[0] for line in before.differences(during)}
            assert {"processes", "mounts", "links", "iptables", "sysctls", "cgroups", "listeners"} <= changed
            assert BRIDGE in during.links
            assert cluster.node_names == [NODE_NAME]
        assert before.differences(HostState.capture()) == []
        assert not NODE_ROOT.exists() and not NODE_STATE.exists()


#: A node started in its own process, with a Pod running, until it is killed.
_KILLED_RUN = textwrap.dedent(
    """
    import json, sys
    from resourceconsist.cluster import kube
    from resourceconsist.cluster.kube import KubeClient
    from resourceconsist.testing import RealNodeCluster, wait_for

    cluster = RealNodeCluster()
    cluster.start()
    client = KubeClient.from_kubeconfig(str(cluster.kubeconfig))
    account = client.resource("v1", "ServiceAccount")
    wait_for(lambda: client.get_or_none(account, "default", "default"), timeout=30)
    client.create(kube.POD, "default", {"metadata": {"name": "left"}, "spec": json.loads(sys.argv[1])})
    wait_for(lambda: client.get(kube.POD, "default", "left").get("status", {}).get("podIP"), timeout=60)
    print("running", flush=True)
    sys.stdin.read()
    """
)


@pytest.mark.usefixtures("swept_host")
def test_a_start_after_a_killed_run_removes_what_it_left(images: list[Path]) -> None:
    before = HostState.capture()
    run = subprocess.Popen(
        [sys.executable, "-c", _KILLED_RUN, json.dumps(_BUSYBOX_POD)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert run.stdout is not None and run.stdout.readline().strip() == "running"
    finally:
        run.send_signal(signal.SIGKILL)
        run.wait(30)
    # Its control plane died with it; the shim, the container, their mounts and network did not.
    left = HostState.capture()
    assert any("containerd-shim" in p for p in left.processes), left.processes
    assert any(p.endswith(" busybox") for p in left.processes), left.processes  # the Pod's httpd
    assert any(str(NODE_STATE) in m for m in left.mounts)
    assert BRIDGE in left.links
    with RealNodeCluster() as cluster:
        assert cluster.node_ready()
        assert not any("containerd-shim" in p for p in HostState.capture().processes)
    assert before.differences(HostState.capture()) == []


def test_leftovers_a_start_cannot_remove_are_named_in_one_line() -> None:
    # An immutable file in the node's directory: no sweep can delete it, as a busy mount.
    NODE_ROOT.mkdir(parents=True)
    stuck = NODE_ROOT / "stuck"
    stuck.write_text("")
    subprocess.run(["chattr", "+i", str(stuck)], check=True)
    try:
        with pytest.raises(Exception, match=rf"a killed real node left directory {NODE_ROOT}") as failed:
            RealNodeCluster().start()
        assert "\n" not in str(failed.value)
    finally:
        subprocess.run(["chattr", "-i", str(stuck)], check=True)
        shutil.rmtree(NODE_ROOT)
    assert not any(str(NODE_ROOT) in point for point, _t, _s in mount_points())


def _start_fails(env: dict[str, str], user: int | None = None) -> str:
    """Start a node in a process of its own (as ``user``, once the kit is imported: the
    interpreter may live where only root reads); returns the one line its error says."""
    start = "from resourceconsist.testing import RealNodeCluster; "
    if user is not None:
        start += f"import os; os.setuid({user}); "
    start += "RealNodeCluster().start()"
    done = subprocess.run(
        [sys.executable, "-c", start], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode != 0, done.stdout + done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("resourceconsist.testing.realnode.RealNodeUnavailable: "), done.stderr
    return last.split(": ", 1)[1]


@pytest.fixture
def bin_without(tmp_path: Path) -> Callable[..., str]:
    """``bin_without(*names)``: a PATH directory holding every program of PATH but those."""

    def make(*names: str) -> str:
        directory = tmp_path / "bin"
        directory.mkdir(exist_ok=True)
        for entry in os.environ["PATH"].split(":"):
            if not os.path.isdir(entry):
                continue
            for program in os.listdir(entry):
                target = directory / program
                if program not in names and not target.exists():
                    target.symlink_to(Path(entry) / program)
        return str(directory)

    return make


def test_a_host_that_cannot_run_a_node_says_what_is_missing_in_one_line(
    tmp_path: Path, bin_without: Callable[..., str]
) -> None:
    env = dict(os.environ)
    # Not root.
    assert _start_fails(env, user=65534).startswith("a real node needs root (this process runs as uid 65534)")
    # No containerd on PATH.
    no_containerd = {**env, "PATH": bin_without("containerd")}
    assert _start_fails(no_containerd) == "a real node needs containerd: apt-get install containerd"
    # No kubelet among the binaries.
    assets = tmp_path / "assets"
    assets.mkdir()
    for binary in default_assets_dir().iterdir():
        if binary.name != "kubelet":
            (assets / binary.name).symlink_to(binary)
    said = _start_fails({**env, "KUBEBUILDER_ASSETS": str(assets)})
    assert said.startswith(f"kubelet not found in {assets}") and "hack/build-controlplane.sh" in said
    # No pause image.
    said = _start_fails({**env, "RESOURCECONSIST_IMAGES_DIR": str(tmp_path / "no-images")})
    archive = tmp_path / "no-images" / "pause.tar"
    assert said == f"image archive {archive} not found: make the node's images with hack/build-node-images.sh"
