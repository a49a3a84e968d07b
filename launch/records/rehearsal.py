"""A rehearsal's findings (`launch up SPEC --rehearse`): every link a stand-in tried, and the
bounded summary of them that run.json's `rehearsal`, the Finished event, the console and the
report carry.

The link table has one entry per (task, peer) pair: 1,000 tasks with 50 ps make ~50,000 of them,
some 7 MB, past run.json's 4 MiB read limit (cluster/runtime/runjson.py MAX_BYTES), and a report
or a console nobody can read. So the table goes to its own JSON Lines file in the rehearsal's
run directory (`LINKS_FILE`, one link a line), and run.json keeps what stays small at any size:
the counts, the unreachable pairs (the first `NAMED` named, the rest counted), per peer the
p50/p99 round trip and rate, and the table itself only while it is small (`KEPT_LINKS`).
"""
from __future__ import annotations

import html
import json
import math
import os
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from cluster.runtime import runjson
from cluster.runtime.rundir import write_atomically
from launch.records.jsonrecord import JsonRecord, json_field, read_real, read_text, read_texts, read_whole

LINKS_FILE = 'rehearsal-links.jsonl'    # in the rehearsal's run directory: every link, one a line
NAMED = 100             # unreachable pairs (and unreported tasks) named in run.json; the rest counted
KEPT_LINKS = 200        # run.json keeps the whole table up to this many links (a small rehearsal's)
SHOWN_GROUPS = 20       # unreachable groups (a peer and a reason) named on the console
SHOWN_SOURCES = 5       # tasks named in one group's line


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


@dataclass(frozen=True)
class PeerFigures(JsonRecord):
    """The links into one peer (a ps by name; any other job's peers as one row, `worker:*`)."""
    peer: str | None = json_field(read_text, doc="the peer (job:index), or job:* for a job's non-ps peers together")
    reached: int | None = json_field(read_whole, doc='links that reached it')
    tried: int | None = json_field(read_whole, doc='links that tried it')
    rtt_p50_ms: float | None = json_field(read_real, doc='median round trip over the links that reached it, ms')
    rtt_p99_ms: float | None = json_field(read_real, doc='99th percentile round trip, ms')
    mb_per_s_p50: float | None = json_field(read_real, doc='median transfer rate, MB/s')
    mb_per_s_p1: float | None = json_field(read_real, doc='1st percentile rate, MB/s (99% of the links were this fast or faster)')


def _read_records(kind: type[JsonRecord]) -> Any:
    def read(value: Any) -> list | None:
        return [kind.from_json(x) for x in value if isinstance(x, dict)] if isinstance(value, list) else None
    return read


@dataclass(frozen=True)
class Rehearsal(JsonRecord):
    """run.json's `rehearsal`: present only for a rehearsal; bounded at any number of tasks."""
    OPTIONAL = frozenset({'links'})
    tasks: int | None = json_field(read_whole, doc='how many tasks ran as stand-ins')
    links_tried: int | None = json_field(read_whole, doc='links tried, all tasks together')
    unreachable_count: int | None = json_field(read_whole, doc='links that did not reach their peer')
    unreachable: list[RehearsedLink] | None = json_field(
        _read_records(RehearsedLink), doc=f'the first {NAMED} of them (every one: `links_file`)')
    unreported: list[str] | None = json_field(read_texts, doc=f'tasks with peers that reported no links (the first {NAMED})')
    unreported_count: int | None = json_field(read_whole, doc='how many tasks reported no links')
    peers: list[PeerFigures] | None = json_field(_read_records(PeerFigures), doc='per peer, the figures of the links into it')
    links_file: str | None = json_field(read_text, doc='the file beside run.json holding every link, one JSON object a line')
    links: list[RehearsedLink] | None = json_field(
        _read_records(RehearsedLink), doc=f'every link tried, while there are at most {KEPT_LINKS} (else only in `links_file`)')

    def unreachable_links(self) -> list[RehearsedLink]:
        """The unreachable links named (an older run.json: from its whole table)."""
        if self.unreachable is not None:
            return self.unreachable
        return [x for x in self.links or () if not x.reached]


def read_rehearsal(value: Any) -> Rehearsal | None:
    return Rehearsal.from_json(value) if isinstance(value, dict) else None


def percentile(values: Sequence[float], p: float) -> float | None:
    """The nearest-rank p-th percentile (0 < p <= 100) of `values`, None for none."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def _row_of(target: str) -> str:
    job = target.split(':', 1)[0]
    return target if job == 'ps' else f'{job}:*'


def peer_figures(links: Iterable[RehearsedLink]) -> list[PeerFigures]:
    """One row per ps (and per other job), in the peers' order (ps:2 before ps:10)."""
    into: dict[str, list[RehearsedLink]] = defaultdict(list)
    for link in links:
        into[_row_of(link.target or '')].append(link)

    def order(name: str) -> tuple[str, int]:
        job, _, index = name.partition(':')
        return job, int(index) if index.isdigit() else -1

    rows = []
    for name in sorted(into, key=order):
        ok = [x for x in into[name] if x.reached]
        rtt = [x.rtt_ms for x in ok if x.rtt_ms is not None]
        rate = [x.mb_per_s for x in ok if x.mb_per_s is not None]
        rows.append(PeerFigures(peer=name, reached=len(ok), tried=len(into[name]), rtt_p50_ms=percentile(rtt, 50),
                                rtt_p99_ms=percentile(rtt, 99), mb_per_s_p50=percentile(rate, 50),
                                mb_per_s_p1=percentile(rate, 1)))
    return rows


def summarise(tasks: int, links: Sequence[RehearsedLink], unreported: Sequence[str],
              links_file: str | None = LINKS_FILE) -> Rehearsal:
    """run.json's bounded `rehearsal` of every link found (the table itself kept only while small)."""
    bad = [x for x in links if not x.reached]
    return Rehearsal(tasks=tasks, links_tried=len(links), unreachable_count=len(bad), unreachable=bad[:NAMED],
                     unreported=list(unreported[:NAMED]), unreported_count=len(unreported),
                     peers=peer_figures(links), links_file=links_file,
                     links=list(links) if len(links) <= KEPT_LINKS else None)


def complete(found: Rehearsal) -> Rehearsal:
    """`found` with its summary: an older run.json held only the whole table (`links`)."""
    if found.links_tried is not None or found.links is None:
        return found
    return summarise(found.tasks or 0, found.links, found.unreported or [], None)


def write_links(path: str, links: Iterable[RehearsedLink]) -> None:
    """The link table as JSON Lines (one object a line, as run.json writes a link), atomically."""
    text = ''.join(runjson.dumps(x.to_json(), separators=(',', ':')) + '\n' for x in links)
    write_atomically(path, text)


def read_links_file(path: str) -> list[RehearsedLink]:
    """The links a LINKS_FILE holds; a line that is no JSON object is passed over. OSError if unreadable."""
    found = []
    with open(path, encoding='utf-8') as f:
        for line in f:
            try:
                data = json.loads(line)
            except ValueError:
                continue
            if isinstance(data, dict):
                found.append(RehearsedLink.from_json(data))
    return found


def _ms(value: float | None) -> str:
    return '-' if value is None else f'{value:.2f} ms'


def _rate(value: float | None) -> str:
    return '-' if value is None else f'{value:.0f}'


def _groups(bad: Iterable[RehearsedLink]) -> list[tuple[RehearsedLink, list[str]]]:
    """The unreachable links grouped by peer and reason: (the first such link, every source)."""
    groups: dict[tuple[str | None, str | None], tuple[RehearsedLink, list[str]]] = {}
    for link in bad:
        groups.setdefault((link.target, link.error), (link, []))[1].append(link.source or '?')
    return list(groups.values())


def _group_line(link: RehearsedLink, sources: list[str]) -> str:
    named = ', '.join(sources[:SHOWN_SOURCES])
    if len(sources) > SHOWN_SOURCES:
        named += f' and {len(sources) - SHOWN_SOURCES} more'
    return f'  {named} cannot reach {link.target} ({link.address}): {link.error}'


def unreachable_lines(found: Rehearsal) -> list[str]:
    """Who cannot reach whom: one line per peer and reason, its tasks named (the first few)."""
    found = complete(found)
    bad = found.unreachable_links()
    groups = _groups(bad)
    lines = [_group_line(link, sources) for link, sources in groups[:SHOWN_GROUPS]]
    left = (found.unreachable_count or len(bad)) - sum(len(s) for _, s in groups[:SHOWN_GROUPS])
    if left > 0:
        lines.append(f'  ... and {left} more unreachable link(s) ({found.links_file or "run.json"})')
    if found.unreported:
        more = (found.unreported_count or 0) - len(found.unreported)
        tail = f' and {more} more' if more > 0 else ''
        lines.append(f'  no report from {", ".join(found.unreported)}{tail} (ended or lost before reaching its peers)')
    return lines


PEER_HEAD = ('peer', 'reached by', 'p50 rtt', 'p99 rtt', 'p50 MB/s', 'p1 MB/s')


def peer_rows(found: Rehearsal) -> list[tuple[str, ...]]:
    return [(p.peer or '?', f'{p.reached}/{p.tried}', _ms(p.rtt_p50_ms), _ms(p.rtt_p99_ms), _rate(p.mb_per_s_p50),
             _rate(p.mb_per_s_p1)) for p in complete(found).peers or ()]


def summary_lines(found: Rehearsal) -> list[str]:
    """The console's account of a rehearsal: a count, who cannot reach whom (grouped), one row per ps."""
    found = complete(found)
    tried, bad = found.links_tried or 0, found.unreachable_count or 0
    lines = [f'rehearsal: {found.tasks} stand-in task(s); {tried - bad} of {tried} link(s) reached']
    lines += unreachable_lines(found)
    rows = peer_rows(found)
    if rows:
        rows.insert(0, PEER_HEAD)
        widths = [max(len(r[i]) for r in rows) for i in range(len(PEER_HEAD))]
        lines += ['  ' + '  '.join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    if found.links_file:
        lines.append(f'  every link: {found.links_file} (one JSON object a line)')
    return lines


def section_html(found: Rehearsal | None) -> str:
    """The report's rehearsal section ('' for any other run): the unreachable pairs, the per-peer
    table, the link file named and linked (it lies beside run.json and report.html)."""
    if found is None:
        return ''
    found = complete(found)
    e = html.escape
    tried, bad = found.links_tried or 0, found.unreachable_count or 0
    parts = ['<h2>Rehearsal</h2>', f'<p>{found.tasks} stand-in task(s); {tried - bad} of {tried} link(s) reached.</p>']
    said = unreachable_lines(found)
    if said:
        parts.append('<pre>' + e('\n'.join(line.strip() for line in said)) + '</pre>')
    rows = peer_rows(found)
    if rows:
        head = ''.join(f'<th>{e(h)}</th>' for h in PEER_HEAD)
        body = ''.join('<tr>' + ''.join(f'<td>{e(c)}</td>' for c in r) + '</tr>\n' for r in rows)
        parts.append(f'<table>\n<tr>{head}</tr>\n{body}</table>')
    if found.links_file:
        name = os.path.basename(found.links_file)
        parts.append(f'<p>Every link: <a href="{e(name)}">{e(name)}</a> (one JSON object a line).</p>')
    return '\n'.join(parts)
