"""Render a spec as a JobSet (jobset.x-k8s.io/v1alpha2): `launch render SPEC --format jobset`.

JobSet is the Kubernetes SIG API for a group of Jobs run and restarted as one, and what Kubeflow
Trainer v2 itself builds on; a cluster set up for training today has it, while the TFJob of
launch/render/tfjob.py needs the retired Training Operator v1. Nobody sets TF_CONFIG here: every pod runs
`python -m cluster.task --jobset`, which works out its task and the whole cluster from its JobSet
labels and a few rendered variables (cluster/env/jobset.py), as `--slurm` does from Slurm's
environment. Pure: a spec in, a dict (`jobset`) or YAML text (`render`) out.

Choices, and why:
- One replicated job per tfcluster job, `ps` and `worker`, each a single Indexed Job of N pods
  (replicas 1, parallelism = completions = N), not N one-pod Jobs: Kubeflow Trainer v2 can only
  build that shape (it pins replicas to 1, kubeflow/trainer#2318), so launch/render/trainjob.py and this
  module share one layout and cluster/env/jobset.py one way to read it; a task's index is then
  Kubernetes' own JOB_COMPLETION_INDEX, and its DNS name `<name>-<rjob>-0-<index>.<name>`.
- backoffLimit 0 and restartPolicy Never: a failed task fails its Job at once, and JobSet's
  failurePolicy restarts the whole set, the all-or-nothing restart tfcluster does itself (a ps
  restarted alone would come back without the variables, a worker alone into a session that
  has lost it). maxRestarts is supervise.max_restarts for `on-failure`, 0 for `never` (the first
  failure fails the JobSet); restartStrategy BlockingRecreate, so that every old pod is gone
  before the new set starts: a new task must not reach an old one under the same DNS name, nor
  the old chief write the checkpoint the new one restores.
- successPolicy: operator All on the worker job. The run is done when every worker is (the chief
  has saved); the JobSet controller then deletes the Jobs still active, the ps among them. The
  ps end by themselves anyway once every worker reported done.
- network.enableDNSHostnames true (JobSet's default, written out because the layout relies on it);
  publishNotReadyAddresses stays at its default, true: the tasks have no readiness probe, and
  the workers must reach a ps as soon as it serves.
- train_dir: an emptyDir on each worker, or with `--pvc` that PersistentVolumeClaim. A JobSet
  restart recreates the pods, so an emptyDir does not survive it: without a claim a restart
  starts again from step 0 (the header and README say so).
- GPUs: a worker asks for as many nvidia.com/gpu as train.devices lists gpu:N towers; a ps none.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Any

from cluster.env import jobset as jobset_env
from cluster.spec import ClusterSpec
from launch.render import k8s
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
    job: str            # ps | worker
    rjob: str
    container: str
    count: int


def roles(spec: ClusterSpec, worker_rjob: str = 'worker', worker_container: str = CONTAINER) -> tuple[Role, Role]:
    return (Role('ps', 'ps', CONTAINER, spec.num_ps),
            Role('worker', worker_rjob, worker_container, spec.num_workers))


def name_limit(both: tuple[Role, Role]) -> tuple[int, str]:
    """How long the JobSet's name may be, and the longest pod name that decides it: JobSet's
    webhook requires `<name>-<rjob>-<jobIndex>-<podIndex>` plus the pod's random suffix to be a
    DNS-1035 label (the hostname, without the suffix, then is one too)."""
    longest = max(both, key=lambda r: len(f'-{r.rjob}-0-{r.count - 1}'))
    suffix = f'-{longest.rjob}-0-{longest.count - 1}{POD_SUFFIX}'
    return k8s.MAX_LABEL - len(suffix), f'JobSet names its pods NAME{suffix}'


def layout_env(both: tuple[Role, Role]) -> dict[str, str]:
    """The rendered half of what cluster/env/jobset.py reads: the cluster's shape and port."""
    ps, worker = both
    return {jobset_env.PS_JOB_ENV: ps.rjob, jobset_env.NUM_PS_ENV: str(ps.count),
            jobset_env.WORKER_JOB_ENV: worker.rjob, jobset_env.NUM_WORKERS_ENV: str(worker.count),
            jobset_env.PORT_ENV: str(PORT)}


def _label_ref(name: str, label: str) -> dict:
    return {'name': name, 'valueFrom': {'fieldRef': {'fieldPath': f"metadata.labels['{label}']"}}}


def pod_env(spec: ClusterSpec, role: Role, both: tuple[Role, Role]) -> list[dict]:
    """The container's environment: the pod's JobSet labels through the downward API, the
    layout, then the spec's `env:` for this job (which must not set any of the former)."""
    own = spec.task_env(role.job)
    taken = sorted(set(own) & set(jobset_env.VARIABLES))
    if taken:
        raise spec.error(f'env.{taken[0]}', f'{taken[0]} cannot be set in a spec rendered for JobSet: '
                                            'cluster.task --jobset reads it to find its place')
    return [_label_ref(jobset_env.NAME_ENV, jobset_env.JOBSET_NAME_LABEL),
            _label_ref(jobset_env.REPLICATED_JOB_ENV, jobset_env.REPLICATED_JOB_LABEL),
            *k8s.env_list(layout_env(both)), *k8s.env_list(own)]


def replicated_job(spec: ClusterSpec, role: Role, both: tuple[Role, Role], image: str, claim: str | None,
                   job_labels: dict | None = None) -> dict:
    container: dict[str, Any] = {'name': role.container, 'image': image, 'command': list(k8s.COMMAND),
                 'args': ['--jobset', *k8s.train_args(spec)],
                 'ports': [{'name': PORT_NAME, 'containerPort': PORT, 'protocol': 'TCP'}],
                 'env': pod_env(spec, role, both)}
    pod: dict = {'restartPolicy': 'Never', 'containers': [container]}
    if role.job == 'worker':
        resources = k8s.gpu_resources(spec)
        if resources:
            container['resources'] = resources
        container['volumeMounts'] = [k8s.train_dir_mount(spec)]
        pod['volumes'] = [k8s.train_dir_volume(claim)]
    template: dict = {'metadata': {'labels': dict(job_labels)}} if job_labels else {}
    template['spec'] = {'completionMode': 'Indexed', 'completions': role.count, 'parallelism': role.count,
                        'backoffLimit': 0, 'template': {'spec': pod}}
    return {'name': role.rjob, 'replicas': 1, 'template': template}


def set_spec(spec: ClusterSpec, both: tuple[Role, Role], image: str, claim: str | None,
             worker_job_labels: dict | None = None) -> dict:
    """A JobSet's spec (also the template of launch/render/trainjob.py's runtime)."""
    failure: dict = {'maxRestarts': spec.supervise.max_restarts if spec.supervise.restart == 'on-failure' else 0}
    if failure['maxRestarts']:
        failure['restartStrategy'] = 'BlockingRecreate'
    ps, worker = both
    return {'network': {'enableDNSHostnames': True},
            'successPolicy': {'operator': 'All', 'targetReplicatedJobs': [worker.rjob]},
            'failurePolicy': failure,
            'replicatedJobs': [replicated_job(spec, ps, both, image, claim),
                               replicated_job(spec, worker, both, image, claim, worker_job_labels)]}


def metadata(spec: ClusterSpec, name: str | None, namespace: str | None, both: tuple[Role, Role],
             kind: str) -> dict:
    limit, derived = name_limit(both)
    out = {'name': k8s.object_name(spec, name, limit, kind, derived)}
    checked = k8s.check_namespace(namespace)
    if checked is not None:
        out['namespace'] = checked
    return out


def jobset(spec: ClusterSpec, name: str | None = None, image: str | None = None, namespace: str | None = None,
           pvc: str | None = None) -> dict:
    """The JobSet as a dict, in the field names of jobset.x-k8s.io/v1alpha2."""
    k8s.check_train_dir(spec)
    both = roles(spec)
    meta = metadata(spec, name, namespace, both, KIND)
    return {'apiVersion': API_VERSION, 'kind': KIND, 'metadata': meta,
            'spec': set_spec(spec, both, k8s.check_image(image), k8s.check_claim(pvc))}


def worker_place(name: str, both: tuple[Role, Role]) -> jobset_env.Place:
    """What worker 1 (else worker 0) computes in its pod: the environment JobSet gives it, put
    through the very function cluster.task --jobset calls."""
    worker = both[1]
    env = {jobset_env.NAME_ENV: name, jobset_env.REPLICATED_JOB_ENV: worker.rjob,
           jobset_env.INDEX_ENV: str(min(1, worker.count - 1)), **layout_env(both)}
    return jobset_env.place(env)


def layout_lines(name: str, both: tuple[Role, Role]) -> list[str]:
    place = worker_place(name, both)
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
    return k8s.wrap(f'Restarts: a failed task fails its Job (backoffLimit 0) and JobSet recreates the whole set, '
                    f'at most {spec.supervise.max_restarts} time(s) (failurePolicy.maxRestarts, BlockingRecreate); '
                    f'the new chief {resume}.')


def body_lines(spec: ClusterSpec, name: str, both: tuple[Role, Role], claim: str | None, image: str,
               unused: list[str]) -> list[str]:
    """The header after its first paragraph and commands, the same for a JobSet and a TrainJob."""
    return [
        *layout_lines(name, both),
        *k8s.wrap(f'The run succeeds once the {both[1].rjob} job has completed (successPolicy); JobSet then ends '
                  'the ps.'),
        *restart_lines(spec, claim),
        '',
        *k8s.train_dir_lines(spec, claim, restart_keeps_pods=False),
        *k8s.user_lines(spec),
        '',
        *k8s.image_lines(image),
        '',
        f'The spec\'s {" and ".join(["host:port addresses", *unused])} are not used: JobSet places and names the '
        'pods.',
    ]


def chief_selector(name: str, worker: Role) -> str:
    """The labels of worker 0's pod, for `kubectl logs -l` (its name has a random suffix)."""
    return (f'{jobset_env.JOBSET_NAME_LABEL}={name},{jobset_env.REPLICATED_JOB_LABEL}={worker.rjob},'
            f'{COMPLETION_INDEX_LABEL}=0')


def header(spec: ClusterSpec, obj: dict, claim: str | None, unused: list[str]) -> str:
    name = obj['metadata']['name']
    both = roles(spec)
    ps, worker = both
    ns = f' -n {obj["metadata"]["namespace"]}' if 'namespace' in obj['metadata'] else ''
    image = obj['spec']['replicatedJobs'][1]['template']['spec']['template']['spec']['containers'][0]['image']
    lines = [
        *k8s.wrap(f'A JobSet rendered by `launch render --format jobset` from {k8s.source_name(spec)}: replicated '
                  f'jobs {ps.rjob} ({ps.count} pod(s)) and {worker.rjob} ({worker.count} pod(s)), each pod running '
                  '`python -m cluster.task --jobset`; worker 0 is the chief. Needs the JobSet controller '
                  '(kubernetes-sigs/jobset), no Kubeflow.'),
        '',
        f'  start:   kubectl apply{ns} -f <this file>',
        f'  follow:  kubectl logs{ns} -f -l {chief_selector(name, worker)}',
        f'  state:   kubectl get{ns} jobset {name}',
        f'  remove:  kubectl delete{ns} jobset {name}',
        '',
        *body_lines(spec, name, both, claim, image, unused),
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
