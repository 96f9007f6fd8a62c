"""One typed configuration per process, layered: defaults < file < environment < flags.

Each process declares a dataclass whose fields carry their unit and help text with
`setting(...)`. From that one declaration this module derives the command-line flags
(`--segment-size-bytes`, with the default and unit in the help), the environment variables
(`CELLAR_<PREFIX>_<FIELD>`), the file keys (TOML or YAML, same names as the fields) and the
`--print-config` listing, so documentation, defaults and code cannot disagree.

Sizes accept "4GiB"-style strings and durations "500ms"-style strings. Invalid values raise
`ConfigError` naming the field; the process entry points turn that into a non-zero exit.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from cellar.errors import ConfigError
from cellar.units import format_size, parse_duration_s, parse_size_bytes

T = TypeVar("T")

UNIT_BYTES = "bytes"
UNIT_SECONDS = "s"


def setting(
    default: Any,
    help: str,
    *,
    unit: str = "",
    flag: bool = True,
    choices: tuple[str, ...] | None = None,
    default_factory: Callable[[], Any] | None = None,
) -> Any:
    """A config field: `unit` is 'bytes' (accepts '4GiB'), 's' (accepts '500ms') or free text."""
    meta = {"help": help, "unit": unit, "flag": flag, "choices": choices}
    if default_factory is not None:
        return dataclasses.field(default_factory=default_factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def _flag_name(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


def parse_bool(value: Any) -> bool:
    """A boolean setting from a file, the environment or a flag: a bool, or 1/true/yes/on and
    0/false/no/off in any case; ValueError otherwise."""
    if isinstance(value, bool):
        return value
    if str(value).lower() in ("1", "true", "yes", "on"):
        return True
    if str(value).lower() in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"not a boolean: {value!r}")


def _coerce(field: dataclasses.Field[Any], value: Any) -> Any:
    """Turn a raw value from a file, the environment or a flag into the field's type."""
    unit = field.metadata.get("unit", "")
    kind = field.type if isinstance(field.type, str) else getattr(field.type, "__name__", "")
    try:
        if unit == UNIT_BYTES:
            result: Any = parse_size_bytes(value)
        elif unit == UNIT_SECONDS:
            result = parse_duration_s(value)
        elif kind == "bool":
            result = parse_bool(value)
        elif kind == "int":
            if isinstance(value, bool):
                raise ValueError(f"not an integer: {value!r}")
            result = int(value)
        elif kind == "float":
            result = float(value)
        elif kind == "str":
            if not isinstance(value, (str, int, float)):
                raise ValueError(f"not a string: {value!r}")
            result = str(value)
        else:  # structured settings (dicts, lists) come from files or JSON in env/flags
            result = json.loads(value) if isinstance(value, str) else value
    except (TypeError, ValueError) as exc:
        raise ConfigError(field.name, str(exc)) from None
    choices = field.metadata.get("choices")
    if choices and result not in choices:
        raise ConfigError(field.name, f"{result!r} is not one of {', '.join(choices)}")
    return result


def read_config_file(path: Path) -> dict[str, Any]:
    """Read a TOML (.toml) or YAML (.yaml/.yml) file into a dict."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError("config", f"cannot read {path}: {exc.strerror}") from None
    try:
        if path.suffix == ".toml":
            import tomllib

            data = tomllib.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text) or {}
    except Exception as exc:  # parse errors of either format
        raise ConfigError("config", f"cannot parse {path}: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError("config", f"{path} must hold a mapping of settings")
    return data


def add_arguments(parser: argparse.ArgumentParser, cls: type[Any]) -> None:
    """Add `--config`, `--print-config` and one flag per field of `cls`."""
    parser.add_argument("--config", type=Path, help="TOML or YAML file with settings")
    parser.add_argument(
        "--print-config", action="store_true", help="print every setting and exit"
    )
    for field in dataclasses.fields(cls):
        if not field.metadata.get("flag", True):
            continue
        unit = field.metadata.get("unit", "")
        default = _default_of(field)
        shown = _show(default, unit)
        help_text = f"{field.metadata.get('help', '')} (default: {shown}{' ' + unit if unit and unit != UNIT_BYTES else ''})"
        parser.add_argument(_flag_name(field.name), dest=f"cfg_{field.name}", default=None, help=help_text)


def _default_of(field: dataclasses.Field[Any]) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return None


def _show(value: Any, unit: str) -> str:
    if unit == UNIT_BYTES and isinstance(value, int):
        return f"{format_size(value)} ({value} bytes)" if value >= 1024 else f"{value} bytes"
    return json.dumps(value) if isinstance(value, (dict, list)) else str(value)


def load(
    cls: type[T],
    *,
    env_prefix: str,
    args: argparse.Namespace | None = None,
    file: Path | None = None,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> tuple[T, dict[str, str]]:
    """Build `cls` from the layers; returns the config and where each value came from."""
    environ = os.environ if environ is None else environ
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    values: dict[str, Any] = {}
    sources = {name: "default" for name in fields}
    if file is None and args is not None:
        file = getattr(args, "config", None)
    if file is not None:
        for key, raw in read_config_file(Path(file)).items():
            name = key.replace("-", "_")
            if name not in fields:
                raise ConfigError(key, f"unknown setting in {file}")
            values[name] = _coerce(fields[name], raw)
            sources[name] = f"file {file}"
    for name, field in fields.items():
        env_name = f"{env_prefix}{name.upper()}"
        if env_name in environ:
            values[name] = _coerce(field, environ[env_name])
            sources[name] = f"env {env_name}"
    if args is not None:
        for name, field in fields.items():
            raw = getattr(args, f"cfg_{name}", None)
            if raw is not None:
                values[name] = _coerce(field, raw)
                sources[name] = f"flag {_flag_name(name)}"
    for name, raw in (overrides or {}).items():
        values[name] = _coerce(fields[name], raw)
        sources[name] = "override"
    config = cls(**values)
    validate = getattr(config, "validate", None)
    if callable(validate):
        validate()
    return config, sources


def render(config: Any, sources: Mapping[str, str] | None = None) -> str:
    """Every setting with its value, unit, default and source, one per line."""
    lines = []
    for field in dataclasses.fields(config):
        unit = field.metadata.get("unit", "")
        value = getattr(config, field.name)
        default = _default_of(field)
        source = (sources or {}).get(field.name, "")
        lines.append(
            f"{field.name} = {_show(value, unit)}"
            f"{'  [' + unit + ']' if unit else ''}"
            f"  # {field.metadata.get('help', '')}; default {_show(default, unit)}"
            f"{'; from ' + source if source and source != 'default' else ''}"
        )
    return "\n".join(lines)


def from_cli(cls: type[T], args: argparse.Namespace, *, env_prefix: str) -> T:
    """Load from the layers; print and exit on --print-config; exit 2 naming the field on error."""
    try:
        config, sources = load(cls, env_prefix=env_prefix, args=args)
    except ConfigError as exc:
        print(f"invalid configuration: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    if getattr(args, "print_config", False):
        print(render(config, sources))
        raise SystemExit(0)
    return config


def require(condition: bool, field: str, message: str) -> None:
    """Validation helper for `validate()` methods."""
    if not condition:
        raise ConfigError(field, message)
