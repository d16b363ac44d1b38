"""The YAML configuration reference (``docs/config-reference.md``), generated from the code.

Everything in it comes from what :mod:`parsl_bf.config` accepts: the executor's
``allocator:`` table from :class:`~parsl_bf.allocation.AllocatorSettings`, the Parsl keys from
``parsl.config.Config``'s signature and docstring, and one table per class of ours from its
constructor's signature and the numpy-style ``Parameters`` section of its docstring.
``parsl-bf config-reference --out docs/config-reference.md`` rewrites the file; a unit test
checks that it is current.
"""

from __future__ import annotations

import argparse
import enum
import importlib
import inspect
import re
import sys
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .allocation import AllocatorSettings
from .config import CLASS_MODULES, CONFIG_KEYS, CONFIG_PACKAGES, KINDS, MAX_DEPTH

__all__ = [
    "CLASSES",
    "EXAMPLE",
    "Param",
    "add_parser",
    "class_params",
    "parse_parameters",
    "render",
]

# The classes documented here, by the module their ``type:`` name resolves in.
CLASSES: tuple[tuple[str, str], ...] = (
    ("parsl_bf.executor", "BackfillExecutor"),
    ("parsl_bf.providers", "LocalBackfillProvider"),
    ("parsl_bf.providers", "SlurmBackfillProvider"),
    ("parsl_bf.providers", "PBSProBackfillProvider"),
)

# A config using every section; the unit test validates it.
EXAMPLE = """\
executors:
  - type: BackfillExecutor
    label: bf
    allocator:
      objective: throughput
      tfwd: auto
    provider:
      type: LocalBackfillProvider
      nodes: 8
      trace: null            # a synthetic idle/busy cycle
      max_walltime: "00:30:00"
      worker_init: ${WORKER_INIT}
retries: 2
"""

_EMPTY = inspect.Parameter.empty
_PLAIN = (type(None), bool, int, float, str)


@dataclass(frozen=True)
class Param:
    """One constructor parameter as the reference shows it."""

    name: str
    annotation: str
    default: Any  # ``inspect.Parameter.empty`` when required
    description: str  # "" when the docstring has none

    @property
    def default_text(self) -> str:
        return _default(self.default)

    @property
    def plain_default(self) -> bool:
        """Whether the default can be written as a YAML scalar (null, bool, number, string)."""
        return self.default is not _EMPTY and type(self.default) in _PLAIN


def _section(doc: str | None, title: str) -> list[str]:
    """The lines of a numpy-style docstring section, without its title and underline."""
    lines = inspect.cleandoc(doc or "").splitlines()
    out: list[str] | None = None
    for i, line in enumerate(lines):
        underline = i + 1 < len(lines) and re.fullmatch(r"\s*-{3,}\s*", lines[i + 1])
        if out is None:
            if line.strip() == title and underline:
                out = []
            continue
        if underline and line.strip():  # the next section's title
            break
        if not re.fullmatch(r"\s*-{3,}\s*", line) or out:
            out.append(line)
    return out or []


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def parse_parameters(doc: str | None) -> dict[str, tuple[str, str]]:
    """``{name: (type, description)}`` from a numpy-style ``Parameters`` section.

    An entry's header may list several names (``min_nodes, max_nodes : int``), may have no
    type, and may go on over several lines when a line ends with a comma; every name gets the
    entry's description (whitespace collapsed to single spaces).
    """
    lines = _section(doc, "Parameters")
    body = [line for line in lines if line.strip()]
    if not body:
        return {}
    base = min(_indent(line) for line in body)
    entries: list[tuple[str, list[str]]] = []  # (header, description lines)
    for line in lines:
        if not line.strip():
            if entries:
                entries[-1][1].append("")
            continue
        if _indent(line) > base:
            if entries:
                entries[-1][1].append(line.strip())
        elif entries and entries[-1][0].rstrip().endswith(",") and not entries[-1][1]:
            entries[-1] = (entries[-1][0] + " " + line.strip(), [])
        else:
            entries.append((line.strip(), []))
    out: dict[str, tuple[str, str]] = {}
    for header, description in entries:
        names, _, kind = header.partition(":")
        parts = [n.strip() for n in names.split(",") if n.strip()]
        if not parts or not all(n.isidentifier() for n in parts):
            continue
        text = _markdown(" ".join(" ".join(description).split()))
        for name in parts:
            out.setdefault(name, (kind.strip(), text))
    return out


def _first_sentence(text: str) -> str:
    match = re.match(r"(.+?\.)(\s|$)", text)
    return match.group(1) if match else text


def _first_paragraph(doc: str | None) -> str:
    paragraph = inspect.cleandoc(doc or "").split("\n\n")[0]
    return " ".join(paragraph.split())


def _type(hint: Any) -> str:
    """A readable annotation: ``int | None``, ``float | 'auto'``, ``Callable``."""
    if hint is _EMPTY:
        return "—"
    if isinstance(hint, str):  # postponed annotations: already as written in the source
        return hint
    if hint is None or hint is type(None):
        return "None"
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        parts = [_type(a) for a in args if a is not type(None)]
        return " | ".join(parts + ["None"] * (type(None) in args))
    if origin is typing.Literal:
        return " | ".join(repr(a) for a in args)
    if origin is not None:
        name = getattr(origin, "__name__", None) or str(origin).replace("typing.", "")
        if name == "Callable":  # the signature of a callback is not something YAML can set
            return "Callable"
        inner = [
            _type(a) if not isinstance(a, list) else f"[{', '.join(map(_type, a))}]" for a in args
        ]
        return f"{name}[{', '.join(inner)}]" if inner else name
    if inspect.isclass(hint):
        return hint.__name__
    return str(hint).replace("typing.", "")


def _default(value: Any) -> str:
    """A stable text for a default: ``repr`` of plain values, the class name of objects."""
    if value is _EMPTY:
        return "required"
    if isinstance(value, enum.Enum):
        return repr(value.value)
    if type(value) in _PLAIN:
        return repr(value)
    if isinstance(value, list | tuple) and all(type(v) in _PLAIN for v in value):
        return repr(value)
    if inspect.isclass(value) or inspect.isroutine(value):
        return value.__name__
    return f"{type(value).__name__}(…)"


def _markdown(text: str) -> str:
    """reStructuredText inline markup as Markdown: ``x`` and :class:`~a.B` become `x` and `B`."""
    text = re.sub(r":\w+:`~[\w.]*?(\w+)`", r"`\1`", text)
    text = re.sub(r":\w+:`([^`]+)`", r"`\1`", text)
    return re.sub(r"``(.+?)``", r"`\1`", text)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _code(text: str) -> str:
    return f"`{_cell(text)}`"


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def _class(module: str, name: str) -> type:
    return getattr(importlib.import_module(module), name)


def class_params(cls: type) -> list[Param]:
    """The constructor parameters of ``cls`` (the keys a YAML object of that type takes)."""
    documented = parse_parameters(cls.__doc__)
    documented.update(parse_parameters(cls.__init__.__doc__))
    out = []
    for p in inspect.signature(cls.__init__).parameters.values():
        if p.name == "self" or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        description = documented.get(p.name, ("", ""))[1]
        out.append(Param(p.name, _type(p.annotation), p.default, description))
    return out


def _constraints(field: Any) -> str:
    symbols = {"gt": ">", "ge": "≥", "lt": "<", "le": "≤"}
    out = []
    for item in field.metadata:
        found = [f"{s} {getattr(item, a)}" for a, s in symbols.items() if hasattr(item, a)]
        out += found or [str(item)]
    if inspect.isclass(field.annotation) and issubclass(field.annotation, enum.Enum):
        out.append("one of " + ", ".join(f"`{m.value}`" for m in field.annotation))
    return ", ".join(out) or "—"


def _allocator_section() -> list[str]:
    rows = []
    for name, field in AllocatorSettings.model_fields.items():
        description = field.description or ""
        rows.append(
            (
                _code(name),
                _code(_type(field.annotation)),
                _code(_default(field.default)),
                _constraints(field),
                _cell(description) or "—",
            )
        )
    return [
        "### `allocator` (under a `BackfillExecutor`)",
        "",
        "The settings (`parsl_bf.allocation.AllocatorSettings`): the allocation policy and "
        "whether fragments resize in place, a mapping under the executor that uses it; every "
        "key is optional. Their defaults are every entry point's: `parsl-bf replay` takes the "
        "policy's as flags, and runs the same policy object; `ReplayConfig` takes `tfwd` and "
        "`objective` from them.",
        "",
        *_table(("key", "type", "default", "constraints", "description"), rows),
    ]


def _parsl_section() -> list[str]:
    from parsl.config import Config

    params = inspect.signature(Config).parameters
    documented = parse_parameters(Config.__doc__)
    rows = []
    for key in CONFIG_KEYS:
        if key not in params:
            rows.append(
                (
                    _code(key),
                    "—",
                    "—",
                    "**Rejected**: the installed Parsl's `Config` has no such parameter.",
                )
            )
            continue
        p = params[key]
        description = _first_sentence(documented.get(key, ("", ""))[1])
        rows.append(
            (
                _code(key),
                _code(_type(p.annotation)),
                _code(_default(p.default)),
                _cell(description) or "—",
            )
        )
    return [
        "### Parsl `Config` keys",
        "",
        "Passed to `parsl.config.Config` as they are (a value may itself be an object with "
        "`type:`, e.g. `monitoring: {type: MonitoringHub, …}`). Descriptions are the first "
        "sentence of Parsl's own.",
        "",
        *_table(("key", "type", "default", "description"), rows),
    ]


def _class_section(module: str, name: str) -> list[str]:
    cls = _class(module, name)
    params = class_params(cls)
    rows = [
        (_code(p.name), _code(p.annotation), _code(p.default_text), _cell(p.description) or "—")
        for p in params
    ]
    lines = [
        f"### `{name}`",
        "",
        f"`type: {name}` (or `type: {module}:{name}`); in Python, `from {module} import {name}` "
        f"(defined in `{cls.__module__}`).",
        "",
        _markdown(_first_paragraph(cls.__doc__)),
        "",
    ]
    return lines + _table(("key", "type", "default", "description"), rows)


def render() -> str:
    """The configuration reference, as Markdown."""
    lines = [
        "# YAML configuration reference",
        "",
        "<!-- Generated from the code by `parsl-bf config-reference --out "
        "docs/config-reference.md`; do not edit by hand. -->",
        "",
        "A config file is YAML turned into a `parsl.config.Config` by "
        "`parsl_bf.load_config(path)` (`parsl-bf run --config path` uses it). Check one with "
        "`parsl-bf validate FILE`: it builds every object without starting anything and prints "
        "the executors and the allocator settings, or the first mistake.",
        "",
        "```yaml",
        *EXAMPLE.rstrip("\n").splitlines(),
        "```",
        "",
        "- **Objects**: a mapping with a `type:` key is an instance of that class, its other keys "
        "being the constructor's arguments (objects nest: an executor's `provider:`, a "
        "provider's `launcher:`). A short `type:` name is looked up in "
        + ", ".join(f"`{m}`" for m in CLASS_MODULES)
        + ", in that order; `package.module:Class` names a class in "
        + ", ".join(f"`{m}`" for m in CONFIG_PACKAGES)
        + " or a package listed in `$PARSL_BF_CONFIG_MODULES` (comma-separated; any other "
        "module is refused before it is imported).",
        "- **Kinds**: `type:` is allowed only under these keys, and the class must be of the kind "
        "the key takes (checked before it is constructed): "
        + "; ".join(
            f"`{key}:` " + " or ".join(f"`{base.rpartition(':')[2]}`" for base in bases)
            for key, bases in KINDS.items()
        )
        + ". A config file runs no other code: YAML anchors and aliases, tags such as "
        "`!!python/object` and nesting deeper than " + str(MAX_DEPTH) + " are refused.",
        "- **Keys and values** are checked against the constructor: an unknown key is an error "
        "(the message lists the allowed ones), and a value must fit the parameter's annotation "
        "(checked with pydantic; a class whose annotations cannot be checked does its own "
        "checks).",
        "- **`${VAR}`** in a value is replaced by the environment variable `VAR` (an unset one is "
        "an error); the result is then typed from the annotation, so `nodes: ${NODES}` gives an "
        'int. Quote a value to keep it a string (`max_walltime: "00:30:00"`).',
        "- **Errors** are reported as `file:line path: message`, e.g. "
        "`c.yaml:7 executors[0].provider.nodes: expected int | None, got 'x'`, never as a "
        "traceback.",
        "- **Defaults** below are Python values: `None` is YAML `null`, `True` is `true`.",
        "",
        "## Top-level keys",
        "",
        "### `executors`",
        "",
        "Required: a list of at least one executor object, e.g. `type: BackfillExecutor` or any "
        "Parsl executor (`type: HighThroughputExecutor`).",
        "",
        *_parsl_section(),
        "",
        "## Classes of parsl_bf",
        "",
    ]
    for module, name in CLASSES:
        lines += [*_class_section(module, name), ""]
        if name == "BackfillExecutor":
            lines += [*_allocator_section(), ""]
    lines += [
        "## Parsl's own classes",
        "",
        "Any Parsl executor, provider, launcher, channel or monitoring class can be used by its "
        "class name, with its own constructor's keyword arguments as keys (see Parsl's "
        "documentation for them), e.g.:",
        "",
        "```yaml",
        "executors:",
        "  - type: HighThroughputExecutor",
        "    label: htex",
        "    max_workers_per_node: 2",
        "    provider:",
        "      type: SlurmBackfillProvider",
        "      launcher:",
        "        type: SrunLauncher",
        "```",
        "",
    ]
    return "\n".join(lines)


def _main(args: argparse.Namespace) -> int:
    text = render()
    if args.out is None:
        sys.stdout.write(text)
    else:
        Path(args.out).write_text(text)
        print(f"wrote {args.out}")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "config-reference",
        help="print the YAML configuration reference (Markdown)",
        description="Print the YAML configuration reference, generated from the code: the "
        "top-level keys and every key of parsl_bf's executor and providers.",
    )
    p.add_argument("--out", metavar="PATH", help="write it to PATH instead of printing it")
    p.set_defaults(func=_main)
