"""What ``resourceconsist run --adapter NAME`` imports, and the peak RSS a process that imports only
that takes (docs/benchmarks.md, "Memory").

For each adapter, twice (``--rounds``), and for every tree given (``--against-tree``, e.g. a
checkout of main, started with its own ``.venv/bin/python`` when it has one): a child runs
``run --adapter NAME`` against an API server that does not answer (a closed loopback port) for
a few seconds and until it loads no more modules (the manager built and started), and reports the modules then
loaded (the same set a run that reconciles loads: the manager imports what it runs before the
caches fill) and its peak RSS. A second child imports exactly those modules and nothing else and
reports its peak RSS (``VmHWM``): the import baseline. The heaviest top-level packages are
listed with what each one alone adds on top of the rest.

    .venv/bin/python bench/bench_imports.py
    .venv/bin/python bench/bench_imports.py --adapters demo,haproxy --against-tree ../main-checkout
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_pace import package_view

#: Runs the CLI in this process; once it has run DELAY seconds and loaded no module for 1.5 s,
#: prints the loaded modules and VmHWM, and exits.
RUN_CHILD = r"""
import json, os, runpy, sys, threading, time
def report():
    time.sleep(float(os.environ["BENCH_DELAY"]))
    seen, still = len(sys.modules), 0.0
    while still < 1.5:
        time.sleep(0.25)
        still = still + 0.25 if len(sys.modules) == seen else 0.0
        seen = len(sys.modules)
    status = dict(l.split(":", 1) for l in open("/proc/self/status"))
    print("\n" + json.dumps({"hwm_kb": int(status["VmHWM"].split()[0]), "modules": sorted(sys.modules)}),
          flush=True)
    os._exit(0)
threading.Thread(target=report, daemon=True).start()
sys.argv = ["resourceconsist", *sys.argv[1:]]
runpy.run_module("resourceconsist", run_name="__main__")
"""

#: Imports the modules given (those a run loaded) and prints VmHWM; with a name to leave out,
#: every module of that top-level package is left out.
IMPORT_CHILD = r"""
import importlib, json, sys
modules, leave_out = json.loads(sys.argv[1])
for name in modules:
    if name.partition(".")[0] == leave_out or name in sys.modules:
        continue
    try:
        importlib.import_module(name)
    except Exception:
        pass  # a module only its parent's import makes (six.moves' and the like)
status = dict(l.split(":", 1) for l in open("/proc/self/status"))
print(json.dumps({"hwm_kb": int(status["VmHWM"].split()[0])}))
"""

KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "https://127.0.0.1:{port}", insecure-skip-tls-verify: true}}}}]
users: [{{name: u, user: {{token: bench}}}}]
contexts: [{{name: x, context: {{cluster: c, user: u}}}}]
current-context: x
"""

#: What each adapter needs in its environment to be built (no provider is reached in the window).
ADAPTER_ENV = {"haproxy": {"HAPROXY_RUNTIME_API": "tcp://127.0.0.1:1"}}


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def python_of(tree: Path | None) -> tuple[list[str], dict[str, str]]:
    """How to start a Python of ``tree`` (None: this one) and the environment it needs."""
    env = dict(os.environ)
    if tree is None:
        return [sys.executable, "-P"], env
    venv = tree / ".venv" / "bin" / "python"
    if venv.exists():
        return [str(venv), "-P"], env
    env["PYTHONPATH"] = str(package_view(tree))
    return [sys.executable, "-P"], env


def run_imports(tree: Path | None, adapter: str, kubeconfig: Path, delay: float) -> dict[str, object]:
    python, env = python_of(tree)
    env.update(ADAPTER_ENV.get(adapter, {}), BENCH_DELAY=str(delay))
    argv = [
        *python,
        "-c",
        RUN_CHILD,
        "--log-level",
        "error",
        "run",
        "--adapter",
        adapter,
        "--kubeconfig",
        str(kubeconfig),
        "--metrics-bind-address",
        "127.0.0.1:0",
        "--health-probe-bind-address",
        "127.0.0.1:0",
    ]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=False)
    last = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not last:
        raise RuntimeError(f"run --adapter {adapter} reported nothing: {(done.stdout + done.stderr)[-2000:]}")
    report: dict[str, object] = json.loads(last[-1])
    return report


def import_only(tree: Path | None, modules: list[str], leave_out: str = "") -> float:
    python, env = python_of(tree)
    argv = [*python, "-c", IMPORT_CHILD, json.dumps([modules, leave_out])]
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=True).stdout
    return float(json.loads(out.splitlines()[-1])["hwm_kb"]) / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--adapters", default="demo,haproxy")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; figures are medians")
    parser.add_argument("--delay", type=float, default=3.0, help="seconds the run gets to start")
    parser.add_argument("--against-tree", type=Path, action="append", default=[])
    parser.add_argument("--top", type=int, default=8, help="top-level packages to weigh one by one")
    args = parser.parse_args()
    trees: list[Path | None] = [None, *(t.resolve() for t in args.against_tree)]
    kubeconfig = Path(tempfile.mkdtemp(prefix="bench-imports-")) / "kubeconfig"
    kubeconfig.write_text(KUBECONFIG.format(port=closed_port()))
    for adapter in [a.strip() for a in args.adapters.split(",") if a.strip()]:
        for tree in trees:
            label = "this tree" if tree is None else str(tree)
            runs, bases, modules = [], [], []
            for _ in range(args.rounds):
                report = run_imports(tree, adapter, kubeconfig, args.delay)
                modules = [str(m) for m in report["modules"]]  # type: ignore[attr-defined]
                runs.append(float(report["hwm_kb"]) / 1024)  # type: ignore[arg-type]
                bases.append(import_only(tree, modules))
            tops = sorted({m.partition(".")[0] for m in modules})
            print(
                f"run --adapter {adapter}, {label}: {len(modules)} modules; imports only "
                f"{statistics.median(bases):.1f} MB peak RSS ({', '.join(f'{b:.1f}' for b in bases)}); "
                f"the run against a closed port {statistics.median(runs):.1f} MB"
            )
            base = statistics.median(bases)
            weights = []
            for top in tops:
                if top.startswith("_") or top in sys.stdlib_module_names:
                    continue
                if sum(1 for m in modules if m.partition(".")[0] == top) < 3:
                    continue
                weights.append((base - import_only(tree, modules, top), top))
            for cost, top in sorted(weights, reverse=True)[: args.top]:
                print(f"    {top:28s} {cost:5.1f} MB (the rest without it)")


if __name__ == "__main__":
    main()
