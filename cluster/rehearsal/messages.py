"""The rehearsal's one message of its own: `Links`, which peers a stand-in reached and how well.

It travels as the contract's messages do (cluster/runtime/contract.py): one tagged JSON record
appended to the task's channel (CHANNEL_ENV), then a human line in its log. The contract's
Reader passes over a record whose kind it does not know, so a `links` record costs a real run's
readers nothing; the launcher reads it at the end of a rehearsal (launch/run/rehearsal.py).
"""
from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from cluster.runtime import runjson
from cluster.runtime.messages import CHANNEL_ENV, RECORD_TAG, append_record

LINKS_KIND = 'links'


@dataclass(frozen=True)
class Link:
    """What a stand-in measured of one peer: `rtt_ms` the median of a few echoes, `mb_per_s` a
    bounded transfer's rate (only towards a ps), `error` why the peer could not be reached ('':
    it was). None where not measured."""
    peer: str
    address: str
    rtt_ms: float | None = None
    mb_per_s: float | None = None
    error: str = ''

    @property
    def reached(self) -> bool:
        return not self.error

    def words(self) -> str:
        if not self.reached:
            return f'{self.peer} ({self.address}) unreachable: {self.error}'
        rate = '' if self.mb_per_s is None else f', {self.mb_per_s:.0f} MB/s'
        return f'{self.peer} rtt {self.rtt_ms:.2f} ms{rate}'


@dataclass(frozen=True)
class Links:
    """A stand-in's findings about every peer its real task must reach."""
    task: str
    links: tuple[Link, ...]

    def human(self) -> str:
        if not self.links:
            return f'{self.task} links: no peer to reach'
        return f'{self.task} links: ' + '; '.join(link.words() for link in self.links)

    def to_record(self) -> str:
        data = {'kind': LINKS_KIND, 'task': self.task,
                'links': [{'peer': x.peer, 'address': x.address, 'rtt_ms': x.rtt_ms, 'mb_per_s': x.mb_per_s,
                           'error': x.error} for x in self.links]}
        return RECORD_TAG + runjson.dumps(data, separators=(',', ':'), sort_keys=True)


def _real(value: Any) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None


def _link(data: Any) -> Link | None:
    if not isinstance(data, dict) or not isinstance(data.get('peer'), str) or not isinstance(data.get('address'), str):
        return None
    error = data.get('error')
    return Link(data['peer'], data['address'], _real(data.get('rtt_ms')), _real(data.get('mb_per_s')),
                error if isinstance(error, str) else '')


def read_links(line: str) -> Links | None:
    """The Links record a channel line holds, else None (another kind, damaged). Never raises."""
    at = line.find(RECORD_TAG)
    if at < 0:
        return None
    try:
        data = json.loads(line[at + len(RECORD_TAG):])
    except ValueError:
        return None
    if not isinstance(data, dict) or data.get('kind') != LINKS_KIND or not isinstance(data.get('task'), str) \
            or not isinstance(data.get('links'), list):
        return None
    links = [_link(x) for x in data['links']]
    return Links(data['task'], tuple(x for x in links if x is not None))


def last_links(lines: Iterable[str]) -> Links | None:
    """The newest Links record among a channel's lines (a restarted task says them again)."""
    found = None
    for line in lines:
        found = read_links(line) or found
    return found


def say_links(log: Any, message: Links, environ: Mapping[str, str] = os.environ) -> None:
    """As the contract's `say`: the record in the channel where the launcher named one, then the line."""
    channel = environ.get(CHANNEL_ENV)
    if channel:
        append_record(channel, message.to_record())
    log.info('%s', message.human())
