"""The bodies of the `launch` commands, one module per concern. launch/cli.py parses the command
line, types each command's flags (launch/commands/flags.py) and calls one of these with the loaded
spec; the backends they need come from launch/run/registry.py.

  up.py       up, scale              status.py   status
  down.py     down                   logs.py     logs
  preview.py  plan, check            files.py    compose, render
  history.py  list, report           dataset.py  download, eval
  debug.py    debug
  request.py  the request, the spec or run it names, its plans and backends
"""
from __future__ import annotations

from typing import Any
from collections.abc import Callable

from cluster.spec import ClusterSpec, SpecError
from launch.commands.dataset import cmd_download, cmd_eval
from launch.commands.debug import cmd_debug
from launch.commands.down import cmd_down
from launch.commands.files import cmd_compose, cmd_render, write_output
from launch.commands.history import cmd_list, cmd_report
from launch.commands.logs import cmd_logs
from launch.commands.preempt import cmd_preempt
from launch.commands.preview import cmd_check, cmd_plan
from launch.commands.request import Request, backends_for, check_request, load_target, plans_of
from launch.commands.status import cmd_status
from launch.commands.up import check_workers, cmd_scale, cmd_up
from launch.errors import EXIT_NO_RUN, LaunchError

__all__ = ['COMMANDS', 'ERRORS', 'EXIT_NO_RUN', 'Request', 'backends_for', 'check_request', 'check_workers',
           'cmd_check', 'cmd_compose', 'cmd_debug', 'cmd_down', 'cmd_download', 'cmd_eval', 'cmd_list', 'cmd_logs',
           'cmd_plan', 'cmd_preempt', 'cmd_render', 'cmd_report', 'cmd_scale', 'cmd_status', 'cmd_up', 'load_target', 'plans_of',
           'write_output']

# The commands that act on a spec or a run: (spec, request) -> exit code.
COMMANDS: dict[str, Callable[[ClusterSpec, Request[Any]], int]] = {
    'up': cmd_up, 'scale': cmd_scale, 'status': cmd_status, 'down': cmd_down, 'logs': cmd_logs, 'plan': cmd_plan,
    'check': cmd_check, 'eval': cmd_eval, 'compose': cmd_compose, 'render': cmd_render, 'report': cmd_report,
    'debug': cmd_debug, 'preempt': cmd_preempt}
ERRORS = (SpecError, LaunchError)     # one line; a LaunchError's class carries its exit code, a SpecError's is 2
