"""Real TensorFlow on many emulated hosts through a ps kill and a recovery (issue #39), by hand:

    python benchmarks/real_hosts.py                               # 2 ps + 22 workers on 8 hosts (~17 GB, minutes)
    python benchmarks/real_hosts.py --ps 1 --workers 2 --hosts 2  # the smallest, to see that it works

The hosts are the many-host rig's (tests/harness/hosts.py: loopback addresses behind real sshds on
this machine), sharing one workdir as hosts sharing a filesystem do (a TF1 checkpoint is written in
parts: each ps saves its own variables on its host); tasks are dealt round-robin, the ps first. The run is async (a TF1
between-graph cluster), checkpoints every tenth of the steps and restarts on failure; once the
chief's progress passes --kill-at of the steps, ps:0 gets SIGKILL. Printed: every server up, the
kill, the fault the launcher saw and the restart it made, the first step after it, the end, and
the peak memory of the machine. Each host's tasks run this checkout (a `python` that sets
PYTHONPATH: sshd passes none on).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

import psutil
import yaml

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEP = re.compile(r'step (\d+)/(\d+)')
GB = 1 << 30


def write_spec(cwd: str, rig, args, python: str) -> str:
    sys.path.insert(0, REPO)
    from tests.conftest import free_ports
    size = args.ps + args.workers
    where = [rig.addresses[i % len(rig.addresses)] for i in range(size)]
    ports = free_ports(size)
    spec = {'cluster': {'ps': [f'{h}:{p}' for h, p in zip(where[:args.ps], ports[:args.ps])],
                        'worker': [f'{h}:{p}' for h, p in zip(where[args.ps:], ports[args.ps:])]},
            'train': {'sync': False, 'steps': args.steps, 'batch_size': args.batch, 'data': 'synthetic',
                      'train_dir': 'run', 'log_every_secs': 2.0, 'checkpoint_steps': max(1, args.steps // 10)},
            'supervise': {'restart': 'on-failure', 'max_restarts': 2},
            # One workdir for every host, as a shared filesystem gives: a TF1 checkpoint's shards are
            # written by each ps on its own host, its index by the chief (separate workdirs: no restore).
            'hosts': rig.host_settings(lambda a: cwd, python=python)}
    path = os.path.join(cwd, 'spec.yaml')
    with open(path, 'w') as f:
        yaml.safe_dump(spec, f)
    return path


def task_pid(rundir: str, name: str) -> int | None:
    """The newest pid the launcher started `name` with (events.jsonl)."""
    pid = None
    try:
        with open(os.path.join(rundir, 'events.jsonl')) as f:
            for line in f:
                e = json.loads(line)
                if e.get('event') == 'task_started' and e.get('task') == name:
                    pid = e.get('pid')
    except (OSError, ValueError):
        pass
    return pid


class Watch:
    """The launcher's lines as they come, each with the time it was read, and the machine's peak
    memory in use meanwhile."""

    def __init__(self, proc: subprocess.Popen):
        self.proc, self.lines, self.peak = proc, [], 0
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append((time.monotonic(), line.rstrip('\n')))
            self.peak = max(self.peak, psutil.virtual_memory().used)

    def first(self, pattern: str, after: float = 0.0) -> tuple[float, str] | None:
        return next(((t, x) for t, x in self.lines if t >= after and re.search(pattern, x)), None)

    def wait_step(self, step: int, timeout: float) -> bool:
        """Until the chief's progress reaches `step`, the launcher ends, or `timeout`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            if any(x.startswith('[worker:0]') and (m := STEP.search(x)) and int(m[1]) >= step for _, x in self.lines):
                return True
            time.sleep(0.2)
        return False


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--ps', type=int, default=2)
    p.add_argument('--workers', type=int, default=22)
    p.add_argument('--hosts', type=int, default=8)
    p.add_argument('--steps', type=int, default=400)
    p.add_argument('--batch', type=int, default=16)
    p.add_argument('--kill-at', type=float, default=0.4, help='share of the steps at which ps:0 is killed')
    p.add_argument('--timeout', type=float, default=1800, help='seconds the whole run may take')
    args = p.parse_args()
    sys.path.insert(0, REPO)
    from tests.harness.hosts import Rig

    with tempfile.TemporaryDirectory() as tmp, Rig(os.path.join(tmp, 'rig'), args.hosts) as rig:
        cwd = os.path.join(tmp, 'run-here')
        os.makedirs(cwd)
        python = os.path.join(tmp, 'python-here')
        with open(python, 'w') as f:
            f.write(f'#!/bin/sh\nPYTHONPATH={REPO} exec {sys.executable} "$@"\n')
        os.chmod(python, 0o755)
        spec = write_spec(cwd, rig, args, python)
        print(f'{args.ps} ps + {args.workers} workers on {args.hosts} hosts, async, {args.steps} steps, batch '
              f'{args.batch}; ps:0 killed at {args.kill_at:.0%} of the steps', flush=True)
        t0 = time.monotonic()
        proc = subprocess.Popen([sys.executable, '-m', 'launch', 'up', spec, '--ssh-config', str(rig.ssh_config),
                                 '--start-timeout', '600'], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3'), start_new_session=True)
        watch = Watch(proc)
        try:
            killed = None
            if watch.wait_step(int(args.steps * args.kill_at), args.timeout):
                pid = task_pid(os.path.join(cwd, 'run'), 'ps:0')
                if pid:
                    os.kill(pid, signal.SIGKILL)
                    killed = time.monotonic()
            rc = proc.wait(timeout=max(60.0, args.timeout - (time.monotonic() - t0)))
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            watch.reader.join(10)
        report(watch, t0, killed, rc, args)


def report(watch: Watch, t0: float, killed: float | None, rc: int, args) -> None:
    def at(found) -> str:
        return 'never' if found is None else f'{found[0] - t0:6.1f} s  {found[1].strip()[:110]}'
    up = watch.first(r'all \d+ servers are up')
    print(f'all up:          {at(up)}')
    print(f'ps:0 killed:     {"never" if killed is None else f"{killed - t0:6.1f} s"}')
    after = killed or 0.0
    for what, pattern in (('fault seen', r'ps:0 was killed|ps:0.*(lost|ended)'), ('restart', r'restart \d+/\d+'),
                          ('resumed', r'resuming from')):
        print(f'{what + ":":<17}{at(watch.first(pattern, after))}')
    steps = [(t, int(m[1])) for t, x in watch.lines if t >= after and x.startswith('[worker:0]') and (m := STEP.search(x))]
    print(f'first step after: {"never" if not steps else f"{steps[0][0] - t0:6.1f} s  step {steps[0][1]}"}')
    print(f'last step:       {"none" if not steps else steps[-1][1]} of {args.steps}')
    print(f'launch up exit:  {rc} after {time.monotonic() - t0:.1f} s; peak memory in use {watch.peak / GB:.1f} GB')
    print('launcher, last lines:')
    for _, x in watch.lines[-6:]:
        print(f'  {x}')
    if rc != 0 or killed is None:
        sys.exit(1)


if __name__ == '__main__':
    main()
