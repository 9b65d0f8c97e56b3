"""Options declared once: each field of a config section is an ``option`` carrying its flat name,
help, choices and check, and everything else is made from those declarations: the command line,
the TOML/JSON config file reader, validation with one-line errors, the flat JSON written into
every log, and the options reference (``docs/options.md``).

A config is a dataclass of sections (``rudder.train.config``); option names are unique across
its sections, so the flat form (``{"buffer_fraction": 0.25, ...}``) is what files and logs hold
and what ``--flag-name`` sets.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import tomllib
import typing
from dataclasses import dataclass, field


class ConfigError(Exception):
    """A bad flag or config file (one line: which flag/file, what was expected)."""


@dataclass(frozen=True)
class Spec:
    name: str  # flat name: the config file key and, with dashes, the flag
    help: str
    choices: object = None  # a collection, or a function returning one (a registry that may grow)
    check: object = None  # (predicate, "what was expected")
    metavar: str | None = None
    flags: tuple = ()  # extra flags setting a constant: ((flag, value, help), ...)
    resumable: bool = False  # may change when a run is resumed
    cli: bool = True  # settable from the command line (some options are file- or API-only)


def option(default, help: str, *, name: str | None = None, choices=None, check=None, metavar=None, flags=(),
           resumable: bool = False, cli: bool = True):
    """A config field; ``name`` defaults to the field's own name."""
    spec = dict(name=name, help=help, choices=choices, check=check, metavar=metavar, flags=tuple(flags),
                resumable=resumable, cli=cli)
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata={"spec": spec})
    return field(default=default, metadata={"spec": spec})


@dataclass(frozen=True)
class Declared:
    section: str
    attr: str
    spec: Spec
    kind: type  # int, float, bool, str or list (of int)
    default: object

    @property
    def flag(self) -> str:
        return "--" + self.spec.name.replace("_", "-")

    def choices(self):
        c = self.spec.choices
        return list(c() if callable(c) else c) if c is not None else None


def declared(config_cls) -> list[Declared]:
    """Every option of a config class, section by section, in declaration order."""
    out = []
    hints = typing.get_type_hints(config_cls)
    for sec in dataclasses.fields(config_cls):
        section_cls = hints[sec.name]
        section_hints = typing.get_type_hints(section_cls)
        for f in dataclasses.fields(section_cls):
            spec = dict(f.metadata["spec"])
            spec["name"] = spec["name"] or f.name
            kind = typing.get_origin(section_hints[f.name]) or section_hints[f.name]
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            out.append(Declared(sec.name, f.name, Spec(**spec), kind, default))
    names = [d.spec.name for d in out]
    if len(set(names)) != len(names):
        raise TypeError(f"{config_cls.__name__}: an option name is declared twice")
    return out


def by_name(config_cls) -> dict[str, Declared]:
    return {d.spec.name: d for d in declared(config_cls)}


KIND_WORDS = {int: "an integer", float: "a number", bool: "true or false", str: "a string", list: "a list of integers"}


def int_list(text) -> list[int]:
    """"10,25" -> [10, 25] (the fanouts' form on the command line and in files)."""
    try:
        return [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError("expected comma-separated integers, e.g. 10,25") from None


def coerce(d: Declared, value, where: str):
    """A file or JSON value as the option's type, or a one-line ConfigError naming ``where``."""
    if d.kind is list and isinstance(value, str):
        try:
            return int_list(value)
        except argparse.ArgumentTypeError:
            raise ConfigError(f"{where}: {d.spec.name} = {value!r}, expected {KIND_WORDS[list]}") from None
    if d.kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, d.kind) or (d.kind is int and isinstance(value, bool)):
        raise ConfigError(f"{where}: {d.spec.name} = {value!r}, expected {KIND_WORDS[d.kind]}")
    return value


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, raised like every other config error
        raise ConfigError(message)


def add_arguments(ap: argparse.ArgumentParser, config_cls, defaults: dict | None = None,
                  sections: tuple[str, ...] | None = None, skip: tuple[str, ...] = ()) -> None:
    """One flag per command-line option of ``config_cls`` (of ``sections`` only, if given; not those
    named in ``skip``), the defaults shown from ``defaults`` or the declarations; unset flags parse
    to None, so a file's value or the default applies."""
    defaults = defaults or {}
    for d in declared(config_cls):
        s = d.spec
        if not s.cli or (sections is not None and d.section not in sections) or s.name in skip:
            continue
        default = defaults.get(s.name, d.default)
        shown = ",".join(map(str, default)) if isinstance(default, list) else default
        text = s.help + (f" (default {shown})" if shown not in ("", None, False) and d.kind is not bool else "")
        dest = {"dest": s.name}
        if d.kind is bool and default is True:  # on by default: a --no-... flag turns it off
            ap.add_argument("--no-" + s.name.replace("_", "-"), action="store_const", const=False, help=text, **dest)
        elif d.kind is bool:
            ap.add_argument(d.flag, action="store_const", const=True, help=text, **dest)
        else:
            kind = int_list if d.kind is list else d.kind
            ap.add_argument(d.flag, type=kind, metavar=s.metavar, help=text, **dest)
        for flag, value, flag_help in s.flags:
            ap.add_argument(flag, action="store_const", const=value, help=flag_help, **dest)


def read_file(path: str, config_cls) -> dict:
    """A TOML or JSON config file as flat option values (keys: option names with underscores)."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise ConfigError(f"--config {path}: cannot read ({e.strerror})") from None
    try:
        values = json.loads(raw) if path.endswith(".json") else tomllib.loads(raw.decode())
    except (ValueError, UnicodeDecodeError) as e:
        raise ConfigError(f"--config {path}: not valid {'JSON' if path.endswith('.json') else 'TOML'} ({e})") from None
    known = by_name(config_cls)
    for key, value in values.items():
        if key not in known:
            raise ConfigError(f"--config {path}: unknown key {key!r} (known: {', '.join(sorted(known))})")
        values[key] = coerce(known[key], value, f"--config {path}")
    return values


def from_flat(config_cls, values: dict, where: str = "config", strict: bool = True):
    """A config from flat option values (the rest default). ``strict``: unknown keys are an error
    (a log written by another version may hold keys this one lacks: read it with strict=False)."""
    known = by_name(config_cls)
    unknown = sorted(set(values) - set(known))
    if unknown and strict:
        raise ConfigError(f"{where}: unknown option {unknown[0]!r}")
    sections: dict[str, dict] = {}
    for name, value in values.items():
        if name in known:
            d = known[name]
            sections.setdefault(d.section, {})[d.attr] = coerce(d, value, where) if value is not None else value
    hints = typing.get_type_hints(config_cls)
    return config_cls(**{s.name: hints[s.name](**sections.get(s.name, {})) for s in dataclasses.fields(config_cls)})


def to_flat(config) -> dict:
    """The flat option values of a config (what logs and checkpoints record)."""
    return {d.spec.name: getattr(getattr(config, d.section), d.attr) for d in declared(type(config))}


def check_options(config) -> None:
    """Every option's declared choices and check; the first failure is a one-line ConfigError."""
    for d in declared(type(config)):
        value = getattr(getattr(config, d.section), d.attr)
        choices = d.choices()
        if choices is not None and value not in choices:
            raise ConfigError(f"{d.flag} {value!r}: expected one of {', '.join(map(str, choices))}")
        if d.spec.check is not None:
            ok, expected = d.spec.check
            if not ok(value):
                raise ConfigError(f"{d.flag} {value!r}: expected {expected}")


def need(ok: bool, flag: str, value, expected: str) -> None:
    """A check across options: one line naming the flag and what was expected."""
    if not ok:
        raise ConfigError(f"{flag} {value!r}: expected {expected}")


def markdown(config_cls, title: str) -> str:
    """The options reference: one table per section."""
    lines = [f"# {title}", "", "Generated from the declarations in `rudder/train/config.py` (a test keeps this file "
             "equal to them). Every option is a flag and a key of a `--config` TOML or JSON file; flags override the "
             "file, which overrides the defaults. Options marked resumable may change when a run is resumed "
             "(`--resume RUN`).", ""]
    section = None
    for d in declared(config_cls):
        if d.section != section:
            section = d.section
            lines += ["", f"## {section}", "", "| flag | file key | default | |", "|---|---|---|---|"]
        s = d.spec
        if d.kind is bool:
            flag = ("--no-" + s.name.replace("_", "-")) if d.default else d.flag
            default = "on" if d.default else "off"
        else:
            flag = d.flag
            default = ",".join(map(str, d.default)) if isinstance(d.default, list) else d.default
        choices = d.choices()
        text = s.help + (" (" + " \\| ".join(map(str, choices)) + ")" if choices and not callable(s.choices) else "")
        text += "".join(f"; `{extra}`: {help_}" for extra, _, help_ in s.flags)
        text += "; resumable" if s.resumable else ""
        text += "; file only" if not s.cli else ""
        lines.append(f"| `{flag}` | `{s.name}` | {'' if default in ('', None) else f'`{default}`'} | {text} |")
    return "\n".join(lines).replace("\n\n\n", "\n\n") + "\n"
