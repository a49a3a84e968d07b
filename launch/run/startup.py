"""The start of a supervised cluster: wait until every task's gRPC server is up and the task
itself has said it serves, or name the first task that is not and why."""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping

import grpc

from launch.backends.base import ENDED, Backend, TaskRecord
from cluster.runtime.rundir import EXIT_FAILED, EXIT_NO_RESTART
from launch.run.faults import TaskFailed, Verdict, explaining_tail, last_error, log_tail, own_error
from launch.run.lifecycle import Failure
from launch.run.policy import describe_exit

# Retry connecting every 100-500 ms: gRPC's default backoff grows towards two minutes, so a
# server that came up during a backoff would be noticed long after it was serving.
CHANNEL_OPTIONS = [('grpc.enable_http_proxy', 0), ('grpc.initial_reconnect_backoff_ms', 100),
                   ('grpc.min_reconnect_backoff_ms', 100), ('grpc.max_reconnect_backoff_ms', 500)]


def wait_for_servers(records: list[TaskRecord], backends: Mapping[str, Backend], deadline: float,
                     stop: threading.Event, reported: Callable[[str], bool] = lambda name: True) -> None:
    """Return once every task's gRPC server accepts connections and the task itself has reported
    serving (`reported(name)`: a port answered by some other process, say another cluster's task on
    the same port, proves nothing); raise TaskFailed naming the first task that died on the way or
    did not come up before the deadline."""
    pending = {r.name: (r, grpc.insecure_channel(r.endpoint, options=CHANNEL_OPTIONS)) for r in records}
    futures = {name: grpc.channel_ready_future(ch) for name, (_, ch) in pending.items()}
    try:
        while pending and not stop.is_set():
            for name, (record, _) in list(pending.items()):
                if _is_up(record, backends, futures[name], reported):
                    del pending[name]
            if pending and time.monotonic() > deadline:
                name, (record, _) = next(iter(pending.items()))
                raise _late(record, backends, futures[name].done())
            time.sleep(0.1)
    finally:
        for future in futures.values():
            future.cancel()
        for _, ch in pending.values():
            ch.close()


def _is_up(record: TaskRecord, backends: Mapping[str, Backend], ready: grpc.Future,
           reported: Callable[[str], bool]) -> bool:
    """Whether the task serves (or has already finished well); TaskFailed if it died."""
    backend = backends[record.backend]
    seen = backend.status(record)
    code = seen.exit_code if seen.state == ENDED else None
    if code is not None and code != 0:
        message = f'{record.name} {describe_exit(code)} during start-up'
        failures = [Failure(record.name, message, record.host, record.pid or None)]
        if code == EXIT_NO_RESTART:     # its checkpoints do not restore: say so, as when it dies later
            line = str(Verdict(message, EXIT_FAILED, failures, can_save=False, no_restore=True,
                               error=own_error(record.name, last_error(record, backends))).failed(lambda: None))
            raise TaskFailed(line, failures=failures, task=record.name, exit_code=code)
        raise TaskFailed(message, explaining_tail(record, backends), failures=failures,
                         task=record.name, exit_code=code)
    if record.job in ('chief', 'evaluator'):
        # A coordinator run's chief serves once its program builds the strategy, and an evaluator
        # serves nothing: their own line is the sign they started.
        return code == 0 or reported(record.name)
    return code == 0 or (backend.probe(record, 0.5, channel_ready=ready) and reported(record.name))


def _late(record: TaskRecord, backends: Mapping[str, Backend], answered: bool) -> TaskFailed:
    """The task not up by the deadline: its port answered for another process, or not at all."""
    if answered:
        return TaskFailed(f'{record.name}: {record.endpoint} answers, but not from this task '
                          '(it never reported serving): another process holds that port?', log_tail(record, backends))
    return TaskFailed(f'{record.name} ({record.endpoint}) did not accept gRPC connections '
                      f'in time; raise the limit with --start-timeout', log_tail(record, backends))
