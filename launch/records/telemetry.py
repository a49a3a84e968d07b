"""A run's telemetry, read from its event log: the `sample` events (what each task measured of
itself, cluster/runtime/telemetry.py) as a series per task and figure, and the `straggler`
events, for `launch status` and the report."""
from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

from cluster.runtime import rundir
from launch.records.event_types import Event, Sample, Straggler
from launch.records.events import typed_events

log = logging.getLogger(__name__)


def stragglers(events: Sequence[Event], attempt: int | None = None) -> list[Straggler]:
    """The straggler events, in order (of `attempt` only, where given)."""
    return [e for e in events if isinstance(e, Straggler) and (attempt is None or e.attempt == attempt)]


def series(events: Sequence[Event], figure: str) -> dict[str, list[tuple[float, float]]]:
    """task -> (epoch seconds, value) of one figure (`steps_per_sec`, `cpu`, ...) over the sample
    events, where the task measured it."""
    out: dict[str, list[tuple[float, float]]] = {}
    for e in events:
        if not isinstance(e, Sample) or not e.tasks:
            continue
        try:
            when = e.epoch
        except ValueError:
            continue
        for task, figures in e.tasks.items():
            value = figures.get(figure)
            if value is not None:
                out.setdefault(task, []).append((when, value))
    return out


def of_run(train_dir: str) -> list[Event]:
    """The sample and straggler events of the run in `train_dir` ([] with no event log, or one that
    cannot be read: said once)."""
    path = rundir.events_path(train_dir)
    try:
        return [e for e in typed_events(path) if isinstance(e, (Sample, Straggler))]
    except FileNotFoundError:
        return []
    except OSError as e:
        log.warning('%s: cannot read it (%s); skipped', path, e.strerror or e)
        return []


def note(straggler: Straggler) -> str:
    """`launch status`'s note of a worker named a straggler."""
    share = (f', {straggler.steps_per_sec / straggler.median:.0%} of the others\' steps/s'
             if straggler.steps_per_sec is not None and straggler.median else '')
    return f'straggler (named {straggler.time[11:19]}{share})'


TENSORBOARD_DIR = 'telemetry'       # <train_dir>/telemetry: the sample events' figures in TensorBoard


class Board:
    """The sample events' figures in TensorBoard, one event file in <train_dir>/telemetry: a tag
    per figure and task (`steps_per_sec/worker:0`, `in_per_sec/ps:1`), so TensorBoard draws every
    worker's steps/s in one group, one point per sample event (its step: the event's number; read
    its wall time). TensorBoard's own writer, no TensorFlow. A disk that refuses it turns it off,
    said once; the run goes on."""

    def __init__(self, train_dir: str) -> None:
        self.logdir = os.path.join(train_dir, TENSORBOARD_DIR)
        self._writer: Any = None
        self._off = False
        self.step = 0

    def add(self, when: float, tasks: Mapping[str, Mapping[str, float | int | None]]) -> None:
        if self._off:
            return
        from tensorboard.compat.proto import event_pb2, summary_pb2
        try:
            if self._writer is None:
                from tensorboard.summary.writer.event_file_writer import EventFileWriter
                self._writer = EventFileWriter(self.logdir, flush_secs=10)
            values = [summary_pb2.Summary.Value(tag=f'{figure}/{task}', simple_value=float(value))
                      for task, figures in tasks.items() for figure, value in figures.items() if value is not None]
            self._writer.add_event(event_pb2.Event(wall_time=when, step=self.step,
                                                   summary=summary_pb2.Summary(value=values)))
            self.step += 1
        except Exception as e:      # noqa: BLE001 (TensorBoard's figures are a courtesy)
            self._off = True
            log.warning('the telemetry in TensorBoard (%s) is off: %s', self.logdir, rundir.os_cause(e) or e)

    def close(self) -> None:
        if self._writer is not None:
            try:
                self._writer.close()
            except Exception:       # noqa: BLE001
                pass
