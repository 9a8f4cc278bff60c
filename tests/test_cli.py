"""The command line as a person (and CI) uses it: the demo converges on a fresh embedded control
plane; ``run`` refuses unknown adapter names with the list of known ones."""

from __future__ import annotations

import os
import subprocess
import sys


def _cli(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "resourceconsist", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "COLUMNS": "120"},
        check=False,
    )


def test_demo_runs_to_completion_and_shows_convergence() -> None:
    done = _cli("demo")
    assert done.returncode == 0, done.stdout + done.stderr
    steps = [line for line in done.stdout.splitlines() if line.startswith("converged: ")]
    assert len(steps) == 6, done.stdout
    assert "demo converged" in done.stdout
    assert "real server" in done.stdout  # the provider's table was shown


def test_run_with_an_unknown_adapter_lists_the_known_names() -> None:
    done = _cli("run", "--adapter", "nosuch", timeout=60)
    assert done.returncode == 2
    assert "no adapter named 'nosuch'" in done.stderr
    assert "demo" in done.stderr


def test_adapters_lists_demo_as_experimental() -> None:
    done = _cli("adapters", timeout=60)
    assert done.returncode == 0
    assert any(line.startswith("demo\t") and "experimental" in line for line in done.stdout.splitlines())
