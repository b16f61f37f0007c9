"""The package's import order: every module imports only from its own unit or from a unit on a
lower floor, so no import runs back up and no two units import each other.

Floors, bottom up (a unit is a top-level module or subpackage of ``avsg``):

    reference -> _ops -> backend -> validation -> buffer -> kvformat, model_config -> cache
    -> lab.traces -> integrations -> lab.costmodel -> runtime -> lab.budget -> cli_util
    -> commands -> lab.commands -> cli

The lab (``avsg.lab``: trace lab, cost model, budget simulator and their commands) lives beside
the package: each of its subpackages is a unit of its own, on its own floor, so the operator core
(everything up to ``cache``, and ``integrations``) cannot import it.

Imports inside functions count too: a lazy import that runs back up is still a loop.
"""
import ast
import os

import pytest

PACKAGE = os.path.join(os.path.dirname(__file__), "..", "..", "python", "avsg")

FLOORS = [
    {"reference"},
    {"_ops"},
    {"backend"},
    {"validation"},
    {"buffer"},
    {"kvformat", "model_config"},
    {"cache"},
    {"lab.traces"},
    {"integrations"},
    {"lab.costmodel"},
    {"runtime"},
    {"lab.budget"},
    {"cli_util"},
    {"commands"},
    {"lab.commands"},
    {"cli"},
]
FLOOR = {unit: i for i, units in enumerate(FLOORS) for unit in units}
FACE_FLOOR = FLOOR["buffer"]      # avsg/__init__.py re-exports buffer, backend and reference


def _modules():
    root = os.path.abspath(PACKAGE)
    for folder, _, files in os.walk(root):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                rel = os.path.relpath(path, os.path.dirname(root))[:-3].split(os.sep)
                is_package = rel[-1] == "__init__"
                module = ".".join(rel[:-1] if is_package else rel)
                yield module, path, is_package


MODULES = {m: (p, pkg) for m, p, pkg in _modules()}


def _exists(module: str) -> bool:
    return module in MODULES


def _imports(module: str, path: str, is_package: bool):
    """(line, imported module) for every import of an avsg module in ``path``."""
    package = module if is_package else module.rsplit(".", 1)[0]
    tree = ast.parse(open(path).read(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "avsg":
                    yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1])
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            if target.split(".")[0] != "avsg":
                continue
            for alias in node.names:       # `from .. import backend` imports a module
                sub = f"{target}.{alias.name}"
                yield node.lineno, sub if _exists(sub) else target


def _unit(module: str) -> str:
    parts = module.split(".")
    if len(parts) > 2 and parts[1] == "lab":
        return f"lab.{parts[2]}"
    return parts[1] if len(parts) > 1 else "avsg"


def test_every_unit_has_a_floor():
    units = {_unit(m) for m in MODULES} - {"avsg", "lab"}
    assert units <= set(FLOOR), f"units without a floor in this test: {sorted(units - set(FLOOR))}"


def test_every_import_resolves_to_a_module():
    missing = [f"{MODULES[m][0]}:{line}: {target}" for m in MODULES
               for line, target in _imports(m, *MODULES[m])
               if not _exists(target)]
    assert not missing, "imports of avsg modules that do not exist:\n" + "\n".join(missing)


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m not in ("avsg", "avsg.lab")))
def test_no_import_runs_back_up(module):
    path, is_package = MODULES[module]
    here = FLOOR[_unit(module)]
    upward = []
    for line, target in _imports(module, path, is_package):
        unit = _unit(target)
        if unit == _unit(module):
            continue
        floor = FACE_FLOOR if unit == "avsg" else FLOOR[unit]
        if floor >= here:
            upward.append(f"line {line}: {target} (floor {floor}; {module} is on floor {here})")
    assert not upward, f"{module} imports upward or sideways:\n" + "\n".join(upward)


def test_no_two_units_import_each_other():
    edges = {}
    for module, (path, is_package) in MODULES.items():
        for _, target in _imports(module, path, is_package):
            a, b = _unit(module), _unit(target)
            if a != b:
                edges.setdefault(a, set()).add(b)
    loops = sorted({tuple(sorted((a, b))) for a in edges for b in edges[a]
                    if a in edges.get(b, ()) and "avsg" not in (a, b)})
    assert not loops, f"units importing each other: {loops}"


CORE = {"reference", "_ops", "backend", "validation", "buffer", "kvformat", "model_config",
        "cache", "integrations"}


def test_the_operator_core_never_imports_the_lab():
    found = [f"{MODULES[m][0]}:{line}: {target}" for m in MODULES if _unit(m) in CORE
             for line, target in _imports(m, *MODULES[m]) if _unit(target).startswith("lab")]
    assert not found, "the operator core imports the lab:\n" + "\n".join(found)
