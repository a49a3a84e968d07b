"""A `train.program` that installs its own SIGTERM handler before it trains, as user code does (a
shutdown hook, a flush on exit): tests of the task's signal handling beside it (plan C.3.1). The
handler only notes each call, in the task's log and in `<train_dir>/user-sigterm-<job>-<index>`;
the training is examples/linear_program.py's, each update a little slowed so that a run lasts
long enough to be preempted mid-way."""
from __future__ import annotations

import os
import signal
import time
import types

STEP_PAUSE_SECS = 0.02


def noted_path(train_dir: str, job: str, index: int) -> str:
    return os.path.join(train_dir, f'user-sigterm-{job}-{index}')


def train(ctx) -> None:
    path = noted_path(ctx.train_dir, ctx.job, ctx.index)

    def users(signum: int, frame: types.FrameType | None) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, f'{signum}\n'.encode())
        finally:
            os.close(fd)
        print(f'user handler: signal {signum}', flush=True)

    signal.signal(signal.SIGTERM, users)
    from examples import linear_program
    linear_program.train(_Slowed(ctx))


class _Slowed:
    """The context as it is, its `report` a little later: fewer steps a second."""

    def __init__(self, ctx) -> None:
        self._ctx = ctx

    def __getattr__(self, name: str):
        return getattr(self._ctx, name)

    def report(self, step: int, loss: float, examples: int | None = None) -> None:
        time.sleep(STEP_PAUSE_SECS)
        self._ctx.report(step, loss, examples)
