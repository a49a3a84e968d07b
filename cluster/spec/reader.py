"""A spec's text and YAML, read within limits: refused in one line, never read without bound.

A spec is a few hundred bytes of YAML. Anything far bigger is a mistake (a wrong file, a device,
a "billion laughs" of nested aliases): refused before it can take the machine's memory or time.
"""
from __future__ import annotations

import os
import select
import stat
import time
from collections.abc import Callable
from typing import Any

import yaml

from cluster.spec.errors import SpecError

MAX_SPEC_BYTES = 1 << 20            # 1 MiB read at most, whatever the file is (a FIFO, /dev/zero)
MAX_SPEC_VALUES = 100_000           # values (mappings, lists, scalars) with YAML aliases expanded
SPEC_READ_SECS = 10                 # a FIFO or a terminal: the most the whole spec may take to arrive


class YAMLSyntaxError(SpecError):
    pass


def read_spec_text(path: str) -> str:
    """The spec file's text, read without ever reading more than MAX_SPEC_BYTES + 1 bytes (a FIFO
    or a device is read up to that too) nor waiting more than SPEC_READ_SECS for it."""
    fd = _open(path)
    try:
        data = _read_bounded(fd, path)
    except OSError as e:
        raise SpecError(f'{path}: cannot read spec file: {e.strerror}') from None
    finally:
        os.close(fd)
    if len(data) > MAX_SPEC_BYTES:
        raise SpecError(f'{path}: more than {MAX_SPEC_BYTES:,} bytes (1 MiB) to read, the limit for a spec: '
                        'a spec is a short YAML file')
    return _decode(data, path)


def _open(path: str) -> int:
    """A descriptor of `path` that never blocks: opening a FIFO would wait for a writer."""
    try:
        return os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise SpecError(f'{path}: spec file not found') from None
    except IsADirectoryError:
        raise SpecError(f'{path}: is a directory, not a spec file') from None
    except OSError as e:
        raise SpecError(f'{path}: cannot read spec file: {e.strerror}') from None


def _read_bounded(fd: int, path: str) -> bytes:
    """At most MAX_SPEC_BYTES + 1 bytes of `fd`, all there within SPEC_READ_SECS."""
    info = os.fstat(fd)
    if stat.S_ISDIR(info.st_mode):
        raise SpecError(f'{path}: is a directory, not a spec file')
    if stat.S_ISREG(info.st_mode) and info.st_size > MAX_SPEC_BYTES:
        raise SpecError(f'{path}: spec file is {info.st_size:,} bytes, over the limit of {MAX_SPEC_BYTES:,} '
                        '(1 MiB): a spec is a short YAML file')
    chunks, size = [], 0
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    deadline = time.monotonic() + SPEC_READ_SECS
    while size <= MAX_SPEC_BYTES:
        # A FIFO's writer may come later (and a FIFO that never had one is not ready, where a
        # read would say end of file); a terminal may never send anything: wait, not for ever.
        if not poller.poll(max(0.0, deadline - time.monotonic()) * 1000):
            raise SpecError(f'{path}: nothing more to read after {SPEC_READ_SECS}s ({size:,} bytes read): '
                            'a spec is a file, or a pipe whose writer ends')
        try:
            chunk = os.read(fd, MAX_SPEC_BYTES + 1 - size)
        except BlockingIOError:
            continue
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b''.join(chunks)


def _decode(data: bytes, path: str) -> str:
    try:
        return data.decode('utf-8')
    except UnicodeDecodeError as e:
        line = data.count(b'\n', 0, e.start) + 1
        column = e.start - (data.rfind(b'\n', 0, e.start) + 1) + 1
        raise SpecError(f'{path}:{line}: not a YAML spec: byte {e.start} (line {line}, column {column}) '
                        'is not UTF-8 text') from None


def parse_yaml(text: str, where: str, line_numbers: bool) -> tuple[yaml.Node | None, Any]:
    """(node tree, data) of one YAML document, read once. SpecError, one line beginning with
    `where` (and `:LINE` with `line_numbers`), for a syntax error, a value that contains itself
    through an alias, nesting too deep to read, or more than MAX_SPEC_VALUES values once its
    aliases are expanded (the data itself shares what an alias repeats, but everything that walks
    it, down to an error message's repr, would not)."""
    def at(line: int | None) -> str:
        return f'{where}:{line}' if line_numbers and line is not None else where
    loader = None
    try:
        try:
            loader = _CountingLoader(text)      # reading starts here: it refuses control characters
            node = loader.get_single_node()
            if node is None:
                return None, None
            _check_expansion(node, lambda line, key, message: SpecError(
                f'{at(line)}: {key + ": " if key else ""}{message}'))
            return node, loader.construct_document(node)
        except yaml.reader.ReaderError as e:
            line = text.count('\n', 0, e.position) + 1 if isinstance(e.position, int) else None
            raise YAMLSyntaxError(f'{at(line)}: YAML syntax error: {str(e).splitlines()[0]}') from None
        except yaml.YAMLError as e:
            mark = getattr(e, 'problem_mark', None)
            problem = getattr(e, 'problem', None) or str(e).splitlines()[0]
            raise YAMLSyntaxError(f'{at(mark.line + 1 if mark else None)}: YAML syntax error: {problem}') from None
        except _TooManyValues as e:
            raise SpecError(f'{at(e.line)}: more than {MAX_SPEC_VALUES:,} values by this line; a spec holds at '
                            f'most {MAX_SPEC_VALUES:,}') from None
        except RecursionError:
            assert loader is not None
            raise SpecError(f'{at(loader.get_mark().line + 1)}: YAML nested too deeply to read (a spec is a few '
                            'levels deep)') from None
    finally:
        if loader is not None:
            loader.dispose()


class _TooManyValues(Exception):
    def __init__(self, line: int) -> None:
        super().__init__(line)
        self.line = line


class _CountingLoader(yaml.SafeLoader):
    """A SafeLoader that stops composing after MAX_SPEC_VALUES nodes (a flat list of half a
    million items fits in 1 MiB, and PyYAML takes most of a minute and ~400 MB to compose it)."""
    composed = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        if not self.check_event(yaml.AliasEvent):
            self.composed += 1
            if self.composed > MAX_SPEC_VALUES:
                raise _TooManyValues(self.peek_event().start_mark.line + 1)
        return super().compose_node(parent, index)


def _children(node: yaml.Node) -> list[tuple[str | None, yaml.Node]]:
    """(key part, child) of a node: a mapping's keys (part None) and values, a list's items."""
    if isinstance(node, yaml.MappingNode):
        out = []
        for k, v in node.value:
            out += [(None, k), (f'.{k.value}' if isinstance(k, yaml.ScalarNode) else '.?', v)]
        return out
    if isinstance(node, yaml.SequenceNode):
        return [(f'[{i}]', item) for i, item in enumerate(node.value)]
    return []


def _check_expansion(root: yaml.Node, error: Callable[[int, str, str], SpecError]) -> None:
    """Raise error(line, key, message) if the node graph has a cycle or holds more than
    MAX_SPEC_VALUES values with its aliases expanded. Linear in the distinct nodes: each node's
    expanded size is computed once (an alias is the same node object as its anchor)."""
    sizes = _expanded_sizes(root, error)
    total = sizes[id(root)]
    if total <= MAX_SPEC_VALUES:
        return
    node, key = root, ''        # the innermost value that is over the limit: where the aliases multiply
    while True:
        over = next(((part, c) for part, c in _children(node) if sizes[id(c)] > MAX_SPEC_VALUES), None)
        if over is None:
            break
        key, node = key + (over[0] or ''), over[1]
    aliased = ' once its YAML aliases (*name) are expanded' if total > len(sizes) else ''
    raise error(node.start_mark.line + 1, key.lstrip('.'),
                f'holds {sizes[id(node)]:,} values{aliased}; a spec holds at most {MAX_SPEC_VALUES:,}')


def _expanded_sizes(root: yaml.Node, error: Callable[[int, str, str], SpecError]) -> dict[int, int]:
    """id(node) -> its values with aliases expanded, for every node under `root` (a depth-first
    walk without recursion); error(...) raised at the first alias inside its own anchor."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()
    stack = [(root, iter(_children(root)))]
    open_nodes.add(id(root))
    while stack:
        node, todo = stack[-1]
        nxt = next(todo, None)
        if nxt is None:
            stack.pop()
            open_nodes.discard(id(node))
            sizes[id(node)] = 1 + sum(sizes[id(c)] for _, c in _children(node))
            continue
        child = nxt[1]
        if id(child) in open_nodes:
            raise error(child.start_mark.line + 1, '', 'a YAML alias refers to a value that contains it (*name '
                                                       'inside &name): a spec cannot be a cycle')
        if id(child) not in sizes:
            open_nodes.add(id(child))
            stack.append((child, iter(_children(child))))
    return sizes
