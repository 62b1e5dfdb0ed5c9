"""Reading a config file: the strict YAML loader, ConfigError, and the checks of single values.

Every problem in a config is a ConfigError phrased as 'file: key: what was expected'; the
checks here (a number, a finite number) and `describe` are what every section phrases alike.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import yaml

from pytest_opperf import files


class ConfigError(Exception):
    """A config problem, already phrased for the user: 'file: key: what was expected'.

    It carries the three parts (`path`, `key`, `expected`); the run layer turns it into pytest's
    collection or usage error with the same line.
    """

    def __init__(self, path: Any, key: str, message: str):
        self.path, self.key, self.expected = str(path), key, message
        where = f"{self.path}: {key}: " if key else f"{self.path}: "
        super().__init__(where + message)


def read_yaml(path: Path) -> Any:
    """The file's YAML, read safely; a duplicate key, bad YAML, an unreadable, non-UTF-8, too large
    or too deeply nested file, or aliases that multiply it, is a ConfigError."""
    try:
        return files.load_yaml(path, _StrictLoader)
    except files.FileError as exc:
        raise ConfigError(path, "", exc.reason) from None


# libyaml's parser where PyYAML was built with it (much faster on large configs), the
# pure-Python one otherwise; the constructor is PyYAML's safe one either way.
_SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _StrictLoader(_SafeLoader):
    """A safe loader that refuses duplicate keys instead of keeping the last one."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    mapping = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in mapping:
            mark = key_node.start_mark
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", mark)
        mapping[key] = loader.construct_object(value_node, deep=deep)
    return mapping


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def number(path: Path, key: str, value: Any):
    """The value, if it is an int or a float (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(path, key, f"expected a number, got {describe(value)}")
    return value


def finite(path: Path, key: str, value: Any):
    """The value, if it is a finite number."""
    if not math.isfinite(number(path, key, value)):
        raise ConfigError(path, key, f"expected a finite number, got {files.short(value)}")
    return value


def describe(value: Any) -> str:
    """What the file gave, for a message: 'nothing', 'int 3', 'str 'x'', 'list' (a quoted value at
    most 80 characters: files.short)."""
    if value is None:
        return "nothing"
    return f"{type(value).__name__} {files.short(value)}" if not isinstance(value, (dict, list)) else type(value).__name__
