"""Recipe YAML: PyYAML's safe loader, reading ``1e-6`` as a float and refusing a key written twice."""

from __future__ import annotations

import re
from typing import Any

import yaml


class _YamlLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that also reads ``1e-6`` as a float (YAML 1.1 wants ``1.0e-6``, so plain
    PyYAML returns the string ``"1e-6"`` and ``train.learning_rate=1e-6`` would be rejected)."""


_YamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9][0-9_]*)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


class DuplicateKeyError(yaml.constructor.ConstructorError):
    """A YAML mapping that writes a key twice (PyYAML alone keeps the last value, silently).

    ``key``: the dotted path of the key (``train`` or ``train.max_steps``); ``lines``: the 1-based
    lines of its first and second occurrence. The message says both, e.g. ``train.max_steps is
    written twice (lines 2 and 7); each section and key may appear once``."""

    def __init__(self, key: str, first: yaml.Mark, second: yaml.Mark):
        self.key, self.lines = key, (first.line + 1, second.line + 1)
        where = (
            f"lines {self.lines[0]} and {self.lines[1]}"
            if first.line != second.line
            else f"line {self.lines[0]}, columns {first.column + 1} and {second.column + 1}"
        )
        super().__init__(
            problem=f"{key} is written twice ({where}); each section and key may appear once", problem_mark=second
        )

    def __str__(self) -> str:
        return self.problem


def _check_unique_keys(node: yaml.Node, path: str = "", _seen: set[int] | None = None) -> None:
    """Raise :class:`DuplicateKeyError` for the first key written twice in any mapping below
    ``node`` (at any depth, in lists too). Keys are compared as the scalars they are written as,
    after YAML's tag resolution (``1`` and ``'1'`` differ); ``<<`` merge keys are YAML's own
    overriding and are left alone. A node reached again through an alias is checked once."""
    _seen = set() if _seen is None else _seen
    if id(node) in _seen:
        return
    _seen.add(id(node))
    if isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _check_unique_keys(item, f"{path}[{i}]", _seen)
    elif isinstance(node, yaml.MappingNode):
        seen: dict[tuple[str, str], yaml.Mark] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                continue
            name = f"{path}.{key_node.value}" if path else key_node.value
            ident = (key_node.tag, key_node.value)
            if ident in seen:
                raise DuplicateKeyError(name, seen[ident], key_node.start_mark)
            seen[ident] = key_node.start_mark
            _check_unique_keys(value_node, name, _seen)


def load_yaml(text: str) -> Any:
    """``text`` parsed as YAML by :class:`_YamlLoader` (safe: plain data only).

    Raises:
        DuplicateKeyError: a mapping writes a key twice, at any depth (a ``yaml.YAMLError``).
        yaml.YAMLError: not valid YAML.
    """
    loader = _YamlLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_unique_keys(node)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def yaml_problem(e: yaml.YAMLError) -> str:
    """One line for a YAML error: ``line L, column C: problem`` where PyYAML knows the place."""
    mark, problem = getattr(e, "problem_mark", None), getattr(e, "problem", None)
    if mark is not None and problem:
        return f"line {mark.line + 1}, column {mark.column + 1}: {problem}"
    return " ".join(str(e).split())
