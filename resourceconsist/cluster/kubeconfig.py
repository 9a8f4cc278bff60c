"""Kubeconfig and in-cluster configuration, read without the official ``kubernetes`` package.

``find_cluster`` says where a process finds its cluster, in controller-runtime's order (the one
order of every command and of ``KubeClient.auto``; docs/index.md, "Which cluster").
``load_kubeconfig`` and ``load_incluster`` give an ``Access``: the API server's address, how to
check it (CA, TLS server name, insecure) and how to authenticate (client certificate, a bearer
``TokenSource``: static, a token file re-read as it rotates, or an exec plugin). They cover the
common cases as kubectl reads them; a file that uses anything else (auth providers, basic auth,
proxies, impersonation, exec plugins that return certificates) raises ``Unsupported``, and the
caller reads it with the official client's loader instead. Importing that client costs the
controller ~17 MB and a quarter second, which is why this module exists at all.
"""

from __future__ import annotations

import atexit
import base64
import binascii
import contextlib
import datetime
import json
import os
import ssl
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import yaml

from resourceconsist.errors import ResourceConsistError

#: The ServiceAccount files a pod gets (read by ``load_incluster``).
SERVICE_TOKEN_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/token"
SERVICE_CA_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
#: How long a token file's content is trusted before it is read again (client-go's one minute).
TOKEN_FILE_PERIOD = 60.0
#: An exec plugin's token is used until this many seconds before its expiry.
EXEC_EXPIRY_MARGIN = 10.0
#: How long an exec plugin may run; it cannot prompt (stdin is not a terminal), so it should be quick.
EXEC_TIMEOUT = 60.0
_EXEC_API_VERSIONS = ("client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1")
#: The kubeconfig read when neither a path nor ``$KUBECONFIG`` names one (kubectl's).
DEFAULT_KUBECONFIG = os.path.join("~", ".kube", "config")


class KubeConfigError(ResourceConsistError, ValueError):
    """A configuration that cannot be used; the message says what is wrong and what to do."""


class Unsupported(Exception):
    """The configuration uses something only the official client's loader reads; ``reason`` says what."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class TokenSource(Protocol):
    """Where a bearer token comes from.

    ``dynamic`` is True when the token can change over time (token file, exec plugin): callers
    ask again every few seconds, from a thread, since a call may block (file read, subprocess).
    ``refresh=True`` means the server answered 401: read the file or run the plugin now."""

    @property
    def dynamic(self) -> bool: ...  # read-only: a class attribute or a property satisfies it

    def __call__(self, *, refresh: bool = False) -> str | None: ...


class StaticToken:
    """A token written in the kubeconfig."""

    dynamic = False

    def __init__(self, token: str) -> None:
        self._token = token

    def __call__(self, *, refresh: bool = False) -> str | None:
        return self._token

    def __repr__(self) -> str:
        return "StaticToken(<hidden>)"  # never print a credential


class FileToken:
    """A token file (kubeconfig ``tokenFile``, a pod's projected ServiceAccount token), read at
    most every ``TOKEN_FILE_PERIOD`` seconds: the kubelet rotates it in place."""

    dynamic = True

    def __init__(self, path: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self._clock = clock
        self._lock = threading.Lock()
        self._token = ""
        self._read_at: float | None = None
        self(refresh=True)  # a missing or empty file is an error at load time, not at the first request

    def __call__(self, *, refresh: bool = False) -> str | None:
        with self._lock:
            now = self._clock()
            if refresh or self._read_at is None or now - self._read_at >= TOKEN_FILE_PERIOD:
                try:
                    with open(self.path, encoding="utf-8") as f:
                        token = f.read().strip()
                except OSError as err:
                    raise KubeConfigError(f"cannot read token file {self.path}: {err.strerror}") from err
                if not token:
                    raise KubeConfigError(f"token file {self.path} is empty")
                self._token, self._read_at = token, now
            return self._token


class ExecToken:
    """A client-go credential plugin (kubeconfig ``users[].user.exec``), run without a terminal.
    Its token is kept until shortly before ``expirationTimestamp``, or until ``refresh``."""

    dynamic = True

    def __init__(self, spec: dict[str, Any], base_dir: str, clock: Callable[[], float] = time.time) -> None:
        api_version, command = spec.get("apiVersion"), spec.get("command")
        if not command or not isinstance(command, str):
            raise KubeConfigError("exec plugin has no command: set users[].user.exec.command")
        if api_version not in _EXEC_API_VERSIONS:
            raise Unsupported(f"exec apiVersion {api_version!r}")
        if spec.get("provideClusterInfo"):
            raise Unsupported("exec provideClusterInfo")
        if spec.get("interactiveMode") == "Always":
            raise Unsupported("exec interactiveMode Always")
        if "/" in command and not os.path.isabs(command):  # as kubectl: relative to the kubeconfig
            command = os.path.normpath(os.path.join(base_dir, command))
        self.argv = [command, *(str(a) for a in spec.get("args") or ())]
        self.api_version: str = api_version
        try:
            self._env = {str(e["name"]): str(e.get("value", "")) for e in spec.get("env") or ()}
        except (KeyError, TypeError, AttributeError) as err:
            raise KubeConfigError(f"exec plugin {command}: env must be a list of {{name, value}}") from err
        self._hint = str(spec.get("installHint") or "").strip()
        self._clock = clock
        self._lock = threading.Lock()
        self._token = ""
        self._valid_until: float | None = None
        self(refresh=True)  # run at load time, as the official loader: a broken plugin fails early

    def __call__(self, *, refresh: bool = False) -> str | None:
        with self._lock:
            if refresh or self._valid_until is None or self._clock() >= self._valid_until:
                self._token, self._valid_until = self._run()
            return self._token

    def _fail(self, what: str) -> KubeConfigError:
        hint = f"; {self._hint}" if self._hint else ""
        return KubeConfigError(f"exec plugin {self.argv[0]}: {what}{hint}")

    def _run(self) -> tuple[str, float]:
        info = {"apiVersion": self.api_version, "kind": "ExecCredential", "spec": {"interactive": False}}
        env = {**os.environ, **self._env, "KUBERNETES_EXEC_INFO": json.dumps(info)}
        try:
            done = subprocess.run(
                self.argv,
                check=False,
                env=env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=EXEC_TIMEOUT,
            )
        except subprocess.TimeoutExpired as err:
            raise self._fail(f"still running after {EXEC_TIMEOUT:g}s") from err
        except OSError as err:
            raise self._fail(
                "not found" if isinstance(err, FileNotFoundError) else f"cannot run: {err}"
            ) from err
        if done.returncode != 0:
            tail = done.stderr.decode(errors="replace").strip()[-1000:]
            raise self._fail(f"exited with {done.returncode}" + (f": {tail}" if tail else ""))
        try:
            cred = json.loads(done.stdout)
        except ValueError as err:
            raise self._fail(f"printed no JSON ExecCredential ({err})") from err
        status = cred.get("status") if isinstance(cred, dict) else None
        if not isinstance(status, dict):
            raise self._fail("printed no ExecCredential with a status")
        if cred.get("apiVersion") != self.api_version or cred.get("kind") != "ExecCredential":
            raise self._fail(f"printed {cred.get('kind')} {cred.get('apiVersion')}, not {self.api_version}")
        if status.get("clientCertificateData") or status.get("clientKeyData"):
            raise Unsupported("exec plugin returns a client certificate (clientCertificateData)")
        token = status.get("token")
        if not token or not isinstance(token, str):
            raise self._fail("printed no status.token")
        expiry = status.get("expirationTimestamp")
        if not expiry:
            return token, float("inf")
        try:
            when = datetime.datetime.fromisoformat(str(expiry).upper())
        except ValueError as err:
            raise self._fail(f"printed a bad expirationTimestamp {expiry!r}") from err
        when = when if when.tzinfo else when.replace(tzinfo=datetime.UTC)  # RFC 3339 has one; else UTC
        return token, when.timestamp() - EXEC_EXPIRY_MARGIN


@dataclass(frozen=True)
class Access:
    """How to reach and authenticate to one API server."""

    host: str  # "https://h:port" (or http://), no trailing slash
    verify: bool = True  # False for insecure-skip-tls-verify
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    tls_server_name: str | None = None
    token: TokenSource | None = None

    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context for an https host (None for http): the CA, the client certificate."""
        if not self.host.startswith("https:"):
            return None
        context = ssl.create_default_context(cafile=self.ca_file or None)
        if self.cert_file:
            context.load_cert_chain(self.cert_file, self.key_file)
        if not self.verify:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        return context

    def bearer(self, *, refresh: bool = False) -> str | None:
        """The bearer token (without "Bearer "), or None without one."""
        return self.token(refresh=refresh) if self.token is not None else None


# -- kubeconfig files ------------------------------------------------------------------------

_temp_files: dict[bytes, str] = {}
_temp_lock = threading.Lock()


def _remove_temp_files() -> None:
    for name in _temp_files.values():
        with contextlib.suppress(OSError):
            os.remove(name)


atexit.register(_remove_temp_files)


def _temp_file(content: bytes) -> str:
    """A private (0600) file holding ``content``: one per distinct content in the process."""
    with _temp_lock:
        name = _temp_files.get(content)
        if name is None or not os.path.isfile(name):  # recreated if something cleaned /tmp
            fd, name = tempfile.mkstemp(prefix="kubeconfig-", suffix=".pem")
            with os.fdopen(fd, "wb") as f:
                f.write(content)
            _temp_files[content] = name
        return name


def _file_or_data(where: str, entry: dict[str, Any], key: str, base_dir: str) -> str | None:
    """The file behind ``key`` (relative to the kubeconfig) or ``key-data`` (base64, preferred)."""
    if data := entry.get(f"{key}-data"):
        try:
            # Whitespace is skipped, as Go's decoder skips line breaks; anything else is an error.
            return _temp_file(base64.b64decode("".join(str(data).split()), validate=True))
        except (binascii.Error, TypeError, ValueError) as err:
            raise KubeConfigError(f"{where}: {key}-data is not base64 ({err}); fix it") from err
    if path := entry.get(key):
        path = os.path.normpath(os.path.join(base_dir, str(path)))
        if not os.path.isfile(path):
            raise KubeConfigError(f"{where}: {key} {path} does not exist; fix the path")
        return path
    return None


def _read(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            config = yaml.safe_load(f)
    except yaml.YAMLError as err:
        raise KubeConfigError(f"kubeconfig {path} is not valid YAML: {err}") from err
    except OSError as err:
        raise KubeConfigError(f"cannot read kubeconfig {path}: {err.strerror}") from err
    if config is None:
        return {}  # an empty file, as kubectl: it adds nothing
    if not isinstance(config, dict):
        raise KubeConfigError(f"kubeconfig {path} is not a mapping (apiVersion: v1, kind: Config)")
    return config


_Named = dict[str, tuple[dict[str, Any], str]]  # name -> (entry, directory of the file defining it)


def _merge(paths: list[str]) -> tuple[str, dict[str, _Named]]:
    """kubectl's merge: each named cluster/user/context, and current-context, from the first file
    that sets it."""
    current = ""
    named: dict[str, _Named] = {"cluster": {}, "user": {}, "context": {}}
    for path in paths:
        config, base_dir = _read(path), os.path.dirname(os.path.abspath(path))
        current = current or str(config.get("current-context") or "")
        for kind, entries in named.items():
            for i, item in enumerate(config.get(f"{kind}s") or ()):
                body = (item.get(kind) or {}) if isinstance(item, dict) else None
                if not isinstance(body, dict) or not item.get("name"):
                    raise KubeConfigError(f"kubeconfig {path}: {kind}s[{i}] is not a named {kind}; fix it")
                entries.setdefault(str(item["name"]), (body, base_dir))
    return current, named


def _entry(label: str, named: _Named, kind: str, name: str, remedy: str) -> tuple[dict[str, Any], str]:
    if name not in named:
        have = ", ".join(sorted(named)) or "none"
        raise KubeConfigError(f'kubeconfig {label} has no {kind} "{name}" (it has: {have}); {remedy}')
    return named[name]


@dataclass(frozen=True)
class ClusterSource:
    """Where a process finds its cluster (``find_cluster``)."""

    #: The kubeconfig to read, one path or several separated by ``os.pathsep``; None: the
    #: in-cluster config.
    kubeconfig: str | None
    #: What chose it: ``--kubeconfig`` (a path given), ``$KUBECONFIG``, ``in-cluster`` or
    #: ``~/.kube/config``; error messages name it.
    origin: str


def find_cluster(kubeconfig: str | None = None, context: str | None = None) -> ClusterSource:
    """Where the cluster is, in controller-runtime's order: the ``kubeconfig`` given (a
    command's ``--kubeconfig``); else ``$KUBECONFIG``; else the in-cluster config when this
    process runs in a pod (``$KUBERNETES_SERVICE_HOST`` is set), so a pod's own ServiceAccount
    wins over a stray file in its image; else ``~/.kube/config``. ``context`` (``--context``)
    picks a kubeconfig's context; with the in-cluster config, which has none, it is an error
    rather than ignored. Raises ``KubeConfigError`` when none applies. It reads no file: a
    kubeconfig chosen may still be missing or unusable."""
    if kubeconfig:
        return ClusterSource(kubeconfig, "--kubeconfig")
    if from_environment := os.environ.get("KUBECONFIG"):
        return ClusterSource(from_environment, "$KUBECONFIG")
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        if context:
            raise KubeConfigError(
                f"--context {context} names a kubeconfig's context, but in a pod without "
                "--kubeconfig or $KUBECONFIG the in-cluster config is used, which has none; pass "
                "--kubeconfig PATH with it, or drop --context"
            )
        return ClusterSource(None, "in-cluster")
    default = os.path.expanduser(DEFAULT_KUBECONFIG)
    if os.path.isfile(default):
        return ClusterSource(default, DEFAULT_KUBECONFIG)
    raise KubeConfigError(
        f"no kubeconfig: $KUBECONFIG is not set, {default} does not exist and this is not a pod in "
        "a cluster; pass --kubeconfig PATH or set $KUBECONFIG"
    )


def load_kubeconfig(path: str | None = None, context: str | None = None) -> Access:
    """The ``Access`` of ``context`` (default: current-context) in the kubeconfig at ``path``:
    ``$KUBECONFIG`` when None, else ~/.kube/config. ``path`` (like ``$KUBECONFIG``) may list
    several files separated by ``os.pathsep``, merged as kubectl does; missing ones are skipped."""
    label = path or os.environ.get("KUBECONFIG") or DEFAULT_KUBECONFIG
    paths = [p for p in (os.path.expanduser(p) for p in label.split(os.pathsep) if p) if os.path.exists(p)]
    if not paths:
        raise KubeConfigError(f"no kubeconfig at {label}: pass --kubeconfig PATH or set $KUBECONFIG")
    current, named = _merge(paths)
    contexts = sorted(named["context"])
    if not contexts:
        raise KubeConfigError(f"kubeconfig {label} has no contexts; add one (kubectl config set-context)")
    if not (name := context or current):
        raise KubeConfigError(
            f"kubeconfig {label} sets no current-context (it has: {', '.join(contexts)}); pass "
            f"--context {contexts[0]} or run kubectl config use-context {contexts[0]}"
        )
    remedy = (
        "pass one of them with --context"
        if context
        else f"pass one of them with --context, or run kubectl config use-context {contexts[0]}"
    )
    ctx, _ = _entry(label, named["context"], "context", name, remedy)
    cname, uname = str(ctx.get("cluster") or ""), str(ctx.get("user") or "")
    if not cname:
        raise KubeConfigError(f'kubeconfig {label}: context "{name}" names no cluster; set its cluster')
    cluster, cluster_dir = _entry(label, named["cluster"], "cluster", cname, f'fix context "{name}"')
    user, user_dir = (
        _entry(label, named["user"], "user", uname, f'fix context "{name}"') if uname else ({}, "")
    )
    if cluster.get("proxy-url"):
        raise Unsupported(f'cluster "{cname}" sets proxy-url')
    for key in ("auth-provider", "username", "password", "as", "as-uid", "as-groups", "as-user-extra"):
        if user.get(key):
            raise Unsupported(f'user "{uname}" sets {key}')
    if not (server := str(cluster.get("server") or "").rstrip("/")):
        raise KubeConfigError(f'kubeconfig {label}: cluster "{cname}" has no server; set its server URL')
    token: TokenSource | None = None
    if user.get("token"):  # the official loader's order: a token (inline, then file), else exec
        token = StaticToken(str(user["token"]))
    elif user.get("tokenFile"):
        token = FileToken(os.path.normpath(os.path.join(user_dir, str(user["tokenFile"]))))
    elif isinstance(user.get("exec"), dict):
        token = ExecToken(user["exec"], user_dir)
    https = server.startswith("https:")  # as the official loader: certificates only for https
    in_c, in_u = f'kubeconfig {label}: cluster "{cname}"', f'kubeconfig {label}: user "{uname}"'
    return Access(
        host=server,
        verify=not cluster.get("insecure-skip-tls-verify"),
        ca_file=_file_or_data(in_c, cluster, "certificate-authority", cluster_dir) if https else None,
        cert_file=_file_or_data(in_u, user, "client-certificate", user_dir) if https else None,
        key_file=_file_or_data(in_u, user, "client-key", user_dir) if https else None,
        tls_server_name=str(cluster.get("tls-server-name") or "") or None,
        token=token,
    )


def load_incluster() -> Access:
    """The pod's ServiceAccount: the API server from KUBERNETES_SERVICE_HOST/_PORT, the token file
    (re-read as it rotates) and the cluster's CA."""
    env = {n: os.environ.get(n, "") for n in ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT")}
    if missing := [n for n, v in env.items() if not v]:
        raise KubeConfigError(
            f"not in a pod: {' and '.join(missing)} not set; outside one, pass --kubeconfig"
        )
    host, port = env.values()
    if ":" in host or "%" in host:  # an IPv6 address, as Go's net.JoinHostPort
        host = f"[{host}]"
    for what, path in (("ServiceAccount token", SERVICE_TOKEN_FILE), ("cluster CA", SERVICE_CA_FILE)):
        if not os.path.isfile(path) or os.path.getsize(path) == 0:
            raise KubeConfigError(f"in-cluster: no {what} at {path}; is automountServiceAccountToken off?")
    return Access(host=f"https://{host}:{port}", ca_file=SERVICE_CA_FILE, token=FileToken(SERVICE_TOKEN_FILE))
