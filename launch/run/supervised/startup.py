"""The start of a supervised cluster: wait until every task's gRPC server is up and the task
itself has said it serves, or name the first task that is not and why."""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping

import grpc

from cluster.runtime import messages
from launch.backends.base import ENDED, Backend, Observation, TaskRecord, status_all
from cluster.runtime.rundir import EXIT_FAILED, EXIT_NO_RESTART, EXIT_USAGE
from launch.run import disk
from launch.run.supervised.faults import TaskFailed, Verdict, explaining_tail, last_error, log_tail, own_error
from launch.run.lifecycle import Failure
from launch.run.policy import describe_exit

# Retry connecting every 100-500 ms: gRPC's default backoff grows towards two minutes, so a
# server that came up during a backoff would be noticed long after it was serving.
CHANNEL_OPTIONS = [('grpc.enable_http_proxy', 0), ('grpc.initial_reconnect_backoff_ms', 100),
                   ('grpc.min_reconnect_backoff_ms', 100), ('grpc.max_reconnect_backoff_ms', 500)]


FROZEN_LOOK_SECS = 1.0      # how often the start-up looks for a stopped task (an end is seen at every poll)
CLOSE_AFTER_SECS = 0.5      # a channel no longer watched is closed this long after (Channels)


def wait_for_servers(records: list[TaskRecord], backends: Mapping[str, Backend], deadline: float,
                     stop: threading.Event, reported: Callable[[str], bool] = lambda name: True,
                     stall_secs: float | None = None) -> None:
    """Return once every task's gRPC server accepts connections and the task itself has reported
    serving (`reported(name)`: a port answered by some other process, say another cluster's task on
    the same port, proves nothing); raise TaskFailed naming the first task that died on the way (one
    already up included), stayed stopped (SIGSTOP, paused) for `stall_secs`, or did not come up
    before the deadline. The TaskFailed names its task, so that a restart can count it as one more
    fault under the run's policy. A task's gRPC channel is opened once it has reported serving and
    closed once ready (one connection per task, not a reconnect every 100-500 ms from the start);
    every task's state comes from one status_many per backend."""
    pending = {r.name: r for r in records}
    channels = Channels()
    frozen_since: dict[str, float] = {}
    looked_frozen = -FROZEN_LOOK_SECS
    try:
        while pending and not stop.is_set():
            seen = status_all(records, backends)
            # A task that refused to start (its port is another run's) explains the others' ends.
            ended = [r for r in records if seen[r.name].state == ENDED and seen[r.name].exit_code]
            for record in sorted(ended, key=lambda r: seen[r.name].exit_code != EXIT_USAGE):
                _check_alive(record, seen[record.name], backends)
            if time.monotonic() - looked_frozen >= FROZEN_LOOK_SECS:
                looked_frozen = time.monotonic()
                for record in records:
                    _check_frozen(record, seen[record.name], frozen_since, stall_secs, backends)
            for name, record in list(pending.items()):
                if _is_up(record, seen[name], backends, channels, reported):
                    del pending[name]
                    channels.close(name)
            if pending and time.monotonic() > deadline:
                record = next(iter(pending.values()))
                raise _late(record, backends, channels.answered(record, backends))
            time.sleep(0.1)
    finally:
        channels.close_all()


class Channels:
    """The launcher's gRPC readiness channels of the tasks that reported serving, until each is
    ready. A channel is closed CLOSE_AFTER_SECS after its future was cancelled: gRPC watches a
    subscribed channel from a thread of its own that wakes every 0.2 s, and a channel closed under
    that watch makes it fail on stderr."""

    def __init__(self) -> None:
        self._open: dict[str, tuple[grpc.Channel, grpc.Future]] = {}
        self._closing: list[tuple[float, grpc.Channel]] = []

    def ready(self, record: TaskRecord) -> grpc.Future:
        """The channel-ready future of the task's address, its channel opened at the first ask."""
        if record.name not in self._open:
            channel = grpc.insecure_channel(record.endpoint, options=CHANNEL_OPTIONS)
            self._open[record.name] = (channel, grpc.channel_ready_future(channel))
        return self._open[record.name][1]

    def answered(self, record: TaskRecord, backends: Mapping[str, Backend]) -> bool:
        """Whether something answers gRPC at the task's address: its channel's word where it has
        one, else one probe now (a task that never reported serving has none)."""
        if record.name in self._open:
            return self._open[record.name][1].done()
        return backends[record.backend].probe(record, 0.5)

    def close(self, name: str) -> None:
        """Stop watching the task's channel; it is closed a little later (sweep)."""
        if name in self._open:
            channel, future = self._open.pop(name)
            future.cancel()
            self._closing.append((time.monotonic(), channel))
        self.sweep()

    def sweep(self, every: bool = False) -> None:
        """Close the channels no longer watched (`every`: all of them, now)."""
        now = time.monotonic()
        while self._closing and (every or now - self._closing[0][0] >= CLOSE_AFTER_SECS):
            self._closing.pop(0)[1].close()

    def close_all(self) -> None:
        """Every channel unwatched now and closed in the background once gRPC's watch is off it."""
        for name in list(self._open):
            self.close(name)
        if self._closing:
            timer = threading.Timer(CLOSE_AFTER_SECS, self.sweep, kwargs={'every': True})
            timer.daemon = True
            timer.start()


def _check_alive(record: TaskRecord, seen: Observation, backends: Mapping[str, Backend]) -> None:
    """TaskFailed if the task died (before or after its server came up)."""
    code = seen.exit_code if seen.state == ENDED else None
    if code is None or code == 0:
        return
    message = f'{record.name} {describe_exit(code)} during start-up'
    failures = [Failure(record.name, message, record.host, record.pid or None)]
    refusal = own_error(record.name, last_error(record, backends)) if code == EXIT_USAGE else None
    if refusal:     # it refused to start (its port is another run's): one line, and no restart mends it
        message = f'{message}: {refusal}'
        raise TaskFailed(message, failures=[Failure(record.name, message, record.host, record.pid or None)])
    if code == EXIT_NO_RESTART:     # its checkpoints do not restore: say so, as when it dies later
        line = str(Verdict(message, EXIT_FAILED, failures, can_save=False, no_restore=True,
                           error=own_error(record.name, last_error(record, backends))).failed(lambda: None))
        raise TaskFailed(line, failures=failures, task=record.name, exit_code=code)
    raise TaskFailed(message, explaining_tail(record, backends), failures=failures,
                     task=record.name, exit_code=code)


def _check_frozen(record: TaskRecord, seen: Observation, since: dict[str, float], stall_secs: float | None,
                  backends: Mapping[str, Backend]) -> None:
    """TaskFailed once the task has been stopped (SIGSTOP, paused) for `stall_secs`: a start-up
    waits no longer for a frozen task than the steady state does (supervise.stall_secs)."""
    if not seen.frozen:
        since.pop(record.name, None)
        return
    first = since.setdefault(record.name, time.monotonic())
    if stall_secs is not None and time.monotonic() - first >= stall_secs:
        message = f'{record.name} {seen.stopped} during start-up for {stall_secs:g}s (supervise.stall_secs)'
        raise TaskFailed(message, log_tail(record, backends),
                         failures=[Failure(record.name, message, record.host, record.pid or None)],
                         task=record.name, how=message)


def _is_up(record: TaskRecord, seen: Observation, backends: Mapping[str, Backend], channels: Channels,
           reported: Callable[[str], bool]) -> bool:
    """Whether the task serves (or has already finished well); its channel is opened only once it
    reported serving."""
    if seen.state == ENDED:         # ended well (_check_alive let no other code through)
        return seen.exit_code == 0
    if record.job in ('chief', 'evaluator'):
        # A coordinator run's chief and evaluator serve nothing of their own: their "started" line
        # (rundir.started_line) is the sign they run.
        return reported(record.name)
    return reported(record.name) and backends[record.backend].probe(record, 0.5, channel_ready=channels.ready(record))


def _says_serving(name: str, lines: list[str]) -> bool:
    """Whether these lines of the task's log say it serves: read here, not through its log's
    follower, which may not have reached the line yet (another thread reads it, on a busy machine
    later)."""
    reader = messages.Reader()
    return any(messages.says_ready(reader.read(line), name) for line in lines)


def _late(record: TaskRecord, backends: Mapping[str, Backend], answered: bool) -> TaskFailed:
    """The task not up by the deadline: its port answered for another process, or not at all,
    or it came up just then (its log says it serves, its follower had not read it yet). It names
    the task: during a restart, one more fault for the policy. A full disk under its files comes
    first: the task may serve but cannot log that it does."""
    try:
        full = disk.refusal([record], backends)
    except Exception:       # whatever a backend raises looking: the words below then
        full = None
    lines = log_tail(record, backends, 200)
    if full:
        message = f'{full}; {record.name} ({record.endpoint}) could not say it serves'
    elif answered and _says_serving(record.name, lines):     # its word came as the time ran out
        message = (f'{record.name} ({record.endpoint}) came up only as the time ran out; '
                   'raise the limit with --start-timeout')
    elif answered:
        message = (f'{record.name}: {record.endpoint} answers, but not from this task '
                   '(it never reported serving): another process holds that port?')
    else:
        message = (f'{record.name} ({record.endpoint}) did not accept gRPC connections '
                   f'in time; raise the limit with --start-timeout')
    return TaskFailed(message, lines[-15:], task=record.name,
                      failures=[Failure(record.name, message, record.host, record.pid or None)],
                      how=f'{record.name} was not up within --start-timeout')
