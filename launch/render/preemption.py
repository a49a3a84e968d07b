"""What every render writes for preemption notices (#41, docs/preemption.md): the grace a
scheduler gives a task between its SIGTERM and its SIGKILL, and which failures are preemptions.

A task that gets a SIGTERM the launcher did not mark has `supervise.preemption_grace` seconds to
have its checkpoint saved and exit EXIT_PREEMPTED (cluster/runtime/contract.py). A scheduler must
therefore wait at least that long before its SIGKILL: NOTICE_MARGIN_SECS more covers the task's
own start of the save and Python's exit. With a grace of 0 such a SIGTERM is a fault as before,
and no render writes any of this.

Pure: a spec in, numbers, dicts and comment lines out.
"""
from __future__ import annotations

import math

from cluster.runtime import rundir
from cluster.runtime.contract import EXIT_PREEMPTED
from cluster.spec import ClusterSpec

NOTICE_MARGIN_SECS = 15
DISRUPTION_CONDITION = 'DisruptionTarget'   # the pod condition Kubernetes sets on an eviction, preemption or drain
JOB_FAILURE_REASON = 'PodFailurePolicy'     # a Job's failure reason when a podFailurePolicy rule failed it
JOBSET_RULE = 'preempted'                   # the JobSet failurePolicy rule's name
# The launcher's stop mark for the whole run (cluster/runtime/rundir.py stop marks): `launch up
# --backend slurm` writes it before its scancel, so the batch script's trap knows its own stop.
STOPS_DIR, ALL_MARK = rundir.STOPS_DIR, rundir.STOP_ALL


def grace(spec: ClusterSpec) -> float:
    return spec.supervise.preemption_grace


def kill_after(spec: ClusterSpec) -> int | None:
    """Seconds from the notice to the scheduler's SIGKILL: the grace, rounded up, plus the margin;
    None with a grace of 0 (nothing to render)."""
    return math.ceil(grace(spec)) + NOTICE_MARGIN_SECS if grace(spec) > 0 else None


def restarts(spec: ClusterSpec) -> bool:
    """Whether a preempted run is to be restarted by the scheduler (requeued, recreated): only
    with notices on and `supervise.restart: on-failure`, as the launcher does."""
    return grace(spec) > 0 and spec.supervise.restart == 'on-failure'


def pod_failure_policy(container: str, ignore: bool) -> dict:
    """A Job template's podFailurePolicy: a pod that exited EXIT_PREEMPTED, or that Kubernetes
    itself marked as disrupted (its node drained or preempted), either fails its Job at once
    (FailJob: the JobSet rule then recreates the set without counting it), or, `ignore`, is
    replaced under the same index without counting against the Job's backoffLimit (a coordinator
    run's chief, worker or evaluator, which ParameterServerStrategy takes back alone)."""
    action = 'Ignore' if ignore else 'FailJob'
    return {'rules': [
        {'action': action, 'onExitCodes': {'containerName': container, 'operator': 'In', 'values': [EXIT_PREEMPTED]}},
        {'action': action, 'onPodConditions': [{'type': DISRUPTION_CONDITION, 'status': 'True'}]},
    ]}


def jobset_rule() -> dict:
    """The JobSet failurePolicy rule that recreates the set after a Job failed by its
    podFailurePolicy (a preemption), without counting it against maxRestarts."""
    return {'name': JOBSET_RULE, 'action': 'RestartJobSetAndIgnoreMaxRestarts',
            'onJobFailureReasons': [JOB_FAILURE_REASON]}


def k8s_text(spec: ClusterSpec, alone: bool) -> str:
    """The header's "Preemption" paragraph of a JobSet or TrainJob (`alone`: a coordinator run,
    whose chief, workers and evaluator are replaced alone)."""
    seconds = kill_after(spec)
    if seconds is None:
        return ''
    text = (f'Preemption (supervise.preemption_grace {grace(spec):g}s): every pod has terminationGracePeriodSeconds '
            f'{seconds}, so a task that gets SIGTERM (its node drained or preempted, the pod deleted) has the grace to '
            f'have its checkpoint saved and exits {EXIT_PREEMPTED}.')
    if not restarts(spec):
        return text + ' supervise.restart is never: a preempted task fails the JobSet.'
    pods = ('A preempted chief, worker or evaluator pod is replaced alone (podFailurePolicy Ignore), a preempted ps '
            'fails its Job' if alone else 'A preempted pod fails its Job')
    return (f'{text} {pods} (podFailurePolicy: exit code {EXIT_PREEMPTED} or the {DISRUPTION_CONDITION} condition), '
            f'and JobSet recreates the set without counting it against maxRestarts (failurePolicy rule '
            f'{JOBSET_RULE}, RestartJobSetAndIgnoreMaxRestarts; Kubernetes 1.26+, JobSet 0.6+).')


def tfjob_text(spec: ClusterSpec) -> str:
    """The TFJob header's "Preemption" paragraph."""
    seconds = kill_after(spec)
    if seconds is None:
        return ''
    text = (f'Preemption (supervise.preemption_grace {grace(spec):g}s): every pod has terminationGracePeriodSeconds '
            f'{seconds}, so a task that gets SIGTERM has the grace to have its checkpoint saved and exits '
            f'{EXIT_PREEMPTED}.')
    if not restarts(spec):
        return text + ' supervise.restart is never: a preempted task fails the job.'
    return (f'{text} OnFailure restarts such a container in place, but the operator counts it against '
            'runPolicy.backoffLimit, and a node preemption that deletes the pod may still fail the TFJob '
            '(kubeflow/trainer#999): render --format jobset for restarts that do not count.')
