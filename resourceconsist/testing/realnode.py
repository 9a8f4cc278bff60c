"""RealNodeCluster: a working cluster whose one node is real — containerd, runc, the CNI bridge,
the kubelet and kube-proxy — for what kwok cannot show (docs/testing.md, "A real node").

A ``LocalCluster`` (control plane, controller-manager, scheduler) without kwok: the kubelet,
built from the same pinned Kubernetes module, registers the node and runs Pods in containers
through Debian's containerd and runc, on a bridge of the kit's own whose address is the API
server's (so Pods reach it through the ``kubernetes`` Service, which kube-proxy programs in
iptables). Images cannot be pulled (no registry is reachable): the pause image and the ones a
test names are imported into containerd at start, and Pods use ``imagePullPolicy: Never``.

A node is host-wide: its bridge, iptables chains, cgroups, kernel settings and containerd's
shim sockets are the host's, so one runs at a time on a host (``HostLock``), in fixed
directories. Everything it changes is recorded before it is changed (``hoststate.Footprint``)
and undone at ``stop()`` (``hoststate.sweep``); a start after a killed run sweeps what that run
left, or fails naming it in one line.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import socket
import subprocess
import time
import urllib.error
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from resourceconsist.cluster import certs
from resourceconsist.testing import hoststate
from resourceconsist.testing.controlplane import (
    CONTROL_PLANE_BINARIES,
    SERVICE_CLUSTER_IP_RANGE,
    ControlPlaneBinariesMissing,
    ControlPlaneError,
    find_binaries,
    free_port,
)
from resourceconsist.testing.localcluster import CONTROLLERS, LocalCluster

#: The binaries a RealNodeCluster needs beside those of the control plane.
REAL_NODE_BINARIES = ("kube-controller-manager", "kube-scheduler", "kubelet", "kube-proxy")
#: The node's name (the kubelet registers it so).
NODE_NAME = "resourceconsist-node"
#: The kit's bridge: the Pods' network, the node's InternalIP and the API server's address.
BRIDGE = "rcnode0"
POD_NETWORK = ipaddress.ip_network("10.242.0.0/24")
BRIDGE_ADDRESS = str(POD_NETWORK[1])
#: The bridge's MAC address, set when it is made (locally administered, from its address). A
#: bridge whose address was never set takes the lowest MAC of its ports, so each new Pod's veth
#: could change it; the Pods' ARP entries for their gateway then point at a MAC no longer the
#: bridge's, and every Pod's answers to the host (HAProxy, the kubelet's probes) are lost for
#: the seconds until those entries are re-resolved: all Pods at once, at every Pod start.
BRIDGE_MAC = "02:52:43:" + ":".join(f"{b:02x}" for b in POD_NETWORK[1].packed[1:])
#: Where the node keeps its state: host-wide and fixed, one node a host (module docstring).
NODE_ROOT = Path("/var/lib/resourceconsist-node")
NODE_STATE = Path("/run/resourceconsist-node")
#: The cgroup (in every hierarchy) under which the kubelet puts the Pods.
CGROUP = "resourceconsist-node"
#: The CPU weight of that cgroup (cgroup v1's ``cpu.shares``, v2's ``cpu.weight``): that of 8
#: busy sessions. On a real node the Pods own the node's CPU; on this shared host, at the
#: default weight, they got 1/(n+1) of it while n host sessions were busy (the kernel's
#: autogroups give each session an equal share: the control plane's daemons, containerd, the
#: kubelet, the controllers, the test), and every Pod stalled for seconds each time a rollout
#: started containers. The Pods use what they need and leave the rest.
PODS_CPU_WEIGHT = {"cpu.shares": "8192", "cpu.weight": "800"}
#: The CNI network of the Pods.
CNI_NETWORK = "resourceconsist-node"
#: Debian's CNI plugins.
CNI_BIN_DIR = Path("/usr/lib/cni")
#: The pause image every Pod sandbox runs; its archive is found with ``find_image("pause")``.
PAUSE_IMAGE = "localhost/resourceconsist/pause:1"
#: The HTTP test server's image (``hack/build-node-images.sh``, resourceconsist/testing/testserver.py)
#: and its port.
TESTSERVER_IMAGE = "localhost/resourceconsist/testserver:1"
TESTSERVER_PORT = 8080
#: Host programs a node needs, and the Debian packages that have them.
HOST_PROGRAMS = {
    "containerd": "containerd",
    "containerd-shim-runc-v2": "containerd",
    "ctr": "containerd",
    "runc": "runc",
    "iptables": "iptables",
    "iptables-save": "iptables",
    "iptables-restore": "iptables",
    "ip": "iproute2",
    "conntrack": "conntrack",
}
CNI_PLUGINS = ("bridge", "host-local", "loopback")
#: The ``kubernetes`` Service's address (the first of the Service range).
KUBERNETES_SERVICE_IP = str(ipaddress.ip_network(SERVICE_CLUSTER_IP_RANGE)[1])
#: Host directories the node's components create outside its own (see ``hoststate.Footprint``).
HOST_DIRS_USED = ("/run/containerd", "/var/lib/cni", "/var/log/containers")


class RealNodeUnavailable(ControlPlaneError):
    """This host cannot run a real node now; the message names what is missing, in one line."""


def default_images_dir() -> Path:
    """Where ``hack/build-node-images.sh`` writes the image archives the node imports."""
    explicit = os.environ.get("RESOURCECONSIST_IMAGES_DIR")
    if explicit:
        return Path(explicit)
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "resourceconsist" / "images"


def find_image(name: str) -> Path:
    """The archive ``<name>.tar`` in ``default_images_dir()``, or one line saying how to make it."""
    path = default_images_dir() / f"{name}.tar"
    if not path.is_file():
        raise RealNodeUnavailable(
            f"image archive {path} not found: make the node's images with hack/build-node-images.sh"
        )
    return path


def http_server_pod_spec(log_dir: Path | None = None, *, log_served: bool = True) -> dict[str, Any]:
    """A Pod spec running the HTTP test server (``testserver``): it answers with the Pod's name
    (from the downward API) on ``TESTSERVER_PORT``, is Ready once it answers ``/healthz``, and
    stops as a real server on SIGTERM. With ``log_dir`` (a host directory), its log is also
    written to ``log_dir/<pod name>.log`` through a hostPath volume, so it outlives the Pod;
    ``log_served=False`` leaves each request's line out of its log (under a load generator)."""
    container: dict[str, Any] = {
        "name": "server",
        "image": TESTSERVER_IMAGE,
        "imagePullPolicy": "Never",
        "ports": [{"name": "http", "containerPort": TESTSERVER_PORT}],
        "env": [
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "PORT", "value": str(TESTSERVER_PORT)},
            *([] if log_served else [{"name": "LOG_SERVED", "value": "0"}]),
        ],
        "readinessProbe": {
            "httpGet": {"path": "/healthz", "port": "http"},
            "periodSeconds": 1,
            "failureThreshold": 1,
        },
    }
    spec: dict[str, Any] = {"containers": [container]}
    if log_dir is not None:
        container["env"].append({"name": "LOG_DIR", "value": "/log"})
        container["volumeMounts"] = [{"name": "log", "mountPath": "/log"}]
        spec["volumes"] = [{"name": "log", "hostPath": {"path": str(log_dir), "type": "DirectoryOrCreate"}}]
    return spec


def http_server_log(log_dir: Path, pod: str) -> list[dict[str, Any]]:
    """The test server's log of ``pod`` (``http_server_pod_spec(log_dir)``), one event a line."""
    path = log_dir / f"{pod}.log"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def check_host() -> None:
    """Fail in one line when this host cannot run a real node: not root, a program missing."""
    if os.geteuid() != 0:
        raise RealNodeUnavailable(f"a real node needs root (this process runs as uid {os.geteuid()})")
    missing = [name for name in HOST_PROGRAMS if shutil.which(name) is None]
    missing += [f"CNI plugin {p}" for p in CNI_PLUGINS if not os.access(CNI_BIN_DIR / p, os.X_OK)]
    if missing:
        packages = sorted({HOST_PROGRAMS.get(m, "containernetworking-plugins") for m in missing})
        raise RealNodeUnavailable(
            f"a real node needs {', '.join(missing)}: apt-get install {' '.join(packages)}"
        )


class RealNodeCluster(LocalCluster):
    """A working cluster with one real node: ``with RealNodeCluster(images=[...]) as c:``.

    ``images``: archives (docker-archive or OCI tar, as ``ctr images import`` reads) imported
    into the node's containerd beside the pause image; Pods name them with
    ``imagePullPolicy: Never``. ``start_timeout`` bounds each component's start.
    """

    binaries = CONTROL_PLANE_BINARIES + REAL_NODE_BINARIES
    #: LocalCluster's controllers, and those of what charts install beside Deployments: Jobs
    #: (a chart's hooks) and DaemonSets.
    controllers = (*CONTROLLERS, "job-controller", "daemonset-controller")

    def __init__(
        self,
        *,
        images: Sequence[Path] = (),
        start_timeout: float = 90.0,
        extra_apiserver_flags: dict[str, str] | None = None,
    ) -> None:
        flags = {
            # ServiceAccount admission on: the kubelet mounts each Pod its token. The taint the
            # other plugin puts on a new node would be lifted by the node-lifecycle controller,
            # which does not run here.
            "disable-admission-plugins": "TaintNodesByCondition",
            "authorization-mode": "Node,RBAC",
            # The API server calls a webhook's Service at an endpoint's IP (no cluster DNS).
            "enable-aggregator-routing": "true",
            **(extra_apiserver_flags or {}),
        }
        super().__init__(nodes=1, start_timeout=start_timeout, extra_apiserver_flags=flags)
        self.images = [Path(p) for p in images]
        self.host = BRIDGE_ADDRESS
        self._lock = hoststate.HostLock()
        self._footprint: hoststate.Footprint | None = None
        self.kubelet_port = 0
        self._kube_proxy: list[str] = []

    @property
    def node_names(self) -> list[str]:
        return [NODE_NAME]

    @property
    def containerd_address(self) -> Path:
        return NODE_STATE / "containerd.sock"

    # -- start ---------------------------------------------------------------------------------

    def start(self) -> None:
        check_host()
        try:
            find_binaries(self.binaries)
        except ControlPlaneBinariesMissing as err:
            # Its first line names what is missing and where it looked; the rest, two ways to get
            # the control plane's binaries, one of which (envtest's) has no kubelet.
            what = str(err).splitlines()[0].split(". Get them")[0]
            raise RealNodeUnavailable(f"{what}: build them with hack/build-controlplane.sh") from None
        find_image("pause")
        self._hold_host()
        try:
            self._sweep_leftovers()
            self._refuse_foreign_state()
            self._record_footprint()
            self._make_bridge()
            super().start()
        except BaseException:
            self._teardown_node()
            raise

    def sweep_leftovers(self) -> None:
        """Remove what a killed run left on this host (its processes, mounts, links, rules,
        cgroups, kernel settings), as :meth:`start` does first, without starting a node: for a
        caller that wants the host clean before it looks at it (a killed session, a restarted
        machine). Names in one line what it cannot remove; refuses while a node runs here."""
        self._hold_host()
        try:
            self._sweep_leftovers()
        finally:
            self._lock.release()

    def _hold_host(self) -> None:
        """Take the host's lock, or refuse in one line: one real node at a time on a host."""
        if not self._lock.acquire():
            raise RealNodeUnavailable(
                "another real node runs on this host: one at a time (docs/testing.md, 'A real node')"
            )

    def _sweep_leftovers(self) -> None:
        """A killed run's leftovers: swept, or named in one line."""
        footprint = hoststate.Footprint.load(NODE_ROOT / "footprint.json")
        if footprint is None and not NODE_ROOT.exists() and not NODE_STATE.exists():
            return
        left = hoststate.sweep(footprint or self._new_footprint())
        if left:
            raise RealNodeUnavailable(
                f"a killed real node left {', '.join(left)}; remove them by hand (docs/testing.md)"
            )

    def _refuse_foreign_state(self) -> None:
        """Another Kubernetes node on this host (kind, k3s, a kubelet) would share chains with us."""
        chains = hoststate.node_chains()
        if chains:
            raise RealNodeUnavailable(
                f"this host has Kubernetes iptables chains already ({chains[0]}, ...): another node "
                "runs here, and two cannot share a host (docs/testing.md)"
            )
        if BRIDGE in hoststate.links():
            raise RealNodeUnavailable(
                f"network interface {BRIDGE} exists already: delete it (ip link delete {BRIDGE})"
            )

    def _new_footprint(self) -> hoststate.Footprint:
        return hoststate.Footprint(
            path=NODE_ROOT / "footprint.json",
            owner=os.getpid(),
            roots=[str(NODE_ROOT), str(NODE_STATE)],
            bridge=BRIDGE,
            cgroup=CGROUP,
            sysctls=hoststate.read_sysctls(),
            created=[d for d in HOST_DIRS_USED if not Path(d).exists()],
            containerd_address=str(self.containerd_address),
            nft_tables=hoststate.nft_tables(),
            network=CNI_NETWORK,
        )

    def _record_footprint(self) -> None:
        self._footprint = self._new_footprint()
        self._footprint.save()
        NODE_STATE.mkdir(parents=True, exist_ok=True)

    def _make_bridge(self) -> None:
        for args in (
            ["link", "add", BRIDGE, "address", BRIDGE_MAC, "type", "bridge"],
            ["addr", "add", f"{BRIDGE_ADDRESS}/{POD_NETWORK.prefixlen}", "dev", BRIDGE],
            ["link", "set", BRIDGE, "up"],
        ):
            done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise RealNodeUnavailable(f"ip {' '.join(args)} failed: {done.stderr.strip()}")

    def _serving_hosts(self) -> tuple[str, ...]:
        return (
            BRIDGE_ADDRESS,
            KUBERNETES_SERVICE_IP,
            "127.0.0.1",
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
        )

    def _start_apiserver(self, binary: Path, etcd_url: str) -> None:
        d = self.dir
        self.extra_apiserver_flags.update(
            {
                # The API server reaches the kubelet (logs, exec) with the admin certificate
                # and checks the kubelet's serving certificate against the cluster CA.
                "kubelet-client-certificate": str(d / "admin.crt"),
                "kubelet-client-key": str(d / "admin.key"),
                "kubelet-certificate-authority": str(d / "ca.crt"),
                "kubelet-preferred-address-types": "InternalIP",
            }
        )
        super()._start_apiserver(binary, etcd_url)

    def _start_more(self, binaries: dict[str, Path]) -> None:
        self._start_controller_manager(binaries["kube-controller-manager"])
        self._start_scheduler(binaries["kube-scheduler"])
        self._start_containerd()
        for image in [find_image("pause"), *self.images]:
            self.import_image(image)
        self._start_kubelet(binaries["kubelet"])
        self._wait_nodes_ready()
        self._start_kube_proxy(binaries["kube-proxy"])
        self._wait_kubernetes_service()
        self._wait_default_service_account()

    # -- containerd ----------------------------------------------------------------------------

    def _start_containerd(self) -> None:
        cni_dir = NODE_ROOT / "cni"
        (cni_dir / "net.d").mkdir(parents=True, exist_ok=True)
        network = {
            "cniVersion": "1.0.0",
            "name": CNI_NETWORK,
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": BRIDGE,
                    "isGateway": True,
                    # Pods talk to the host and to each other only: no masquerading, so no
                    # per-Pod NAT chains.
                    "ipMasq": False,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": str(POD_NETWORK), "gateway": BRIDGE_ADDRESS}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dataDir": str(cni_dir / "ipam"),
                    },
                }
            ],
        }
        (cni_dir / "net.d" / "10-resourceconsist.conflist").write_text(json.dumps(network, indent=1))
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        config = f"""version = 2
root = "{NODE_ROOT / "containerd"}"
state = "{NODE_STATE / "containerd"}"
[grpc]
  address = "{self.containerd_address}"
[plugins."io.containerd.internal.v1.opt"]
  path = "{NODE_ROOT / "opt"}"
[{cri}]
  sandbox_image = "{PAUSE_IMAGE}"
  # The machine may withhold CAP_SYS_RESOURCE: without this every sandbox fails with
  # "runc create failed: ... can't get final child's PID from pipe: EOF".
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [{cri}.cni]
    bin_dir = "{CNI_BIN_DIR}"
    conf_dir = "{cni_dir / "net.d"}"
  [{cri}.containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [{cri}.containerd.runtimes.runc.options]
      Root = "{NODE_STATE / "runc"}"
      SystemdCgroup = false
"""
        path = NODE_ROOT / "containerd.toml"
        path.write_text(config)
        self._spawn("containerd", ["containerd", f"--config={path}"])
        self._poll("containerd", lambda: self._ctr("version").returncode == 0)

    def _ctr(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["ctr", f"--address={self.containerd_address}", "--namespace=k8s.io", *args],
            capture_output=True,
            text=True,
            check=False,
            timeout=self.start_timeout,
        )

    def import_image(self, archive: Path) -> list[str]:
        """Import an image archive into the node's containerd; returns the names it holds."""
        done = self._ctr("images", "import", "--all-platforms", str(archive))
        if done.returncode != 0:
            raise ControlPlaneError(f"ctr images import {archive} failed: {done.stderr.strip()}")
        return [line.split()[1] for line in done.stdout.splitlines() if line.startswith("unpacking ")]

    def images_present(self) -> list[str]:
        """The image names containerd holds (what Pods can run)."""
        return self._ctr("images", "list", "--quiet").stdout.split()

    # -- kubelet and kube-proxy ---------------------------------------------------------------

    def _identity(self, name: str, common_name: str, organizations: tuple[str, ...] = ()) -> Path:
        """A kubeconfig for a client certificate ``common_name`` (in ``organizations``)."""
        assert self.ca is not None
        pair = certs.make_signed(self.ca, common_name, organizations=organizations, server=False, client=True)
        crt, key = NODE_ROOT / f"{name}.crt", NODE_ROOT / f"{name}.key"
        crt.write_bytes(pair.cert_pem)
        key.write_bytes(pair.key_pem)
        key.chmod(0o600)
        user = {"client-certificate": str(crt), "client-key": str(key)}
        return self.write_kubeconfig(NODE_ROOT / f"{name}.kubeconfig", name, user)

    def _start_kubelet(self, binary: Path) -> None:
        assert self.ca is not None
        kubeconfig = self._identity("kubelet", f"system:node:{NODE_NAME}", ("system:nodes",))
        serving = certs.make_signed(self.ca, NODE_NAME, hosts=(BRIDGE_ADDRESS, NODE_NAME))
        (NODE_ROOT / "kubelet-serving.crt").write_bytes(serving.cert_pem)
        (NODE_ROOT / "kubelet-serving.key").write_bytes(serving.key_pem)
        self.kubelet_port = free_port()
        config: dict[str, Any] = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            # The API server reaches it on the bridge (logs, exec); its health on loopback.
            "address": BRIDGE_ADDRESS,
            "port": self.kubelet_port,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": free_port(),
            "tlsCertFile": str(NODE_ROOT / "kubelet-serving.crt"),
            "tlsPrivateKeyFile": str(NODE_ROOT / "kubelet-serving.key"),
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": True},
                "x509": {"clientCAFile": str(self.dir / "ca.crt")},
            },
            "authorization": {"mode": "Webhook"},
            "containerRuntimeEndpoint": f"unix://{self.containerd_address}",
            "imageServiceEndpoint": f"unix://{self.containerd_address}",
            # cgroup v1 machines, no systemd: the kubelet writes the cgroups itself.
            "cgroupDriver": "cgroupfs",
            "failCgroupV1": False,
            "cgroupRoot": f"/{CGROUP}",
            "failSwapOn": False,
            "oomScoreAdj": 0,
            # Imported images cannot be pulled again: never collect them, never evict for disk.
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "evictionHard": {
                "memory.available": "0%",
                "nodefs.available": "0%",
                "nodefs.inodesFree": "0%",
                "imagefs.available": "0%",
                "imagefs.inodesFree": "0%",
            },
            "podLogsDir": str(NODE_ROOT / "pod-logs"),
            "volumePluginDir": str(NODE_ROOT / "volume-plugins"),
            "resolvConf": "",
            "serializeImagePulls": False,
            "nodeStatusUpdateFrequency": "2s",
            "syncFrequency": "10s",
            "fileCheckFrequency": "10s",
            "shutdownGracePeriod": "0s",
        }
        path = NODE_ROOT / "kubelet.yaml"
        path.write_text(yaml.safe_dump(config))
        for cgroup in self._cgroup_tops():
            cgroup.mkdir(exist_ok=True)
            for name, value in PODS_CPU_WEIGHT.items():
                if (cgroup / name).exists():
                    (cgroup / name).write_text(value)
        self._spawn(
            "kubelet",
            [
                str(binary),
                f"--config={path}",
                f"--kubeconfig={kubeconfig}",
                f"--root-dir={NODE_ROOT / 'kubelet'}",
                f"--hostname-override={NODE_NAME}",
                f"--node-ip={BRIDGE_ADDRESS}",
                "--v=1",
            ],
        )

    @staticmethod
    def _cgroup_tops() -> list[Path]:
        root = Path("/sys/fs/cgroup")
        if (root / "cgroup.controllers").exists():
            return [root / CGROUP]
        return [h / CGROUP for h in sorted(root.iterdir()) if h.is_dir() and not h.is_symlink()]

    def node_ready(self) -> bool:
        """Whether the node is registered and its Ready condition True."""
        try:
            node = self._api("GET", f"/api/v1/nodes/{NODE_NAME}")
        except urllib.error.HTTPError as err:
            if err.code == 404:
                return False
            raise
        return any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in (node.get("status") or {}).get("conditions") or []
        )

    def _wait_nodes_ready(self) -> None:
        self._poll("kubelet", self.node_ready)

    def _start_kube_proxy(self, binary: Path) -> None:
        kubeconfig = self._identity("kube-proxy", "system:kube-proxy")
        config = {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "mode": "iptables",
            "clientConnection": {"kubeconfig": str(kubeconfig)},
            "hostnameOverride": NODE_NAME,
            "bindAddress": BRIDGE_ADDRESS,
            "healthzBindAddress": f"127.0.0.1:{free_port()}",
            "metricsBindAddress": f"127.0.0.1:{free_port()}",
            "clusterCIDR": str(POD_NETWORK),
            # NodePorts only on the bridge's address, never on every interface.
            "nodePortAddresses": [f"{BRIDGE_ADDRESS}/32"],
            "oomScoreAdj": 0,
            # Zero: leave the host's conntrack settings as they are.
            "conntrack": {
                "maxPerCore": 0,
                "min": 0,
                "tcpEstablishedTimeout": "0s",
                "tcpCloseWaitTimeout": "0s",
            },
            "iptables": {"syncPeriod": "10s", "minSyncPeriod": "0s"},
        }
        path = NODE_ROOT / "kube-proxy.yaml"
        path.write_text(yaml.safe_dump(config))
        self._kube_proxy = [str(binary), f"--config={path}"]
        self._spawn("kube-proxy", [*self._kube_proxy, "--v=1"])

    def _wait_kubernetes_service(self) -> None:
        """In-cluster clients reach the API server at the ``kubernetes`` Service's address once
        kube-proxy has programmed it; the host's own connections take the same rules."""

        def reachable() -> bool:
            with socket.create_connection((KUBERNETES_SERVICE_IP, 443), timeout=1):
                return True

        self._poll("kube-proxy", reachable)

    # -- what runs on it -----------------------------------------------------------------------

    def node_pids(self) -> set[int]:
        """The node's processes beside those ``pids`` lists: containerd's shims and the
        containers' processes."""
        if self._footprint is None:
            return set()
        return hoststate.node_processes(self._footprint)

    def pod_log(self, namespace: str, pod: str, container: str | None = None) -> str:
        """A container's log, read by the API server from the kubelet (``kubectl logs``)."""
        from kubernetes import client

        with self.api_client() as api:
            text: str = client.CoreV1Api(api).read_namespaced_pod_log(pod, namespace, container=container)
        return text

    def exec_in(self, namespace: str, pod: str, command: list[str], container: str | None = None) -> str:
        """Run ``command`` in a container through the API server and the kubelet (``kubectl
        exec``); returns what it wrote (stdout and stderr)."""
        from kubernetes import client
        from kubernetes.stream import stream

        with self.api_client() as api:
            core = client.CoreV1Api(api)
            kwargs = {"container": container} if container else {}
            out: str = stream(
                core.connect_get_namespaced_pod_exec,
                pod,
                namespace,
                command=command,
                stderr=True,
                stdin=False,
                stdout=True,
                tty=False,
                **kwargs,
            )
        return out

    # -- stop ----------------------------------------------------------------------------------

    def stop(self, *, keep_etcd: Path | None = None) -> None:
        """Stop the Pods through the kubelet (their containers, sandboxes and networks), then
        every process, and undo all the node changed on the host (``hoststate.sweep``)."""
        try:
            if self._procs:
                self._stop_pods()
            super().stop(keep_etcd=keep_etcd)
        finally:
            self._teardown_node()

    def _stop_pods(self) -> None:
        """No controller recreates what is deleted, then every Pod deleted with a grace period
        of one second: the kubelet stops their containers and sandboxes and tears their network
        down, as on a drained node. Bounded: what is still running after it, the sweep kills."""
        for name in ("kube-controller-manager", "kube-scheduler"):
            proc = self._procs.pop(name, None)
            if proc is not None:
                self._terminate(proc)
        if "kubelet" not in self._procs or "kube-apiserver" not in self._procs:
            return
        try:
            for item in self._api("GET", "/api/v1/namespaces").get("items", []):
                namespace = item["metadata"]["name"]
                self._api("DELETE", f"/api/v1/namespaces/{namespace}/pods?gracePeriodSeconds=1")
        except (urllib.error.URLError, OSError, ValueError):
            return
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and self._procs["kubelet"].poll() is None:
            if not self._ctr("tasks", "list", "--quiet").stdout.split():
                break
            time.sleep(0.2)

    def _teardown_node(self) -> None:
        """Undo this node's footprint (none before it was recorded) and let the host go."""
        if self._kube_proxy:
            # kube-proxy removes its own rules (the sweep takes what remains).
            cleanup = [*self._kube_proxy, "--cleanup"]
            subprocess.run(cleanup, capture_output=True, check=False, timeout=60)
            self._kube_proxy = []
        try:
            if self._footprint is not None:
                left = hoststate.sweep(self._footprint)
                if left:
                    raise ControlPlaneError(f"the real node's teardown left {', '.join(left)}")
        finally:
            self._footprint = None
            self._lock.release()
