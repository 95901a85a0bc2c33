"""Reading a run config: YAML (safe loader) + dotted `key=value` overrides -> `RunConfig`.

Every mistake becomes one `UserError` line naming the source, the key path and what is
allowed, e.g. `config.yaml: training.max_stepz: unknown key (allowed: max_steps, seed, ...)`.
No torch here: `flopwise train --help` and config errors stay fast.
"""

from __future__ import annotations

import reprlib
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from flopwise.errors import UserError
from flopwise.config.schema import RunConfig

DEFAULT_CONFIG_NAME = "default.yaml (embedded)"


class UniqueKeyLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a key given twice in one mapping (PyYAML keeps the last, silently)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
                seen.add(key)
            except TypeError:  # an unhashable key: let PyYAML report it
                continue
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (each key may appear once per mapping)", key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


def safe_load_unique(text: str):
    """Parse YAML with the safe loader, duplicate keys being an error."""
    return yaml.load(text, Loader=UniqueKeyLoader)


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> RunConfig:
    """Build the run config from an optional YAML file plus overrides; schema defaults fill the rest."""
    data = {} if path is None else read_yaml(Path(path))
    return config_from_mapping(data, path, overrides)


def config_from_mapping(data: dict, path: str | Path | None, overrides: list[str] | tuple[str, ...] = (),
                        source: str | None = None) -> RunConfig:
    """The run config from the mapping a YAML file (`path`) held, plus the command line's overrides.

    A file never switches on remote code: `model.trust_remote_code` in `data` is dropped, and
    only an override (the command line of the person running it) can set it.
    """
    source = source or (DEFAULT_CONFIG_NAME if path is None else str(path))
    drop_remote_code_switch(data)
    override_keys: dict[tuple[str, ...], str] = {}
    for item in overrides:
        keys, value = parse_override(item)
        set_dotted(data, keys, value, item)
        override_keys[keys] = item
    if path is not None:
        default_run_dir(data, Path(path))
    try:
        return RunConfig.model_validate(data)
    except ValidationError as err:
        raise UserError(describe_validation_error(err, source, override_keys)) from None


def drop_remote_code_switch(data: dict) -> None:
    """Remove `model.trust_remote_code` from a mapping read from a file (see `config_from_mapping`)."""
    model = data.get("model") if isinstance(data, dict) else None
    if isinstance(model, dict):
        model.pop("trust_remote_code", None)


def default_run_dir(data: dict, path: Path) -> None:
    """A config file without `logging.run_dir` trains into runs/<file stem>, so two configs never share a run."""
    logging = data.get("logging")
    if logging is None:
        logging = data["logging"] = {}
    if isinstance(logging, dict) and logging.get("run_dir") is None:
        logging["run_dir"] = f"runs/{path.stem}"


def read_yaml(path: Path) -> dict:
    """Safe-load a YAML mapping; a missing, unreadable or non-mapping file is a UserError."""
    if not path.exists():
        raise UserError(f"{path}: config file not found")
    if not path.is_file():
        raise UserError(f"{path}: not a file (expected a YAML config)")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise UserError(f"{path}: cannot read config ({err.__class__.__name__})") from None
    return parse_yaml_mapping(text, path)


def parse_yaml_mapping(text: str, path: Path) -> dict:
    """Safe-load YAML text read from `path` as a mapping; a syntax error or non-mapping is a UserError."""
    try:
        data = safe_load_unique(text)
    except RecursionError:
        raise UserError(f"{path}: invalid YAML: nested too deeply") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or "malformed YAML"
        raise UserError(f"{path}: invalid YAML{where}: {problem}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserError(f"{path}: the top level must be a mapping of sections (model, data, parallel, ...)")
    return data


def parse_override(item: str) -> tuple[tuple[str, ...], Any]:
    """Split `a.b.c=value`; the value is read as YAML so `3e-4`, `true`, `[0.9, 0.95]` get their types."""
    key, sep, raw = item.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise UserError(f"override '{item}': expected section.key=value (e.g. training.max_steps=100)")
    try:
        value = safe_load_unique(raw) if raw.strip() else raw
    except yaml.constructor.ConstructorError as err:
        raise UserError(f"override '{item[:200]}': {err.problem}") from None
    except RecursionError:
        raise UserError(f"override '{item[:200]}': value nested too deeply") from None
    except yaml.YAMLError:
        value = raw
    return tuple(key.split(".")), value


def set_dotted(data: dict, keys: tuple[str, ...], value: Any, item: str) -> None:
    """Set `data[k1][k2]... = value`, creating sections as needed."""
    node = data
    for i, key in enumerate(keys[:-1]):
        child = node.get(key)
        if child is None:
            child = node[key] = {}
        if not isinstance(child, dict):
            path = ".".join(keys[: i + 1])
            raise UserError(f"override '{item}': {path} is a value, not a section")
        node = child
    node[keys[-1]] = value


def describe_validation_error(
    err: ValidationError, source: str, override_keys: dict[tuple[str, ...], str] | None = None
) -> str:
    """Turn pydantic's first error into one line: `<source>: <key.path>: <what> (allowed: ...)`."""
    first = err.errors(include_url=False)[0]
    loc = tuple(str(part) for part in first["loc"])
    where = _source_of(loc, source, override_keys or {})
    kind = first["type"]
    if kind == "extra_forbidden":
        allowed = allowed_keys(loc[:-1])
        hint = f" (allowed: {', '.join(allowed)})" if allowed else ""
        return f"{where}: {'.'.join(loc)}: unknown key{hint}"
    message = str(first["msg"])
    if message.startswith("Value error, "):
        # Our own validators name the field first ("min_lr: ..."): fold it into the key path.
        message = message[len("Value error, ") :]
        field, sep, rest = message.partition(": ")
        if sep and " " not in field:
            full = loc + tuple(field.split("."))
            return f"{_source_of(full, source, override_keys or {})}: {'.'.join(full)}: {rest}"
    given = first.get("input")
    shown = "" if isinstance(given, (dict, list)) or given is None else f" (got {reprlib.repr(given)})"
    if kind == "missing":
        shown = ""
    return f"{where}: {'.'.join(_clean_loc(loc))}: {message[:1].lower()}{message[1:]}{shown}"


def allowed_keys(section_loc: tuple[str, ...]) -> list[str]:
    """The field names valid at a section path (`()` = top level), following nested models."""
    model: type[BaseModel] | None = RunConfig
    for part in section_loc:
        field = model.model_fields.get(part) if model is not None else None
        model = _nested_model(field.annotation) if field is not None else None
    # a field named after a Python keyword (`checkpoint.async`) is spelled by its alias
    return [field.alias or name for name, field in model.model_fields.items()] if model is not None else []


def _nested_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _nested_model(arg)
        if found is not None:
            return found
    return None


def _clean_loc(loc: tuple[str, ...]) -> tuple[str, ...]:
    """Drop pydantic's union-branch tags (`bool`, `int`, `PruningConfig`) from a location."""
    tags = {"bool", "int", "float", "str", "none", "function-after[_check(), PruningConfig]"}
    return tuple(part for part in loc if part not in tags and not part.startswith(("function-", "literal[")))


def _source_of(loc: tuple[str, ...], source: str, override_keys: dict[tuple[str, ...], str]) -> str:
    for keys, item in override_keys.items():
        if loc[: len(keys)] == keys or keys[: len(loc)] == loc and loc:
            return f"override '{item}'"
    return source


def dump_config(cfg: RunConfig) -> str:
    """The resolved config as YAML: written into the run directory and fed to the workers."""
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)


def load_train_config(config_path: str | None, overrides: list[str], check_compress=None):
    """The run config with every section validated before any process starts.

    `check_compress(section, pruning, source)` validates the `compress:` section; the CLI
    passes compress's own parser in (`flopwise.cli`), so train does not import compress.
    """
    cfg = load_config(config_path, overrides)
    if cfg.compress is not None and check_compress is not None:
        check_compress(cfg.compress, cfg.training.pruning, source=config_path or "config")
    return cfg


def split_arguments(args: list[str]) -> tuple[str | None, list[str]]:
    """The first argument is the config file unless it looks like `key=value`."""
    if args and "=" not in args[0]:
        return args[0], list(args[1:])
    return None, list(args)
