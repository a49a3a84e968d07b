"""Helpers shared by conftest, the harness's fixtures that start real parts and the chaos harness
(none of them may import conftest, which loads them as plugins): the repository's root, free
ports, the processes of a run, and the skip that is a failure under CI."""
from __future__ import annotations

import os
import random
import socket

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def free_ports(n: int) -> list[int]:
    """n distinct ports nobody listens on now, below the kernel's range for outgoing connections
    (ip_local_port_range starts at 32768), so no client socket takes one before its task binds it."""
    found: list[int] = []
    for port in random.sample(range(20000, 32000), 400):
        with socket.socket() as s:
            try:
                s.bind(('', port))
            except OSError:
                continue
        found.append(port)
        if len(found) == n:
            return found
    raise RuntimeError(f'no {n} free ports in 20000-32000')


def unavailable(message: str, ci_note: str):
    """Skip, saying why in one line; under CI=true, where the part must run, fail instead."""
    if os.environ.get('CI') == 'true':
        pytest.fail(f'{message} (CI=true: {ci_note})', pytrace=False)
    pytest.skip(message)


# What a task's or a launcher's command line holds, however it was started.
TASK_MARKERS = ('cluster.task', 'cluster/task.py', 'cluster.rehearsal', 'cluster.standby', 'cluster.zygote', 'launch.cli', 'bin/launch ', '-m launch ')


def processes_naming(text: str) -> dict[int, str]:
    """pid -> command line of every live (not zombie) process whose command line holds `text`,
    from /proc: psutil may not be installed."""
    out = {}
    for entry in os.listdir('/proc'):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f'/proc/{entry}/cmdline', 'rb') as f:
                cmd = f.read().replace(b'\0', b' ').decode(errors='replace')
            with open(f'/proc/{entry}/stat') as f:
                state = f.read().rsplit(')', 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != 'Z' and text in cmd:
            out[int(entry)] = cmd
    return out


def task_processes(within: str) -> dict[int, str]:
    """pid -> command line of every live task or launcher whose command line names `within` (a
    folder its spec lies below)."""
    return {pid: cmd for pid, cmd in processes_naming(within).items() if any(m in cmd for m in TASK_MARKERS)}


# The head of a user's command that speaks the classic TF1 flags and serves on its port over gRPC
# as a TensorFlow task would, without TensorFlow: a ps serves for ever, a worker goes on below it.
GRPC_STANDIN = '''\
import argparse, os, sys, time
from concurrent import futures
import grpc
p = argparse.ArgumentParser()
for flag in ('--job_name', '--task_index', '--ps_hosts', '--worker_hosts'):
    p.add_argument(flag)
a = p.parse_args()
hosts = (a.ps_hosts if a.job_name == 'ps' else a.worker_hosts).split(',')
server = grpc.server(futures.ThreadPoolExecutor(1))
server.add_insecure_port('[::]:' + hosts[int(a.task_index)].rsplit(':', 1)[1])
server.start()
if a.job_name == 'ps':
    server.wait_for_termination()
'''
