"""`launch list` (the runs the user started, or those under a directory) and `launch report` (one
run's HTML page): what the runs left in their train_dirs, read back."""
from __future__ import annotations

import os
import sys

from cluster.runtime import rundir, runjson
from cluster.spec import ClusterSpec
from launch.commands.flags import ListFlags, OutputFlags
from launch.commands.request import Request
from launch.errors import UsageError
from launch.records import index, runs


def cmd_list(flags: ListFlags) -> int:
    """The runs under DIR; with none named, the runs the user started, wherever they are (the
    index of launch/records/index.py): never what lies under the current directory by chance,
    such as a test's recorded run in a clone of this repository. Stale entries of the index
    (their train_dir moved or removed) cost one line on stderr."""
    if flags.dir is not None:
        found, empty = runs.find_runs(flags.dir), ''
    else:
        found, stale = runs.recorded_runs()
        empty = (f'no runs recorded in {index.runs_dir()} (`launch up` records each run it starts; '
                 '`launch list DIR` finds the runs under a directory)')
        if stale:
            shown = ', '.join(f'{e.id} ({e.train_dir})' for e in stale[-3:])
            print(f'launch: {len(stale)} run(s) recorded in {index.runs_dir()} are no longer where they were '
                  f'started (moved or removed): {shown}', file=sys.stderr)
    if flags.json:
        print(runjson.dumps([r.to_json() for r in found], indent=1))
    else:
        print(runs.table(found, flags.dir or '.', empty))
    return 0


def cmd_report(spec: ClusterSpec, req: Request[OutputFlags]) -> int:
    from launch.records import report
    train_dir = spec.train.train_dir
    output = req.flags.output
    if runs.describe(train_dir) is None:
        raise runs.RunNotFound(f'{os.path.abspath(train_dir)} holds no run (no events.jsonl or run.json)')
    try:
        path = report.write(train_dir, output)
    except OSError as e:
        raise UsageError(f'{output or rundir.report_path(train_dir)}: cannot write: {e.strerror}') from None
    print(f'wrote {path}')
    return 0
