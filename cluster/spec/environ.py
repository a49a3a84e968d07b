"""A task's environment as the spec gives it: values taken from the launcher's environment by
reference, the names whose values are never shown, and the limits the OS puts on them.

`env: {API_TOKEN: {from_env: API_TOKEN}}` takes the value from the environment the launcher runs
in, so a secret never enters the spec file. A value is hidden wherever the launcher writes or
prints it (plan, the spec copy in the train_dir and on every host, the report, the recorded
`--set` options) when its name looks secret (KEY, TOKEN, ...) or it came by reference; the task
still gets it, in its process environment.

A value is handed to the task by execve(2), which refuses a single "NAME=value" string longer
than MAX_ARG_STRLEN (Linux: 32 pages) and argv plus environment over ARG_MAX: a value that
cannot work is refused when the spec is read, naming its key, not when a task is spawned.
"""
from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

import yaml

from cluster.spec.reader import parse_yaml

FROM_ENV = 'from_env'
MASK = '***'
SECRET_WORDS = ('KEY', 'TOKEN', 'SECRET', 'PASSWORD', 'PASSWD', 'CREDENTIAL')
# Linux's limit on one argument or environment string, its NUL included (include/uapi/linux/binfmts.h:
# MAX_ARG_STRLEN = 32 pages); other systems have only the total, ARG_MAX.
MAX_ARG_STRLEN = 32 * 4096 if sys.platform.startswith('linux') else None
POINTER_BYTES = 8           # each string also costs its pointer in argv[] or envp[]


def looks_secret(name: str) -> bool:
    """A variable whose value is not shown: its name holds KEY, TOKEN, SECRET, PASSWORD, ..."""
    upper = name.upper()
    return any(word in upper for word in SECRET_WORDS)


def arg_max() -> int:
    """The OS's limit on a new process's argv and environment together, in bytes."""
    try:
        value = os.sysconf('SC_ARG_MAX')
    except (ValueError, OSError):
        value = -1
    return value if value > 0 else 128 * 1024      # POSIX's smallest ARG_MAX is 4096; Linux's never below this


def env_string_bytes(name: str, value: str) -> int:
    """What "NAME=value" costs execve as one string, its NUL included."""
    return len(name.encode()) + 1 + len(value.encode('utf-8', 'surrogateescape')) + 1


def string_problem(name: str, value: str) -> str | None:
    """Why NAME=value cannot be one environment string of a task on this OS (None: it can)."""
    size = env_string_bytes(name, value)
    if MAX_ARG_STRLEN is not None and size > MAX_ARG_STRLEN:
        return (f'a value of {size - len(name.encode()) - 2:,} bytes exceeds the OS limit of {MAX_ARG_STRLEN:,} '
                f'bytes for one environment string ({name}=value); pass large data in a file and its path here')
    limit = arg_max()
    if size + POINTER_BYTES > limit:
        return (f'a value of {size - len(name.encode()) - 2:,} bytes exceeds the OS limit of {limit:,} bytes '
                '(ARG_MAX) for a command line and its environment; pass large data in a file and its path here')
    return None


def exec_bytes(argv: list[str] | tuple[str, ...], env: Mapping[str, str]) -> int:
    """What starting `argv` with environment `env` costs against ARG_MAX: every string with its
    NUL and its pointer, and the two NULL pointers that end the lists."""
    strings = sum(len(a.encode('utf-8', 'surrogateescape')) + 1 for a in argv) + \
        sum(env_string_bytes(k, v) for k, v in env.items())
    return strings + POINTER_BYTES * (len(argv) + len(env) + 2)


def reference(value: Any) -> str | None:
    """The variable a `{from_env: NAME}` value names; None for any other value."""
    if isinstance(value, dict) and set(value) == {FROM_ENV} and isinstance(value[FROM_ENV], str):
        return value[FROM_ENV]
    return None


def is_reference_like(value: Any) -> bool:
    """A mapping meant as a reference, well formed or not (the spec's check says what is wrong)."""
    return isinstance(value, dict) and FROM_ENV in value


def masked(env: Mapping[str, str], is_hidden: Callable[[str], bool]) -> dict[str, str]:
    """`env` with every hidden value replaced by MASK."""
    return {k: MASK if is_hidden(k) else v for k, v in env.items()}


def mask_raw(raw: Any, replace: Callable[[str], Any] = lambda name: MASK) -> Any:
    """A copy of a raw spec (a file's YAML, parsed) whose secret-looking env values are replaced
    by replace(name): MASK to show, or a reference to keep the spec usable. References and nulls
    stay as they are. Anything that is not a mapping is returned as it is."""
    if not isinstance(raw, dict):
        return raw
    out = dict(raw)
    if isinstance(raw.get('env'), dict):
        out['env'] = _mask_env(raw['env'], replace)
    if isinstance(raw.get('tasks'), dict):
        out['tasks'] = {job: ({**s, 'env': _mask_env(s['env'], replace)}
                              if isinstance(s, dict) and isinstance(s.get('env'), dict) else s)
                        for job, s in raw['tasks'].items()}
    return out


def _mask_env(env: dict, replace: Callable[[str], Any]) -> dict:
    return {name: (replace(name) if isinstance(name, str) and looks_secret(name) and value is not None
                   and not is_reference_like(value) else value)
            for name, value in env.items()}


def masked_spec_text(text: str) -> str | None:
    """A spec file's text to show (the report): as written when no secret-looking env name has a
    value there, else its YAML again with each such value as MASK. None when it cannot be read as
    YAML: a value in it could not be told from the rest, so it is not shown at all."""
    try:
        raw = parse_yaml(text, 'spec', line_numbers=False)[1]     # within the reader's bounds
    except ValueError:
        return None
    shown = mask_raw(raw)
    return text if shown == raw else yaml.safe_dump(shown, sort_keys=False)
