"""The import contracts cover the whole package (docs/concepts.md, "Layers").

``.importlinter`` is what ``make lint`` checks, but a contract only binds the modules it names:
a module left out of every layer may import anything. These tests walk the package as it
installs (pyproject's package-dir: ``adapters/``, ``experimental/`` and ``webhook/`` mapped under
``resourceconsist``) and fail on a module that no contract names, on a contract that names a
module that does not exist, and on a module that imports the package root.
"""

from __future__ import annotations

import ast
import configparser
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "resourceconsist"
#: What stands outside the layers by design: the package root (it re-exports the public names
#: lazily, and no module imports it) and the testing kit (only the entry points import it; the
#: forbidden contract names it).
OUTSIDE_THE_LAYERS = {PACKAGE, f"{PACKAGE}.testing"}


def _folders() -> dict[str, Path]:
    """Each package of the install and the folder it comes from (pyproject's package-dir)."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    return {name: ROOT / folder for name, folder in setuptools["package-dir"].items()}


def _modules() -> Iterator[tuple[str, Path]]:
    """(dotted name, file) of every module of the installed package."""
    folders = _folders()
    for package, folder in folders.items():
        for path in sorted(folder.rglob("*.py")):
            parts = path.relative_to(folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            name = ".".join((package, *parts))
            # A folder mapped by a package-dir entry of its own is walked under that name only.
            if any(len(other) > len(package) and name.startswith(other + ".") for other in folders):
                continue
            yield name, path


def _top(name: str) -> str:
    """The module a contract names for ``name``: the package's direct child (or the root)."""
    parts = name.split(".")
    return ".".join(parts[:2])


def _contracts() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(inline_comment_prefixes=None, comment_prefixes=(";", "#"))
    parser.read(ROOT / ".importlinter")
    return parser


def _layer_modules() -> list[str]:
    """Every module the package's layers contract puts in a layer (not the contracts inside
    one of its packages, which name its submodules)."""
    found: list[str] = []
    for section in _contracts().values():
        if section.get("type") != "layers" or section.get("containers"):
            continue
        for line in section["layers"].splitlines():
            found += [m.strip() for m in re.split(r"[|:]", line) if m.strip()]
    return found


def _named_modules() -> set[str]:
    """Every module any contract names (layers, sources, forbidden, independent)."""
    named = set(_layer_modules())
    for section in _contracts().values():
        for key in ("source_modules", "forbidden_modules", "modules"):
            named |= {m.strip() for m in section.get(key, "").splitlines() if m.strip()}
    return named


def test_every_module_of_the_package_is_in_a_layer() -> None:
    layered = set(_layer_modules())
    named = _named_modules()
    tops = {_top(name) for name, _ in _modules()}
    assert f"{PACKAGE}.reconcile" in tops and f"{PACKAGE}.webhook" in tops  # the walk found the package
    missing = sorted(t for t in tops - layered if t not in OUTSIDE_THE_LAYERS)
    assert missing == [], f"modules in no layer of .importlinter: {missing}"
    unnamed = sorted(t for t in tops - named if t != PACKAGE)
    assert unnamed == [], f"modules no contract of .importlinter names: {unnamed}"


def test_every_module_a_layer_names_exists_and_none_is_optional() -> None:
    tops = {_top(name) for name, _ in _modules()}
    layers = _layer_modules()
    optional = [m for m in layers if m.startswith("(")]
    assert optional == [], f"layers that name a module as optional (it exists or it goes): {optional}"
    stale = sorted(m for m in set(layers) - tops)
    assert stale == [], f"layers name modules the package does not have: {stale}"
    assert len(layers) == len(set(layers)), "a module is in two layers"
    modules = {name for name, _ in _modules()}
    for section in _contracts().values():
        if section.get("type") == "layers" and section.get("containers"):
            (container,) = section["containers"].split()
            inner = [m.strip() for line in section["layers"].splitlines() for m in re.split(r"[|:]", line)]
            stale = sorted(m for m in inner if m and f"{container}.{m}" not in modules)
            assert stale == [], f"the layers of {container} name modules it does not have: {stale}"


def _imports_the_root(tree: ast.Module) -> list[str]:
    """The names a module takes from the package root itself (not from its submodules)."""
    submodules = {_top(name).rsplit(".", 1)[-1] for name, _ in _modules()}
    taken: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == PACKAGE:
            taken += [alias.name for alias in node.names if alias.name not in submodules]
        elif isinstance(node, ast.Import):
            taken += [alias.name for alias in node.names if alias.name == PACKAGE]
    return taken


def test_no_module_imports_the_package_root() -> None:
    offenders = {
        name: taken
        for name, path in _modules()
        if name != PACKAGE and (taken := _imports_the_root(ast.parse(path.read_text())))
    }
    assert offenders == {}, (
        f"modules that import the package root (import the module that holds the name): {offenders}"
    )


def _layers() -> list[set[str]]:
    """The layers of the layers contract, top floor first, as sets of short module names."""
    (section,) = (s for s in _contracts().values() if s.get("type") == "layers" and not s.get("containers"))
    return [
        {m.strip().removeprefix(f"{PACKAGE}.") for m in re.split(r"[|:]", line) if m.strip()}
        for line in section["layers"].splitlines()
        if line.strip()
    ]


def test_the_floors_of_the_docs_are_the_layers_of_the_contract() -> None:
    text = (ROOT / "docs" / "concepts.md").read_text()
    section = text.split("\n## Layers", 1)[1].split("\n## ", 1)[0]
    modules = {_top(name).rsplit(".", 1)[-1] for name, _ in _modules()}
    floors = [
        {m for m in re.findall(r"`([a-z_]+)`", row.split("|")[2]) if m in modules}
        for row in section.splitlines()
        if row.startswith("| ") and not row.startswith(("| floor", "| ---"))
    ]
    assert floors == _layers(), 'docs/concepts.md "Layers" and .importlinter disagree'


# -- no circle --------------------------------------------------------------------------------------


def _imported(name: str, path: Path, modules: set[str]) -> set[str]:
    """The package's modules ``name`` imports anywhere in it: at the top, in functions, under
    ``TYPE_CHECKING``. ``from a import b`` is module ``a.b`` when there is one, else ``a``."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
    return {m for m in found if m in modules and m != name}


def _import_graph() -> dict[str, set[str]]:
    paths = dict(_modules())
    modules = set(paths)
    return {name: _imported(name, path, modules) for name, path in paths.items()}


def _a_circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of the graph (its modules, the first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                return [*path[path.index(target) :], target]
            if target not in state and (circle := visit(target)) is not None:
                return circle
        path.pop()
        state[module] = 2
        return None

    for module in sorted(graph):
        if module not in state and (circle := visit(module)) is not None:
            return circle
    return None


def test_the_import_graph_finds_a_circle_when_there_is_one() -> None:
    assert _a_circle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert _a_circle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_no_module_of_the_package_imports_another_in_a_circle() -> None:
    graph = _import_graph()
    assert graph["resourceconsist.runtime.controller"] >= {
        "resourceconsist.reconcile",
        "resourceconsist.cluster.kube",
    }
    circle = _a_circle(graph)
    assert circle is None, (
        f"an import circle (TYPE_CHECKING and function-local imports count): {' -> '.join(circle)}"
    )


# -- the folders are the floors -------------------------------------------------------------------


def test_the_package_top_is_small_and_its_floors_are_few() -> None:
    """A newcomer meets a handful of public modules and the folders (issue 34): at most 8 modules
    at the top of resourceconsist/, at most 10 folders, a root contract of at most 10 layers, and
    no contract that excuses an import."""
    top = ROOT / PACKAGE
    modules = sorted(p.name for p in top.glob("*.py"))
    folders = sorted(p.name for p in top.iterdir() if (p / "__init__.py").is_file())
    assert len(modules) <= 8, f"modules at the top of resourceconsist/: {modules}"
    assert len(folders) <= 10, f"folders of resourceconsist/: {folders}"
    assert len(_layers()) <= 10, f"layers of the root contract: {_layers()}"
    excused = [name for name, section in _contracts().items() if section.get("ignore_imports")]
    assert excused == [], f"contracts with ignore_imports: {excused}"
    # Every folder of resourceconsist/ is named by the root contract as a whole, not module by module.
    layered = {m for layer in _layers() for m in layer}
    assert set(folders) - {"testing"} <= layered, f"folders in no layer: {set(folders) - layered}"


def test_only_the_profile_asks_an_adapter_for_its_capabilities() -> None:
    """An adapter's optional protocols are read once, by its profile (issue 34): no other module
    calls ``isinstance`` with one of them."""
    import resourceconsist.adapter as api

    protocols = {
        name
        for name, value in vars(api).items()
        if isinstance(value, type) and getattr(value, "_is_runtime_protocol", False)
    }
    assert {"ReconcileWatchOptions", "StatusRecordOptions", "WebhookCacheOptions"} <= protocols
    askers: dict[str, list[str]] = {}
    for name, path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "isinstance"
            ):
                continue
            if len(node.args) == 2:
                second = node.args[1]
                names = second.elts if isinstance(second, ast.Tuple) else [second]
                asked = [n.id for n in names if isinstance(n, ast.Name) and n.id in protocols]
                if asked:
                    askers.setdefault(name, []).extend(asked)
    assert set(askers) == {f"{PACKAGE}.reconcile.profile"}, f"modules asking for capabilities: {askers}"
