"""Run configs as YAML files, with ``key=value`` overrides from the command line.

A run file is a flat mapping of :class:`PPOConfig` fields plus one more key, ``algorithm``
(``ppo`` by default): a built-in's name, ``package.module:function`` (an ``@hf.algorithm``
function; the working directory is on the import path) or a graph JSON file. ``imports``
lists modules to import first (custom ops), ``algorithm_args`` the algorithm's own attributes::

    algorithm: my_algos:rloo_lenpen
    imports: [my_ops]
    algorithm_args: {len_penalty: 0.01}
    actor_model_name: ./my-model
    rollout_batch_size: 16
    device_map: {actor: cpu}

Overrides are ``key=value`` with the value read as YAML (``actor_lr=3e-4``, ``trackers=[console]``,
``reward_model_name=null``); ``key.sub=value`` sets one entry of a mapping field
(``device_map.actor=cuda:0``) or one field of a settings record
(``actor_lr_schedule.name=cosine``). A key given twice in the file, an unknown key, a sub-key of a field that is not a mapping,
or a value of the wrong type is a ConfigError naming the field path.
"""
from __future__ import annotations

import difflib
import os
import typing
from pathlib import Path
from typing import Any, Sequence

import yaml
from pydantic import BaseModel

from ..errors import ConfigError
from .config import MOVED_FIELDS, PPOConfig

__all__ = ["ALGORITHM_KEY", "load_run_config", "apply_override", "read_yaml"]

ALGORITHM_KEY = "algorithm"
DEFAULT_ALGORITHM = "ppo"


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, except that a key given twice in one mapping is an error (not the last value silently)."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            self.flatten_mapping(node)
            seen: dict[Any, Any] = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                try:
                    first = seen.setdefault(key, key_node.start_mark)
                except TypeError:  # an unhashable key: the base class reports it
                    continue
                if first is not key_node.start_mark:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"key {key!r} is given twice (first at line {first.line + 1}); keep one",
                        key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


def _load_yaml(text: str) -> Any:
    return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass


def read_yaml(path: str | os.PathLike) -> dict[str, Any]:
    """The mapping in a YAML file; ConfigError for a missing file, a syntax error (with its line) or a non-mapping."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist")
    try:
        data = _load_yaml(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path}: not UTF-8 text (byte {err.object[err.start]:#04x} at offset {err.start}); "
                          "save it as UTF-8") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"{path}: not valid YAML{where}: {getattr(err, 'problem', err)}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the file must hold a mapping of config fields, not a {type(data).__name__}")
    return data


def _unknown(key: str, where: str) -> ConfigError:
    close = difflib.get_close_matches(key, [*PPOConfig.model_fields, ALGORITHM_KEY], n=1)
    hint = f"; did you mean {close[0]!r}?" if close else "; `hybridflow run --fields` lists them"
    if key in MOVED_FIELDS:
        hint = f"; it moved to {MOVED_FIELDS[key]}"
    return ConfigError(f"{where}: unknown config field {key!r}{hint}")


def _optional_record(field: str) -> bool:
    """Whether config field ``field`` holds an optional settings record (``reward_server``: a model or None)."""
    annotation = PPOConfig.model_fields[field].annotation
    return any(isinstance(t, type) and issubclass(t, BaseModel) for t in typing.get_args(annotation))


def apply_override(data: dict[str, Any], item: str) -> None:
    """Apply one ``key[.sub...]=value`` override to ``data`` in place."""
    key, sep, text = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override {item!r} must be written key=value (or key.sub=value)")
    path = key.strip().split(".")
    if path[0] not in PPOConfig.model_fields and path[0] != ALGORITHM_KEY:
        raise _unknown(path[0], f"override {item!r}")
    try:
        value = _load_yaml(text) if text.strip() else ""
    except yaml.YAMLError as err:
        raise ConfigError(f"override {item!r}: the value is not valid YAML ({err})") from None
    target = data
    for depth, part in enumerate(path[:-1]):
        current = target.get(part)
        if current is None and depth == 0:
            default = PPOConfig.model_fields[part].get_default(call_default_factory=True)
            current = dict(default) if isinstance(default, dict) else default
            if isinstance(current, BaseModel):  # a settings record (actor_lr_schedule): its fields are the sub-keys
                current = current.model_dump()
            elif current is None and _optional_record(part):  # reward_server.url=...: a record started here
                current = {}
        if depth == 0 and isinstance(current, str) and part.endswith("_lr_schedule"):
            current = {"name": current}  # a schedule given by its name
        if not isinstance(current, dict):
            field = ".".join(path[:depth + 1])
            raise ConfigError(f"override {item!r}: {field} is not a mapping, so {key} cannot be set; write {field}=VALUE")
        target[part] = current
        target = current
    target[path[-1]] = value


def load_run_config(path: str | os.PathLike | None, overrides: Sequence[str] = (),
                    imports: Sequence[str] = ()) -> tuple[str, PPOConfig]:
    """``(algorithm, config)`` from a YAML file (None: no file) and overrides, validated once.

    ``imports`` (``--import``) are added to the config's ``imports``; all of them are imported
    before the algorithm is resolved, so an unknown algorithm fails here.
    """
    from ..algorithms.resolve import import_modules, resolve_algorithm

    data = read_yaml(path) if path is not None else {}
    where = str(path) if path is not None else "command line"
    for key in data:
        if key not in PPOConfig.model_fields and key != ALGORITHM_KEY:
            raise _unknown(str(key), where)
    for item in overrides:
        apply_override(data, item)
    algorithm = data.pop(ALGORITHM_KEY, DEFAULT_ALGORITHM)
    if imports:
        listed = data.get("imports") or []
        data["imports"] = [*([listed] if isinstance(listed, str) else listed), *imports]
    if not isinstance(algorithm, str):
        raise ConfigError(f"{where}: algorithm: {algorithm!r} is not a name; write a built-in's name, "
                          "package.module:function or a graph JSON file")
    try:
        config = PPOConfig(**data)
    except ConfigError as err:
        raise ConfigError(f"{where}{' with overrides' if overrides else ''}: {err}") from None
    import_modules(config.imports, f"{where}: imports")
    resolve_algorithm(algorithm, f"{where}: algorithm")  # an unknown algorithm fails before anything is set up
    return algorithm, config
