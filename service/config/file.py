"""`ringserve serve --config FILE`: a TOML file of settings (read with tomllib), checked whole
against service/config/settings.py's SETTINGS and MODEL_SETTINGS before anything starts, and layered
under the environment and the command line (`resolve`).

Precedence, highest first: a flag on the command line, its RINGSERVE_* variable, the file, the
default. Every effective value keeps where it came from (`Resolved.sources`), which `ringserve
config show` prints. A refusal names the file, the line and the key (`ConfigError`).
"""

from __future__ import annotations

import argparse
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ringserve.service.config import settings as S

_KEY_LINE = re.compile(r"\s*(\"[^\"]*\"|'[^']*'|[A-Za-z0-9_.-]+)\s*=")
_TABLE_LINE = re.compile(r"\s*\[\s*([^\]]+?)\s*\]")


class ConfigError(ValueError):
    """A config file refused: `FILE:LINE: key KEY: why`."""


@dataclass
class ModelTable:
    """One [models.NAME] table: where its model lies and its per-model settings."""

    name: str
    path: str
    options: dict[str, Any]  # Config attr -> value (MODEL_SETTINGS' but `path`)
    line: int
    lines: dict[str, int] = field(default_factory=dict)  # Config attr -> its line
    file: str = ""

    def where(self) -> dict[str, str]:
        """Config attr -> "FILE:LINE", for a refusal that comes later (service.model_info)."""
        return {attr: f"{self.file}:{line}" for attr, line in self.lines.items()}


@dataclass
class ConfigFile:
    """A checked config file: the options it sets (Config attr -> (value, line)) and its model
    tables in file order."""

    path: str
    options: dict[str, tuple[Any, int]] = field(default_factory=dict)
    models: dict[str, ModelTable] = field(default_factory=dict)


def key_lines(text: str) -> dict[tuple[str, ...], int]:
    """Where each key is set: (table parts..., key) -> line number (1-based). Enough for the
    file's own shape: tables and `key = value` lines (a dotted key splits on its dots)."""
    lines: dict[tuple[str, ...], int] = {}
    table: tuple[str, ...] = ()
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("#"):
            continue
        header = _TABLE_LINE.match(line)
        if header is None:
            found = _KEY_LINE.match(line)
            if found:
                key = tuple(p.strip().strip("\"'") for p in found.group(1).split("."))
                lines.setdefault(table + key, number)
        else:
            table = tuple(p.strip().strip("\"'") for p in header.group(1).split("."))
            lines.setdefault(table, number)
    return lines


class Reader:
    """Checks one parsed file against the settings, naming the line of each refusal."""

    def __init__(self, path: str, text: str) -> None:
        self.path = path
        self.lines = key_lines(text)

    def fail(self, where: tuple[str, ...], why: str) -> ConfigError:
        line = self.lines.get(where) or self.lines.get(where[:1]) or 0
        return ConfigError(f"{self.path}:{line}: key {'.'.join(where)}: {why}")

    def line(self, where: tuple[str, ...]) -> int:
        return self.lines.get(where, 0)

    def option(self, key: str, value: Any) -> Any:
        setting = S.BY_NAME.get(key.replace("_", "-"))
        if setting is None or setting.name == "config":
            raise self.fail((key,), "unknown key (not an option of `ringserve serve`)")
        if setting.name == "model":
            many = [value] if isinstance(value, str) else value
            if not isinstance(many, list) or not all(isinstance(v, str) for v in many):
                raise self.fail((key,), "expected a string or an array of strings")
            return many
        return self.convert((key,), value, setting.kind, setting.type)

    def convert(self, where: tuple[str, ...], value: Any, kind: str, parse: Any) -> Any:
        """A TOML value of `kind`, parsed as the flag's text would be; raises ConfigError."""
        ok = {
            "integer": isinstance(value, int) and not isinstance(value, bool),
            "number": isinstance(value, int | float) and not isinstance(value, bool),
            "boolean": isinstance(value, bool) or value in (0, 1),
            "array of integers": isinstance(value, str)
            or (isinstance(value, list) and all(type(v) is int for v in value)),
            "integer or string": isinstance(value, str)
            or (isinstance(value, int) and not isinstance(value, bool)),
            "string": isinstance(value, str),
        }[kind]
        if not ok:
            raise self.fail(where, f"expected {kind}, got {toml_type(value)} {value!r}")
        text = ",".join(str(v) for v in value) if isinstance(value, list) else str(value)
        try:
            return parse(text)
        except ValueError as exc:
            raise self.fail(where, f"bad value: {exc}") from None

    def model(self, name: str, table: Any) -> ModelTable:
        where = ("models", name)
        if not S._NAME.fullmatch(name):
            raise self.fail(where, "a model name is letters, digits and _.- (at most 128)")
        if not isinstance(table, dict):
            raise self.fail(where, f"expected a table [models.{name}], got {toml_type(table)}")
        by_name = {m.name: m for m in S.MODEL_SETTINGS}
        options: dict[str, Any] = {}
        lines: dict[str, int] = {}
        path = ""
        for key, value in table.items():
            m = by_name.get(key.replace("_", "-"))
            here = (*where, key)
            if m is None:
                known = ", ".join(x.name for x in S.MODEL_SETTINGS if x.served)
                raise self.fail(here, f"unknown key in a model table (known: {known})")
            if not m.served:
                raise self.fail(here, f"{m.name} is {m.help}: remove it")
            parsed = self.convert(here, value, S.model_kind(m), m.parse)
            if m.name == "path":
                path = str(parsed)
            elif m.name != "version" or parsed != "latest":
                options[m.attr] = parsed
                lines[m.attr] = self.line(here)
        if not path:
            raise self.fail(where, "a model table needs a path")
        return ModelTable(name, path, options, self.line(where), lines, self.path)


def toml_type(value: Any) -> str:
    return {bool: "boolean", int: "integer", float: "float", str: "string", list: "array",
            dict: "table"}.get(type(value), type(value).__name__)  # fmt: skip


def read(path: str | os.PathLike[str]) -> ConfigFile:
    """Read and check a config file whole; raises ConfigError naming the file, line and key."""
    where = str(path)
    try:
        text = Path(where).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{where}: cannot read the config file: {exc}") from None
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:  # its message names the line and column
        raise ConfigError(f"{where}: not valid TOML: {exc}") from None
    reader = Reader(where, text)
    out = ConfigFile(where)
    seen: dict[str, str] = {}
    for key, value in doc.items():
        if key == "models":
            if not isinstance(value, dict):
                raise reader.fail((key,), "expected tables [models.NAME]")
            for name, table in value.items():
                out.models[name] = reader.model(name, table)
            continue
        parsed = reader.option(key, value)
        attr = key.replace("-", "_")
        if attr in seen:
            raise reader.fail((key,), f"set twice (also as {seen[attr]})")
        seen[attr] = key
        out.options[attr] = (parsed, reader.line((key,)))
    return out


# -- layering: flags, then RINGSERVE_*, then the file, then the defaults ---------------------------
@dataclass
class Resolved:
    config: S.Config
    sources: dict[str, str]  # option name -> "flag", "env NAME", "FILE:LINE" or "default"
    file: ConfigFile | None


def flags_given(argv: list[str]) -> set[str]:
    """The options the command line itself sets (Config attrs)."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    for s in S.SETTINGS:
        flag: dict[str, Any] = {"nargs": "?"} if s.type is S.parse_flag else {}
        parser.add_argument("--" + s.name, dest=s.attr, default=argparse.SUPPRESS, **flag)
    known, _ = parser.parse_known_args(argv)
    return set(vars(known))


def config_path(argv: list[str], environ: Mapping[str, str]) -> str | None:
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--config", default=environ.get(S.BY_NAME["config"].env) or None)
    known, _ = parser.parse_known_args(argv)
    value = known.config
    return str(value) if value else None


def resolve(
    argv: list[str], environ: Mapping[str, str] | None = None, prog: str = "ringserve serve"
) -> Resolved:
    """The effective settings of `ringserve serve ARGV` and where each came from. Raises
    ConfigError for a bad file; argparse exits on a bad flag."""
    env = os.environ if environ is None else environ
    path = config_path(argv, env)
    file = read(path) if path else None
    from_file = {attr: value for attr, (value, _) in (file.options if file else {}).items()}
    parser = argparse.ArgumentParser(prog=prog, description="start the server")
    S.add_arguments(parser, from_file, env)
    config = S.from_namespace(parser.parse_args(argv))
    given = flags_given(argv)
    sources: dict[str, str] = {}
    for s in S.SETTINGS:
        if s.attr in given:
            sources[s.name] = "flag"
        elif env.get(s.env):
            sources[s.name] = f"env {s.env}"
        elif file is not None and s.attr in file.options:
            sources[s.name] = f"{file.path}:{file.options[s.attr][1]}"
        else:
            sources[s.name] = "default"
    if file is not None:
        add_model_tables(config, file, sources)
    return Resolved(config, sources, file)


def add_model_tables(config: S.Config, file: ConfigFile, sources: dict[str, str]) -> None:
    """The file's [models.NAME] tables join the named models (a --model NAME=DIR of the same
    name, a flag or variable, keeps its own directory), with their per-model settings."""
    flagged = {name for name, _ in config.named_models}
    for name, table in file.models.items():
        config.model_options[name] = dict(table.options)
        config.model_lines[name] = table.where()
        if name not in flagged:
            sources[f"models.{name}"] = f"{file.path}:{table.line}"
    tables = tuple((n, t.path) for n, t in file.models.items() if n not in flagged)
    config.named_models = (*config.named_models, *tables)
    config.file_models = tuple(name for name, _ in tables)


def show(resolved: Resolved) -> str:
    """`ringserve config show`: every effective setting, its value and where it came from."""
    c = resolved.config
    rows = []
    for s in S.SETTINGS:
        if s.name == "model":
            value: Any = c.model
        else:
            value = getattr(c, s.attr)
        if s.name == "api-key" and value:
            value = "(set; not shown)"
        shown = ",".join(map(str, value)) if isinstance(value, tuple) else value
        rows.append((s.name, "" if shown is None else str(shown), resolved.sources[s.name]))
    for name, where in c.named_models:
        options = c.model_options.get(name, {})
        extra = "".join(f" {k.replace('_', '-')}={v}" for k, v in sorted(options.items()))
        source = resolved.sources.get(f"models.{name}", "flag or env (--model NAME=DIR)")
        rows.append((f"models.{name}", f"path={where}{extra}", source))
    width = max(len(r[0]) for r in rows)
    vwidth = min(48, max(len(r[1]) for r in rows))
    return "\n".join(f"{n:<{width}}  {v:<{vwidth}}  {src}" for n, v, src in rows)
