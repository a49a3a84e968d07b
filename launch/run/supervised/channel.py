"""A task's channel as the supervisor reads it: the record lines the task appended beside its log
(cluster/runtime/messages.py, CHANNEL_ENV) since the last look, through the task's backend.

Why here and not a follower of its own: the messages' Reader asks for the channel while it reads
the task's log, in the log's thread, only at a line that shows a message. So the messages come in
the log's order whichever file they were read from, one follower per task as before, and a log
with no message line costs no read of the channel.

A backend whose tasks write channels says so (Backend.records_channel: the local one, the file;
the SSH one, over SFTP) and reads the channel with its read_log, as it reads a log. Compose names
its tasks none (their environment is compose.yaml, a run file that stays as it was), nor does a
Slurm job: there the Reader takes the log's own lines, as for a task started by hand. A channel
not there (yet) reads as empty.
"""
from __future__ import annotations

import dataclasses
import logging

from cluster.runtime import messages
from launch.backends.base import Backend, TaskRecord

log = logging.getLogger(__name__)


class ChannelReader:
    """The new complete record lines of one task's channel at each call (a messages.Channel)."""

    def __init__(self, backend: Backend, record: TaskRecord) -> None:
        self._backend = backend
        self._channel = dataclasses.replace(record, log=messages.channel_beside(record.log))
        # From byte 0: the backend emptied the channel as it started this start (messages.clear_channel),
        # so it holds this start's records alone, for a launcher that resumes the run as well.
        self._offset = 0

    def __call__(self) -> list[str]:
        try:
            lines = list(self._backend.read_log(self._channel, offset=self._offset))
        except Exception:      # a channel that cannot be read leaves it to the task's lines
            log.debug('cannot read %s', self._channel.log, exc_info=True)
            return []
        return self.take(lines)

    def take(self, lines: list[str]) -> list[str]:
        """The records among `lines` (read from the offset), the offset moved past them; a last
        line that is no record yet is being written: it is read again at the next call."""
        out = []
        for i, line in enumerate(lines):
            if i == len(lines) - 1 and not messages.is_record(line):
                break
            self._offset += len(line.encode('utf-8')) + 1       # records are ASCII: a byte a character
            out.append(line)
        return out
