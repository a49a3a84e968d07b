"""`launch list` (the runs under a directory) and `launch report` (one run's HTML page): what the
runs left in their train_dirs, read back."""
from __future__ import annotations

import os

from cluster.runtime import rundir, runjson
from cluster.spec import ClusterSpec
from launch.commands.flags import ListFlags, OutputFlags
from launch.commands.request import Request
from launch.errors import UsageError
from launch.records import runs


def cmd_list(flags: ListFlags) -> int:
    found = runs.find_runs(flags.dir)
    if flags.json:
        print(runjson.dumps([r.to_json() for r in found], indent=1))
    else:
        print(runs.table(found, flags.dir))
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
