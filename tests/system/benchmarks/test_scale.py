"""`benchmarks/bench.py --only scale --quick`: the launcher's scale rows, local and over SSH to the
many-host rig, each with every figure printed (no figure judged: targets live in the benchmark)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO
from tests.harness.hosts import unavailable

FIGURES = ('serving_p50_s', 'serving_p99_s', 'all_up_s', 'launcher_cpu_share', 'launcher_rss_mb', 'fault_p50_s',
           'fault_p99_s', 'teardown_s', 'events_bytes_per_min', 'status_s', 'status_bytes', 'report_s', 'report_bytes')


@pytest.mark.slow
@pytest.mark.bench          # some 3 minutes of rehearsals: by hand (`python -m pytest -m bench`), not in CI
@pytest.mark.skipif(unavailable(namespaces=False) == 'needs root', reason='the rig: sshd runs as root')
def test_the_scale_benchmark_quick_mode_prints_every_figure_local_and_over_ssh(tmp_path):
    out = tmp_path / 'figures.json'
    result = subprocess.run([sys.executable, 'benchmarks/bench.py', '--only', 'scale', '--quick', '--json', str(out)],
                            cwd=REPO, capture_output=True, text=True, timeout=900)
    said = result.stdout + result.stderr
    assert result.returncode == 0, said[-4000:]
    scale = json.loads(out.read_text())['scale']
    assert [r['tasks'] for r in scale['rows']] == [10]
    assert [(r['hosts'], r['tasks']) for r in scale['ssh_rows']] == [(1, 10), (2, 10)]
    for r in scale['rows'] + scale['ssh_rows']:
        assert r.get('exit_code') == 0, r
        assert [f for f in FIGURES if r.get(f) is None] == [], r
    lines = result.stdout.splitlines()
    table = [x for x in lines if x.split()[:1] in (['10'], ['1'], ['2'])]
    assert len(table) == 3 and not any(' n/a' in x for x in table), '\n'.join(lines)
