"""The step profiler of benchmarks/profile.py: the trainer runs the local steps that
$TFCLUSTER_PROFILE names through a StepProfiler, which writes what it saw into the run directory.

Benchmark-only, so it lives apart from the trainer. TensorFlow is imported when a step is traced,
not with the module: the benchmark reads PROFILE_ENV here without paying for TensorFlow.
"""
from __future__ import annotations

import os
import re
import time
from typing import TYPE_CHECKING, Any

from cluster.runtime import rundir, runjson
from cluster.spec import TaskSpec

if TYPE_CHECKING:
    import cProfile

    import tensorflow as tf

PROFILE_ENV = 'TFCLUSTER_PROFILE'     # 'FIRST:COUNT': trace COUNT local steps from the FIRST-th on


class StepProfiler:
    """Where a worker's step goes, for benchmarks/profile.py. First TensorFlow's step stats
    (RunMetadata, full trace) of COUNT steps, summed per task and kind of op, with the bytes each
    transfer carried; then a Python profile of the next COUNT steps: how much of the loop's time is
    Python rather than TensorFlow's C++ session run. Written to <train_dir>/profile-worker-N.json."""

    KINDS = (('input', ('IteratorGetNext', 'IteratorV2', 'MakeIterator')),
             ('sync token', ('QueueDequeue', 'QueueEnqueue', 'AccumulatorApplyGradient', 'AccumulatorTakeGradient',
                             'AccumulatorNumAccumulated', 'AccumulatorSetGlobalStep', 'TakeGradient',
                             'ResourceAccumulator')),
             ('update', ('ApplyGradientDescent', 'ResourceApplyGradientDescent', 'Assign', 'AssignSub', 'AssignAdd',
                         'AssignVariableOp', 'AssignSubVariableOp', 'AssignAddVariableOp', 'ScatterSub')))
    UNITS = {'B': 1, 'KB': 1e3, 'KiB': 1 << 10, 'MB': 1e6, 'MiB': 1 << 20, 'GB': 1e9, 'GiB': 1 << 30}

    def __init__(self, path: str, first: int, count: int) -> None:
        self.path, self.first, self.count = path, first, count
        self.walls: list[float] = []
        self.by: dict[str, float] = {}
        self.bytes: dict[str, float] = {}
        self.python: cProfile.Profile | None = None     # the cProfile of the second COUNT steps, while it runs
        self.python_steps, self.python_t0 = 0, 0.0
        self.python_report: dict[str, float] | None = None

    @classmethod
    def of_env(cls, train_dir: str, task: TaskSpec) -> StepProfiler | None:
        value = os.environ.get(PROFILE_ENV)
        if not value:
            return None
        first, _, count = value.partition(':')
        return cls(rundir.profile_path(train_dir, task.index), int(first), int(count or 10))

    def wants(self, local_step: int) -> bool:
        return self.first <= local_step < self.first + 2 * self.count

    def run(self, sess: tf.compat.v1.Session, fetches: Any) -> Any:
        if len(self.walls) < self.count:
            return self._traced(sess, fetches)
        if self.python is None:
            import cProfile
            self.python, self.python_t0 = cProfile.Profile(), time.monotonic()
            self.python.enable()
        out = sess.run(fetches)
        self.python_steps += 1
        if self.python_steps == self.count:
            self._end_python()
        return out

    def _traced(self, sess: tf.compat.v1.Session, fetches: Any) -> Any:
        import tensorflow as tf
        v1 = tf.compat.v1
        meta = v1.RunMetadata()
        t0 = time.monotonic()
        out = sess.run(fetches, options=v1.RunOptions(trace_level=v1.RunOptions.FULL_TRACE), run_metadata=meta)
        self.walls.append(time.monotonic() - t0)
        for dev in meta.step_stats.dev_stats:
            job = 'ps' if '/job:ps' in dev.device else 'worker'
            for node in dev.node_stats:
                label = node.timeline_label
                if node.node_name == 'RecvTensor':     # '[3.4MB] [9.3Gb/s] edge_28_... from A to B'
                    kind = 'transfer in'
                    m = re.match(r'\[([\d.]+)([KMG]?i?B)\]', label)
                    size, unit = m.groups() if m else ('0', 'B')
                    self.bytes[job] = self.bytes.get(job, 0.0) + float(size) * self.UNITS.get(unit, 1)
                else:                                   # '[mklcpu 2.2MB 2.2MB] name = Op(inputs)'
                    op = label.split('(')[0].split(' = ')[-1].strip()
                    kind = next((k for k, ops in self.KINDS if any(o in op for o in ops)), 'compute')
                    if 'ExponentialMovingAverage' in node.node_name:
                        kind = 'moving averages'
                key = f'{job} {kind}'
                self.by[key] = self.by.get(key, 0.0) + node.all_end_rel_micros / 1e6
        return out

    def _end_python(self) -> None:
        """Stop the Python profile, if it runs, and sum it up."""
        if self.python is None or self.python_report is not None:
            return
        self.python.disable()
        elapsed = time.monotonic() - self.python_t0
        import pstats
        # Stats fills `stats` when it loads a profile; typeshed does not declare it
        stats = pstats.Stats(self.python).stats     # type: ignore[attr-defined]
        in_tf = sum(row[2] for (_, _, name), row in stats.items() if 'TF_SessionRun_wrapper' in name)
        n = self.python_steps
        self.python_report = {'steps': n, 'loop_s_per_step': elapsed / n, 'in_tf_run_s_per_step': in_tf / n,
                              'python_s_per_step': (elapsed - in_tf) / n}

    def write(self) -> None:
        self._end_python()      # the run may end before its COUNT steps
        n = max(1, len(self.walls))
        report = {'steps': len(self.walls), 'wall_s_per_step': sum(self.walls) / n,
                  'op_s_per_step': {k: v / n for k, v in sorted(self.by.items(), key=lambda kv: -kv[1])},
                  'bytes_in_per_step': {k: v / n for k, v in self.bytes.items()},
                  'python': self.python_report}
        with open(self.path, 'w') as f:
            f.write(runjson.dumps(report, indent=1))
