"""Helpers of the tests of ownership, used by
tests/unit/launch/records/test_ownership.py, tests/unit/launch/run/test_check.py: here, since no test module
imports another."""
from __future__ import annotations

import json
import os




def snapshot(root) -> dict:
    """Every entry under `root`: its kind, mode, time and bytes."""
    out = {}
    for where, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(where, name)
            st = os.lstat(path)
            data = open(path, 'rb').read() if name in files else None
            out[os.path.relpath(path, root)] = (st.st_mode, st.st_mtime_ns, data)
    return out


def someone_elses(train_dir) -> None:
    """Another program's training directory, with some of the names tfcluster writes too."""
    os.makedirs(train_dir / 'logs')
    (train_dir / 'checkpoint').write_text('model_checkpoint_path: "model.ckpt-900"\n')
    (train_dir / 'model.ckpt-900.index').write_bytes(b'\x00their weights')
    (train_dir / 'run.json').write_text(json.dumps({'loss': 0.12, 'epochs': 30}))
    (train_dir / 'events.jsonl').write_text('{"event": "epoch_end", "epoch": 30, "loss": 0.12}\n')
    (train_dir / 'worker-0.json').write_text('{"their": "figures"}')
    (train_dir / 'spec.yaml').write_text('model: resnet\n')
    (train_dir / 'logs' / 'train.log').write_text('epoch 30 done\n')

