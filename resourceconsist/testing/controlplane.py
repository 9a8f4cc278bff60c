"""LocalControlPlane: a real etcd + kube-apiserver on loopback, for tests and for adapter authors.

The Python counterpart of controller-runtime's envtest: it starts the two real binaries in a
temporary directory with a serving certificate, an admin client certificate in
``system:masters``, RBAC authorization and a service-account signer, writes a kubeconfig,
waits for readiness with a deadline and tears everything down, leaving no process and no
temporary directory behind (children are also bound to this process's life, so they die with
it even when it is killed). ``LocalControlPlane(audit=True)`` has kube-apiserver write an audit log
at Metadata level (who did what to which resource, no bodies; ``audit_policy=`` another policy),
read by ``audit_events()``: what
a ServiceAccount's run actually used (docs/security.md); ``service_account_token()`` and
``token_kubeconfig()`` let a process run as a ServiceAccount. ``restart_apiserver()`` stops and
starts kube-apiserver on the same port while etcd keeps running, so a test can show that clients
survive an API-server restart.

Binaries are found in ``$KUBEBUILDER_ASSETS`` (envtest's convention), else in
``$RESOURCECONSIST_ASSETS_DIR``, else in the cache that ``hack/build-controlplane.sh`` fills;
``find_tool()`` finds the tools that script builds beside them (helm, for tests of the chart;
vegeta, the load generator's engine).
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Collection, Mapping
from contextlib import suppress
from pathlib import Path
from types import TracebackType
from typing import Any, Self, cast

import yaml

from resourceconsist.cluster import certs

log = logging.getLogger(__name__)

#: The Kubernetes version the project builds and tests against (hack/controlplane/go.mod).
KUBERNETES_VERSION = "1.34.4"
#: The etcd version pinned beside it.
ETCD_VERSION = "3.6.4"

#: The binaries a plain control plane runs; ``LocalCluster`` needs more (docs/testing.md).
CONTROL_PLANE_BINARIES = ("kube-apiserver", "etcd")
#: The helm version hack/build-controlplane.sh builds beside them (hack/helm/go.mod).
HELM_VERSION = "3.22.0"
#: The vegeta version it builds beside them (hack/vegeta/go.mod): the load generator's engine.
VEGETA_VERSION = "12.13.0"
#: The tools built beside the control plane's binaries: name -> (version, Go module).
TOOLS = {"helm": (HELM_VERSION, "hack/helm"), "vegeta": (VEGETA_VERSION, "hack/vegeta")}
#: The Service IP range: a /16, so a test can create thousands of Services.
SERVICE_CLUSTER_IP_RANGE = "10.96.0.0/16"
_TMP_PREFIX = "resourceconsist-cp-"
#: The audit policy of ``LocalControlPlane(audit=True)``: every request at Metadata level (user,
#: verb, resource, response code; no bodies), once it has a response.
AUDIT_POLICY: dict[str, Any] = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived", "ResponseStarted"],
    "rules": [{"level": "Metadata"}],
}
_PR_SET_PDEATHSIG = 1


class ControlPlaneBinariesMissing(RuntimeError):
    """A binary of the control plane (kube-apiserver, etcd, ...) could not be found."""


class ControlPlaneError(RuntimeError):
    """The control plane did not start or did not become ready in time."""


def default_assets_dir() -> Path:
    """Where ``hack/build-controlplane.sh`` puts the binaries by default."""
    explicit = os.environ.get("RESOURCECONSIST_ASSETS_DIR")
    if explicit:
        return Path(explicit)
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "resourceconsist" / f"k8s-{KUBERNETES_VERSION}"


def find_binaries(names: tuple[str, ...] = CONTROL_PLANE_BINARIES) -> dict[str, Path]:
    """Paths of the named binaries, or one error naming what is missing and how to get it."""
    assets = os.environ.get("KUBEBUILDER_ASSETS")
    directory = Path(assets) if assets else default_assets_dir()
    found = {name: directory / name for name in names}
    missing = [name for name, path in found.items() if not os.access(path, os.X_OK)]
    if missing:
        source = "$KUBEBUILDER_ASSETS" if assets else "the default cache"
        raise ControlPlaneBinariesMissing(
            f"{' and '.join(missing)} not found in {directory} ({source}). Get them either way:\n"
            f"  1. build them from Go modules: hack/build-controlplane.sh "
            f"(needs Go; builds Kubernetes {KUBERNETES_VERSION} into {default_assets_dir()}), or\n"
            f"  2. point KUBEBUILDER_ASSETS at a directory holding {', '.join(names)}, "
            "e.g. the one printed by controller-runtime's `setup-envtest use -p path`."
        )
    return found


def find_tool(name: str) -> Path:
    """A tool hack/build-controlplane.sh builds beside the control plane's binaries (``TOOLS``:
    helm, vegeta), or an error saying how to get it. Never one from $PATH: the tests run the
    pinned version."""
    version, module = TOOLS[name]
    assets = os.environ.get("KUBEBUILDER_ASSETS")
    directory = Path(assets) if assets else default_assets_dir()
    tool = directory / name
    if not os.access(tool, os.X_OK):
        source = "$KUBEBUILDER_ASSETS" if assets else "the default cache"
        raise ControlPlaneBinariesMissing(
            f"{name} not found in {directory} ({source}). Build it: hack/build-controlplane.sh "
            f"(needs Go; builds {name} {version} from {module}/go.mod into {default_assets_dir()} "
            f"beside the control plane, and only what is missing), or copy a {name} {version} "
            "binary to that path."
        )
    return tool


def find_helm() -> Path:
    """The helm that renders and lints the chart in the tests (``find_tool``)."""
    return find_tool("helm")


def free_port() -> int:
    """A TCP port free right now on every local IPv4 address, not only loopback: the real node's
    kubelet listens on the bridge's address, where a port free on loopback may be taken (a
    listener or a connection of a run killed just before)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("0.0.0.0", 0))
        port: int = s.getsockname()[1]
        return port


def process_alive(pid: int) -> bool:
    """Whether the process runs (a zombie, dead but not yet reaped, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


def _die_with_parent() -> None:
    """Runs in the child before exec: SIGKILL it when the test process dies.

    The kernel sends the signal when the *thread* that spawned the child ends, so start and
    restart a control plane from a thread that outlives it (normally the main thread)."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def set_priority(niceness: int) -> None:
    """Runs in a child before exec, once it has a session of its own (``start_new_session``):
    gives the child's scheduling group and the child itself the nice value ``niceness``.

    Where the kernel groups tasks by session (``kernel.sched_autogroup_enabled``, on by default
    on many distributions), a process's own nice value ranks it only inside its session, and
    each session gets an equal share: the control plane's daemons, each in a session of its own,
    would crowd out a process however nice its value. The group's nice value
    (``/proc/self/autogroup``) ranks the session against the others, so both are set. Values
    below 0 need root."""
    with suppress(OSError):
        Path("/proc/self/autogroup").write_text(str(niceness))
    os.nice(niceness)


def _remove_stale_dirs() -> None:
    """Remove temp dirs left by control planes whose process was killed outright."""
    for path in Path(tempfile.gettempdir()).glob(f"{_TMP_PREFIX}*"):
        try:
            pid = int(path.name[len(_TMP_PREFIX) :].split("-", 1)[0])
        except ValueError:
            continue
        if pid == os.getpid():
            continue
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
        except PermissionError:
            continue


class LocalControlPlane:
    """A real etcd + kube-apiserver on free loopback ports.

    Use as ``with LocalControlPlane() as cp:`` or through ``start()`` / ``stop()``.
    ``cp.kubeconfig`` is the path of an admin kubeconfig; ``cp.api_client()`` gives an
    official-client ``ApiClient`` bound to it.
    """

    #: The binaries ``start()`` needs; a subclass that runs more names them here.
    binaries: tuple[str, ...] = CONTROL_PLANE_BINARIES

    def __init__(
        self,
        *,
        start_timeout: float = 60.0,
        extra_apiserver_flags: dict[str, str] | None = None,
        audit: bool = False,
        audit_policy: Mapping[str, Any] | None = None,
        etcd_seed: Path | None = None,
    ) -> None:
        self.start_timeout = start_timeout
        #: An audit policy implies the audit log (``AUDIT_POLICY`` when only ``audit`` is set).
        self.audit = audit or audit_policy is not None
        self.audit_policy: Mapping[str, Any] = AUDIT_POLICY if audit_policy is None else audit_policy
        #: An etcd data directory kept by ``stop(keep_etcd=...)``: this control plane starts with
        #: a copy of it, every object of the earlier one in place (a benchmark fills a large
        #: cluster once and starts from it for each run).
        self.etcd_seed = etcd_seed
        self.extra_apiserver_flags = dict(extra_apiserver_flags or {})
        self._dir: Path | None = None
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._argv: dict[str, list[str]] = {}
        self._logs: dict[str, Any] = {}
        self.host = "127.0.0.1"
        self.port = 0
        self.ca: certs.KeyPair | None = None

    # -- life cycle ---------------------------------------------------------------

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return bool(self._procs) and all(p.poll() is None for p in self._procs.values())

    @property
    def url(self) -> str:
        return f"https://{self.host}:{self.port}"

    @property
    def dir(self) -> Path:
        if self._dir is None:
            raise ControlPlaneError("the control plane is not started")
        return self._dir

    @property
    def kubeconfig(self) -> Path:
        return self.dir / "kubeconfig"

    @property
    def audit_log(self) -> Path:
        """The audit log's path (written only with ``audit=True``)."""
        return self.dir / "audit.log"

    def audit_events(self) -> list[dict[str, Any]]:
        """The audit log's events so far (``audit=True``), one per request that got a response:
        ``user.username``, ``verb``, ``objectRef`` (resource, subresource, namespace, name) and
        ``responseStatus.code`` among others."""
        if not self.audit:
            raise ControlPlaneError("the control plane was started without audit=True")
        if not self.audit_log.exists():
            return []
        return [json.loads(line) for line in self.audit_log.read_text().splitlines() if line.strip()]

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs.values()]

    def start(self) -> None:
        """Start etcd and kube-apiserver and wait until the API server is ready."""
        if self._procs:
            raise ControlPlaneError("the control plane is already started")
        binaries = find_binaries(self.binaries)
        _remove_stale_dirs()
        self._dir = Path(tempfile.mkdtemp(prefix=f"{_TMP_PREFIX}{os.getpid()}-"))
        try:
            self._write_certs()
            etcd_url = self._start_etcd(binaries["etcd"])
            self._start_apiserver(binaries["kube-apiserver"], etcd_url)
            self._write_kubeconfig()
            self._wait_ready()
            self._start_more(binaries)
        except BaseException:
            self.stop()
            raise
        log.info("control plane ready at %s (kubeconfig %s)", self.url, self.kubeconfig)

    def _start_more(self, binaries: dict[str, Path]) -> None:
        """Start what runs beside the API server (nothing here; ``LocalCluster`` adds to it)."""

    def stop(self, *, keep_etcd: Path | None = None) -> None:
        """Stop every process, last started first, and remove the temporary directory.
        ``keep_etcd``: a directory (that must not exist yet) where etcd's data is copied once etcd
        has stopped, the seed of a later ``LocalControlPlane(etcd_seed=...)``."""
        for name in reversed(list(self._procs)):
            self._terminate(self._procs.pop(name))
        self._argv.clear()
        for handle in self._logs.values():
            handle.close()
        self._logs.clear()
        if keep_etcd is not None and self._dir is not None:
            shutil.copytree(self._dir / "etcd", keep_etcd)
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    @staticmethod
    def _terminate(proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=15)

    def restart_apiserver(self) -> None:
        """Stop kube-apiserver (SIGTERM, as a rolling upgrade does) and start it again with the
        same flags on the same port, then wait until it is ready. etcd keeps running, so every
        object and resourceVersion survives; clients see their watches end and connections
        refused meanwhile. Call it from the thread that started the control plane."""
        proc = self._procs.get("kube-apiserver")
        if proc is None:
            raise ControlPlaneError("the control plane is not started")
        self._terminate(proc)
        # The same key keeps its place in _procs, so stop() still stops it before etcd.
        self._spawn("kube-apiserver", self._argv["kube-apiserver"])
        self._wait_ready()
        log.info("kube-apiserver restarted at %s", self.url)

    # -- start-up pieces ---------------------------------------------------------

    def _write_certs(self) -> None:
        d = self.dir
        self.ca = certs.make_ca("resourceconsist-local-ca")
        serving = certs.make_signed(self.ca, "kube-apiserver", hosts=self._serving_hosts())
        admin = certs.make_signed(
            self.ca, "admin", organizations=("system:masters",), server=False, client=True
        )
        sa = certs.make_signing_key()
        files = {
            "ca.crt": self.ca.cert_pem,
            "ca.key": self.ca.key_pem,
            "apiserver.crt": serving.cert_pem,
            "apiserver.key": serving.key_pem,
            "admin.crt": admin.cert_pem,
            "admin.key": admin.key_pem,
            "sa.pub": sa.cert_pem,
            "sa.key": sa.key_pem,
        }
        for name, data in files.items():
            path = d / name
            path.write_bytes(data)
            path.chmod(0o600)

    def _serving_hosts(self) -> tuple[str, ...]:
        """The names and addresses kube-apiserver's serving certificate carries."""
        return (self.host, "localhost")

    def _spawn(
        self, name: str, argv: list[str], env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        old_log = self._logs.get(name)
        if old_log is not None:  # a restart: the new process appends to the same log
            old_log.close()
        log_file = open(self.dir / f"{name}.log", "ab")  # noqa: SIM115 - closed in stop()
        self._logs[name] = log_file
        proc = subprocess.Popen(
            argv,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=self.dir,
            env=env,
            start_new_session=True,
            preexec_fn=_die_with_parent,  # noqa: PLW1509 - only sets the death signal
        )
        self._procs[name] = proc
        self._argv[name] = argv
        return proc

    def _start_etcd(self, binary: Path) -> str:
        client_port, peer_port = free_port(), free_port()
        client_url = f"http://127.0.0.1:{client_port}"
        peer_url = f"http://127.0.0.1:{peer_port}"
        seeded: list[str] = []
        if self.etcd_seed is not None:
            shutil.copytree(self.etcd_seed, self.dir / "etcd")
            # The copy remembers the seed's member and its peer URL: one new member, these URLs.
            seeded = ["--force-new-cluster=true"]
        self._spawn(
            "etcd",
            [
                str(binary),
                *seeded,
                f"--data-dir={self.dir / 'etcd'}",
                f"--listen-client-urls={client_url}",
                f"--advertise-client-urls={client_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=default={peer_url}",
                "--unsafe-no-fsync=true",
                "--log-level=warn",
            ],
        )
        self._wait_http(f"{client_url}/health", "etcd", context=None)
        return client_url

    def _start_apiserver(self, binary: Path, etcd_url: str) -> None:
        d = self.dir
        self.port = free_port()
        flags = {
            "etcd-servers": etcd_url,
            "bind-address": self.host,
            "advertise-address": self.host,
            "secure-port": str(self.port),
            "cert-dir": str(d),
            "tls-cert-file": str(d / "apiserver.crt"),
            "tls-private-key-file": str(d / "apiserver.key"),
            "client-ca-file": str(d / "ca.crt"),
            "authorization-mode": "RBAC",
            "service-account-issuer": f"https://{self.host}:{self.port}/",
            "service-account-key-file": str(d / "sa.pub"),
            "service-account-signing-key-file": str(d / "sa.key"),
            "service-cluster-ip-range": SERVICE_CLUSTER_IP_RANGE,
            "allow-privileged": "true",
            # No controller-manager runs, so nothing would create default service accounts.
            "disable-admission-plugins": "ServiceAccount",
            "profiling": "false",
            "v": "1",
        }
        if self.audit:
            (d / "audit-policy.yaml").write_text(yaml.safe_dump(dict(self.audit_policy)))
            flags["audit-policy-file"] = str(d / "audit-policy.yaml")
            flags["audit-log-path"] = str(self.audit_log)
        flags.update(self.extra_apiserver_flags)
        self._spawn("kube-apiserver", [str(binary)] + [f"--{k}={v}" for k, v in flags.items()])

    def _write_kubeconfig(self) -> None:
        d = self.dir
        user = {"client-certificate": str(d / "admin.crt"), "client-key": str(d / "admin.key")}
        self.write_kubeconfig(self.kubeconfig, "admin", user)

    def write_kubeconfig(self, path: Path, name: str, user: dict[str, str]) -> Path:
        """Write a kubeconfig at ``path`` for this API server (trusting its CA) with the
        credentials ``user`` (a kubeconfig user: ``token``, or ``client-certificate`` and
        ``client-key``) called ``name``; returns ``path``."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "local",
                    "cluster": {"server": self.url, "certificate-authority": str(self.dir / "ca.crt")},
                }
            ],
            "users": [{"name": name, "user": user}],
            "contexts": [{"name": "local", "context": {"cluster": "local", "user": name}}],
            "current-context": "local",
        }
        path.write_text(yaml.safe_dump(config))
        path.chmod(0o600)
        return path

    def ssl_context(self) -> ssl.SSLContext:
        """A client TLS context that trusts the API server and presents the admin certificate."""
        ctx = ssl.create_default_context(cafile=str(self.dir / "ca.crt"))
        ctx.load_cert_chain(str(self.dir / "admin.crt"), str(self.dir / "admin.key"))
        return ctx

    def _wait_http(self, url: str, what: str, context: ssl.SSLContext | None) -> None:
        """Poll ``url`` until it answers 200, failing early when a process exits."""

        def answers() -> bool:
            with urllib.request.urlopen(url, timeout=2, context=context) as resp:
                if resp.status != 200:
                    raise ValueError(f"HTTP {resp.status}")
                return True

        self._poll(what, answers)

    def _poll(self, what: str, check: Callable[[], bool]) -> None:
        """Call ``check`` until it returns True, within ``start_timeout``. Fails early when a
        process exits, and at the deadline with the last error and the tail of ``what``'s log."""
        deadline = time.monotonic() + self.start_timeout
        last = "no answer yet"
        while time.monotonic() < deadline:
            for name, proc in self._procs.items():
                if proc.poll() is not None:
                    raise ControlPlaneError(
                        f"{name} exited with code {proc.returncode} while starting:\n{self._tail(name)}"
                    )
            try:
                if check():
                    return
                last = "not yet"
            except (urllib.error.URLError, OSError, ValueError) as err:
                last = str(err)
            time.sleep(0.1)
        raise ControlPlaneError(
            f"{what} not ready within {self.start_timeout:.0f}s ({last}):\n{self._tail(what)}"
        )

    def _wait_ready(self) -> None:
        self._wait_http(f"{self.url}/readyz", "kube-apiserver", context=self.ssl_context())

    def _tail(self, name: str, lines: int = 30) -> str:
        path = self.dir / f"{name}.log" if self._dir else None
        if path is None or not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    # -- clients and helpers -----------------------------------------------------------

    def api_client(self) -> Any:
        """An official-client ``kubernetes.client.ApiClient`` with admin rights."""
        from kubernetes import client, config

        configuration = client.Configuration()
        config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=str(self.kubeconfig), client_configuration=configuration
        )
        return client.ApiClient(configuration)

    def raw_get(self, path: str) -> str:
        """GET a raw API path (``/metrics``, ``/readyz?verbose``) as admin and return the body."""
        with urllib.request.urlopen(f"{self.url}{path}", timeout=10, context=self.ssl_context()) as resp:
            body: bytes = resp.read()
        return body.decode()

    def requests_served(self, resource: str, verbs: Collection[str]) -> Counter[str]:
        """Requests on ``resource`` (a plural, e.g. ``pods``) with one of ``verbs`` (as the API
        server names them: ``PATCH``, ``POST``...) the API server has answered so far, by HTTP
        code (``"409"``: a conflict), from its own ``apiserver_request_total``."""
        counts: Counter[str] = Counter()
        for labels, value in self.metric_samples("apiserver_request_total"):
            if labels.get("resource") == resource and labels.get("verb") in verbs:
                counts[labels["code"]] += int(value)
        return counts

    def watchers_terminated(self, resource: str) -> int:
        """Watches of ``resource`` (a plural) the API server closed because their client did not
        keep up (``apiserver_terminated_watchers_total``): a watch that fell behind."""
        return sum(
            int(value)
            for labels, value in self.metric_samples("apiserver_terminated_watchers_total")
            if labels.get("resource") == resource
        )

    def metric_samples(self, name: str) -> list[tuple[dict[str, str], float]]:
        """The samples of the API server's metric ``name``, as (labels, value) pairs."""
        from prometheus_client.parser import text_string_to_metric_families

        return [
            (sample.labels, sample.value)
            for family in text_string_to_metric_families(self.raw_get("/metrics"))
            for sample in family.samples
            if sample.name == name
        ]

    def service_account_token(self, namespace: str, name: str, *, seconds: int = 3600) -> str:
        """A token of ServiceAccount ``namespace/name``, minted by the TokenRequest API (as the
        kubelet does for a pod), for running a process as that ServiceAccount."""
        request = urllib.request.Request(
            f"{self.url}/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
            data=json.dumps(
                {
                    "apiVersion": "authentication.k8s.io/v1",
                    "kind": "TokenRequest",
                    "spec": {"expirationSeconds": seconds},
                }
            ).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=10, context=self.ssl_context()) as resp:
            answer: dict[str, Any] = json.loads(resp.read())
        return str(answer["status"]["token"])

    def token_kubeconfig(self, token: str, path: Path) -> Path:
        """Write a kubeconfig at ``path`` that authenticates with ``token`` (a ServiceAccount's,
        from ``service_account_token``) instead of the admin certificate; returns ``path``."""
        return self.write_kubeconfig(path, "token", {"token": token})

    def webhook_certificate(self, hosts: tuple[str, ...] = ("127.0.0.1", "localhost")) -> tuple[Path, Path]:
        """Write a serving certificate signed by this control plane's CA; return (cert, key) paths.

        A webhook server in the test process serves it, and ``install_webhook`` gives the API
        server this CA as the caBundle, so the real API server calls the webhook over TLS.
        """
        if self.ca is None:
            raise ControlPlaneError("the control plane is not started")
        pair = certs.make_signed(self.ca, "webhook", hosts=hosts)
        stem = "webhook-" + "-".join(h.replace(".", "_") for h in hosts)
        cert, key = self.dir / f"{stem}.crt", self.dir / f"{stem}.key"
        cert.write_bytes(pair.cert_pem)
        key.write_bytes(pair.key_pem)
        return cert, key

    def install_webhook(
        self,
        name: str,
        *,
        port: int,
        path: str,
        rules: list[dict[str, Any]],
        mutating: bool = True,
        object_selector: dict[str, Any] | None = None,
        namespace_selector: dict[str, Any] | None = None,
        failure_policy: str = "Fail",
        timeout_seconds: int = 10,
    ) -> dict[str, Any]:
        """Create a (Mutating|Validating)WebhookConfiguration whose one webhook calls
        ``https://127.0.0.1:<port>/<path>`` trusting this control plane's CA. Returns the body."""
        import base64

        from kubernetes import client

        if self.ca is None:
            raise ControlPlaneError("the control plane is not started")
        webhook: dict[str, Any] = {
            "name": f"{name}.resourceconsist.test",
            "clientConfig": {
                "url": f"https://127.0.0.1:{port}/{path.lstrip('/')}",
                "caBundle": base64.b64encode(self.ca.cert_pem).decode(),
            },
            "rules": rules,
            "admissionReviewVersions": ["v1"],
            "sideEffects": "None",
            "failurePolicy": failure_policy,
            "timeoutSeconds": timeout_seconds,
        }
        if object_selector is not None:
            webhook["objectSelector"] = object_selector
        if namespace_selector is not None:
            webhook["namespaceSelector"] = namespace_selector
        kind = "MutatingWebhookConfiguration" if mutating else "ValidatingWebhookConfiguration"
        body: dict[str, Any] = {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": kind,
            "metadata": {"name": name},
            "webhooks": [webhook],
        }
        with self.api_client() as api:
            admission = client.AdmissionregistrationV1Api(api)
            if mutating:
                admission.create_mutating_webhook_configuration(cast(Any, body))
            else:
                admission.create_validating_webhook_configuration(cast(Any, body))
        return body
