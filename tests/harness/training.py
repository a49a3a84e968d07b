"""Helpers of the tests of training, used by
tests/system/cluster/test_programs.py, tests/system/cluster/training/test_training.py,
tests/system/launch/run/test_elastic.py, tests/unit/cluster/training/test_training.py: here, since no test
module imports another."""
from __future__ import annotations

import glob
import json
import os




def results(train_dir: str, n: int) -> list[dict]:
    out = []
    for i in range(n):
        with open(os.path.join(train_dir, f'worker-{i}.json')) as f:
            out.append(json.load(f))
    return out


def summaries_in(logdir: str) -> dict[str, list[tuple[int, object]]]:
    """{tag: [(step, value), ...]} of the TensorBoard event files directly in `logdir`, in the
    order written (of every file): a scalar's float, a text summary's str."""
    import tensorflow as tf
    events = [e for path in glob.glob(os.path.join(logdir, 'events.out.tfevents.*'))
              for e in tf.compat.v1.train.summary_iterator(path)]
    out: dict[str, list] = {}
    for event in sorted(events, key=lambda e: e.wall_time):
        for v in event.summary.value:
            value = v.simple_value if v.HasField('simple_value') else tf.make_ndarray(v.tensor).item().decode()
            out.setdefault(v.tag, []).append((event.step, value))
    return out
