"""A spec's errors, and where each dotted key was given: a file's line, a `--set` argument or
TF_CONFIG.

A spec is validated long after its YAML is parsed, and some of its errors are found only when it
is used; every one of them names the place the user has to change, so that place is kept here.
"""
from __future__ import annotations

import re

import yaml


class SpecError(ValueError):
    """A user error in a spec or an override; the message is one line."""


_HERE = None       # in Origins' tree: the key recorded at a node (no part of a key is None)
_PART = re.compile(r'\.|(?=\[)')


def _parts(key: str) -> list[str]:
    """A dotted key's parts, a list index its own part: 'cluster.ps[0]' -> cluster, ps, [0]. One
    key is below another exactly when the other's parts begin its own."""
    return _PART.split(key)


class Origins:
    """Remembers where each dotted key came from, so errors can point at it."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._where: dict[str, str] = {}
        # The same keys as a tree of their parts (`cluster.ps[0]`: cluster, ps, [0]), so that a key
        # given again drops what was recorded below it in time proportional to that alone: with a
        # scan of every key, N `--set` options took time N squared (50,000: minutes).
        self._tree: dict = {}

    def record_yaml(self, node: yaml.Node, prefix: str = '') -> None:
        """Every key under `node` (at `prefix`) came from its line of the file; SpecError for a
        key given twice (PyYAML would keep the last one without a word)."""
        self._set(prefix, f'{self.path}:{node.start_mark.line + 1}')
        if isinstance(node, yaml.MappingNode):
            first_line: dict[str, int] = {}
            for key_node, value_node in node.value:
                key = f'{prefix}.{key_node.value}' if prefix else str(key_node.value)
                line = key_node.start_mark.line + 1
                if key in first_line:
                    raise SpecError(f'{self.path}:{line}: {key}: duplicate key (first given on line '
                                    f'{first_line[key]})')
                first_line[key] = line
                self.record_yaml(value_node, key)
                self._set(key, f'{self.path}:{key_node.start_mark.line + 1}')
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                self.record_yaml(item, f'{prefix}[{i}]')

    def record_value(self, key: str, where: str) -> None:
        """`key` came whole from somewhere else than the file (TF_CONFIG): what was recorded for
        it and for every key below it is forgotten."""
        parts = _parts(key)
        parent: dict | None = self._tree
        for part in parts[:-1]:
            parent = parent.get(part) if parent is not None else None
        if parent is not None:
            below = parent.pop(parts[-1], None)
            stack = [below] if below is not None else []
            while stack:
                node = stack.pop()
                for part, child in node.items():
                    if part is _HERE:
                        del self._where[child]
                    else:
                        stack.append(child)
        self._set(key, where)

    def _set(self, key: str, where: str) -> None:
        node = self._tree
        for part in _parts(key):
            node = node.setdefault(part, {})
        node[_HERE] = key
        self._where[key] = where

    def record_override(self, key: str, text: str) -> None:
        self.record_value(key, f'--set {text}')

    def error(self, key: str, message: str) -> SpecError:
        return SpecError(f'{self._locate(key)}: {key}: {message}')

    def _locate(self, key: str) -> str:
        """Where `key` came from: itself, else a --set below it, else its nearest ancestor."""
        probe = key
        while probe:
            if probe in self._where:
                return self._where[probe]
            below = [w for k, w in self._where.items() if k.startswith((probe + '.', probe + '['))]
            if below and below[0].startswith('--set'):
                return below[0]
            parent = re.sub(r'(\.[^.\[]*|\[\d+\])$', '', probe)
            probe = '' if parent == probe else parent
        return self.path
