"""The Helm chart (charts/resourceconsist, docs/install.md), through the real helm binary the
project builds (hack/helm/go.mod): it lints clean, config/ is exactly its default rendering, and
`helm install` with default and with non-default values puts on a real API server objects that
read back as the values say."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from resourceconsist import wire
from resourceconsist.adapters.alibabacloudslb.credentials import SLBAccess
from resourceconsist.cluster import kube
from resourceconsist.cluster.kube import KubeClient, KubeObject
from resourceconsist.commands import cli
from resourceconsist.testing import (
    HELM_VERSION,
    LocalControlPlane,
    find_helm,
    run_cli,
    schemaless_crd,
    wait_for,
)

# helm lives beside the control plane's binaries (find_helm): CI's run without them skips this
# module by the marker, never by a missing binary.
pytestmark = pytest.mark.controlplane

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "resourceconsist"
CONFIG = REPO / "config"
#: An object of a release: (kind, name).
Key = tuple[str, str]

#: Everything the defaults leave alone or set otherwise (docs/install.md, "Values").
NON_DEFAULT_VALUES: dict[str, Any] = {
    "replicaCount": 3,
    "image": {"repository": "registry.example.com/platform/resourceconsist", "tag": "0.1.0-rc1"},
    "leaderElection": {"leaseDuration": 30, "renewDeadline": 20, "retryPeriod": 4},
    "watchNamespace": "shop",
    "webhook": {
        "failurePolicy": "Ignore",
        "timeoutSeconds": 5,
        "namespaceSelector": {
            "matchExpressions": [
                {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system"]}
            ]
        },
        "certHosts": ["resourceconsist.platform.example"],
        "certManager": {"enabled": True},
    },
    "logLevel": "debug",
    "serviceMonitor": {
        "enabled": True,
        "additionalLabels": {"release": "prometheus"},
        "interval": "15s",
        "tlsConfig": {"serverName": "resourceconsist-manager-metrics.resourceconsist.svc"},
    },
    "podDisruptionBudget": {"minAvailable": 2},
    "priorityClassName": "platform-controllers",
    "affinity": {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "topologyKey": "kubernetes.io/hostname",
                    "labelSelector": {"matchLabels": {"control-plane": "resourceconsist-manager"}},
                }
            ]
        }
    },
    "topologySpreadConstraints": [],
    "resources": {"requests": {"cpu": "200m", "memory": "512Mi"}, "limits": {"cpu": None, "memory": "1Gi"}},
    "serviceAccount": {"annotations": {"pod-identity.alibabacloud.com/role-name": "resourceconsist"}},
    "credentials": {
        "secretName": "slb-credentials",
        "rrsa": {
            "enabled": True,
            "roleArn": "acs:ram::1:role/rc",
            "oidcProviderArn": "acs:ram::1:oidc-provider/c",
            "stsRegion": "cn-hangzhou",
            "stsVpcEndpoint": True,
        },
    },
    "clusterName": "prod-a",
    "slb": {"loadBalancers": ["lb-1", "lb-2"]},
    "providerBudget": {"rate": 8, "burst": 4},
    "extraArgs": ["--resync-seconds=600", "--garbage-dry-run"],
    "extraEnv": [{"name": "ALIYUN_SLB_CALL_DEADLINE_SECONDS", "value": "8"}],
}


def _helm(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(find_helm()), *args], check=False, capture_output=True, text=True, timeout=180, env=env
    )


def _values_args(values: dict[str, Any] | None, tmp_path: Path) -> list[str]:
    if values is None:
        return []
    values_file = tmp_path / "values.yaml"
    values_file.write_text(yaml.safe_dump(values))
    return ["--values", str(values_file)]


def _template(namespace: str, values: dict[str, Any] | None, tmp_path: Path) -> list[dict[str, Any]]:
    rendered = _helm(
        "template", "resourceconsist", str(CHART), "--namespace", namespace, *_values_args(values, tmp_path)
    )
    assert rendered.returncode == 0, rendered.stderr
    return [d for d in yaml.safe_load_all(rendered.stdout) if d]


def _by_kind(docs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


@dataclass
class ChartCluster:
    """A control plane of one test, and the environment that points helm at it."""

    client: KubeClient
    helm_env: dict[str, str]

    def install(self, namespace: str, values: dict[str, Any] | None, tmp_path: Path) -> dict[Key, KubeObject]:
        """`helm install --create-namespace` of the chart on the real API server; every object
        of the release's manifest as the API server stored it."""
        installed = _helm(
            "install",
            "resourceconsist",
            str(CHART),
            "--namespace",
            namespace,
            "--create-namespace",
            *_values_args(values, tmp_path),
            env=self.helm_env,
        )
        assert installed.returncode == 0, installed.stderr
        manifest = _helm("get", "manifest", "resourceconsist", "--namespace", namespace, env=self.helm_env)
        assert manifest.returncode == 0, manifest.stderr
        stored: dict[Key, KubeObject] = {}
        for doc in yaml.safe_load_all(manifest.stdout):
            if not doc:
                continue
            resource = self.client.resource(doc["apiVersion"], doc["kind"])
            where = doc["metadata"].get("namespace") if resource.namespaced else None
            stored[(doc["kind"], doc["metadata"]["name"])] = self.client.get(
                resource, where, doc["metadata"]["name"]
            )
        return stored

    def create(self, doc: dict[str, Any]) -> KubeObject:
        """Create a cluster-scoped object, once the API server serves its kind (a CRD's kind is
        served a moment after the CRD is created)."""
        resource = wait_for(
            lambda: self.client.resource(doc["apiVersion"], doc["kind"]),
            timeout=60,
            message=f"the API server to serve {doc['kind']}",
            ignore=(LookupError,),
        )
        return self.client.create(resource, None, doc)


@pytest.fixture
def chart_cluster(tmp_path: Path) -> Iterator[ChartCluster]:
    """A control plane for each installation: the chart's webhook configuration (failurePolicy
    Fail on controlled pods) is created for real and must not reach the session's other tests,
    and one cluster holds one release (its cluster-scoped objects have fixed names)."""
    helm_home = tmp_path / "helm-home"
    with LocalControlPlane() as cp:
        client = KubeClient.from_kubeconfig(str(cp.kubeconfig))
        env = {
            **os.environ,
            "KUBECONFIG": str(cp.kubeconfig),
            "HELM_CACHE_HOME": str(helm_home / "cache"),
            "HELM_CONFIG_HOME": str(helm_home / "config"),
            "HELM_DATA_HOME": str(helm_home / "data"),
        }
        try:
            yield ChartCluster(client, env)
        finally:
            client.close()


def _container(deployment: dict[str, Any]) -> dict[str, Any]:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return dict(container)


def test_the_pinned_helm_is_the_one_built() -> None:
    go_mod = (REPO / "hack" / "helm" / "go.mod").read_text()
    assert re.search(rf"^require helm\.sh/helm/v3 v{re.escape(HELM_VERSION)}$", go_mod, re.M)
    version = _helm("version", "--short")
    assert version.returncode == 0, version.stderr
    assert version.stdout.startswith(f"v{HELM_VERSION}")


#: Sharding on, with its non-default settings (docs/scaling.md, "The chart").
SHARDING_VALUES: dict[str, Any] = {
    "sharding": {"enabled": True, "controllerRing": "slb", "sharder": False, "webhookReplicas": 3},
    "replicaCount": 4,
    "leaderElection": {"namespace": "leases", "leaseDuration": 20},
}


#: The wait drain on, with the NetworkPolicy (docs/zero-downtime.md, "A drain that waits for the
#: provider").
DRAIN_VALUES: dict[str, Any] = {"drainWaiter": {"enabled": True}, "networkPolicy": {"enabled": True}}


@pytest.mark.parametrize(
    "values",
    [None, NON_DEFAULT_VALUES, SHARDING_VALUES, DRAIN_VALUES, {**SHARDING_VALUES, **DRAIN_VALUES}],
    ids=["default", "non-default", "sharding", "wait-drain", "sharded-wait-drain"],
)
def test_helm_lint_is_clean(values: dict[str, Any] | None, tmp_path: Path) -> None:
    args = ["lint", "--strict", str(CHART)]
    if values is not None:
        (tmp_path / "values.yaml").write_text(yaml.safe_dump(values))
        args += ["--values", str(tmp_path / "values.yaml")]
    linted = _helm(*args)
    assert linted.returncode == 0, linted.stdout + linted.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in linted.stdout
    assert not re.search(r"\[(WARNING|ERROR)\]", linted.stdout + linted.stderr)


def test_config_is_the_chart_rendered_with_default_values(tmp_path: Path) -> None:
    """config/ is generated (hack/generate-config.sh): edit the chart and run the script."""
    fresh = tmp_path / "config"
    generated = subprocess.run(
        [str(REPO / "hack" / "generate-config.sh"), str(fresh)],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "HELM": str(find_helm())},
    )
    assert generated.returncode == 0, generated.stderr
    committed = {p.relative_to(CONFIG): p.read_text() for p in CONFIG.rglob("*") if p.is_file()}
    rendered = {p.relative_to(fresh): p.read_text() for p in fresh.rglob("*") if p.is_file()}
    assert sorted(committed) == sorted(rendered), "config/ has other files than the chart renders"
    stale = [str(path) for path in rendered if committed[path] != rendered[path]]
    assert not stale, f"config/ differs from the chart in {stale}: run hack/generate-config.sh"


def test_the_image_tag_defaults_to_the_package_version_and_latest_is_refused(tmp_path: Path) -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    app_version = chart["appVersion"]
    assert chart["version"] == app_version  # released together (Chart.yaml)
    pyproject = (REPO / "pyproject.toml").read_text()
    assert re.search(rf'^version = "{re.escape(app_version)}"$', pyproject, re.M)
    deployment = _by_kind(_template("resourceconsist", None, tmp_path))[
        ("Deployment", "resourceconsist-manager")
    ]
    assert _container(deployment)["image"] == f"resourceconsist:{app_version}"

    refused = _helm("template", "x", str(CHART), "--set", "image.tag=latest")
    assert refused.returncode != 0
    assert "image.tag: latest is a moving tag" in refused.stderr


@pytest.mark.parametrize(
    ("setting", "error"),
    [
        ("webhook.failurePolicy=fail", "at '/webhook/failurePolicy': value must be one of 'Fail', 'Ignore'"),
        ("replicaCount=0", "at '/replicaCount': minimum: got 0, want 1"),
        ("logFormat=yaml", "at '/logFormat': value must be one of 'text', 'json'"),
        # A Role goes into the namespace watched: it must be a namespace's name.
        ("watchNamespace=Shop", "at '/watchNamespace': 'Shop' does not match pattern"),
        ("providerBudget.burst=0", "at '/providerBudget/burst': minimum: got 0, want 1"),
        # The ring's name ends label keys: a DNS label.
        ("sharding.controllerRing=SLB", "at '/sharding/controllerRing': 'SLB' does not match pattern"),
        ("watchNamespaces={shop,Web}", "at '/watchNamespaces/1': 'Web' does not match pattern"),
        ("watchNamespaces={shop,shop}", "at '/watchNamespaces': items at 0 and 1 are equal"),
        (
            "extraArgs[0]=resync-seconds=5",
            "at '/extraArgs/0': 'resync-seconds=5' does not match pattern '^--'",
        ),
    ],
)
def test_bad_values_are_refused_naming_the_value(setting: str, error: str) -> None:
    refused = _helm("template", "x", str(CHART), "--set", setting)
    assert refused.returncode != 0
    assert error in refused.stderr


def test_watch_namespaces_put_a_role_and_binding_in_each_and_tell_the_manager(tmp_path: Path) -> None:
    """watchNamespaces (and watchNamespace, the one-namespace value of earlier charts, merged
    in): a Role and RoleBinding of the manager in each, no ClusterRole of the manager, the
    Services grant off the webhook's ClusterRole, and `--namespace` with the list
    (docs/security.md, "A namespaced install")."""
    docs = _template(
        "resourceconsist", {"watchNamespaces": ["web", "shop"], "watchNamespace": "pay"}, tmp_path
    )
    manager = "resourceconsist-manager"
    roles = {(d["kind"], d["metadata"].get("namespace")) for d in docs if d["metadata"]["name"] == manager}
    assert {(kind, ns) for kind, ns in roles if kind in {"Role", "RoleBinding"}} == {
        (kind, ns) for kind in ("Role", "RoleBinding") for ns in ("pay", "shop", "web")
    }
    assert not {kind for kind, _ in roles} & {"ClusterRole", "ClusterRoleBinding"}
    for binding in (d for d in docs if d["kind"] == "RoleBinding" and d["metadata"]["name"] == manager):
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": manager,
        }
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": manager, "namespace": "resourceconsist"}
        ]
    webhook_role = _by_kind(docs)[("ClusterRole", "resourceconsist-webhook")]
    assert not [r for r in webhook_role["rules"] if "services" in r["resources"]]
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    assert "--namespace=pay,shop,web" in _container(deployment)["args"]
    # Pods of other namespaces are not sent to the webhook (a selector given is kept instead).
    configuration = _by_kind(docs)[("MutatingWebhookConfiguration", wire.MUTATING_WEBHOOK_CONFIGURATION)]
    (hook,) = configuration["webhooks"]
    assert hook["namespaceSelector"] == {
        "matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["pay", "shop", "web"]}
        ]
    }
    # Without either value: a ClusterRole, and no --namespace.
    default = _template("resourceconsist", None, tmp_path)
    assert ("ClusterRole", manager) in _by_kind(default)
    (deployment,) = [d for d in default if d["kind"] == "Deployment"]
    assert not [a for a in _container(deployment)["args"] if a.startswith("--namespace")]


def test_sharding_runs_the_shards_and_the_webhook_in_deployments_of_their_own(tmp_path: Path) -> None:
    """sharding.enabled: the manager's replicas run `run --sharding`, each shard named after its
    pod (the downward API), leader election's Lease namespace and timings for the shard Leases,
    no webhook (a shard caches only its share of the employers); the webhook runs as
    `resourceconsist webhook` in resourceconsist-webhook, which the webhook Service selects alone;
    the Lease grants are the sharding Role's, not leader election's (docs/scaling.md)."""
    docs = _template("resourceconsist", SHARDING_VALUES, tmp_path)
    found = _by_kind(docs)
    manager = found[("Deployment", "resourceconsist-manager")]
    webhook = found[("Deployment", "resourceconsist-webhook")]
    assert manager["spec"]["replicas"] == 4
    assert webhook["spec"]["replicas"] == 3
    args = _container(manager)["args"]
    assert args[0] == "run"
    for wanted in (
        "--sharding",
        "--controller-ring=slb",
        "--shard-name=$(POD_NAME)",
        "--no-sharder",
        "--leader-election-namespace=leases",
        "--lease-duration=20",
    ):
        assert wanted in args
    assert not [a for a in args if a.startswith(("--webhook", "--cert-dir")) or a == "--leader-elect"]
    env = {e["name"]: e for e in _container(manager)["env"]}
    assert env["POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert "volumes" not in manager["spec"]["template"]["spec"]
    hook_args = _container(webhook)["args"]
    assert hook_args[0] == "webhook"
    assert "--webhook-service=resourceconsist-manager" in hook_args
    assert not [a for a in hook_args if a.startswith(("--shard", "--lease", "--slb-", "--shutdown"))]
    # Two Deployments, two selectors that never select each other's pods; the manager's is the
    # one it has unsharded (its selector is immutable: an upgrade into sharding keeps it).
    manager_selector = manager["spec"]["selector"]["matchLabels"]
    webhook_selector = webhook["spec"]["selector"]["matchLabels"]
    assert manager_selector == {"control-plane": "resourceconsist-manager"}
    assert webhook_selector == {"control-plane": "resourceconsist-webhook"}
    for deployment, other in ((manager, webhook), (webhook, manager)):
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert labels.items() >= deployment["spec"]["selector"]["matchLabels"].items()
        assert not labels.items() >= other["spec"]["selector"]["matchLabels"].items()
    assert manager["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"] == "manager"
    assert webhook["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"] == "webhook"
    # One disruption budget per Deployment.
    budgets = {
        name: d["spec"]["selector"]["matchLabels"]
        for (kind, name), d in found.items()
        if kind == "PodDisruptionBudget"
    }
    assert budgets == {
        "resourceconsist-manager": manager_selector,
        "resourceconsist-webhook": webhook_selector,
    }
    assert found[("Service", "resourceconsist-manager")]["spec"]["selector"] == webhook_selector
    role = found[("Role", "resourceconsist-sharding")]
    assert role["metadata"]["namespace"] == "leases"
    assert role["rules"] == [
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "verbs": ["get", "list", "watch", "create", "patch", "delete"],
        }
    ]
    assert ("Role", "resourceconsist-leader-election") not in found
    # Off (the default): one Deployment, its selector as config/ has always had it.
    default = _by_kind(_template("resourceconsist", None, tmp_path))
    assert ("Deployment", "resourceconsist-webhook") not in default
    assert ("Role", "resourceconsist-sharding") not in default
    assert default[("Deployment", "resourceconsist-manager")]["spec"]["selector"]["matchLabels"] == {
        "control-plane": "resourceconsist-manager"
    }


def test_pod_employer_label_tells_the_shards_and_the_webhook(tmp_path: Path) -> None:
    """sharding.podEmployerLabel (docs/scaling.md, "Pods selected by the API server"): the shards
    run `run --pod-employer-label` and the webhook Deployment `webhook --pod-employer-label`, as
    the real command line parses them; off, or without sharding, neither has the flag."""
    on = _by_kind(
        _template(
            "resourceconsist",
            {**SHARDING_VALUES, "sharding": {**SHARDING_VALUES["sharding"], "podEmployerLabel": True}},
            tmp_path,
        )
    )
    shard_args = _container(on[("Deployment", "resourceconsist-manager")])["args"]
    hook_args = _container(on[("Deployment", "resourceconsist-webhook")])["args"]
    assert "--pod-employer-label" in shard_args and "--pod-employer-label" in hook_args
    managed, _ = _parsed(shard_args)
    assert managed.sharding is not None and managed.sharding.pod_employer_label
    with cli.webhook.make_context("webhook", hook_args[1:]) as ctx:
        assert ctx.params["pod_employer_label"] is True
    for values in (SHARDING_VALUES, {"sharding": {"podEmployerLabel": True}}):
        docs = _template("resourceconsist", values, tmp_path)
        deployments = [d for d in docs if d["kind"] == "Deployment"]
        assert deployments
        assert not [d for d in deployments if "--pod-employer-label" in _container(d)["args"]], values


def test_the_sharders_placement_reaches_the_shards(tmp_path: Path) -> None:
    """sharding.placement (docs/scaling.md, "Balanced placement"): `ring` by default, `balanced`
    when set, as the real command line parses the shards' arguments; any other value is refused
    by the chart's schema."""
    for placement in ("ring", "balanced"):
        values = {**SHARDING_VALUES, "sharding": {**SHARDING_VALUES["sharding"], "placement": placement}}
        if placement == "ring":
            values = SHARDING_VALUES  # the default
        docs = _by_kind(_template("resourceconsist", values, tmp_path))
        managed, _ = _parsed(_container(docs[("Deployment", "resourceconsist-manager")])["args"])
        assert managed.sharding is not None and managed.sharding.placement == placement
    bad = {**SHARDING_VALUES, "sharding": {**SHARDING_VALUES["sharding"], "placement": "even"}}
    refused = _helm("template", "resourceconsist", str(CHART), *_values_args(bad, tmp_path))
    assert refused.returncode != 0 and "placement" in refused.stderr, refused.stderr


def test_helm_install_with_sharding_on_a_real_api_server(chart_cluster: ChartCluster, tmp_path: Path) -> None:
    """The sharded chart is accepted by a real API server: both Deployments, the Lease Role in the
    Lease namespace, the webhook Service on the webhook's pods only, and the notes say where the
    shards' Leases are."""
    chart_cluster.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "leases"}})
    stored = chart_cluster.install("resourceconsist", SHARDING_VALUES, tmp_path)
    manager = stored[("Deployment", "resourceconsist-manager")]
    webhook = stored[("Deployment", "resourceconsist-webhook")]
    assert "--sharding" in _container(manager)["args"]
    assert _container(webhook)["args"][0] == "webhook"
    assert stored[("Role", "resourceconsist-sharding")]["metadata"]["namespace"] == "leases"
    binding = stored[("RoleBinding", "resourceconsist-sharding")]
    assert binding["subjects"][0]["name"] == "resourceconsist-manager"
    service = stored[("Service", "resourceconsist-manager")]
    assert service["spec"]["selector"] == webhook["spec"]["selector"]["matchLabels"]
    notes = _helm(
        "get", "notes", "resourceconsist", "--namespace", "resourceconsist", env=chart_cluster.helm_env
    )
    assert f"-l {wire.SHARD_RING_LABEL}=slb" in notes.stdout
    assert "deployment/resourceconsist-webhook" in notes.stdout


def test_helm_install_with_default_values_on_a_real_api_server(
    chart_cluster: ChartCluster, tmp_path: Path
) -> None:
    stored = chart_cluster.install(wire.DEFAULT_NAMESPACE, None, tmp_path)

    # The names the code relies on (docs/wire-contract.md).
    assert ("Service", "resourceconsist-manager") in stored
    webhook = stored[("MutatingWebhookConfiguration", wire.MUTATING_WEBHOOK_CONFIGURATION)]
    (hook,) = webhook["webhooks"]
    assert hook["failurePolicy"] == "Fail"
    assert hook["objectSelector"] == {"matchLabels": {wire.CONTROL_LABEL: wire.CONTROL_LABEL_VALUE}}
    assert hook["clientConfig"]["service"] == {
        "namespace": wire.DEFAULT_NAMESPACE,
        "name": "resourceconsist-manager",
        "path": "/mutating-alibabacloudslb",
        "port": 443,
    }
    # The least-privilege policy, bound to the manager's ServiceAccount only (docs/security.md).
    policy = stored[("ValidatingAdmissionPolicy", "resourceconsist-manager-least-privilege")]
    (match,) = policy["spec"]["matchConditions"]
    user = f"system:serviceaccount:{wire.DEFAULT_NAMESPACE}:resourceconsist-manager"
    assert match["expression"] == f"request.userInfo.username == '{user}'"
    binding = stored[("ValidatingAdmissionPolicyBinding", "resourceconsist-manager-least-privilege")]
    assert binding["spec"]["validationActions"] == ["Deny"]
    role = stored[("Role", "resourceconsist-webhook-certs")]
    assert [wire.WEBHOOK_CERT_SECRET] in [r.get("resourceNames") for r in role["rules"]]

    deployment = stored[("Deployment", "resourceconsist-manager")]
    pod = deployment["spec"]["template"]["spec"]
    container = _container(deployment)
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxUnavailable": 0, "maxSurge": 1}
    assert pod["priorityClassName"] == "system-cluster-critical"
    assert pod["terminationGracePeriodSeconds"] == 40
    preferred = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert preferred[0]["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    (spread,) = pod["topologySpreadConstraints"]
    assert spread["whenUnsatisfiable"] == "ScheduleAnyway"
    assert spread["labelSelector"]["matchLabels"].items() <= pod_labels(deployment).items()
    assert container["resources"] == {
        "requests": {"cpu": "100m", "memory": "256Mi"},
        "limits": {"cpu": "1", "memory": "512Mi"},
    }
    assert pod["securityContext"]["runAsUser"] == 65532
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    args = container["args"]
    assert args[:2] == ["run", "--adapter=alibabacloudslb"]
    for flag in (
        "--webhook",
        "--metrics-bind-address=:8080",
        "--metrics-secure",
        "--health-probe-bind-address=:8081",
    ):
        assert flag in args
    assert not [arg for arg in args if arg.startswith("--metrics-cert-path")]  # self-signed
    assert "--log-format=json" in args and "--leader-elect" in args and "--lease-duration=15" in args
    assert "--no-bootstrap-certs" not in args
    assert container["envFrom"] == [{"secretRef": {"name": "resourceconsist-slb-credentials"}}]
    certs = next(v for v in pod["volumes"] if v["name"] == "certs")
    assert certs == {"name": "certs", "emptyDir": {}}

    pdb = stored[("PodDisruptionBudget", "resourceconsist-manager")]
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels(deployment).items()
    # /metrics on the port named `metrics`, behind its own Service; no ServiceMonitor by default.
    metrics = stored[("Service", "resourceconsist-manager-metrics")]
    (port,) = metrics["spec"]["ports"]
    assert (port["name"], port["port"], port["targetPort"]) == ("metrics", 8080, 8080)
    assert {"name": "metrics", "containerPort": 8080, "protocol": "TCP"} in container["ports"]
    assert not [key for key in stored if key[0] in {"ServiceMonitor", "Certificate", "Issuer"}]
    # Secure metrics (docs/security.md): the reviews the manager asks for, cluster-wide; who may
    # read them, for your Prometheus to be bound to; the pods say to scrape over HTTPS.
    auth = stored[("ClusterRole", "resourceconsist-metrics-auth")]
    assert sorted((r["apiGroups"], r["resources"], r["verbs"]) for r in auth["rules"]) == [
        (["authentication.k8s.io"], ["tokenreviews"], ["create"]),
        (["authorization.k8s.io"], ["subjectaccessreviews"], ["create"]),
    ]
    (subject,) = stored[("ClusterRoleBinding", "resourceconsist-metrics-auth")]["subjects"]
    assert (subject["name"], subject["namespace"]) == ("resourceconsist-manager", wire.DEFAULT_NAMESPACE)
    reader = stored[("ClusterRole", "resourceconsist-metrics-reader")]
    assert reader["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    assert ("ClusterRoleBinding", "resourceconsist-metrics-reader") not in stored  # no readers given
    scrape = deployment["spec"]["template"]["metadata"]["annotations"]
    assert scrape["prometheus.io/scheme"] == "https" and scrape["prometheus.io/port"] == "8080"

    # A pod of the template is admitted in the release namespace with the priority class's value
    # (the API server's Priority admission; the class is not limited to kube-system).
    template = deployment["spec"]["template"]
    pod_doc = {"metadata": {**template["metadata"], "name": "manager-0"}, "spec": template["spec"]}
    created = chart_cluster.client.create(kube.POD, wire.DEFAULT_NAMESPACE, pod_doc)
    assert created["spec"]["priority"] == 2_000_000_000


def pod_labels(deployment: dict[str, Any]) -> dict[str, str]:
    return dict(deployment["spec"]["template"]["metadata"]["labels"])


def test_helm_install_with_non_default_values_on_a_real_api_server(
    chart_cluster: ChartCluster, tmp_path: Path
) -> None:
    for crd in (
        schemaless_crd("cert-manager.io", "Certificate", "certificates"),
        schemaless_crd("cert-manager.io", "Issuer", "issuers"),
        schemaless_crd("monitoring.coreos.com", "ServiceMonitor", "servicemonitors"),
    ):
        chart_cluster.create(crd)
    chart_cluster.create(
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": "platform-controllers"},
            "value": 1000000,
        }
    )

    # The watched namespace holds the manager's Role: it exists before the install.
    chart_cluster.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "shop"}})
    namespace = "platform-lb"
    stored = chart_cluster.install(namespace, NON_DEFAULT_VALUES, tmp_path)

    deployment = stored[("Deployment", "resourceconsist-manager")]
    assert deployment["metadata"]["namespace"] == namespace
    pod = deployment["spec"]["template"]["spec"]
    container = _container(deployment)
    assert deployment["spec"]["replicas"] == 3
    assert container["image"] == "registry.example.com/platform/resourceconsist:0.1.0-rc1"
    args = container["args"]
    for flag in (
        "--namespace=shop",
        "--no-bootstrap-certs",
        "--log-level=debug",
        "--lease-duration=30",
        "--renew-deadline=20",
        "--retry-period=4",
        "--resync-seconds=600",
        "--garbage-dry-run",
        "--slb-cluster-name=prod-a",
        "--slb-load-balancer=lb-1",
        "--slb-load-balancer=lb-2",
        "--provider-rate=8",
        "--provider-burst=4",
    ):
        assert flag in args
    assert pod["priorityClassName"] == "platform-controllers"
    assert "requiredDuringSchedulingIgnoredDuringExecution" in pod["affinity"]["podAntiAffinity"]
    assert "topologySpreadConstraints" not in pod
    assert container["resources"]["limits"] == {"memory": "1Gi"}
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["ALIYUN_SLB_CALL_DEADLINE_SECONDS"] == "8"
    assert env["ALIBABA_CLOUD_ROLE_ARN"] == "acs:ram::1:role/rc"
    assert env["ALIBABA_CLOUD_OIDC_PROVIDER_ARN"] == "acs:ram::1:oidc-provider/c"
    assert env["ALIBABA_CLOUD_ROLE_SESSION_NAME"] == "resourceconsist-manager"
    assert env["ALIBABA_CLOUD_STS_REGION"] == "cn-hangzhou"
    assert env["ALIBABA_CLOUD_VPC_ENDPOINT_ENABLED"] == "true"
    token_file = env["ALIBABA_CLOUD_OIDC_TOKEN_FILE"]
    assert container["envFrom"] == [{"secretRef": {"name": "slb-credentials"}}]
    account = stored[("ServiceAccount", "resourceconsist-manager")]
    assert account["metadata"]["annotations"]["pod-identity.alibabacloud.com/role-name"] == "resourceconsist"
    token = next(v for v in pod["volumes"] if v["name"] == "rrsa-token")
    (source,) = token["projected"]["sources"]
    assert source["serviceAccountToken"]["audience"] == "sts.aliyuncs.com"
    mount = next(m for m in container["volumeMounts"] if m["name"] == "rrsa-token")
    assert token_file == f"{mount['mountPath']}/{source['serviceAccountToken']['path']}"
    # The variables the chart sets are the ones the SLB adapter reads: they select RRSA.
    access = SLBAccess.from_env(
        {**{k: v for k, v in env.items() if v}, "ALIYUN_SLB_ENDPOINT": "slb.cn-hangzhou.aliyuncs.com"}
    )
    assert access.source.kind == "rrsa"

    pdb = stored[("PodDisruptionBudget", "resourceconsist-manager")]
    assert pdb["spec"]["minAvailable"] == 2 and "maxUnavailable" not in pdb["spec"]

    # cert-manager: its Certificate's Secret is what the manager mounts at its cert dir, and the
    # webhook configuration asks its CA injector for that Certificate's CA.
    webhook = stored[("MutatingWebhookConfiguration", wire.MUTATING_WEBHOOK_CONFIGURATION)]
    inject = webhook["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
    cert_namespace, cert_name = inject.split("/")
    certificate = stored[("Certificate", cert_name)]
    assert certificate["metadata"]["namespace"] == cert_namespace == namespace
    assert f"resourceconsist-manager.{namespace}.svc" in certificate["spec"]["dnsNames"]
    # The extra host goes to cert-manager; the manager, which makes no certificate, is not told.
    assert "resourceconsist.platform.example" in certificate["spec"]["dnsNames"]
    assert not [a for a in args if a.startswith("--webhook-cert-host")]
    issuer = stored[("Issuer", certificate["spec"]["issuerRef"]["name"])]
    assert issuer["spec"] == {"selfSigned": {}}
    cert_dir = next(a.split("=", 1)[1] for a in args if a.startswith("--cert-dir="))
    cert_mount = next(m for m in container["volumeMounts"] if m["mountPath"] == cert_dir)
    cert_volume = next(v for v in pod["volumes"] if v["name"] == cert_mount["name"])
    assert cert_volume["secret"]["secretName"] == certificate["spec"]["secretName"]
    (hook,) = webhook["webhooks"]
    assert hook["failurePolicy"] == "Ignore" and hook["timeoutSeconds"] == 5
    assert hook["clientConfig"]["service"]["namespace"] == namespace
    assert hook["namespaceSelector"] == NON_DEFAULT_VALUES["webhook"]["namespaceSelector"]
    # watchNamespace: the manager's grants are a Role in that namespace, no ClusterRole
    # (docs/security.md, "A namespaced install").
    assert stored[("Role", "resourceconsist-manager")]["metadata"]["namespace"] == "shop"
    assert ("ClusterRole", "resourceconsist-manager") not in stored
    # Without the bootstrap, the manager gets none of the RBAC it needs: least privilege.
    assert ("Role", "resourceconsist-webhook-certs") not in stored
    webhook_role = stored[("ClusterRole", "resourceconsist-webhook")]
    assert not [r for r in webhook_role["rules"] if "admissionregistration.k8s.io" in r["apiGroups"]]

    # The ServiceMonitor selects the metrics Service and scrapes its `metrics` port.
    monitor = stored[("ServiceMonitor", "resourceconsist-manager")]
    metrics = stored[("Service", "resourceconsist-manager-metrics")]
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= metrics["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [namespace]}
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["interval"] == "15s"
    assert endpoint["port"] in {p["name"] for p in metrics["spec"]["ports"]}
    assert metrics["spec"]["selector"].items() <= pod_labels(deployment).items()
    # Secure metrics: HTTPS with Prometheus's own token, the tlsConfig given.
    assert endpoint["scheme"] == "https"
    assert endpoint["bearerTokenFile"] == "/var/run/secrets/kubernetes.io/serviceaccount/token"
    assert endpoint["tlsConfig"] == NON_DEFAULT_VALUES["serviceMonitor"]["tlsConfig"]
    # A namespaced install (watchNamespace) still gets the reviews' ClusterRole: they are
    # cluster-scoped (docs/security.md, "A namespaced install").
    assert ("ClusterRole", "resourceconsist-metrics-auth") in stored
    assert "--metrics-secure" in _container(deployment)["args"]


#: Every switch the defaults turn on, off.
SWITCHES_OFF: dict[str, Any] = {
    "replicaCount": 1,
    "leaderElection": {"enabled": False},
    "webhook": {"enabled": False},
    "metrics": {"enabled": False},
    "credentials": {"secretName": ""},
    "priorityClassName": "",
    "configureDefaultAffinity": False,
    "topologySpreadConstraints": [],
    "resources": None,
    "leastPrivilegePolicy": {"enabled": False},
    "rbac": {"create": False},
    "serviceAccount": {"create": False},
}


def test_helm_install_with_every_switch_off_on_a_real_api_server(
    chart_cluster: ChartCluster, tmp_path: Path
) -> None:
    stored = chart_cluster.install("controllers", SWITCHES_OFF, tmp_path)

    kinds = {kind for kind, _ in stored}
    assert "MutatingWebhookConfiguration" not in kinds and "PodDisruptionBudget" not in kinds
    assert not [name for kind, name in stored if kind == "Service"]  # neither webhook nor metrics
    # rbac.create off: no grant at all (leader election is off too: no Lease); serviceAccount.create
    # off: the ServiceAccount is yours.
    assert not kinds & {"Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding", "ServiceAccount"}
    assert not [key for key in stored if key[0].startswith("ValidatingAdmissionPolicy")]
    deployment = stored[("Deployment", "resourceconsist-manager")]
    pod = deployment["spec"]["template"]["spec"]
    container = _container(deployment)
    assert container["args"] == [
        "run",
        "--adapter=alibabacloudslb",
        "--metrics-bind-address=0",
        "--health-probe-bind-address=:8081",
        "--cache-sync-timeout=120",
        "--log-format=json",
        "--no-leader-elect",
        "--shutdown-timeout=30",
    ]
    assert [p["name"] for p in container["ports"]] == ["health"]
    for absent in ("priorityClassName", "affinity", "topologySpreadConstraints", "volumes"):
        assert absent not in pod, absent
    assert "envFrom" not in container and "volumeMounts" not in container
    assert container["resources"] == {}


@pytest.mark.parametrize(
    ("setting", "key"),
    [
        ("replicacount=3", "'': additional properties 'replicacount'"),
        ("nameOverride=lb", "'': additional properties 'nameOverride'"),
        ("resources.limit.cpu=1", "'/resources': additional properties 'limit'"),
        ("webhook.certmanager.enabled=true", "'/webhook': additional properties 'certmanager'"),
        ("serviceAccount.automount=false", "'/serviceAccount': additional properties 'automount'"),
    ],
)
def test_a_misspelled_key_fails_helm_lint_and_helm_template(setting: str, key: str) -> None:
    """The values schema is closed wherever the chart owns the tree: a misspelled or unknown key
    is refused by both, naming it, instead of rendering as if it were not there."""
    templated = _helm("template", "x", str(CHART), "--set", setting)
    assert templated.returncode != 0
    assert f"at {key} not allowed" in templated.stderr, templated.stderr
    linted = _helm("lint", "--strict", str(CHART), "--set", setting)
    assert linted.returncode != 0
    assert f"at {key} not allowed" in linted.stdout + linted.stderr


def test_global_values_of_a_parent_chart_are_accepted() -> None:
    templated = _helm("template", "x", str(CHART), "--set", "global.imageRegistry=registry.example.com")
    assert templated.returncode == 0, templated.stderr
    linted = _helm("lint", "--strict", str(CHART), "--set", "global.imageRegistry=registry.example.com")
    assert linted.returncode == 0, linted.stdout + linted.stderr


#: The values a platform team expects (docs/install.md, "Values"), each set.
FIELD_VALUES: dict[str, Any] = {
    "serviceAccount": {"name": "lb-controller", "automountServiceAccountToken": False},
    "hostNetwork": True,
    "webhook": {"port": 19443, "tls": {"secretName": "lb-webhook-tls", "caBundle": "Q0EgYnVuZGxl"}},
    "metrics": {
        "port": 18080,
        "certSecretName": "lb-metrics-tls",
        "readers": [{"kind": "ServiceAccount", "name": "prometheus-k8s", "namespace": "monitoring"}],
    },
    "healthProbe": {"port": 18081},
    "livenessProbe": {"initialDelaySeconds": 5, "periodSeconds": 20, "failureThreshold": 6},
    "readinessProbe": {"periodSeconds": 5, "timeoutSeconds": 3},
    "maxConcurrentReconciles": 10,
    "extraEnv": [{"name": "ALIBABA_CLOUD_CREDENTIALS_FILE", "value": "/etc/slb/credentials"}],
    "extraVolumes": [
        {"name": "slb-credentials", "secret": {"secretName": "slb-credentials-file"}},
        {
            "name": "api-token",
            "projected": {"sources": [{"serviceAccountToken": {"path": "token", "expirationSeconds": 3600}}]},
        },
    ],
    "extraVolumeMounts": [
        {"name": "slb-credentials", "mountPath": "/etc/slb", "readOnly": True},
        {"name": "api-token", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": True},
    ],
    "networkPolicy": {
        "enabled": True,
        "metricsFrom": [
            {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
        ],
        "webhookFrom": [{"ipBlock": {"cidr": "10.0.0.0/8"}}],
    },
    "prometheusRule": {"enabled": True, "additionalLabels": {"release": "prometheus"}},
}


def test_helm_install_with_the_field_s_values_on_a_real_api_server(
    chart_cluster: ChartCluster, tmp_path: Path
) -> None:
    """Each value of the field's list (issue 37) set, installed on a real API server: the objects
    read back as the values say, and the Deployment's pod is admitted as a Pod."""
    chart_cluster.create(schemaless_crd("monitoring.coreos.com", "PrometheusRule", "prometheusrules"))
    namespace = "platform-lb"
    stored = chart_cluster.install(namespace, FIELD_VALUES, tmp_path)

    # The ServiceAccount: its name everywhere the manager's identity is named, no token mounted
    # by the kubelet (one is mounted through extraVolumes instead).
    account = stored[("ServiceAccount", "lb-controller")]
    assert account["automountServiceAccountToken"] is False
    assert ("ServiceAccount", "resourceconsist-manager") not in stored
    bindings = [
        o
        for (kind, name), o in stored.items()
        if kind in {"RoleBinding", "ClusterRoleBinding"} and name != "resourceconsist-metrics-reader"
    ]
    assert bindings and all(b["subjects"][0]["name"] == "lb-controller" for b in bindings)
    policy = stored[("ValidatingAdmissionPolicy", "resourceconsist-manager-least-privilege")]
    (match,) = policy["spec"]["matchConditions"]
    assert (
        match["expression"]
        == f"request.userInfo.username == 'system:serviceaccount:{namespace}:lb-controller'"
    )

    deployment = stored[("Deployment", "resourceconsist-manager")]
    pod = deployment["spec"]["template"]["spec"]
    container = _container(deployment)
    assert pod["serviceAccountName"] == "lb-controller"
    assert pod["automountServiceAccountToken"] is False
    assert pod["hostNetwork"] is True and pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"webhook": 19443, "health": 18081, "metrics": 18080}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health", "scheme": "HTTP"}
    assert (
        container["livenessProbe"]["initialDelaySeconds"],
        container["livenessProbe"]["periodSeconds"],
    ) == (5, 20)
    assert container["livenessProbe"]["failureThreshold"] == 6
    assert (container["readinessProbe"]["periodSeconds"], container["readinessProbe"]["timeoutSeconds"]) == (
        5,
        3,
    )
    args = container["args"]
    assert "--max-concurrent-reconciles=10" in args
    # Every flag the values pass is one `resourceconsist run` knows.
    done = run_cli("run", "--help")
    assert done.returncode == 0, done.stderr
    unknown = {arg.split("=", 1)[0] for arg in args[1:]} - set(re.findall(r"(--[a-z][a-z-]+)", done.stdout))
    assert not unknown, unknown
    assert "--no-bootstrap-certs" in args and "--webhook-port=19443" in args
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["certs"]["secret"]["secretName"] == "lb-webhook-tls"
    assert volumes["slb-credentials"]["secret"]["secretName"] == "slb-credentials-file"
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["slb-credentials"]["mountPath"] == "/etc/slb"
    assert mounts["api-token"]["mountPath"] == "/var/run/secrets/kubernetes.io/serviceaccount"
    assert mounts["certs"]["readOnly"] is True
    # No ServiceMonitor: the pods say where to scrape them, and that it is HTTPS.
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations == {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": "18080",
        "prometheus.io/path": "/metrics",
        "prometheus.io/scheme": "https",
    }
    # The metrics endpoint's certificate brought: mounted read-only where the flag says.
    assert "--metrics-secure" in args
    assert "--metrics-cert-path=/tmp/k8s-metrics-server/metrics-certs" in args
    assert volumes["metrics-certs"]["secret"]["secretName"] == "lb-metrics-tls"
    assert mounts["metrics-certs"] == {
        "name": "metrics-certs",
        "mountPath": "/tmp/k8s-metrics-server/metrics-certs",
        "readOnly": True,
    }
    # The readers given are bound to the reader role.
    readers = stored[("ClusterRoleBinding", "resourceconsist-metrics-reader")]
    assert readers["roleRef"]["name"] == "resourceconsist-metrics-reader"
    assert readers["subjects"] == FIELD_VALUES["metrics"]["readers"]

    # The certificate brought: its CA in the configuration, none of the bootstrap's RBAC.
    webhook = stored[("MutatingWebhookConfiguration", wire.MUTATING_WEBHOOK_CONFIGURATION)]
    (hook,) = webhook["webhooks"]
    assert hook["clientConfig"]["caBundle"] == "Q0EgYnVuZGxl"
    assert ("Role", "resourceconsist-webhook-certs") not in stored

    # Ingress: the webhook from its block, metrics from the monitoring namespace, the probes.
    policy_net = stored[("NetworkPolicy", "resourceconsist-manager")]
    assert policy_net["spec"]["podSelector"]["matchLabels"].items() <= pod_labels(deployment).items()
    rules = {rule["ports"][0]["port"]: rule.get("from") for rule in policy_net["spec"]["ingress"]}
    assert rules == {
        19443: FIELD_VALUES["networkPolicy"]["webhookFrom"],
        18080: FIELD_VALUES["networkPolicy"]["metricsFrom"],
        18081: None,
    }
    rule = stored[("PrometheusRule", "resourceconsist-manager")]
    assert rule["metadata"]["labels"]["release"] == "prometheus"
    assert {r["alert"] for r in rule["spec"]["groups"][0]["rules"]} >= {"ResourceconsistUnguardedRoutingPods"}

    # The pod of the template, as the API server admits it (the Deployment controller does not
    # run here).
    template = deployment["spec"]["template"]
    pod_doc = {"metadata": {**template["metadata"], "name": "manager-0"}, "spec": template["spec"]}
    created = chart_cluster.client.create(kube.POD, namespace, pod_doc, dry_run=True)
    assert created["spec"]["hostNetwork"] is True


def test_plain_metrics_need_no_reviews_and_are_scraped_over_http(tmp_path: Path) -> None:
    """``metrics.secure: false``: plain HTTP as before, no review grants, no reader role; the
    ServiceMonitor and the scrape annotations say http. The default ServiceMonitor of secure
    metrics skips verifying the self-signed certificate, as kubebuilder's."""
    plain = _by_kind(_template("resourceconsist", {"metrics": {"secure": False}}, tmp_path))
    deployment = plain[("Deployment", "resourceconsist-manager")]
    assert not [a for a in _container(deployment)["args"] if a.startswith("--metrics-secure")]
    assert deployment["spec"]["template"]["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
    assert "prometheus.io/scheme" not in deployment["spec"]["template"]["metadata"]["annotations"]
    assert not [name for kind, name in plain if name.startswith("resourceconsist-metrics-")]
    monitored = {"metrics": {"secure": False}, "serviceMonitor": {"enabled": True}}
    (endpoint,) = _by_kind(_template("resourceconsist", monitored, tmp_path))[
        ("ServiceMonitor", "resourceconsist-manager")
    ]["spec"]["endpoints"]
    assert endpoint["scheme"] == "http" and "bearerTokenFile" not in endpoint and "tlsConfig" not in endpoint
    secure = _by_kind(_template("resourceconsist", {"serviceMonitor": {"enabled": True}}, tmp_path))
    (endpoint,) = secure[("ServiceMonitor", "resourceconsist-manager")]["spec"]["endpoints"]
    assert (endpoint["scheme"], endpoint["tlsConfig"]) == ("https", {"insecureSkipVerify": True})


def test_a_certificate_brought_needs_its_ca_and_excludes_cert_manager() -> None:
    alone = _helm("template", "x", str(CHART), "--set", "webhook.tls.secretName=mine")
    assert alone.returncode != 0 and "webhook.tls.secretName needs webhook.tls.caBundle" in alone.stderr
    both = _helm(
        "template",
        "x",
        str(CHART),
        *("--set", "webhook.tls.secretName=mine", "--set", "webhook.tls.caBundle=Q0E="),
        *("--set", "webhook.certManager.enabled=true"),
    )
    assert both.returncode != 0 and "set one" in both.stderr


def test_the_credentials_secret_is_named_only_where_an_adapter_reads_it(tmp_path: Path) -> None:
    """adapters: [demo] runs without the SLB Secret (it started into CreateContainerConfigError
    when the chart named it whatever the adapters); alibabacloudslb still reads it."""
    demo = _by_kind(_template("resourceconsist", {"adapters": ["demo"]}, tmp_path))
    assert "envFrom" not in _container(demo[("Deployment", "resourceconsist-manager")])
    both = _by_kind(_template("resourceconsist", {"adapters": ["demo", "alibabacloudslb"]}, tmp_path))
    assert _container(both[("Deployment", "resourceconsist-manager")])["envFrom"] == [
        {"secretRef": {"name": "resourceconsist-slb-credentials"}}
    ]


def test_uninstall_waits_for_the_uninstall_check_hook(tmp_path: Path) -> None:
    """A pre-delete hook Job runs `resourceconsist uninstall-check` as the manager, over the
    watched namespaces (docs/install.md, "Uninstalling"); off, none is rendered."""
    found = _by_kind(_template("resourceconsist", {"watchNamespaces": ["shop", "pay"]}, tmp_path))
    job = found[("Job", "resourceconsist-uninstall-check")]
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-delete"
    spec = job["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] == "resourceconsist-manager"
    assert spec["containers"][0]["args"][:3] == [
        "uninstall-check",
        "--wait-seconds=60",
        "--namespace=pay,shop",
    ]
    # No Service of the release selects its pod (it carries no app.kubernetes.io/name).
    assert "app.kubernetes.io/name" not in job["spec"]["template"]["metadata"]["labels"]
    off = _by_kind(_template("resourceconsist", {"uninstallCheck": {"enabled": False}}, tmp_path))
    assert ("Job", "resourceconsist-uninstall-check") not in off


def _parsed(args: list[str]) -> tuple[Any, Any]:
    """The ``ManagerOptions`` and ``WebhookOptions`` the real command line builds from a container's
    rendered args (click's own parsing and the options' checks; nothing run), $(POD_NAME) put in
    as the kubelet does."""
    command = {"run": cli.run, "webhook": cli.webhook}[args[0]]
    given = [a.replace("$(POD_NAME)", "resourceconsist-manager-0") for a in args[1:]]
    with command.make_context(args[0], given) as ctx:
        flags = dict(ctx.params)
    managed = cli._manager_options(flags) if args[0] == "run" else None
    return managed, cli._webhook_options(flags)


def _drain_rule(policy: dict[str, Any], port: int) -> list[dict[str, Any]]:
    """The NetworkPolicy's ingress rules on ``port``."""
    return [r for r in policy["spec"]["ingress"] if [p["port"] for p in r["ports"]] == [port]]


def test_the_wait_drain_serves_the_endpoint_on_every_replica_and_tells_the_webhook(tmp_path: Path) -> None:
    """drainWaiter.enabled (docs/zero-downtime.md, "A drain that waits for the provider"): every
    manager replica serves the drain endpoint on its own port, a ClusterIP Service selecting all of
    them fronts it, the webhook gives the waiters the manager's image and that Service's address,
    and the NetworkPolicy lets the pods the webhook admits reach the port; the real command line
    takes the rendered flags."""
    namespace = "platform-lb"
    found = _by_kind(_template(namespace, DRAIN_VALUES, tmp_path))
    manager = found[("Deployment", "resourceconsist-manager")]
    container = _container(manager)
    args = container["args"]
    endpoint = f"http://resourceconsist-manager-drain.{namespace}.svc:8082"
    for flag in ("--drain-bind-address=:8082", "--drain-waiter-image=resourceconsist:0.1.0"):
        assert flag in args
    assert [a for a in args if a.startswith("--drain-waiter-endpoint")] == [
        f"--drain-waiter-endpoint={endpoint}"
    ]
    assert {"name": "drain", "containerPort": 8082} in container["ports"]
    managed, webhook = _parsed(args)
    assert managed.drain_address == ("", 8082)
    assert webhook.drain_waiter.image == "resourceconsist:0.1.0"
    assert webhook.drain_waiter.endpoints == (endpoint,)

    service = found[("Service", "resourceconsist-manager-drain")]
    assert service["metadata"]["namespace"] == namespace
    assert service["spec"]["type"] == "ClusterIP"
    assert service["spec"]["ports"] == [
        {"name": "drain", "port": 8082, "protocol": "TCP", "targetPort": "drain"}
    ]
    # Every replica, the standby too: the selector is the Deployment's own.
    assert service["spec"]["selector"] == manager["spec"]["selector"]["matchLabels"]
    assert (
        endpoint
        == f"http://{service['metadata']['name']}.{namespace}.svc:{service['spec']['ports'][0]['port']}"
    )

    # From the pods the webhook admits (its object selector, every namespace), nothing else.
    policy = found[("NetworkPolicy", "resourceconsist-manager")]
    (rule,) = _drain_rule(policy, 8082)
    assert rule["ports"] == [{"port": 8082, "protocol": "TCP"}]
    assert rule["from"] == [
        {
            "podSelector": {"matchLabels": {wire.CONTROL_LABEL: wire.CONTROL_LABEL_VALUE}},
            "namespaceSelector": {},
        }
    ]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod_labels(manager).items()

    # Off (the default): none of it, and the NetworkPolicy has no drain rule.
    off = _by_kind(_template(namespace, {"networkPolicy": {"enabled": True}}, tmp_path))
    container = _container(off[("Deployment", "resourceconsist-manager")])
    assert not [a for a in container["args"] if a.startswith("--drain")]
    assert "drain" not in {p["name"] for p in container["ports"]}
    assert not [name for kind, name in off if name.endswith("-drain")]
    assert not _drain_rule(off[("NetworkPolicy", "resourceconsist-manager")], 8082)
    managed, webhook = _parsed(container["args"])
    assert managed.drain_address is None and webhook.drain_waiter is None


def test_the_wait_drain_when_sharded_is_served_by_the_shards_and_told_by_the_webhook(tmp_path: Path) -> None:
    """Sharded, the shards serve the endpoint (a pod outside a shard's cache is read from the API
    server) and the Service selects them, not the webhook's pods, which serve none; the webhook
    Deployment gives the waiters the address."""
    found = _by_kind(_template("resourceconsist", {**SHARDING_VALUES, **DRAIN_VALUES}, tmp_path))
    shards = found[("Deployment", "resourceconsist-manager")]
    hooks = found[("Deployment", "resourceconsist-webhook")]
    shard_args, hook_args = _container(shards)["args"], _container(hooks)["args"]
    assert "--drain-bind-address=:8082" in shard_args
    assert not [a for a in shard_args if a.startswith("--drain-waiter")]
    assert "drain" in {p["name"] for p in _container(shards)["ports"]}
    assert not [a for a in hook_args if a.startswith("--drain-bind")]
    assert "drain" not in {p["name"] for p in _container(hooks)["ports"]}
    _, webhook = _parsed(hook_args)
    assert webhook.drain_waiter.endpoints == (
        "http://resourceconsist-manager-drain.resourceconsist.svc:8082",
    )
    managed, _ = _parsed(shard_args)
    assert managed.drain_address == ("", 8082) and managed.sharding is not None
    service = found[("Service", "resourceconsist-manager-drain")]
    assert service["spec"]["selector"] == shards["spec"]["selector"]["matchLabels"]
    assert not service["spec"]["selector"].items() <= pod_labels(hooks).items()


def test_the_wait_drain_s_image_endpoints_and_peers_can_be_given(tmp_path: Path) -> None:
    """The waiter's image from a mirror the gated pods can pull (the tag still the manager's),
    endpoints of your own (each one a flag), the peers allowed to ask, and in a namespaced install
    the default peers are the watched namespaces' pods, as the webhook's."""
    values = {
        "image": {"tag": "0.1.0-rc1"},
        "drainWaiter": {
            "enabled": True,
            "port": 18082,
            "image": {"repository": "mirror.example.com/resourceconsist"},
            "endpoints": ["http://10.96.0.50:18082", "http://lb-drain.example:18082/"],
        },
        "networkPolicy": {"enabled": True, "drainFrom": [{"ipBlock": {"cidr": "10.0.0.0/8"}}]},
    }
    found = _by_kind(_template("resourceconsist", values, tmp_path))
    args = _container(found[("Deployment", "resourceconsist-manager")])["args"]
    assert "--drain-bind-address=:18082" in args
    _, webhook = _parsed(args)
    assert webhook.drain_waiter.image == "mirror.example.com/resourceconsist:0.1.0-rc1"
    assert webhook.drain_waiter.endpoints == ("http://10.96.0.50:18082", "http://lb-drain.example:18082/")
    assert found[("Service", "resourceconsist-manager-drain")]["spec"]["ports"][0]["port"] == 18082
    (rule,) = _drain_rule(found[("NetworkPolicy", "resourceconsist-manager")], 18082)
    assert rule["from"] == [{"ipBlock": {"cidr": "10.0.0.0/8"}}]

    namespaced = {**DRAIN_VALUES, "watchNamespaces": ["web", "shop"]}
    found = _by_kind(_template("resourceconsist", namespaced, tmp_path))
    (rule,) = _drain_rule(found[("NetworkPolicy", "resourceconsist-manager")], 8082)
    (hook,) = found[("MutatingWebhookConfiguration", wire.MUTATING_WEBHOOK_CONFIGURATION)]["webhooks"]
    assert rule["from"] == [
        {"podSelector": hook["objectSelector"], "namespaceSelector": hook["namespaceSelector"]}
    ]
    assert hook["namespaceSelector"]["matchExpressions"][0]["values"] == ["shop", "web"]
    # Without the webhook here (served elsewhere), the port is open to any peer.
    found = _by_kind(_template("resourceconsist", {**DRAIN_VALUES, "webhook": {"enabled": False}}, tmp_path))
    (rule,) = _drain_rule(found[("NetworkPolicy", "resourceconsist-manager")], 8082)
    assert "from" not in rule
    assert ("Service", "resourceconsist-manager-drain") in found


@pytest.mark.parametrize(
    ("settings", "error"),
    [
        (["drainWaiter.port=8081"], "drainWaiter.port 8081 is healthProbe.port too"),
        (["drainWaiter.port=9443"], "drainWaiter.port 9443 is webhook.port too"),
        (["drainWaiter.port=8080"], "drainWaiter.port 8080 is metrics.port too"),
        (["drainWaiter.image.tag=latest"], "drainWaiter.image.tag: latest is a moving tag"),
        (["drainWaiter.port=0"], "at '/drainWaiter/port': minimum: got 0, want 1"),
        (
            ["drainWaiter.endpoints={resourceconsist-manager-drain:8082}"],
            "at '/drainWaiter/endpoints/0': 'resourceconsist-manager-drain:8082' does not match pattern",
        ),
    ],
)
def test_drain_values_that_cannot_work_are_refused(settings: list[str], error: str) -> None:
    sets = [arg for setting in ["drainWaiter.enabled=true", *settings] for arg in ("--set", setting)]
    refused = _helm("template", "x", str(CHART), *sets)
    assert refused.returncode != 0
    assert error in refused.stderr, refused.stderr


def test_helm_install_with_the_wait_drain_on_a_real_api_server(
    chart_cluster: ChartCluster, tmp_path: Path
) -> None:
    """The API server takes the drain Service and the NetworkPolicy's rule as rendered (a named
    target port, a peer of both selectors), gives the Service a cluster IP, and the notes say where
    the managers answer."""
    stored = chart_cluster.install("platform-lb", DRAIN_VALUES, tmp_path)
    service = stored[("Service", "resourceconsist-manager-drain")]
    assert service["spec"]["clusterIP"] not in ("", "None")
    assert service["spec"]["ports"][0]["targetPort"] == "drain"
    deployment = stored[("Deployment", "resourceconsist-manager")]
    assert service["spec"]["selector"].items() <= pod_labels(deployment).items()
    (rule,) = _drain_rule(stored[("NetworkPolicy", "resourceconsist-manager")], 8082)
    assert rule["from"][0]["namespaceSelector"] == {}
    notes = _helm("get", "notes", "resourceconsist", "--namespace", "platform-lb", env=chart_cluster.helm_env)
    assert "http://resourceconsist-manager-drain.platform-lb.svc:8082" in notes.stdout
    assert "drain-mode=wait" in notes.stdout
