"""The chart's alert rules (templates/monitoring/prometheusrule.yaml; docs/observability.md,
"Alerts"), rendered by the real helm and checked by the real promtool (Debian's prometheus
package, hack/install-promtool.sh): `promtool check rules` passes, `promtool test rules` sees each
alert fire on one series history and stay silent on another, every series an alert reads is one
the manager exposes (read from resourceconsist.runtime.metrics' registry, not from a list here), and each
alert has its section in docs/observability.md."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from resourceconsist.runtime.metrics import Metrics
from resourceconsist.testing import find_helm

# helm lives beside the control plane's binaries: CI's run without them deselects this module by
# the marker, never by a missing binary.
pytestmark = pytest.mark.controlplane

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "resourceconsist"
OBSERVABILITY_DOC = REPO / "docs" / "observability.md"
JOB = "resourceconsist-manager-metrics"
#: Series Prometheus makes for every target itself, not read from /metrics.
PROMETHEUS_OWN = {"up"}


def _promtool() -> Path:
    """promtool: $PROMTOOL, else hack/install-promtool.sh's, else on PATH."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    for candidate in (os.environ.get("PROMTOOL"), cache / "resourceconsist" / "promtool" / "promtool"):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    found = shutil.which("promtool")
    assert found, "no promtool: run hack/install-promtool.sh (make setup does)"
    return Path(found)


def _rules(values: list[str] | None = None) -> dict[str, Any]:
    """The PrometheusRule's spec, rendered with ``prometheusRule.enabled`` (and ``values``)."""
    settings = [arg for value in values or [] for arg in ("--set", value)]
    rendered = subprocess.run(
        [
            str(find_helm()),
            *("template", "resourceconsist", str(CHART), "--namespace", "resourceconsist"),
            *("--set", "prometheusRule.enabled=true", *settings),
            *("--show-only", "templates/monitoring/prometheusrule.yaml"),
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert rendered.returncode == 0, rendered.stderr
    rule = yaml.safe_load(rendered.stdout)
    assert rule["kind"] == "PrometheusRule"
    return dict(rule["spec"])


def _alerts(spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {rule["alert"]: rule for group in spec["groups"] for rule in group["rules"] if "alert" in rule}


def _promtool_run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(_promtool()), *args], check=False, capture_output=True, text=True, timeout=120, cwd=cwd
    )


def test_promtool_checks_the_rules(tmp_path: Path) -> None:
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(_rules()))
    checked = _promtool_run("check", "rules", "rules.yaml", cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(_alerts(_rules()))} rules found" in checked.stdout


def _series(name: str, labels: dict[str, str], values: str) -> dict[str, str]:
    selector = ", ".join(f'{key}="{value}"' for key, value in {"job": JOB, **labels}.items())
    return {"series": f"{name}{{{selector}}}", "values": values}


LEASE, WEBHOOK = "resourceconsist-manager", "/mutating-alibabacloudslb"


def _held(values: str) -> dict[str, str]:
    return _series("resourceconsist_guard_held_deletion_seconds", {"cluster": "", "instance": "a"}, values)


def _lease(values: str) -> dict[str, str]:
    return _series("leader_election_master_status", {"instance": "a", "name": LEASE}, values)


def _admissions(code: str, values: str) -> dict[str, str]:
    return _series("controller_runtime_webhook_requests_total", {"webhook": WEBHOOK, "code": code}, values)


def _latencies(under_half_a_second: int) -> list[dict[str, str]]:
    """100 admissions a minute, ``under_half_a_second`` of them answered within 0.5 s, all within 10 s."""
    name = "controller_runtime_webhook_latency_seconds_bucket"
    counts = (("0.5", under_half_a_second), ("10", 100), ("+Inf", 100))
    return [_series(name, {"webhook": WEBHOOK, "le": le}, f"0+{count}x25") for le, count in counts]


#: Each alert: (the evaluation time, the labels it fires with beside its severity, the series
#: history that fires it, the one that does not). Histories in promtool's notation, a sample a
#: minute ("a+bxN": N+1 samples from a, adding b).
CASES: dict[str, tuple[str, dict[str, str], list[dict[str, str]], list[dict[str, str]]]] = {
    "ResourceconsistDown": (
        "10m",
        {},
        [_series("up", {"instance": "a"}, "0x15")],
        [_series("up", {"instance": "a"}, "0x3 1x12")],
    ),
    "ResourceconsistUnguardedRoutingPods": (
        "10m",
        {"job": JOB, "controller": "slb"},
        [_series("resourceconsist_unguarded_routing_pods", {"controller": "slb", "instance": "a"}, "2x15")],
        # A moment's count (the provider's view lags a pass) is not the promise broken.
        [
            _series(
                "resourceconsist_unguarded_routing_pods", {"controller": "slb", "instance": "a"}, "1x2 0x13"
            )
        ],
    ),
    "ResourceconsistGuardHoldsDeletion": (
        "20m",
        {"job": JOB},
        [_held("0+60x20")],
        # A deregistration that takes a few minutes (a slow provider) is no page.
        [_held("0+60x4 0x16")],
    ),
    "ResourceconsistPodsHeldByGoneEmployers": (
        "40m",
        {"job": JOB, "controller": "slb"},
        [
            _series(
                "resourceconsist_pods_held_by_gone_employers", {"controller": "slb", "instance": "a"}, "3x45"
            )
        ],
        [
            _series(
                "resourceconsist_pods_held_by_gone_employers",
                {"controller": "slb", "instance": "a"},
                "3x20 0x25",
            )
        ],
    ),
    "ResourceconsistReconcileStuck": (
        "20m",
        {"job": JOB, "controller": "slb"},
        [
            _series(
                "workqueue_longest_running_processor_seconds",
                {"name": "slb", "controller": "slb", "instance": "a"},
                "0+60x20",
            )
        ],
        [
            _series(
                "workqueue_longest_running_processor_seconds",
                {"name": "slb", "controller": "slb", "instance": "a"},
                "30x20",
            )
        ],
    ),
    "ResourceconsistReconcileErrors": (
        "30m",
        {"job": JOB, "controller": "slb"},
        [
            _series(
                "controller_runtime_reconcile_total", {"controller": "slb", "result": "success"}, "0+10x35"
            ),
            _series("controller_runtime_reconcile_total", {"controller": "slb", "result": "error"}, "0+5x35"),
            _series("controller_runtime_reconcile_errors_total", {"controller": "slb"}, "0+5x35"),
        ],
        [
            _series(
                "controller_runtime_reconcile_total", {"controller": "slb", "result": "success"}, "0+100x35"
            ),
            _series("controller_runtime_reconcile_total", {"controller": "slb", "result": "error"}, "0+1x35"),
            _series("controller_runtime_reconcile_errors_total", {"controller": "slb"}, "0+1x35"),
        ],
    ),
    "ResourceconsistProviderBudgetStarved": (
        "20m",
        {"job": JOB, "account": "slb:cn-hangzhou", "priority": "remove_traffic"},
        [
            _series(
                "resourceconsist_provider_budget_queued",
                {"account": "slb:cn-hangzhou", "priority": "remove_traffic"},
                "4x25",
            )
        ],
        # Reads and registrations may wait: they go last by design.
        [
            _series(
                "resourceconsist_provider_budget_queued",
                {"account": "slb:cn-hangzhou", "priority": "read"},
                "4x25",
            )
        ],
    ),
    "ResourceconsistLeaseLostRepeatedly": (
        "10m",
        {"job": JOB, "instance": "a", "name": LEASE},
        [_lease("1 1 0 0 1 1 0 1 1 1 1")],
        # One loss (a rollout, a restart of the API server) is not a pattern.
        [_lease("1 1 0 0 1 1 1 1 1 1 1")],
    ),
    "ResourceconsistWebhookErrors": (
        "15m",
        {"job": JOB, "webhook": WEBHOOK},
        [_admissions("200", "0+100x20"), _admissions("500", "0+20x20")],
        [_admissions("200", "0+100x20"), _admissions("500", "0+1x20")],
    ),
    "ResourceconsistWebhookSlow": (
        "20m",
        {"job": JOB, "webhook": WEBHOOK},
        _latencies(under_half_a_second=50),
        _latencies(under_half_a_second=100),
    ),
}


def _expanded(annotations: dict[str, str], labels: dict[str, str]) -> dict[str, str]:
    """The annotations as Prometheus fills them in for ``labels`` ({{ $labels.x }} only)."""
    return {
        key: re.sub(r"\{\{\s*\$labels\.(\w+)\s*\}\}", lambda m: labels[m.group(1)], value)
        for key, value in annotations.items()
    }


def test_each_alert_fires_on_its_case_and_stays_silent_on_the_other(tmp_path: Path) -> None:
    spec = _rules()
    alerts = _alerts(spec)
    assert set(CASES) == set(alerts), "every alert has a firing and a silent case here, and no other"
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(spec))
    tests = []
    for name, (at, labels, firing, silent) in CASES.items():
        rule = alerts[name]
        expected = {**labels, **rule["labels"]}
        fired = {"exp_labels": expected, "exp_annotations": _expanded(rule["annotations"], expected)}
        for history, exp_alerts in ((firing, [fired]), (silent, [])):
            tests.append(
                {
                    "name": f"{name} {'fires' if exp_alerts else 'stays silent'}",
                    "interval": "1m",
                    "input_series": history,
                    "alert_rule_test": [{"eval_time": at, "alertname": name, "exp_alerts": exp_alerts}],
                }
            )
    (tmp_path / "tests.yaml").write_text(
        yaml.safe_dump({"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": tests})
    )
    tested = _promtool_run("test", "rules", "tests.yaml", cwd=tmp_path)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout + tested.stderr


def _exposed() -> set[str]:
    """The sample names the manager's registry exposes (the families with no samples yet too):
    a counter's ``_total``, a histogram's ``_bucket``, ``_sum`` and ``_count``, a gauge's name."""
    suffixes = {
        "counter": ("_total",),
        "histogram": ("_bucket", "_sum", "_count"),
        "summary": ("_sum", "_count"),
    }
    names: set[str] = set()
    for family in text_string_to_metric_families(generate_latest(Metrics().registry).decode()):
        names.update(family.name + suffix for suffix in suffixes.get(family.type, ("",)))
    return names


def test_each_alert_reads_series_the_manager_exposes() -> None:
    exposed = _exposed()
    for name, rule in _alerts(_rules()).items():
        read = set(re.findall(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\{", rule["expr"]))
        assert read, f"{name} reads no series"
        assert read <= exposed | PROMETHEUS_OWN, f"{name} reads {sorted(read - exposed)}, not on /metrics"


def test_the_selector_picks_this_release_s_series() -> None:
    """Every series an alert reads carries the selector (controller-runtime's names are every
    operator's); an empty selector reads them all."""
    for selector in ('namespace="platform"', ""):
        for name, rule in _alerts(_rules([f"prometheusRule.selector={selector}"])).items():
            for match in re.finditer(r"[a-zA-Z_:][a-zA-Z0-9_:]*\{([^}]*)\}", rule["expr"]):
                assert selector in match.group(1), f"{name}: {match.group(0)}"


def test_each_alert_says_what_to_do_in_the_docs() -> None:
    text = OBSERVABILITY_DOC.read_text()
    for name, rule in _alerts(_rules()).items():
        assert rule["annotations"]["runbook"] == f"docs/observability.md, Alerts, {name}"
        assert re.search(rf"^#### `{name}`$", text, re.M), f"docs/observability.md has no section {name}"
