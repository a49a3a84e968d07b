"""What the supervisor reads in a task's log while it is written (the task's messages,
cluster/runtime/messages.py): that it serves, the global steps it trains, the checkpoints a
chief saves. The follower's thread writes only what is made for it: the task's serving flag,
the attempt's step and checkpoint (under the attempt's lock), the workers that stepped, and the
recovery clock (under its own)."""
from __future__ import annotations

import threading

from cluster.runtime import messages
from launch.backends.base import Backend, TaskRecord
from launch.run.lifecycle import Lifecycle
from launch.run.supervised.channel import ChannelReader
from launch.run.supervised.mending import RecoveryClock
from launch.run.supervised.state import SupervisorState


def follow(life: Lifecycle, state: SupervisorState, clock: RecoveryClock, backend: Backend, record: TaskRecord,
           chief: bool, coordinator: bool) -> None:
    """Follow the log of the start `record` (`chief`: the task that saves; `coordinator`: a
    coordinator run's, whose chief alone counts the global step)."""
    serving = state.serving[record.name] = threading.Event()
    state.stepped.discard(record.name)

    def seen(line: str) -> None:
        said = life.said(record.name, line)
        if not serving.is_set() and messages.says_ready(said, record.name):
            serving.set()
            clock.served(record.name)
        found = life.saw_line(record.name, line, record.job == 'worker' or chief, chief)
        if chief and isinstance(said, messages.Checkpoint):
            state.attempt.saw_saved(said.step)
        if isinstance(said, messages.Preempted):
            state.attempt.saw_notice(record.name, said.grace, said.step)
        if found is not None and (chief or not coordinator):
            state.attempt.saw_step(found['step'])
            state.stepped.add(record.name)
            clock.stepped(record.name, found['step'], by_chief=chief and coordinator)
    life.follow(record.name, backend.log_tail(record, record.log_offset), seen,
                ChannelReader(backend, record) if backend.records_channel else None, group=backend.name)
