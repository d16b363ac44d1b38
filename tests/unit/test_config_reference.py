"""The generated YAML configuration reference: current, complete, and true to the validator."""

from __future__ import annotations

import functools
import textwrap
from pathlib import Path

import pytest
import yaml

from parsl_bf.cli import main
from parsl_bf.config import _resolve, validate_config
from parsl_bf.config_reference import (
    CLASSES,
    EXAMPLE,
    _class,
    class_params,
    parse_parameters,
    render,
)

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "config-reference.md"


def _undocumented() -> list[str]:
    return [
        f"{name}.{p.name}"
        for module, name in CLASSES
        for p in class_params(_class(module, name))
        if not p.description
    ]


def test_committed_reference_is_current() -> None:
    assert REFERENCE.read_text() == render(), (
        "docs/config-reference.md is stale: run "
        "`parsl-bf config-reference --out docs/config-reference.md`"
    )


def test_every_parameter_is_documented() -> None:
    missing = _undocumented()
    assert not missing, "no description in the class docstring's Parameters: " + ", ".join(missing)


@pytest.mark.parametrize("module,name", CLASSES)
def test_type_name_resolves_to_the_documented_class(module: str, name: str) -> None:
    assert _resolve(name) is _class(module, name)
    assert _resolve(f"{module}:{name}") is _class(module, name)


def _yaml_with(name: str, key: str, value: object) -> str:
    """A config whose object of class ``name`` sets ``key`` to ``value`` (and nothing else)."""
    setting = yaml.safe_dump({key: value})
    if name == "BackfillExecutor":
        return "executors:\n  - type: BackfillExecutor\n" + textwrap.indent(setting, "    ")
    return (
        "executors:\n"
        "  - type: HighThroughputExecutor\n"
        "    label: x\n"
        "    provider:\n"
        f"      type: {name}\n" + textwrap.indent(setting, "      ")
    )


@functools.cache
def _section(name: str) -> str:
    return render().split(f"### `{name}`")[1].split("\n## ")[0].split("\n### ")[0]


_CASES = [
    pytest.param(name, p, id=f"{name}.{p.name}")
    for module, name in CLASSES
    for p in class_params(_class(module, name))
]


@pytest.mark.parametrize("name,param", _CASES)
def test_every_key_in_the_reference_validates(name: str, param, tmp_path: Path) -> None:
    assert f"| `{param.name}` | `" in _section(name)
    if not param.plain_default:
        pytest.skip(f"default {param.default_text} is not a YAML scalar")
    text = _yaml_with(name, param.name, param.default)
    path = tmp_path / "c.yaml"
    path.write_text(text)
    config = validate_config(path)
    (executor,) = config.executors
    target = executor if name == "BackfillExecutor" else executor.provider
    assert type(target).__name__ == name, text


def test_example_in_the_reference_validates(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("WORKER_INIT", "true")
    (tmp_path / "c.yaml").write_text(EXAMPLE)
    config = validate_config(tmp_path / "c.yaml")
    assert config.retries == 2 and config.executors[0].allocator.tfwd == "auto"
    assert config.executors[0].provider.nodes == 8


def test_parameters_parser_handles_groups_untyped_and_continued_names() -> None:
    doc = """Summary.

    More.

    Parameters
    ----------
    a, b : int
        Both ``ints``.
    c
        Untyped,
        two lines.
    d, e,
    f
        Names over two lines.

    Returns
    -------
    x : int
        Not a parameter.
    """
    assert parse_parameters(doc) == {
        "a": ("int", "Both `ints`."),
        "b": ("int", "Both `ints`."),
        "c": ("", "Untyped, two lines."),
        "d": ("", "Names over two lines."),
        "e": ("", "Names over two lines."),
        "f": ("", "Names over two lines."),
    }


def test_cli_prints_and_writes(tmp_path: Path, capsys) -> None:
    assert main(["config-reference"]) == 0
    assert capsys.readouterr().out == render()
    out = tmp_path / "ref.md"
    assert main(["config-reference", "--out", str(out)]) == 0
    assert out.read_text() == render()
