"""A rehearsal's findings (`launch up SPEC --rehearse`): every link a stand-in tried, as run.json's
`rehearsal` object, and the lines that summarise it on the console.

run.json holds every link (one entry per pair: from, to, address, rtt_ms, mb_per_s, error) and
the tasks that should have reported and did not (`unreported`: ended or lost before they could);
the console holds a summary that stays readable at a thousand tasks: who could not reach whom,
named, and per peer the median round trip and transfer rate over the tasks that reached it.
"""
from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from launch.records.jsonrecord import JsonRecord, json_field, read_real, read_text, read_texts

SHOWN_UNREACHABLE = 20      # pairs named on the console; run.json names them all


@dataclass(frozen=True)
class RehearsedLink(JsonRecord):
    """One stand-in's try of one peer."""
    source: str | None = json_field(read_text, doc='the task that tried (job:index)')
    target: str | None = json_field(read_text, doc='the peer it tried to reach (job:index)')
    address: str | None = json_field(read_text, doc='host:port it tried')
    rtt_ms: float | None = json_field(read_real, doc='median round trip of a few echoes, ms (null: not reached)')
    mb_per_s: float | None = json_field(read_real, doc="a bounded transfer's rate, MB/s (towards a ps only)")
    error: str | None = json_field(read_text, '', doc="why it was not reached ('': it was)")

    @property
    def reached(self) -> bool:
        return not self.error


def _read_links(value: Any) -> list[RehearsedLink] | None:
    if not isinstance(value, list):
        return None
    return [RehearsedLink.from_json(x) for x in value if isinstance(x, dict)]


@dataclass(frozen=True)
class Rehearsal(JsonRecord):
    """run.json's `rehearsal`: present only for a rehearsal."""
    tasks: int | None = json_field(lambda v: v if isinstance(v, int) and not isinstance(v, bool) else None,
                                   doc='how many tasks ran as stand-ins')
    links: list[RehearsedLink] | None = json_field(_read_links, doc='every link tried, by the task that tried it')
    unreported: list[str] | None = json_field(read_texts, doc='tasks with peers that reported no links')

    def unreachable(self) -> list[RehearsedLink]:
        return [x for x in self.links or () if not x.reached]


def read_rehearsal(value: Any) -> Rehearsal | None:
    return Rehearsal.from_json(value) if isinstance(value, dict) else None


def _p50(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def summary_lines(rehearsal: Rehearsal) -> list[str]:
    """The console's account of a rehearsal: a count, the unreachable pairs, one row per peer."""
    links = rehearsal.links or []
    bad = rehearsal.unreachable()
    lines = [f'rehearsal: {rehearsal.tasks} stand-in task(s); {len(links) - len(bad)} of {len(links)} link(s) reached']
    for link in bad[:SHOWN_UNREACHABLE]:
        lines.append(f'  {link.source} cannot reach {link.target} ({link.address}): {link.error}')
    if len(bad) > SHOWN_UNREACHABLE:
        lines.append(f'  ... and {len(bad) - SHOWN_UNREACHABLE} more unreachable link(s) (run.json: rehearsal.links)')
    if rehearsal.unreported:
        lines.append(f'  no report from {", ".join(rehearsal.unreported)} (ended or lost before reaching its peers)')
    rows = [('peer', 'reached by', 'p50 rtt', 'p50 MB/s')]
    for target in sorted({x.target or '' for x in links}):
        into = [x for x in links if x.target == target]
        ok = [x for x in into if x.reached]
        rtt, rate = _p50(x.rtt_ms for x in ok), _p50(x.mb_per_s for x in ok)
        rows.append((target, f'{len(ok)}/{len(into)}', '-' if rtt is None else f'{rtt:.2f} ms',
                     '-' if rate is None else f'{rate:.0f}'))
    if len(rows) > 1:
        widths = [max(len(r[i]) for r in rows) for i in range(4)]
        lines += ['  ' + '  '.join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return lines
