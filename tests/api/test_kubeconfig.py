"""resourceconsist.cluster.kubeconfig: the kubeconfig and in-cluster loader that spares the controller the
official client. Its results are compared with what the official loader puts in a
``kubernetes.client.Configuration`` for the same files; the tests may import the official client,
the module may not (the last test checks it does not)."""

from __future__ import annotations

import base64
import datetime
import json
import os
import ssl
import stat
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from resourceconsist.cluster import certs, kubeconfig
from resourceconsist.cluster.kube import KubeClient
from resourceconsist.cluster.kubeconfig import (
    Access,
    ClusterSource,
    KubeConfigError,
    Unsupported,
    find_cluster,
    load_incluster,
    load_kubeconfig,
)

SERVER = "https://api.example.test:6443"


@pytest.fixture(scope="module")
def pems() -> dict[str, bytes]:
    """A real CA and a client certificate it signed, as PEM."""
    ca = certs.make_ca("kubeconfig-test-ca")
    client = certs.make_signed(ca, "alice", server=False, client=True)
    return {"ca": ca.cert_pem, "cert": client.cert_pem, "key": client.key_pem}


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def write(path: Path, data: bytes | str) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    return str(path)


def kubeconfig_file(
    path: Path,
    *,
    cluster: dict[str, Any] | None = None,
    user: dict[str, Any] | None = None,
    current: str | None = "main",
    extra: dict[str, Any] | None = None,
) -> str:
    """A kubeconfig with one context "main" on cluster "c" and user "u" (plus ``extra`` keys)."""
    config: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": SERVER, **(cluster or {})}}],
        "users": [{"name": "u", "user": user or {}}],
        "contexts": [{"name": "main", "context": {"cluster": "c", "user": "u", "namespace": "ns"}}],
        **(extra or {}),
    }
    if current is not None:
        config["current-context"] = current
    return write(path, yaml.safe_dump(config))


def exec_plugin(tmp_path: Path, body: str = "") -> Path:
    """An exec credential plugin: logs each run (its env and stdin) to $RUNS, then prints an
    ExecCredential with $TOKEN and $EXPIRY unless ``body`` does something else first."""
    script = tmp_path / "bin" / "plugin"
    write(
        script,
        f"""#!{sys.executable}
import json, os, sys
with open(os.environ["RUNS"], "a") as log:
    log.write(json.dumps({{"info": os.environ.get("KUBERNETES_EXEC_INFO"), "argv": sys.argv[1:],
                          "tty": sys.stdin.isatty(), "env": os.environ.get("GREETING")}}) + "\\n")
{body}
status = {{"token": os.environ["TOKEN"]}}
if os.environ.get("EXPIRY"):
    status["expirationTimestamp"] = os.environ["EXPIRY"]
info = json.loads(os.environ["KUBERNETES_EXEC_INFO"])
print(json.dumps({{"apiVersion": info["apiVersion"], "kind": "ExecCredential", "status": status}}))
""",
    )
    script.chmod(0o755)
    return script


def exec_user(tmp_path: Path, command: str, *, expiry: str = "", **more: Any) -> dict[str, Any]:
    env = {"RUNS": str(tmp_path / "runs"), "TOKEN": "exec-token", "EXPIRY": expiry, "GREETING": "hi"}
    return {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1",
            "command": command,
            "args": ["--flag", "x"],
            "env": [{"name": k, "value": v} for k, v in env.items()],
            "interactiveMode": "Never",
            **more,
        }
    }


def runs(tmp_path: Path) -> list[dict[str, Any]]:
    log = tmp_path / "runs"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


# -- the same results as the official loader -------------------------------------------------


def _token(tmp_path: Path, pems: dict[str, bytes]) -> tuple[str, str | None]:
    write(tmp_path / "ca.pem", pems["ca"])
    cluster = {"server": SERVER + "/", "certificate-authority": "ca.pem"}
    return kubeconfig_file(tmp_path / "config", cluster=cluster, user={"token": "t0k"}), None


def _token_file(tmp_path: Path, pems: dict[str, bytes]) -> tuple[str, str | None]:
    write(tmp_path / "secrets" / "token", "from-file")
    return kubeconfig_file(tmp_path / "config", user={"tokenFile": "secrets/token"}), None


def _cert_files(tmp_path: Path, pems: dict[str, bytes]) -> tuple[str, str | None]:
    write(tmp_path / "kube" / "pki" / "client.crt", pems["cert"])
    write(tmp_path / "kube" / "pki" / "client.key", pems["key"])
    write(tmp_path / "kube" / "pki" / "ca.crt", pems["ca"])
    user = {"client-certificate": "pki/client.crt", "client-key": "pki/client.key"}
    cluster = {"certificate-authority": str(tmp_path / "kube" / "pki" / "ca.crt")}  # absolute
    return kubeconfig_file(tmp_path / "kube" / "config", cluster=cluster, user=user), None


def _data(tmp_path: Path, pems: dict[str, bytes]) -> tuple[str, str | None]:
    user = {"client-certificate-data": b64(pems["cert"]), "client-key-data": b64(pems["key"]), "token": "t"}
    cluster = {"certificate-authority-data": b64(pems["ca"])}
    return kubeconfig_file(tmp_path / "config", cluster=cluster, user=user), None


def _data_wrapped(tmp_path: Path, pems: dict[str, bytes]) -> tuple[str, str | None]:
    """-data with line breaks, as some tools write it."""
    wrapped = "\n".join(textwrap.wrap(b64(pems["ca"]), 64))
    return kubeconfig_file(tmp_path / "config", cluster={"certificate-authority-data": wrapped}), None


def _data_over_file(tmp_path: Path, pems: dict[str, bytes]) -> tuple[str, str | None]:
    cluster = {"certificate-authority-data": b64(pems["ca"]), "certificate-authority": "missing.pem"}
    return kubeconfig_file(tmp_path / "config", cluster=cluster), None


def _insecure(tmp_path: Path, pems: dict[str, bytes]) -> tuple[str, str | None]:
    return kubeconfig_file(tmp_path / "config", cluster={"insecure-skip-tls-verify": True}), None


def _tls_server_name(tmp_path: Path, pems: dict[str, bytes]) -> tuple[str, str | None]:
    cluster = {"certificate-authority-data": b64(pems["ca"]), "tls-server-name": "kubernetes.default"}
    return kubeconfig_file(tmp_path / "config", cluster=cluster, user={"token": "t"}), None


def _http(tmp_path: Path, pems: dict[str, bytes]) -> tuple[str, str | None]:
    return kubeconfig_file(tmp_path / "config", cluster={"server": "http://127.0.0.1:8080"}), None


def _merged(tmp_path: Path, pems: dict[str, bytes]) -> tuple[str, str | None]:
    """Two files, as $KUBECONFIG lists them: the first defines the context and its user, the
    second the cluster (its CA relative to itself) and another user "u" that loses."""
    first = write(
        tmp_path / "a" / "config",
        yaml.safe_dump(
            {
                "current-context": "main",
                "contexts": [{"name": "main", "context": {"cluster": "c", "user": "u"}}],
                "users": [{"name": "u", "user": {"token": "first"}}],
            }
        ),
    )
    write(tmp_path / "b" / "ca.pem", pems["ca"])
    cluster = {"certificate-authority": "ca.pem"}
    second = kubeconfig_file(
        tmp_path / "b" / "config", cluster=cluster, user={"token": "second"}, current=None
    )
    return os.pathsep.join([first, str(tmp_path / "absent"), second]), None


def _named_context(tmp_path: Path, pems: dict[str, bytes]) -> tuple[str, str | None]:
    extra = {
        "clusters": [
            {"name": "c", "cluster": {"server": SERVER}},
            {
                "name": "other",
                "cluster": {"server": "https://10.0.0.1:443", "insecure-skip-tls-verify": True},
            },
        ],
        "users": [{"name": "u", "user": {"token": "u"}}, {"name": "v", "user": {"token": "v"}}],
        "contexts": [
            {"name": "main", "context": {"cluster": "c", "user": "u"}},
            {"name": "side", "context": {"cluster": "other", "user": "v"}},
        ],
    }
    return kubeconfig_file(tmp_path / "config", extra=extra), "side"


def _no_user(tmp_path: Path, pems: dict[str, bytes]) -> tuple[str, str | None]:
    extra = {"contexts": [{"name": "main", "context": {"cluster": "c"}}]}
    return kubeconfig_file(tmp_path / "config", extra=extra), None


def _exec(tmp_path: Path, pems: dict[str, bytes]) -> tuple[str, str | None]:
    exec_plugin(tmp_path)
    return kubeconfig_file(tmp_path / "config", user=exec_user(tmp_path, "./bin/plugin")), None


CASES: dict[str, Callable[[Path, dict[str, bytes]], tuple[str, str | None]]] = {
    "token": _token,
    "tokenFile": _token_file,
    "client cert files": _cert_files,
    "-data": _data,
    "-data wrapped": _data_wrapped,
    "data over file": _data_over_file,
    "insecure": _insecure,
    "tls-server-name": _tls_server_name,
    "http": _http,
    "merged": _merged,
    "named context": _named_context,
    "no user": _no_user,
    "exec": _exec,
}


def _bytes(path: str | None) -> bytes | None:
    return None if path is None else Path(path).read_bytes()


@pytest.mark.parametrize("case", CASES)
def test_same_as_the_official_loader(
    case: str, tmp_path: Path, pems: dict[str, bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    from kubernetes import client, config

    config_file, context = CASES[case](tmp_path, pems)
    monkeypatch.chdir(tmp_path.parent)  # relative paths resolve against the kubeconfig, not the cwd
    official = client.Configuration()
    config.load_kube_config(
        config_file=config_file, context=context, client_configuration=official, persist_config=False
    )
    ours = load_kubeconfig(config_file, context)

    assert ours.host == official.host
    assert ours.verify == official.verify_ssl
    assert ours.tls_server_name == official.tls_server_name
    assert _bytes(ours.ca_file) == _bytes(official.ssl_ca_cert)
    assert _bytes(ours.cert_file) == _bytes(official.cert_file)
    assert _bytes(ours.key_file) == _bytes(official.key_file)
    bearer = official.get_api_key_with_prefix("BearerToken", alias="authorization")
    assert ours.bearer() == (bearer.removeprefix("Bearer ") if bearer else None)
    if ours.ca_file or ours.cert_file:
        assert ours.ssl_context() is not None  # the real PEMs load


def test_kubeconfig_env_lists_files(
    tmp_path: Path, pems: dict[str, bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    joined, _ = _merged(tmp_path, pems)
    monkeypatch.setenv("KUBECONFIG", joined)
    access = load_kubeconfig()
    assert access.bearer() == "first"
    assert _bytes(access.ca_file) == pems["ca"]


def test_current_context_from_the_first_file_that_sets_it(tmp_path: Path) -> None:
    """kubectl's rule (the official Python loader takes the last one)."""
    first = kubeconfig_file(tmp_path / "a", current="main", user={"token": "a"})
    extra = {"contexts": [{"name": "b", "context": {"cluster": "c", "user": "u"}}]}
    second = kubeconfig_file(tmp_path / "b", current="b", extra=extra)
    assert load_kubeconfig(os.pathsep.join([second, first])).bearer() is None  # "b", user "u" of the second
    assert load_kubeconfig(os.pathsep.join([first, second])).bearer() == "a"


def test_data_temp_files_are_private_and_shared(tmp_path: Path, pems: dict[str, bytes]) -> None:
    path = kubeconfig_file(tmp_path / "config", cluster={"certificate-authority-data": b64(pems["ca"])})
    first, second = load_kubeconfig(path), load_kubeconfig(path)
    assert first.ca_file is not None
    assert first.ca_file == second.ca_file
    assert stat.S_IMODE(os.stat(first.ca_file).st_mode) == 0o600


def test_static_token_is_not_dynamic_nor_printed(tmp_path: Path) -> None:
    access = load_kubeconfig(kubeconfig_file(tmp_path / "config", user={"token": "s3cret"}))
    assert access.token is not None
    assert not access.token.dynamic
    assert access.bearer(refresh=True) == "s3cret"
    assert "s3cret" not in repr(access)


# -- token file ------------------------------------------------------------------------------


def test_token_file_is_reread_on_refresh_and_after_its_period(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    token = tmp_path / "token"
    token.write_text("one\n")
    access = load_kubeconfig(kubeconfig_file(tmp_path / "config", user={"tokenFile": "token"}))
    assert access.token is not None
    assert access.token.dynamic
    assert access.bearer() == "one"
    token.write_text("two")
    assert access.bearer() == "one"  # within TOKEN_FILE_PERIOD
    assert access.bearer(refresh=True) == "two"
    token.write_text("three")
    monkeypatch.setattr(kubeconfig, "TOKEN_FILE_PERIOD", 0.0)
    assert access.bearer() == "three"


def test_token_file_missing_or_empty(tmp_path: Path) -> None:
    with pytest.raises(KubeConfigError, match=r"cannot read token file .*nope"):
        load_kubeconfig(kubeconfig_file(tmp_path / "config", user={"tokenFile": "nope"}))
    write(tmp_path / "empty", "")
    with pytest.raises(KubeConfigError, match=r"token file .*empty is empty"):
        load_kubeconfig(kubeconfig_file(tmp_path / "config", user={"tokenFile": "empty"}))


# -- exec plugins ----------------------------------------------------------------------------


def _in(hours: float) -> str:
    when = datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=hours)
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def test_exec_plugin_runs_with_its_env_and_exec_info(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    exec_plugin(tmp_path)
    path = kubeconfig_file(tmp_path / "config", user=exec_user(tmp_path, "./bin/plugin"))
    monkeypatch.chdir(tmp_path.parent)
    access = load_kubeconfig(path)
    assert access.token is not None
    assert access.token.dynamic
    assert access.bearer() == "exec-token"
    [run] = runs(tmp_path)
    assert run["env"] == "hi"
    assert run["argv"] == ["--flag", "x"]
    assert run["tty"] is False
    assert json.loads(run["info"]) == {
        "apiVersion": "client.authentication.k8s.io/v1",
        "kind": "ExecCredential",
        "spec": {"interactive": False},
    }


def test_exec_v1beta1(tmp_path: Path) -> None:
    plugin = exec_plugin(tmp_path)
    user = exec_user(tmp_path, str(plugin), apiVersion="client.authentication.k8s.io/v1beta1")
    access = load_kubeconfig(kubeconfig_file(tmp_path / "config", user=user))
    assert access.bearer() == "exec-token"
    assert json.loads(runs(tmp_path)[0]["info"])["apiVersion"] == "client.authentication.k8s.io/v1beta1"


def test_exec_token_is_cached_until_its_expiry(tmp_path: Path) -> None:
    plugin = exec_plugin(tmp_path)
    access = load_kubeconfig(
        kubeconfig_file(tmp_path / "config", user=exec_user(tmp_path, str(plugin), expiry=_in(1)))
    )
    assert access.bearer() == access.bearer() == "exec-token"
    assert len(runs(tmp_path)) == 1  # the load's run
    access.bearer(refresh=True)
    assert len(runs(tmp_path)) == 2


def test_exec_token_without_expiry_is_kept_until_refresh(tmp_path: Path) -> None:
    plugin = exec_plugin(tmp_path)
    access = load_kubeconfig(kubeconfig_file(tmp_path / "config", user=exec_user(tmp_path, str(plugin))))
    access.bearer()
    access.bearer()
    assert len(runs(tmp_path)) == 1
    access.bearer(refresh=True)
    assert len(runs(tmp_path)) == 2


@pytest.mark.parametrize("hours", [-1, 5 / 3600], ids=["past", "within the margin"])
def test_exec_token_expired_runs_on_each_call(tmp_path: Path, hours: float) -> None:
    plugin = exec_plugin(tmp_path)
    user = exec_user(tmp_path, str(plugin), expiry=_in(hours))
    access = load_kubeconfig(kubeconfig_file(tmp_path / "config", user=user))
    access.bearer()
    access.bearer()
    assert len(runs(tmp_path)) == 3


def test_exec_failure_names_exit_code_stderr_and_install_hint(tmp_path: Path) -> None:
    plugin = exec_plugin(tmp_path, body='sys.stderr.write("no credentials here\\n"); sys.exit(3)')
    user = exec_user(tmp_path, str(plugin), installHint="Install it with: brew install plugin")
    with pytest.raises(KubeConfigError) as caught:
        load_kubeconfig(kubeconfig_file(tmp_path / "config", user=user))
    message = str(caught.value)
    assert "exited with 3" in message
    assert "no credentials here" in message
    assert "brew install plugin" in message


def test_exec_not_found_names_install_hint(tmp_path: Path) -> None:
    user = exec_user(tmp_path, "./no-such-plugin", installHint="get it from example.test")
    with pytest.raises(KubeConfigError, match=r"no-such-plugin: not found; get it from example\.test"):
        load_kubeconfig(kubeconfig_file(tmp_path / "config", user=user))


def test_exec_bad_output(tmp_path: Path) -> None:
    plugin = exec_plugin(tmp_path, body='print("not json"); sys.exit(0)')
    with pytest.raises(KubeConfigError, match="no JSON ExecCredential"):
        load_kubeconfig(kubeconfig_file(tmp_path / "config", user=exec_user(tmp_path, str(plugin))))


def test_exec_returning_a_client_certificate_is_unsupported(tmp_path: Path) -> None:
    body = (
        'print(json.dumps({"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential",'
        ' "status": {"clientCertificateData": "x", "clientKeyData": "y"}})); sys.exit(0)'
    )
    plugin = exec_plugin(tmp_path, body=body)
    with pytest.raises(Unsupported) as caught:
        load_kubeconfig(kubeconfig_file(tmp_path / "config", user=exec_user(tmp_path, str(plugin))))
    assert "clientCertificateData" in caught.value.reason


# -- in-cluster ------------------------------------------------------------------------------


@pytest.fixture
def pod(tmp_path: Path, pems: dict[str, bytes], monkeypatch: pytest.MonkeyPatch) -> Path:
    """The ServiceAccount files a pod gets, in tmp_path, and the Service's env."""
    monkeypatch.setattr(kubeconfig, "SERVICE_TOKEN_FILE", write(tmp_path / "token", "sa-token\n"))
    monkeypatch.setattr(kubeconfig, "SERVICE_CA_FILE", write(tmp_path / "ca.crt", pems["ca"]))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    return tmp_path


@pytest.mark.parametrize(
    ("host", "url"), [("10.96.0.1", "https://10.96.0.1:443"), ("fd00::1", "https://[fd00::1]:443")]
)
def test_incluster(pod: Path, monkeypatch: pytest.MonkeyPatch, host: str, url: str) -> None:
    from kubernetes import client
    from kubernetes.config.incluster_config import InClusterConfigLoader

    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", host)
    access = load_incluster()
    official = client.Configuration()
    InClusterConfigLoader(str(pod / "token"), str(pod / "ca.crt")).load_and_set(official)
    assert access.host == official.host == url
    assert access.ca_file == official.ssl_ca_cert == str(pod / "ca.crt")
    assert access.verify
    assert access.token is not None
    assert access.token.dynamic
    assert access.bearer() == "sa-token"
    assert isinstance(access.ssl_context(), ssl.SSLContext)
    (pod / "token").write_text("rotated")
    assert access.bearer(refresh=True) == "rotated"


@pytest.mark.parametrize("missing", ["KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"])
def test_incluster_without_env(pod: Path, monkeypatch: pytest.MonkeyPatch, missing: str) -> None:
    monkeypatch.delenv(missing)
    with pytest.raises(KubeConfigError, match=f"{missing} not set; outside one, pass --kubeconfig"):
        load_incluster()


@pytest.mark.parametrize("name", ["token", "ca.crt"])
def test_incluster_without_files(pod: Path, name: str) -> None:
    (pod / name).unlink()
    with pytest.raises(KubeConfigError, match=f"no .* at {pod / name}"):
        load_incluster()


# -- which cluster: one order for the command line and KubeClient.auto ------------------------


def test_the_cluster_is_found_in_controller_runtimes_order(
    pod: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # In a pod ($KUBERNETES_SERVICE_HOST, from the fixture), with $KUBECONFIG and a home kubeconfig.
    home = tmp_path / "home"
    kubeconfig_file(home / ".kube" / "config", user={"token": "home"})
    from_env = kubeconfig_file(tmp_path / "env-config", user={"token": "env"})
    given = kubeconfig_file(tmp_path / "given-config", user={"token": "given"})
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("KUBECONFIG", from_env)
    assert find_cluster(given) == ClusterSource(given, "--kubeconfig")
    assert find_cluster() == ClusterSource(from_env, "$KUBECONFIG")
    monkeypatch.delenv("KUBECONFIG")
    assert find_cluster() == ClusterSource(None, "in-cluster")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST")
    assert find_cluster() == ClusterSource(str(home / ".kube" / "config"), "~/.kube/config")
    (home / ".kube" / "config").unlink()
    with pytest.raises(
        KubeConfigError, match=r"^no kubeconfig: \$KUBECONFIG is not set, .* pass --kubeconfig"
    ):
        find_cluster()


def test_kube_client_auto_takes_the_same_order_as_the_command_line(
    pod: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # $KUBECONFIG wins over the in-cluster config, as on the command line (it used to be the
    # other way round for KubeClient.auto).
    monkeypatch.setenv("KUBECONFIG", kubeconfig_file(tmp_path / "config", user={"token": "env"}))
    client = KubeClient.auto()
    assert client.access is not None and client.access.host == SERVER and client.access.bearer() == "env"
    client.close()
    monkeypatch.delenv("KUBECONFIG")
    in_pod = KubeClient.auto()
    assert in_pod.access is not None and in_pod.access.host == "https://10.96.0.1:443"
    in_pod.close()


def test_a_context_is_honoured_and_is_an_error_where_no_kubeconfig_is_read(
    pod: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = {"name": "other", "context": {"cluster": "c", "user": "o"}}
    extra = {
        "contexts": [{"name": "main", "context": {"cluster": "c", "user": "u"}}, other],
        "users": [{"name": "u", "user": {"token": "main"}}, {"name": "o", "user": {"token": "other"}}],
    }
    path = kubeconfig_file(tmp_path / "config", extra=extra)
    client = KubeClient.auto(path, context="other")
    assert client.access is not None and client.access.bearer() == "other"
    client.close()
    with pytest.raises(KubeConfigError, match="--context other names a kubeconfig's context, but in a pod"):
        KubeClient.auto(context="other")


# -- what only the official loader reads -----------------------------------------------------


UNSUPPORTED: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "auth-provider": ({}, {"auth-provider": {"name": "oidc", "config": {"id-token": "x"}}}),
    "username": ({}, {"username": "admin", "password": "secret"}),
    "password": ({}, {"password": "secret"}),
    "proxy-url": ({"proxy-url": "http://proxy:3128"}, {"token": "t"}),
    "as": ({}, {"token": "t", "as": "someone"}),
    "as-groups": ({}, {"token": "t", "as-groups": ["system:masters"]}),
    "provideClusterInfo": (
        {},
        {
            "exec": {
                "apiVersion": "client.authentication.k8s.io/v1",
                "command": "x",
                "provideClusterInfo": True,
            }
        },
    ),
    "interactiveMode Always": (
        {},
        {
            "exec": {
                "apiVersion": "client.authentication.k8s.io/v1",
                "command": "x",
                "interactiveMode": "Always",
            }
        },
    ),
    "v1alpha1": ({}, {"exec": {"apiVersion": "client.authentication.k8s.io/v1alpha1", "command": "x"}}),
}


@pytest.mark.parametrize("key", UNSUPPORTED)
def test_unsupported(tmp_path: Path, key: str) -> None:
    cluster, user = UNSUPPORTED[key]
    with pytest.raises(Unsupported) as caught:
        load_kubeconfig(kubeconfig_file(tmp_path / "config", cluster=cluster, user=user))
    assert key in caught.value.reason


def test_harmless_unknown_keys_are_ignored(tmp_path: Path) -> None:
    ext = [{"name": "x", "extension": {"a": 1}}]
    path = kubeconfig_file(
        tmp_path / "config",
        cluster={"extensions": ext, "disable-compression": True},
        user={"token": "t", "extensions": ext},
        extra={"preferences": {"colors": True}, "extensions": ext},
    )
    assert load_kubeconfig(path).bearer() == "t"


# -- errors that say what to do --------------------------------------------------------------


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(
        KubeConfigError, match=r"no kubeconfig at .*nope: pass --kubeconfig PATH or set \$KUBECONFIG"
    ):
        load_kubeconfig(str(tmp_path / "nope"))


def test_default_is_home_kube_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(KubeConfigError, match=r"no kubeconfig at ~/\.kube/config"):
        load_kubeconfig()
    kubeconfig_file(tmp_path / ".kube" / "config", user={"token": "home"})
    assert load_kubeconfig().bearer() == "home"


def test_invalid_yaml(tmp_path: Path) -> None:
    path = write(tmp_path / "config", "clusters: [\n  - {name: c\n")
    with pytest.raises(KubeConfigError, match=r"(?s)is not valid YAML: while parsing .* line 2, column 3"):
        load_kubeconfig(path)


def test_no_current_context(tmp_path: Path) -> None:
    path = kubeconfig_file(tmp_path / "config", current=None)
    with pytest.raises(KubeConfigError) as caught:
        load_kubeconfig(path)
    assert str(caught.value) == (
        f"kubeconfig {path} sets no current-context (it has: main); pass --context main "
        "or run kubectl config use-context main"
    )
    assert load_kubeconfig(path, context="main").host  # the advice works


def test_unknown_context(tmp_path: Path) -> None:
    path = kubeconfig_file(tmp_path / "config")
    with pytest.raises(KubeConfigError) as caught:
        load_kubeconfig(path, context="foo")
    assert str(caught.value) == (
        f'kubeconfig {path} has no context "foo" (it has: main); pass one of them with --context'
    )


@pytest.mark.parametrize("kind", ["cluster", "user"])
def test_unknown_cluster_or_user(tmp_path: Path, kind: str) -> None:
    context = {"cluster": "c", "user": "u", kind: "gone"}
    path = kubeconfig_file(tmp_path / "config", extra={"contexts": [{"name": "main", "context": context}]})
    with pytest.raises(
        KubeConfigError, match=f'has no {kind} "gone" \\(it has: {kind[0]}\\); fix context "main"'
    ):
        load_kubeconfig(path)


def test_cluster_without_server(tmp_path: Path) -> None:
    path = kubeconfig_file(tmp_path / "config", cluster={"server": ""})
    with pytest.raises(KubeConfigError, match='cluster "c" has no server; set its server URL'):
        load_kubeconfig(path)


def test_missing_certificate_file(tmp_path: Path) -> None:
    path = kubeconfig_file(tmp_path / "config", cluster={"certificate-authority": "ca.pem"})
    with pytest.raises(KubeConfigError, match=f"certificate-authority {tmp_path / 'ca.pem'} does not exist"):
        load_kubeconfig(path)


def test_bad_base64(tmp_path: Path) -> None:
    path = kubeconfig_file(tmp_path / "config", user={"client-key-data": "not base64!"})
    with pytest.raises(KubeConfigError, match='user "u": client-key-data is not base64'):
        load_kubeconfig(path)


# -- TLS -------------------------------------------------------------------------------------


def test_ssl_context_loads_ca_and_client_certificate(tmp_path: Path, pems: dict[str, bytes]) -> None:
    ca, cert, key = (write(tmp_path / n, pems[n]) for n in ("ca", "cert", "key"))
    context = Access(SERVER, ca_file=ca, cert_file=cert, key_file=key).ssl_context()
    assert context is not None
    assert context.verify_mode == ssl.CERT_REQUIRED
    assert context.check_hostname
    assert [c["subject"] for c in context.get_ca_certs()] == [((("commonName", "kubeconfig-test-ca"),),)]
    other = certs.make_signed(certs.make_ca("other"), "bob", server=False, client=True)
    wrong_key = write(tmp_path / "wrong", other.key_pem)
    with pytest.raises(ssl.SSLError):  # the chain really is loaded: a key that does not match fails
        Access(SERVER, cert_file=cert, key_file=wrong_key).ssl_context()


def test_ssl_context_insecure_and_http() -> None:
    context = Access(SERVER, verify=False).ssl_context()
    assert context is not None
    assert context.verify_mode == ssl.CERT_NONE
    assert not context.check_hostname
    assert Access("http://127.0.0.1:8080").ssl_context() is None
    assert Access("http://127.0.0.1:8080").bearer() is None


def test_import_does_not_load_the_official_client() -> None:
    code = (
        "import sys, resourceconsist.cluster.kubeconfig; print([m for m in sys.modules if 'kubernetes' in m])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
