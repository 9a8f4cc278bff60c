"""The command line loads only what a command runs (docs/reference/options.md, "Import cost"):
importing it, ``--help``, ``adapters`` and a refused flag load none of the runtime (the manager,
aiohttp, prometheus_client, the Kubernetes client, cryptography, the adapter API). Each check runs
in a fresh interpreter, since this one has imported everything already."""

from __future__ import annotations

import json
import subprocess
import sys

from resourceconsist.testing import run_cli

#: What only a running command may load.
RUNTIME = (
    "aiohttp",
    "prometheus_client",
    "kubernetes",
    "cryptography",
    "pydantic",
    # The SLB adapter's credentials library: imported only when an RRSA or ECS source is built.
    "alibabacloud_credentials",
    "resourceconsist.manager",
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
    assert _runtime_loaded_by("import resourceconsist.cli") == []


def test_listing_the_adapters_loads_none_of_them() -> None:
    code = (
        "from resourceconsist.cli import main\n"
        "main(['adapters'], standalone_mode=False)\n"
        "assert 'resourceconsist.experimental.demo' not in sys.modules\n"
    )
    assert _runtime_loaded_by(code) == []


def test_a_refused_flag_loads_no_runtime() -> None:
    # --lease-duration shorter than the default renew deadline: LeaderElectionOptions refuses it
    # while the flags are turned into options, before anything runs.
    code = (
        "import click\n"
        "from resourceconsist.cli import main\n"
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
