"""Whether each planned task can be started at all: its command line and environment against the
OS's limits for starting a process (execve: ARG_MAX in all, MAX_ARG_STRLEN per string on Linux).

One value is checked when the spec is read (cluster/spec/environ.py); what only a plan knows is
checked here, before anything is written or started: the launcher's own variables (TF_CONFIG of a
large cluster), what a local task inherits, the sum of them all, and an SSH task's start command,
which the remote shell receives as one string. Pure: the caller gives what a task inherits and
the command its backend sends.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from cluster.spec import ClusterSpec
from cluster.spec.environ import MAX_ARG_STRLEN, arg_max, env_string_bytes, exec_bytes, string_problem
from launch.planning.plan import TaskPlan


def check(spec: ClusterSpec, plans: Iterable[TaskPlan], inherited: Callable[[TaskPlan], Mapping[str, str]],
          one_string: Callable[[TaskPlan], str | None]) -> None:
    """SpecError, one line naming the key to change, for the first task that could not be started:
    a variable or argument too long, argv and environment (`inherited` under `plan.env`) over
    ARG_MAX, or the text `one_string` gives (a command a remote shell gets whole) over MAX_ARG_STRLEN."""
    limit = arg_max()
    for plan in plans:
        for name, value in plan.env.items():
            problem = string_problem(name, value)
            if problem:
                raise spec.error(_key_of(spec, plan, name), f'{plan.name}: {problem}')
        longest = max(plan.argv, key=len)
        if MAX_ARG_STRLEN is not None and len(longest.encode()) + 1 > MAX_ARG_STRLEN:
            raise spec.error('train.command', f'{plan.name}: an argument of {len(longest.encode()):,} bytes exceeds '
                                              f'the OS limit of {MAX_ARG_STRLEN:,} bytes for one argument')
        size = exec_bytes(plan.argv, {**inherited(plan), **plan.env})
        if size > limit:
            key, part = _largest(spec, plan)
            raise spec.error(key, f'{plan.name}: its command line and environment come to {size:,} bytes, over the '
                                  f'OS limit of {limit:,} bytes (ARG_MAX) for starting a process; the largest part is '
                                  f'{key} ({part:,} bytes)')
        text = one_string(plan)
        if text is not None and MAX_ARG_STRLEN is not None and len(text.encode()) + 1 > MAX_ARG_STRLEN:
            key, part = _largest(spec, plan)
            raise spec.error(key, f'{plan.name}: its start command comes to {len(text.encode()):,} bytes, over the '
                                  f'OS limit of {MAX_ARG_STRLEN:,} bytes for the one string a remote shell gets over '
                                  f'SSH; the largest part is {key} ({part:,} bytes)')


def _key_of(spec: ClusterSpec, plan: TaskPlan, name: str) -> str:
    """The spec key that gives `name` to the task (its job's env wins), else the cluster (TF_CONFIG)."""
    job = plan.task.job
    if name in spec.job_env.get(job, {}):
        return f'tasks.{job}.env.{name}'
    return f'env.{name}' if name in spec.env else 'cluster'


def _largest(spec: ClusterSpec, plan: TaskPlan) -> tuple[str, int]:
    """The spec key that adds the most to the task's command line and environment, and its bytes."""
    parts = [(_key_of(spec, plan, name), env_string_bytes(name, value))
             for name, value in spec.task_env(plan.task.job).items()]
    if spec.train.command:
        parts.append(('train.command', sum(len(a.encode()) + 1 for a in spec.train.command)))
    return max(parts, key=lambda p: p[1], default=('env', 0))

