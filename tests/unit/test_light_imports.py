"""Processes that start often import only what they need: a pilot's agent does not pay for
torch (about 1 s of every pilot's start). And the layers stay apart: the pilot side
(:mod:`parsl_bf.pilot`) imports nothing of the driver, the driver imports only the pilot's
contracts, and no live component imports the offline replay or analysis."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "parsl_bf"

#: What the driver may import of the pilot package: the contracts both sides share.
PILOT_CONTRACTS = {"parsl_bf.pilot.wire", "parsl_bf.pilot.outcome"}
#: The driver side, Parsl's DataFlowKernel, the solver and the offline code: none of it on a
#: pilot's node.
NOT_ON_THE_NODE = (
    "parsl_bf.executor",
    "parsl_bf.allocation",
    "parsl_bf.providers",
    "parsl_bf.replay",
    "parsl_bf.config",
    "parsl_bf.commands",
    "parsl_bf.report",
    "pyomo",
    "parsl.dataflow",
)
#: Offline: what reads recorded traces and finished runs.
OFFLINE = ("parsl_bf.replay", "parsl_bf.executor.analysis")
#: The modules that may import the offline code: itself, and the command line and the report
#: that run it.
OFFLINE_USERS = ("parsl_bf.replay", "parsl_bf.executor.analysis", "parsl_bf.cli", "parsl_bf.report")
#: The pilot's modules that import Parsl, for its serialisation only (``import parsl.serialize``
#: runs Parsl's own ``__init__``, which imports its DataFlowKernel's module: not avoidable).
PARSL_SERIALISATION = {"parsl_bf.pilot.outcome", "parsl_bf.pilot.runner"}


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


MODULES = _modules()


def _imports(name: str) -> set[str]:
    """Every module ``name`` imports, at the top or inside a function, relative ones resolved
    (``from X import y`` counts X, and X.y when that is a module of the package)."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            out.add(target)
            out.update(f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in MODULES)
    return out


def _within(module: str, prefixes: tuple[str, ...] | set[str]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def test_the_pilot_agent_does_not_import_torch() -> None:
    code = "import sys, parsl_bf.pilot.agent; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_pilot_agent_does_not_import_parsl() -> None:
    # Parsl's serialisation is the plain apps' warm host's to import, with its first app.
    code = "import sys, parsl_bf.pilot.agent; print('parsl' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_pilot_package_imports_nothing_of_the_driver() -> None:
    # Every module of the pilot side, in one fresh interpreter: the agent, its ranks, warm
    # hosts, relays, standbys, the runner and the contracts.
    pilot = [m for m in MODULES if _within(m, ("parsl_bf.pilot",))]
    code = (
        "import importlib, json, sys\n"
        f"for m in {pilot!r}: importlib.import_module(m)\n"
        "print(json.dumps(sorted(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = set(ast.literal_eval(out.stdout.strip()))
    # Parsl's DataFlowKernel module comes in only through Parsl's own package init, with the
    # runner's serialisation (checked below by what each module imports).
    forbidden = tuple(p for p in NOT_ON_THE_NODE if p != "parsl.dataflow")
    assert sorted(m for m in loaded if _within(m, forbidden)) == []
    assert "torch" not in loaded  # the standby and the rank host import it when they run


@pytest.mark.parametrize(
    "module", sorted(m for m in MODULES if _within(m, ("parsl_bf.pilot",))), ids=str
)
def test_a_pilot_module_imports_nothing_of_the_driver(module: str) -> None:
    imported = _imports(module)
    assert sorted(m for m in imported if _within(m, NOT_ON_THE_NODE)) == []
    if module not in PARSL_SERIALISATION:
        allowed = {"parsl_bf.pilot.runner", "parsl_bf.pilot.outcome"}  # lazily, by the hosts
        assert sorted(m for m in imported if _within(m, ("parsl",)) and m not in allowed) == []


def test_the_driver_imports_only_the_pilots_contracts() -> None:
    wrong = {
        (name, m)
        for name in MODULES
        if not _within(name, ("parsl_bf.pilot",))
        for m in _imports(name)
        if _within(m, ("parsl_bf.pilot",)) and m not in PILOT_CONTRACTS | {"parsl_bf.pilot"}
    }
    assert sorted(wrong) == []


def test_no_live_component_imports_the_replay_or_the_analysis() -> None:
    wrong = {
        (name, m)
        for name in MODULES
        if not _within(name, OFFLINE_USERS)
        for m in _imports(name)
        if _within(m, OFFLINE)
    }
    assert sorted(wrong) == []
