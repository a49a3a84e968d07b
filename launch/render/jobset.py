"""Render a spec as a JobSet (jobset.x-k8s.io/v1alpha2): `launch render SPEC --format jobset`.

JobSet is the Kubernetes SIG API for a group of Jobs run and restarted as one, and what Kubeflow
Trainer v2 itself builds on; a cluster set up for training today has it, while the TFJob of
launch/render/tfjob.py needs the retired Training Operator v1. Nobody sets TF_CONFIG here: every pod runs
`python -m cluster.task --jobset`, which works out its task and the whole cluster from its JobSet
labels and a few rendered variables (cluster/env/jobset.py), as `--slurm` does from Slurm's
environment. Pure: a spec in, a dict (`jobset`) or YAML text (`render`) out.

Choices, and why:
- One replicated job per tfcluster job, `ps` and `worker` (and a coordinator run's `chief` and
  `evaluator`, in the order of cluster/env/slurm.py's ranks: ps, chief, evaluator, worker), each
  a single Indexed Job of N pods (replicas 1, parallelism = completions = N), not N one-pod
  Jobs: Kubeflow Trainer v2 can only build that shape (it pins replicas to 1,
  kubeflow/trainer#2318), so launch/render/trainjob.py and this module share one layout and
  cluster/env/jobset.py one way to read it; a task's index is then Kubernetes' own
  JOB_COMPLETION_INDEX, and its DNS name `<name>-<rjob>-0-<index>.<name>`.
- backoffLimit 0 (but see coordinator runs below) and restartPolicy Never: a failed task fails its
  Job at once, and JobSet's failurePolicy restarts the whole set, the all-or-nothing restart
  tfcluster does itself (a ps restarted alone would come back without the variables, a worker alone
  into a session that has lost it). maxRestarts is supervise.max_restarts for `on-failure`, 0 for
  `never` (the first failure fails the JobSet); restartStrategy BlockingRecreate, so that every old
  pod is gone before the new set starts: a new task must not reach an old one under the same DNS
  name, nor the old chief write the checkpoint the new one restores.
- successPolicy (TF1): operator All on the worker job. The run is done when every worker is (the
  chief has saved); the JobSet controller then deletes the Jobs still active, the ps among them. The
  ps end by themselves anyway once every worker reported done.
- A coordinator run (a `chief`, TF2 ParameterServerStrategy) differs in three ways. Success: All
  on the chief job alone, as the run is done when the chief's program is; JobSet then deletes the
  ps, workers and evaluator, which never end by themselves (so an evaluator still busy with the
  last checkpoint is cut short). Failure: PSS takes back a worker that returns at its address and
  a chief restarted alone resumes from the checkpoint, so with `on-failure` the chief, worker
  and evaluator Jobs get backoffLimit max_restarts (the Job controller replaces a failed pod under
  the same index, hence the same hostname) while a ps Job keeps 0: a lost ps takes its variables,
  and the whole set restarts (failurePolicy, as above). train_dir: on the chief and the evaluator,
  not the workers (they only serve); an evaluator needs --pvc to see the chief's checkpoints.
  Every container gets GRPC_FAIL_FAST=use_caller and TF_USE_LEGACY_KERAS=1.
- network.enableDNSHostnames true (JobSet's default, written out because the layout relies on it);
  publishNotReadyAddresses stays at its default, true: the tasks have no readiness probe, and
  the workers must reach a ps as soon as it serves.
- train_dir: an emptyDir on each worker, or with `--pvc` that PersistentVolumeClaim. A JobSet
  restart recreates the pods, so an emptyDir does not survive it: without a claim a restart
  starts again from step 0 (the header and docs/backends/kubernetes.md say so).
- GPUs: a worker asks for as many nvidia.com/gpu as train.devices lists gpu:N towers; a ps, the
  chief and the evaluator none.
- Preemption (supervise.preemption_grace > 0, launch/render/preemption.py): every pod gets
  terminationGracePeriodSeconds grace + 15 s, so a task SIGTERMed by a drain or a deleted pod can
  have its checkpoint saved and exit EXIT_PREEMPTED (200). With `on-failure`, each Job template gets
  a podFailurePolicy on exit code 200 and the DisruptionTarget pod condition: FailJob, which the
  JobSet failurePolicy rule `preempted` (RestartJobSetAndIgnoreMaxRestarts on the PodFailurePolicy
  reason) turns into a restart of the set that maxRestarts does not count; a coordinator run's
  chief, worker and evaluator Jobs Ignore instead (the pod is replaced alone, uncounted). This is
  JobSet's own pattern for host maintenance; podFailurePolicy needs restartPolicy Never, which
  every pod has. A grace of 0 renders none of it.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Any

from cluster.env import jobset as jobset_env
from cluster.env.slurm import RANK_ORDER
from cluster.spec import ClusterSpec
from launch.render import k8s, preemption
from launch.render.options import RenderOptions

log = logging.getLogger(__name__)

API_VERSION = 'jobset.x-k8s.io/v1alpha2'
KIND = 'JobSet'
CONTAINER = 'tfcluster'
PORT, PORT_NAME = 2222, 'grpc'
POD_SUFFIX = '-xxxxx'       # the five random characters the Job controller appends to a pod's name
COMPLETION_INDEX_LABEL = 'batch.kubernetes.io/job-completion-index'     # on pods, Kubernetes 1.28+


@dataclasses.dataclass(frozen=True)
class Role:
    """One tfcluster job as a replicated job: its name there, its container's, how many pods."""
    job: str            # ps | chief | evaluator | worker
    rjob: str
    container: str
    count: int


Layout = tuple[Role, ...]       # every role of a spec, in ORDER
ORDER = RANK_ORDER              # ps, chief, evaluator, worker: as Slurm's ranks (cluster/env/slurm.py)


def roles(spec: ClusterSpec, worker_rjob: str = 'worker', worker_container: str = CONTAINER) -> Layout:
    """The spec's jobs as replicated jobs: ps and worker, and a coordinator run's chief and evaluator."""
    return tuple(Role(job, worker_rjob, worker_container, spec.num_workers) if job == 'worker' else
                 Role(job, job, CONTAINER, len(spec.job_tasks(job))) for job in ORDER if spec.job_tasks(job))


def role_of(layout: Layout, job: str) -> Role:
    return next(r for r in layout if r.job == job)


def lead(spec: ClusterSpec, layout: Layout) -> Role:
    """The role whose end is the run's: the chief of a coordinator run, else the workers."""
    return role_of(layout, 'chief' if spec.coordinator else 'worker')


def name_limit(layout: Layout) -> tuple[int, str]:
    """How long the JobSet's name may be, and the longest pod name that decides it: JobSet's
    webhook requires `<name>-<rjob>-<jobIndex>-<podIndex>` plus the pod's random suffix to be a
    DNS-1035 label (the hostname, without the suffix, then is one too)."""
    longest = max(layout, key=lambda r: len(f'-{r.rjob}-0-{r.count - 1}'))
    suffix = f'-{longest.rjob}-0-{longest.count - 1}{POD_SUFFIX}'
    return k8s.MAX_LABEL - len(suffix), f'JobSet names its pods NAME{suffix}'


def layout_env(layout: Layout) -> dict[str, str]:
    """The rendered half of what cluster/env/jobset.py reads: the cluster's shape and port."""
    ps, worker = role_of(layout, 'ps'), role_of(layout, 'worker')
    out = {jobset_env.PS_JOB_ENV: ps.rjob, jobset_env.NUM_PS_ENV: str(ps.count),
           jobset_env.WORKER_JOB_ENV: worker.rjob, jobset_env.NUM_WORKERS_ENV: str(worker.count)}
    out.update({jobset_env.SINGLE_JOB_ENV[r.job]: r.rjob for r in layout if r.job in jobset_env.SINGLE_JOB_ENV})
    return {**out, jobset_env.PORT_ENV: str(PORT)}


def _label_ref(name: str, label: str) -> dict:
    return {'name': name, 'valueFrom': {'fieldRef': {'fieldPath': f"metadata.labels['{label}']"}}}


def pod_env(spec: ClusterSpec, role: Role, layout: Layout) -> list[dict]:
    """The container's environment: the pod's JobSet labels through the downward API, the
    layout, then its own (k8s.container_env: a coordinator run's, the spec's `env:` for this job,
    which must not set any of the former)."""
    own = k8s.container_env(spec, role.job)
    taken = sorted(set(own) & set(jobset_env.VARIABLES))
    if taken:
        raise spec.error(f'env.{taken[0]}', f'{taken[0]} cannot be set in a spec rendered for JobSet: '
                                            'cluster.task --jobset reads it to find its place')
    return [_label_ref(jobset_env.NAME_ENV, jobset_env.JOBSET_NAME_LABEL),
            _label_ref(jobset_env.REPLICATED_JOB_ENV, jobset_env.REPLICATED_JOB_LABEL),
            *k8s.env_list(layout_env(layout)), *k8s.env_list(own)]


def backoff_limit(spec: ClusterSpec, role: Role) -> int:
    """How many of its pods may fail before its Job does (and JobSet's failurePolicy acts): none,
    but in a coordinator run with restarts, where a chief, worker or evaluator replaced alone (same
    index, same hostname) is what PSS recovers from; a lost ps fails its Job (module doc)."""
    return spec.supervise.max_restarts if alone(spec, role) else 0


def alone(spec: ClusterSpec, role: Role) -> bool:
    """Whether a failed pod of `role` is replaced alone rather than the whole set recreated."""
    return spec.coordinator and spec.supervise.restart == 'on-failure' and role.job != 'ps'


def replicated_job(spec: ClusterSpec, role: Role, layout: Layout, image: str, claim: str | None,
                   job_labels: dict | None = None) -> dict:
    container: dict[str, Any] = {'name': role.container, 'image': image, 'command': list(k8s.COMMAND),
                 'args': ['--jobset', *k8s.train_args(spec)],
                 'ports': [{'name': PORT_NAME, 'containerPort': PORT, 'protocol': 'TCP'}],
                 'env': pod_env(spec, role, layout)}
    pod: dict = {'restartPolicy': 'Never', 'containers': [container]}
    grace = preemption.kill_after(spec)
    if grace is not None:
        pod['terminationGracePeriodSeconds'] = grace
    resources = k8s.gpu_resources(spec) if role.job == 'worker' else None
    if resources:
        container['resources'] = resources
    if role.job in k8s.train_dir_jobs(spec):
        container['volumeMounts'] = [k8s.train_dir_mount(spec)]
        pod['volumes'] = [k8s.train_dir_volume(claim)]
    template: dict = {'metadata': {'labels': dict(job_labels)}} if job_labels else {}
    template['spec'] = {'completionMode': 'Indexed', 'completions': role.count, 'parallelism': role.count,
                        'backoffLimit': backoff_limit(spec, role), 'template': {'spec': pod}}
    if preemption.restarts(spec):       # replaced without counting (module doc); restartPolicy Never, as it needs
        template['spec']['podFailurePolicy'] = preemption.pod_failure_policy(role.container, alone(spec, role))
    return {'name': role.rjob, 'replicas': 1, 'template': template}


def set_spec(spec: ClusterSpec, layout: Layout, image: str, claim: str | None,
             worker_job_labels: dict | None = None) -> dict:
    """A JobSet's spec (also the template of launch/render/trainjob.py's runtime)."""
    failure: dict = {'maxRestarts': spec.supervise.max_restarts if spec.supervise.restart == 'on-failure' else 0}
    if failure['maxRestarts'] or preemption.restarts(spec):
        failure['restartStrategy'] = 'BlockingRecreate'
    if preemption.restarts(spec):
        failure['rules'] = [preemption.jobset_rule()]
    return {'network': {'enableDNSHostnames': True},
            'successPolicy': {'operator': 'All', 'targetReplicatedJobs': [lead(spec, layout).rjob]},
            'failurePolicy': failure,
            'replicatedJobs': [replicated_job(spec, r, layout, image, claim,
                                              worker_job_labels if r.job == 'worker' else None) for r in layout]}


def metadata(spec: ClusterSpec, name: str | None, namespace: str | None, layout: Layout, kind: str) -> dict:
    limit, derived = name_limit(layout)
    out = {'name': k8s.object_name(spec, name, limit, kind, derived)}
    checked = k8s.check_namespace(namespace)
    if checked is not None:
        out['namespace'] = checked
    return out


def jobset(spec: ClusterSpec, name: str | None = None, image: str | None = None, namespace: str | None = None,
           pvc: str | None = None) -> dict:
    """The JobSet as a dict, in the field names of jobset.x-k8s.io/v1alpha2."""
    k8s.check_train_dir(spec)
    layout = roles(spec)
    meta = metadata(spec, name, namespace, layout, KIND)
    return {'apiVersion': API_VERSION, 'kind': KIND, 'metadata': meta,
            'spec': set_spec(spec, layout, k8s.check_image(image), k8s.check_claim(pvc))}


def worker_place(name: str, layout: Layout) -> jobset_env.Place:
    """What worker 1 (else worker 0) computes in its pod: the environment JobSet gives it, put
    through the very function cluster.task --jobset calls."""
    worker = role_of(layout, 'worker')
    env = {jobset_env.NAME_ENV: name, jobset_env.REPLICATED_JOB_ENV: worker.rjob,
           jobset_env.INDEX_ENV: str(min(1, worker.count - 1)), **layout_env(layout)}
    return jobset_env.place(env)


def layout_lines(name: str, layout: Layout) -> list[str]:
    place = worker_place(name, layout)
    return ['Every pod computes the whole cluster from its JobSet labels, JOB_COMPLETION_INDEX and the',
            'TFCLUSTER_JOBSET_* values below (cluster/env/jobset.py); here, with each task\'s DNS name:',
            *(f'  {job}: {", ".join(addresses)}' for job, addresses in place.cluster.items()),
            f'worker {place.index}\'s TF_CONFIG would be: {place.tf_config()}']


def restart_lines(spec: ClusterSpec, claim: str | None) -> list[str]:
    if spec.supervise.restart != 'on-failure':
        return k8s.wrap('Restarts: none (failurePolicy.maxRestarts 0, as supervise.restart is never): a failed '
                        'task fails its Job and the JobSet.')
    resume = 'resumes from the newest checkpoint on the claim' if claim else \
        'would resume from the newest checkpoint, but the emptyDir went with the old pods'
    n = spec.supervise.max_restarts
    if spec.coordinator:
        return k8s.wrap(f'Restarts: a failed chief, worker or evaluator pod is replaced alone under the same name, at '
                        f'most {n} time(s) per Job (backoffLimit): ParameterServerStrategy takes a worker back, and a '
                        f'new chief {resume}. A failed ps fails its Job (backoffLimit 0), and JobSet recreates the '
                        f'whole set, at most {n} time(s) (failurePolicy.maxRestarts, BlockingRecreate).')
    return k8s.wrap(f'Restarts: a failed task fails its Job (backoffLimit 0) and JobSet recreates the whole set, '
                    f'at most {n} time(s) (failurePolicy.maxRestarts, BlockingRecreate); the new chief {resume}.')


def success_lines(spec: ClusterSpec, layout: Layout) -> list[str]:
    if spec.coordinator:
        rest = [r.rjob for r in layout if r.job != 'chief']
        others = ', '.join(rest[:-1]) + ' and ' + rest[-1]
        return k8s.wrap(f'The run succeeds once the {lead(spec, layout).rjob} job has completed (successPolicy): '
                        f'JobSet then ends {others}, which never end by themselves.')
    return k8s.wrap(f'The run succeeds once the {lead(spec, layout).rjob} job has completed (successPolicy); JobSet '
                    'then ends the ps.')


def body_lines(spec: ClusterSpec, name: str, layout: Layout, claim: str | None, image: str,
               unused: list[str]) -> list[str]:
    """The header after its first paragraph and commands, the same for a JobSet and a TrainJob."""
    return [
        *layout_lines(name, layout),
        *success_lines(spec, layout),
        *restart_lines(spec, claim),
        *k8s.wrap(preemption.k8s_text(spec, alone=spec.coordinator)),
        '',
        *k8s.train_dir_lines(spec, claim, restart_keeps_pods=False),
        *k8s.user_lines(spec),
        '',
        *k8s.image_lines(image),
        '',
        f'The spec\'s {" and ".join(["host:port addresses", *unused])} are not used: JobSet places and names the '
        'pods.',
    ]


def chief_selector(name: str, spec: ClusterSpec, layout: Layout) -> str:
    """The labels of the chief's pod (worker 0's in a TF1 run), for `kubectl logs -l` (its name has
    a random suffix)."""
    return (f'{jobset_env.JOBSET_NAME_LABEL}={name},{jobset_env.REPLICATED_JOB_LABEL}={lead(spec, layout).rjob},'
            f'{COMPLETION_INDEX_LABEL}=0')


def jobs_text(layout: Layout) -> str:
    """'ps (1 pod(s)) and worker (2 pod(s))', every role of the layout so."""
    parts = [f'{r.rjob} ({r.count} pod(s))' for r in layout]
    return ', '.join(parts[:-1]) + ' and ' + parts[-1]


def image_of(obj_spec: dict) -> str:
    return obj_spec['replicatedJobs'][0]['template']['spec']['template']['spec']['containers'][0]['image']


def header(spec: ClusterSpec, obj: dict, claim: str | None, unused: list[str]) -> str:
    name = obj['metadata']['name']
    layout = roles(spec)
    ns = f' -n {obj["metadata"]["namespace"]}' if 'namespace' in obj['metadata'] else ''
    lines = [
        *k8s.wrap(f'A JobSet rendered by `launch render --format jobset` from {k8s.source_name(spec)}: replicated '
                  f'jobs {jobs_text(layout)}, each pod running `python -m cluster.task --jobset`. Needs the JobSet '
                  'controller (kubernetes-sigs/jobset), no Kubeflow.'),
        *k8s.role_lines(spec),
        '',
        f'  start:   kubectl apply{ns} -f <this file>',
        f'  follow:  kubectl logs{ns} -f -l {chief_selector(name, spec, layout)}',
        f'  state:   kubectl get{ns} jobset {name}',
        f'  remove:  kubectl delete{ns} jobset {name}',
        '',
        *body_lines(spec, name, layout, claim, image_of(obj['spec']), unused),
    ]
    return k8s.comment(lines)


def warn_restarts(spec: ClusterSpec, claim: str | None) -> None:
    """Restarts without a claim restart from nothing: say so once, on the terminal too."""
    if spec.supervise.restart == 'on-failure' and not claim:
        log.warning('%s: supervise.restart is on-failure but the train_dir is an emptyDir: a restart of the '
                    'set starts again from step 0; render with --pvc CLAIM to resume from the checkpoint', spec.path)


def render(spec: ClusterSpec, opts: RenderOptions | None) -> str:
    """The JobSet as YAML for `kubectl apply -f`, with a comment header saying how to run it."""
    obj, claim, unused = k8s.build(spec, opts, jobset, KIND)
    warn_restarts(spec, claim)
    return header(spec, obj, claim, unused) + k8s.dump(obj)
