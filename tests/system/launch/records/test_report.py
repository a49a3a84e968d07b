"""`launch report`: the page for a run with an injected fault (ps:0 killed by SIGKILL, a cluster
restart, a Ctrl-C, a resume the next morning), for a run with no events yet and for damaged input;
then the same page opened in a real headless Chromium, which must decode every plot."""
from __future__ import annotations

import os
import re

import pytest

from launch.records import report     # at collection: a fresh matplotlib font cache runs fc-list once, here
from tests.harness.report import ARTIFACTS, PNG_SIGNATURE, chromium, fault_run


@pytest.mark.slow
def test_report_opens_in_headless_chromium_with_every_image_decoded(tmp_path):
    train_dir = fault_run(tmp_path / 'run')
    url = 'file://' + report.write(train_dir)
    dom = chromium('--virtual-time-budget=5000', '--dump-dom', url, profile=str(tmp_path / 'profile'))
    found = re.search(r'<title>images-ok (\d+)/(\d+)', dom)
    assert found, f'the page\'s check never ran: {dom[:500]}'
    ok, total = map(int, found.groups())
    assert ok == total == 2, f'{ok} of {total} images decoded'
    os.makedirs(ARTIFACTS, exist_ok=True)
    shot = os.path.join(ARTIFACTS, 'report.png')
    chromium(f'--screenshot={shot}', '--window-size=1280,2400', '--hide-scrollbars', url,
             profile=str(tmp_path / 'profile'))
    with open(shot, 'rb') as f:
        data = f.read()
    assert data.startswith(PNG_SIGNATURE) and len(data) > 50_000, len(data)
    print(f'report screenshot: {shot}')

