"""How the launcher joins a Ray cluster, or starts its own Ray instance for the run, and the
one-line refusals before it tries (not installed, nothing answers at the address, a Ray Client
address). Ray is imported here only when a connection is made: `import ray` takes over a second,
and `launch --help`, `plan` and every other backend need none of it.
"""
from __future__ import annotations

import importlib.util
import logging
import os
import socket
import sys
from typing import Any

from launch.errors import UsageError

NAMESPACE = 'tfcluster'         # every actor of every run lives here, named after its run and task
CONNECT_TIMEOUT = 2.0           # Ray itself retries an address that does not answer for ~20 s
EMBEDDED_STORE = 100_000_000    # an embedded instance's object store: the tasks pass no objects through Ray
ADDRESS_ENV = 'RAY_ADDRESS'
EXTRA = "pip install -e '.[ray]' (or pip install 'tfcluster[ray]')"


def installed() -> bool:
    return importlib.util.find_spec('ray') is not None


def not_installed() -> str:
    return f'--backend ray needs Ray, which is not installed for {sys.executable}: {EXTRA}'


def address_given(flag: str | None) -> tuple[str | None, str]:
    """The cluster's address (None: start a Ray instance for the run) and where it came from."""
    if flag:
        return flag, '--ray-address'
    value = os.environ.get(ADDRESS_ENV, '').strip()
    return (value, ADDRESS_ENV) if value else (None, '')


def refusal(address: str | None, source: str) -> str | None:
    """Why `address` cannot be used, one line, before any connection is tried; None: it can."""
    if address is None:
        return None if installed() else not_installed()
    if address.startswith('ray://'):
        return (f'{source} {address}: Ray Client addresses are not supported (the launcher must run on a node of '
                'the cluster): run it there, e.g. ray job submit -- launch up SPEC --backend ray')
    if not installed():
        return not_installed()
    return None


def answers(address: str, source: str) -> None:
    """UsageError when nothing accepts a TCP connection at the GCS address `host:port` within
    CONNECT_TIMEOUT ('auto' and other forms are left to Ray)."""
    host, _, port = address.rpartition(':')
    if not host or not port.isdigit():
        return
    try:
        with socket.create_connection((host.strip('[]'), int(port)), timeout=CONNECT_TIMEOUT):
            return
    except TimeoutError:
        why = f'no answer in {CONNECT_TIMEOUT:g}s'
    except OSError as e:
        why = e.strerror or str(e)
    raise UsageError(f'no Ray cluster answers at {address} ({source}): {why}')


def connect(address: str | None, cpus: int, gpus: int, token: bool = False) -> Any:
    """Join the cluster at `address`, or start a Ray instance on this machine for the run (with
    at least `cpus` logical CPUs, so a spec of more tasks than cores still places, and the
    machine's `gpus`), and return the `ray` module. The instance started dies with this process
    (Ray starts it with the launcher as the owner of its processes); close() stops it sooner.
    `token`: the cluster is a run's own instance, which Ray started in token mode (its token in
    ~/.ray/auth_token): a process that joins it (`launch status`) must send the token too."""
    if token:
        os.environ.setdefault('RAY_AUTH_MODE', 'token')
    os.environ.setdefault('RAY_USAGE_STATS_ENABLED', '0')
    import ray
    logging.getLogger('ray').setLevel(logging.ERROR)   # its notices (token mode, ...) are not the run's
    common: dict[str, Any] = {'namespace': NAMESPACE, 'log_to_driver': False, 'logging_level': logging.WARNING,
                              'configure_logging': False}
    if address is None:
        ray.init(address='local', num_cpus=max(os.cpu_count() or 1, cpus), num_gpus=gpus, include_dashboard=False,
                 object_store_memory=EMBEDDED_STORE, **common)
    else:
        ray.init(address=address, **common)
    return ray


def gcs_address(ray: Any) -> str:
    """The address other processes (`launch status`, `down`) reach this run's cluster at."""
    return str(ray.get_runtime_context().gcs_address)
