"""The rehearsal's stand-in task (`launch up SPEC --rehearse`): a light process that plays a real
task's part without TensorFlow, so a big spec can be tried on its real hosts before spending
GPU hours, and a thousand tasks fit on one machine (Kubernetes' hollow nodes play this part).

- `python -m cluster.rehearsal` takes a task's own command line (cluster/runtime/contract.py
  `parse_task_argv`; `argv.py` turns a task's argv into the stand-in's);
- `standin.py`: binds the task's port, says the task's messages (serving or started, progress,
  checkpoints, finished) at a steady rate and ends at train.steps as the real task would;
- `wire.py`: the stand-in's port on one selector loop (gRPC's readiness check sees it READY; the
  stand-ins' own echo, bounded blob and done lines); `probe.py`: every peer reached and timed at
  once from one selector;
- `messages.py`: `Links`, what a stand-in found of the peers the real task must reach, as one
  more task->launcher record.
"""
