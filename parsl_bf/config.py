"""YAML → ``parsl.config.Config``.

A config file describes executors, providers and launchers as objects with a ``type:`` key
(a Parsl class name such as ``HighThroughputExecutor``, one of ours such as
``LocalBackfillProvider``, or a dotted ``package.module:Class``) and the class's arguments::

    executors:
      - type: HighThroughputExecutor
        label: bf
        max_workers_per_node: 2
        provider:
          type: LocalBackfillProvider
          nodes: 2
          trace: ${PARSL_BF_DATA}/trace
    retries: 1

``${VAR}`` takes an environment variable. A value for a parameter whose annotation includes
``pathlib.Path`` (e.g. the provider's ``trace``) is a path: ``~`` is expanded, a relative path
is relative to the YAML file's directory (not the working directory), and it must exist. Every
mistake is reported as ``file:line path: message`` (an unknown key, a wrong type, an unknown
class, an unset variable, a missing file, a value out of range), never as a traceback.
A parameter annotated with a pydantic model (the BackfillExecutor's ``allocator``) takes a
mapping of that model's fields, checked key by key on their own lines.

A config file is input, not code: validating one runs no code it names beyond the config
classes' own constructors.

- ``type:`` is allowed only under the keys of :data:`KINDS`, and takes only a class of the
  kind that key expects (``executors:`` a ``ParslExecutor``, ``provider:`` an
  ``ExecutionProvider``, ``launcher:`` a ``Launcher``, ``monitoring:`` a ``MonitoringHub``,
  ``retry_handler:`` our ``PreemptionRetries``, ...), checked with ``issubclass`` before the
  class is called. Anything else (``type: subprocess:Popen``) is ``file:line path.type: ...``.
- A dotted ``module:Class`` is imported only from the packages of :data:`CONFIG_PACKAGES`
  (``parsl``, ``parsl_bf``) and those named in ``$PARSL_BF_CONFIG_MODULES`` (comma-separated
  top-level packages, e.g. your site's providers): importing a module runs its code, so an
  arbitrary one is refused before it is imported.
- YAML anchors and aliases (``&a``/``*a``) are refused (an alias bomb expands exponentially),
  as are tags other than YAML's core ones (``!!python/...``), nesting deeper than
  :data:`MAX_DEPTH` and files larger than :data:`MAX_CONFIG_BYTES`.
"""

from __future__ import annotations

import importlib
import inspect
import os
import re
import typing
from pathlib import Path, PurePath
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

from .checks import SettingError

__all__ = [
    "ConfigError",
    "CONFIG_KEYS",
    "CONFIG_PACKAGES",
    "CLASS_MODULES",
    "KINDS",
    "MAX_CONFIG_BYTES",
    "MAX_DEPTH",
    "load_config",
    "validate_config",
]

_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
#: Where short class names (``type: LocalBackfillProvider``) are looked up, in order.
CLASS_MODULES = (
    "parsl_bf.providers",
    "parsl_bf.executor",
    "parsl.executors",
    "parsl.providers",
    "parsl.launchers",
    "parsl.channels",
    "parsl.monitoring",
    "parsl.addresses",
)
#: Top-level keys passed to ``parsl.config.Config`` as they are.
CONFIG_KEYS = (
    "retries",
    "retry_handler",
    "run_dir",
    "strategy",
    "strategy_period",
    "max_idletime",
    "initialize_logging",
    "usage_tracking",
    "monitoring",
    "std_autopath",
)


#: What ``type:`` may build under each key: the base classes (``module:Class``) a class there
#: must derive from, checked before it is constructed. ``type:`` under any other key is refused.
KINDS: dict[str, tuple[str, ...]] = {
    "executors": ("parsl.executors.base:ParslExecutor",),
    "provider": ("parsl.providers.base:ExecutionProvider",),
    "launcher": ("parsl.launchers.base:Launcher",),
    "monitoring": ("parsl.monitoring.monitoring:MonitoringHub",),
    "remote_monitoring_radio": ("parsl.monitoring.radios.base:RadioConfig",),
    "storage_access": ("parsl.data_provider.staging:Staging",),
    "manager_selector": ("parsl.executors.high_throughput.manager_selector:ManagerSelector",),
    "initialize_logging": ("parsl.logconfigs.base:LogConfig",),
    # Parsl takes any callable here; a config file may name only our handlers.
    "block_error_handler": ("parsl_bf.providers.handlers:BackfillErrorHandler",),
    "retry_handler": ("parsl_bf.providers.handlers:PreemptionRetries",),
}
#: Top-level packages a dotted ``type: package.module:Class`` may import from; more are named
#: in the environment variable :data:`CONFIG_MODULES_VAR`.
CONFIG_PACKAGES = ("parsl", "parsl_bf")
CONFIG_MODULES_VAR = "PARSL_BF_CONFIG_MODULES"
#: The largest config file read, in bytes.
MAX_CONFIG_BYTES = 1 << 20
#: The deepest nesting of mappings and lists in a config file.
MAX_DEPTH = 32
_CORE_TAGS = frozenset(
    f"tag:yaml.org,2002:{t}" for t in ("str", "int", "float", "bool", "null", "map", "seq")
) | {"tag:yaml.org,2002:timestamp"}
_MODULE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
_ATTR = re.compile(r"^[A-Za-z_]\w*$")


class ConfigError(ValueError):
    """A config mistake, located as ``file:line path: message``."""


class _Located:
    """YAML data with the line of every node, by path."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lines: dict[tuple, int] = {}
        text = self._read()
        try:
            self._check_events(text)
            node = yaml.compose(text, Loader=yaml.SafeLoader)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            line = mark.line + 1 if mark else 1
            problem = getattr(exc, "problem", exc)
            raise ConfigError(f"{path}:{line}: not valid YAML: {problem}") from None
        if node is None:
            raise ConfigError(f"{path}:1: the file is empty")
        self.data = self._convert(node, ())

    def _read(self) -> str:
        try:
            with self.path.open("rb") as f:
                raw = f.read(MAX_CONFIG_BYTES + 1)
        except OSError as exc:
            raise ConfigError(f"{self.path}: {exc.strerror or exc}") from None
        if len(raw) > MAX_CONFIG_BYTES:
            raise ConfigError(f"{self.path}: larger than {MAX_CONFIG_BYTES} bytes: not a config")
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            line = raw[: exc.start].count(b"\n") + 1
            raise ConfigError(f"{self.path}:{line}: not UTF-8 text") from None

    def _check_events(self, text: str) -> None:
        """Refuse anchors, aliases, foreign tags and deep nesting before composing a node."""
        depth = 0
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            line = event.start_mark.line + 1
            if isinstance(event, yaml.AliasEvent):
                raise ConfigError(
                    f"{self.path}:{line}: YAML aliases (*{event.anchor}) are not allowed in a "
                    "config file: write the value out"
                )
            if getattr(event, "anchor", None) is not None:
                raise ConfigError(
                    f"{self.path}:{line}: YAML anchors (&{event.anchor}) are not allowed in a "
                    "config file: write the value out"
                )
            tag = getattr(event, "tag", None)  # None: implicit; "!": non-specific
            if tag not in (None, "!") and tag not in _CORE_TAGS:
                shown = tag.replace("tag:yaml.org,2002:", "!!")
                raise ConfigError(f"{self.path}:{line}: YAML tag {shown} is not allowed")
            if isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                if depth > MAX_DEPTH:
                    raise ConfigError(f"{self.path}:{line}: nested more than {MAX_DEPTH} deep")
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1

    def _convert(self, node: yaml.Node, at: tuple) -> Any:
        # A mapping's key keeps its own line (its value, a nested mapping, starts below it).
        self.lines.setdefault(at, node.start_mark.line + 1)
        if isinstance(node, yaml.MappingNode):
            out = {}
            for key_node, value_node in node.value:
                key = key_node.value
                self.lines[(*at, key)] = key_node.start_mark.line + 1
                out[key] = self._convert(value_node, (*at, key))
            return out
        if isinstance(node, yaml.SequenceNode):
            return [self._convert(v, (*at, i)) for i, v in enumerate(node.value)]
        if _VAR.search(node.value):  # a string; typed later from the class's annotation
            return _VAR.sub(lambda m: self._env(m.group(1), at), node.value)
        plain = node.style is None  # unquoted: typed by YAML (42, 1.5, true, null)
        return yaml.safe_load(node.value) if plain and node.value != "" else node.value

    def _env(self, name: str, at: tuple) -> str:
        if name not in os.environ:
            raise self.error(at, f"environment variable {name} is not set")
        return os.environ[name]

    def error(self, at: tuple, message: str) -> ConfigError:
        line = next((self.lines[at[:k]] for k in range(len(at), -1, -1) if at[:k] in self.lines), 1)
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in at).lstrip(".")
        return ConfigError(
            f"{self.path}:{line} {where}: {message}" if where else f"{self.path}:{line}: {message}"
        )


class _Refused(LookupError):
    """A ``type:`` that names something a config may not build (the message says why)."""


def _packages() -> tuple[str, ...]:
    extra = os.environ.get(CONFIG_MODULES_VAR, "").split(",")
    return (*CONFIG_PACKAGES, *(m.strip() for m in extra if m.strip()))


def _kind(key: str) -> tuple[type, ...]:
    """The base classes of ``KINDS[key]`` that the installed Parsl has."""
    bases = []
    for spec in KINDS[key]:
        module, _, attr = spec.partition(":")
        try:
            base = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError):
            continue
        if inspect.isclass(base):
            bases.append(base)
    return tuple(bases)


def _resolve(name: str, key: str | None = None) -> type:
    """The class ``name`` (a short name or ``package.module:Class``), refused unless it is of
    the kind ``KINDS[key]`` when ``key`` is given. LookupError for an unknown name; its subclass
    _Refused, with the reason, for a name that may not be built. Nothing is constructed."""
    if ":" in name:
        module, _, attr = name.partition(":")
        if not (_MODULE.match(module) and _ATTR.match(attr)):
            raise LookupError(name)
        packages = _packages()
        if module.partition(".")[0] not in packages:  # refused before it is imported
            raise _Refused(
                f"{name!r}: module {module!r} is not in a config package ({', '.join(packages)}; "
                f"name more in ${CONFIG_MODULES_VAR})"
            )
        try:
            found = getattr(importlib.import_module(module), attr, None)
        except Exception:  # ImportError, or the module's own failure: it is not there
            found = None
    else:
        found = None
        for module in CLASS_MODULES if _ATTR.match(name) else ():
            try:
                found = getattr(importlib.import_module(module), name, None)
            except ImportError:
                continue
            if inspect.isclass(found):
                break
    if not inspect.isclass(found):
        raise LookupError(name)
    if key is not None:
        bases = _kind(key)
        if not (bases and issubclass(found, bases)):
            wanted = " or ".join(b.__name__ for b in bases) or KINDS[key][0]
            raise _Refused(f"{name!r} is not a subclass of {wanted}, which {key}: takes")
    return found


def _hints(cls: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls.__init__)
    except Exception:  # unresolvable annotations: leave the checks to the class
        return {}


def _typed(hint: Any, value: Any) -> tuple[bool, Any]:
    """(fits, value): exact types pass; a string (e.g. from ``${VAR}``) may convert."""
    try:
        adapter = TypeAdapter(hint, config=ConfigDict(arbitrary_types_allowed=True))
    except Exception:  # pydantic cannot judge this annotation: leave it to the class
        return True, value
    try:
        adapter.validate_python(value, strict=True)
        return True, value
    except ValidationError:
        pass
    if isinstance(value, str):
        try:
            return True, adapter.validate_python(value)
        except ValidationError:
            pass
    return False, value


def _is_path(hint: Any) -> bool:
    """Whether an annotation admits a ``pathlib`` path (``Path``, ``str | Path | None``, ...)."""
    if inspect.isclass(hint) and issubclass(hint, PurePath):
        return True
    return any(_is_path(arg) for arg in typing.get_args(hint))


def _path(doc: _Located, value: str, at: tuple) -> Path:
    """``value`` as an existing absolute path: ``~`` expanded, relative to the YAML file."""
    try:
        given = Path(value).expanduser()
    except RuntimeError as exc:  # ~user with no such user
        raise doc.error(at, str(exc)) from None
    # ``..`` taken lexically, like the shell's cd: ``../data`` beside the file, whatever the cwd.
    path = (
        given if given.is_absolute() else Path(os.path.normpath(doc.path.absolute().parent / given))
    )
    if not path.exists():
        relative = "" if given.is_absolute() else " (relative to the file)"
        raise doc.error(at, f"no such file or directory: {path}{relative}")
    return path


def _name(hint: Any) -> str:
    if typing.get_origin(hint) is None and hasattr(hint, "__name__"):
        return hint.__name__
    return str(hint).replace("typing.", "")


def _model(hint: Any) -> type[BaseModel] | None:
    """The pydantic model an annotation admits (``Settings | dict | None`` → Settings)."""
    for arg in (hint, *typing.get_args(hint)):
        if inspect.isclass(arg) and issubclass(arg, BaseModel):
            return arg
    return None


def _settings(doc: _Located, model: type[BaseModel], value: dict, at: tuple) -> BaseModel:
    """A mapping as ``model``, a mistake located at its own key's line."""
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        err = exc.errors()[0]
        message = err["msg"]
        if err["type"] == "extra_forbidden":
            message = f"unknown key (allowed: {', '.join(model.model_fields)})"
        elif err["type"] == "value_error":  # our validators' words, without pydantic's prefix
            message = str(err["ctx"]["error"])
        raise doc.error((*at, *err["loc"]), message) from None


#: Keys a class took once that now go elsewhere: class → key → where, for the error.
_MOVED = {
    "BackfillExecutor": {
        k: f"the BackfillExecutor's allocator: mapping (allocator: {{{k}: ...}}), the settings "
        "the replay shares"
        for k in ("shrink_in_place", "grow_in_place")
    }
}


def _build(doc: _Located, value: Any, at: tuple) -> Any:
    """Instantiate ``type:`` objects depth first; other values pass through."""
    if isinstance(value, list):
        return [_build(doc, v, (*at, i)) for i, v in enumerate(value)]
    if not isinstance(value, dict) or "type" not in value:
        return value
    key = next((p for p in reversed(at) if isinstance(p, str)), None)
    if key not in KINDS:
        under = f"not under {key}:" if key else "not at the top level"
        raise doc.error(
            (*at, "type"), f"'type:' makes an object only under {', '.join(KINDS)}; {under}"
        )
    if not isinstance(value["type"], str):
        raise doc.error((*at, "type"), f"expected a class name, got {value['type']!r}")
    kwargs = {k: v for k, v in value.items() if k != "type"}
    try:
        cls = _resolve(value["type"], key)
    except _Refused as exc:
        raise doc.error((*at, "type"), str(exc)) from None
    except LookupError:
        raise doc.error((*at, "type"), f"unknown class {value['type']!r}") from None
    params = inspect.signature(cls.__init__).parameters
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
    moved = _MOVED.get(cls.__name__, {})
    for key in kwargs:
        if key in moved and key not in params:
            raise doc.error((*at, key), f"{key} is now a key of {moved[key]}")
        if key not in params and not takes_any:
            allowed = ", ".join(p for p in params if p not in ("self", "args", "kwargs"))
            raise doc.error((*at, key), f"unknown key for {cls.__name__} (allowed: {allowed})")
    hints = _hints(cls)
    built = {}
    for key, v in kwargs.items():
        model = _model(hints.get(key))
        built[key] = (
            _settings(doc, model, v, (*at, key))
            if model is not None and isinstance(v, dict) and "type" not in v
            else _build(doc, v, (*at, key))
        )
    for key, v in built.items():
        if key in hints and isinstance(v, str) and _is_path(hints[key]):
            v = built[key] = _path(doc, v, (*at, key))
        if key in hints:
            ok, built[key] = _typed(hints[key], v)
            if not ok:
                raise doc.error((*at, key), f"expected {_name(hints[key])}, got {v!r}")
    try:
        return cls(**built)
    except SettingError as exc:  # one argument at fault: point at its own line
        raise doc.error((*at, exc.field), exc.message) from None
    except Exception as exc:  # the class's own checks (typeguard, ValueError, ...)
        raise doc.error(at, f"{cls.__name__}: {exc}".splitlines()[0]) from None


def validate_config(path: str | Path) -> Any:
    """Parse and check ``path``; returns the ``parsl.config.Config`` (nothing started)."""
    from parsl.config import Config

    doc = _Located(Path(path))
    data = doc.data
    if not isinstance(data, dict):
        raise doc.error((), "expected a mapping with 'executors'")
    for key in data:
        if key == "allocator":
            raise doc.error(
                (key,),
                "the allocator's settings now go under the BackfillExecutor that uses them "
                "(executors: - type: BackfillExecutor ... allocator: {...})",
            )
        if key not in ("executors", *CONFIG_KEYS):
            raise doc.error(
                (key,), "unknown key (allowed: executors, " + ", ".join(CONFIG_KEYS) + ")"
            )
    if not isinstance(data.get("executors"), list) or not data["executors"]:
        raise doc.error(("executors",), "needs a list of at least one executor")
    executors = _build(doc, data["executors"], ("executors",))
    extra = {k: _build(doc, data[k], (k,)) for k in CONFIG_KEYS if k in data}
    try:
        return Config(executors=executors, **extra)
    except Exception as exc:
        raise doc.error((), f"Config: {exc}".splitlines()[0]) from None


def load_config(path: str | Path):
    """The ``parsl.config.Config`` of a YAML file (``with parsl.load(load_config(p)):``)."""
    return validate_config(path)
