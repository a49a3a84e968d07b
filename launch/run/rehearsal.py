"""`launch up SPEC --rehearse`: the run as it would go, every task a stand-in (cluster/rehearsal/).

The plans are the real ones but for the module their command runs (cluster/rehearsal/argv.py), so
each stand-in starts on its real host, by its real backend, with its real environment, and the
supervisor, the event log, run.json, `status`, `logs` and `down` treat it as the task it stands
in for. What a rehearsal adds is read at its end: each stand-in's `Links` record, from the
channel beside its log (the backends that read channels: local, SSH; several at once, as an SSH
read is a round trip), written whole to the rehearsal's link file and summarised, bounded, in
run.json's `rehearsal` (launch/records/rehearsal.py) and on the console.
"""
from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor

from cluster.rehearsal.argv import rehearsal_argv
from cluster.rehearsal.messages import last_links
from cluster.rehearsal.parts import peers
from cluster.runtime import rundir
from cluster.runtime.messages import channel_beside
from cluster.spec import ClusterSpec
from launch.backends.base import Backend, TaskRecord
from launch.errors import UsageError
from launch.planning.plan import TaskPlan
from launch.records.result import RunState
from launch.records.rehearsal import LINKS_FILE, RehearsedLink, Rehearsal, summarise, summary_lines, write_links
from launch.run.lifecycle import Lifecycle, Outcome
from launch.run.supervised import SupervisedRun

log = logging.getLogger(__name__)

STAND_IN_LINE = 'rehearsal: every task runs as a stand-in (python -m cluster.rehearsal: no TensorFlow, nothing saved)'
READERS = 16        # channels read at once at the end (an SSH read is a round trip to its host)


def rehearsal_spec(spec: ClusterSpec) -> ClusterSpec:
    """The spec a rehearsal runs: the same but for its train_dir, `<train_dir>/rehearsal`, so the
    rehearsal is a run of its own (its id, events, run.json, logs, state file) and the real run's
    files, checkpoints and resume are never touched by it."""
    train_dir = os.path.join(spec.train.train_dir, rundir.REHEARSAL_DIR)
    return dataclasses.replace(spec, train=dataclasses.replace(spec.train, train_dir=train_dir))


def stand_ins(plans: Iterable[TaskPlan]) -> list[TaskPlan]:
    """The plans with each task's command turned into its stand-in's."""
    return [dataclasses.replace(p, argv=rehearsal_argv(p.argv)) for p in plans]


def check_backends(backends: Mapping[str, Backend]) -> None:
    """UsageError where a backend names its tasks no channel: the stand-ins' findings could not be read."""
    blind = sorted(name for name, backend in backends.items() if not backend.records_channel)
    if blind:
        raise UsageError(f'--rehearse: the {", ".join(blind)} backend cannot carry a rehearsal\'s reports yet '
                         '(it reads no task channel); rehearse on the local or ssh backend')


def _links_of(record: TaskRecord, backend: Backend) -> list[RehearsedLink] | None:
    """The links the stand-in of `record` reported last, None where it reported none (or its
    channel cannot be read)."""
    channel = dataclasses.replace(record, log=channel_beside(record.log))
    try:
        found = last_links(backend.read_log(channel))
    except Exception:       # a channel that cannot be read: the task counts as unreported
        log.debug('cannot read %s', channel.log, exc_info=True)
        return None
    if found is None:
        return None
    return [RehearsedLink(source=found.task, target=x.peer, address=x.address, rtt_ms=x.rtt_ms,
                          mb_per_s=x.mb_per_s, error=x.error) for x in found.links]


def collect(spec: ClusterSpec, records: Iterable[TaskRecord], backends: Mapping[str, Backend]) -> Rehearsal:
    """Every started stand-in's links (its newest start's), and the ones with peers that said none:
    the whole table written to the run's link file (where it can be), the summary returned."""
    latest = {r.name: r for r in records}
    asked = [(task.name, latest[task.name]) for task in spec.tasks if task.name in latest and peers(spec, task)]
    with ThreadPoolExecutor(max_workers=READERS) as pool:
        found = list(pool.map(lambda pair: _links_of(pair[1], backends[pair[1].backend]), asked))
    links = [x for got in found if got is not None for x in got]
    unreported = [name for (name, _), got in zip(asked, found) if got is None]
    path = os.path.join(spec.train.train_dir, LINKS_FILE)
    try:
        write_links(path, links)
    except OSError as e:        # a full disk: the summary still says what was found
        log.warning('cannot write %s: %s', path, e.strerror)
        return summarise(len(latest), links, unreported, None)
    return summarise(len(latest), links, unreported)


class RehearsedRun(SupervisedRun):
    """The supervised run of stand-ins: as any, and at its end the findings of the stand-ins."""

    def run(self, life: Lifecycle) -> Outcome:
        self.life = life
        self.say(STAND_IN_LINE)
        self.say(f'rehearsal: its run lives in {self.spec.train.train_dir} (`launch status {self.spec.train.train_dir}`); '
                 'the real run\'s train_dir is not touched')
        outcome = super().run(life)
        found = collect(self.spec, self.state.records, self.backends)
        for line in summary_lines(found):
            self.say(line)
        resume = None
        if outcome.state is RunState.INTERRUPTED:      # resume_hint speaks of the real run's resume
            resume = (f'`launch up {self.spec.path} --rehearse` rehearses again, and the real run '
                      f'(`launch up {self.spec.path}`) starts as if no rehearsal had been')
        headline = f'rehearsal {outcome.headline}' if outcome.headline else ''
        return dataclasses.replace(outcome, headline=headline, rehearsal=found, resume=resume)
