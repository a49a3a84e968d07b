"""Render a spec as a Kubeflow TFJob (kubeflow.org/v1): `launch render SPEC --format tfjob`.

Pure: a spec in, a dict (`tfjob`) or YAML text (`render`) out; nothing is started or checked
against a cluster. The training operator creates one pod per task and sets TF_CONFIG in each
(cluster and task), which is exactly what `python -m cluster.task` reads when it is given no
--job/--index; the train settings travel as `--set train.KEY=VALUE` arguments, so a pod needs no
spec file. The spec's host:port addresses, `hosts` and `isolation` have no meaning there (the
operator names every task `<job>-<type>-<index>:2222`) and are left out, not refused (a warning
says so). The TFJob API belongs to the Training Operator v1, which Kubeflow Trainer v2 replaced:
launch/render/jobset.py renders the same cluster for plain JobSet, what a new cluster has. What the
Kubernetes formats share is in launch/render/k8s.py.

Choices, and why:
- restartPolicy: `on-failure` is OnFailure, with runPolicy.backoffLimit = supervise.max_restarts (the
  operator sums container restarts over the job's pods, like the launcher's per-run budget); `never`
  is Never. Not ExitCode: it treats exit codes 1-127 as permanent, and 1 is what cluster.task exits
  with when it loses a peer, the very failure a restart mends.
- cleanPodPolicy Running: the job has succeeded once worker 0 (the chief of a TF1 spec, which has
  no Chief replica) has, but ps tasks end only when every worker reported done, and a late worker may still be saving;
  those pods go, while finished ones stay so that `kubectl logs` still shows them.
- Workers mount an emptyDir at their train_dir, so the chief's checkpoints survive a container
  restart (OnFailure restarts it in place) and the chief resumes from them; `--pvc CLAIM` mounts
  that PersistentVolumeClaim instead, to keep them after the job.
- GPUs: a worker asks for as many `nvidia.com/gpu` as train.devices lists gpu:N entries (cluster.task
  numbers them from 0 among the GPUs it sees). ps tasks keep the variables in host memory: no GPU.
- A coordinator run (a `chief`, TF2 ParameterServerStrategy) adds the replica types `Chief` and
  `Evaluator`, which the operator knows: its TF_CONFIG then names the chief, ps and workers (never
  the evaluator: the operator leaves it out of the cluster, as PSS needs), and with a Chief the
  job succeeds when the Chief does (TFJob's default successPolicy, written nowhere), after which
  cleanPodPolicy Running removes the ps, workers and evaluator, which never end by themselves.
  Only the Evaluator's pod is told train.evaluator: the others' TF_CONFIG has no evaluator, and
  the spec they read refuses the setting without one. The train_dir is on the chief and the
  evaluator (the workers only serve; the evaluator needs --pvc to see the chief's checkpoints),
  no GPU for either, and every container has GRPC_FAIL_FAST=use_caller and TF_USE_LEGACY_KERAS=1.
  OnFailure restarts a container in place, at its address: PSS takes a worker back, a chief
  resumes from the emptyDir its pod kept.
- Preemption (supervise.preemption_grace > 0, launch/render/preemption.py): every pod gets
  terminationGracePeriodSeconds grace + 15 s, for the checkpoint a SIGTERMed task has saved before
  it exits EXIT_PREEMPTED (200). The restart policy stays OnFailure (a preempted container restarts
  in place, counted against backoffLimit); TFJob has no podFailurePolicy, and a node preemption
  may fail the TFJob (kubeflow/trainer#999): the header says so and points to --format jobset.
"""
from __future__ import annotations

from typing import Any

from cluster.spec import ClusterSpec
from launch.render import k8s, preemption
from launch.render.options import RenderOptions

API_VERSION = 'kubeflow.org/v1'
KIND = 'TFJob'
CONTAINER = 'tensorflow'        # the operator sets TF_CONFIG in (and only knows) the container of this name
PORT, PORT_NAME = 2222, 'tfjob-port'    # the operator's default; TF_CONFIG names every task at this port
# TFJob replica type, tfcluster job, in the spec's order of jobs (a TF1 spec has PS and Worker)
REPLICAS = (('Chief', 'chief'), ('PS', 'ps'), ('Worker', 'worker'), ('Evaluator', 'evaluator'))
RESTART_POLICY = {'never': 'Never', 'on-failure': 'OnFailure'}
CLEAN_POD_POLICY = 'Running'


def replicas(spec: ClusterSpec) -> tuple[tuple[str, str, int], ...]:
    """(replica type, job, count) of every job the spec has, in REPLICAS' order."""
    return tuple((kind, job, len(spec.job_tasks(job))) for kind, job in REPLICAS if spec.job_tasks(job))


def longest_pod(spec: ClusterSpec) -> str:
    """The longest `-<type>-<index>` the operator appends to the job's name."""
    return max((f'-{kind.lower()}-{count - 1}' for kind, _, count in replicas(spec)), key=len)


def longest_name(spec: ClusterSpec) -> int:
    """How long the job name may be: the operator names each pod and its service
    `<name>-<type>-<index>`, and a service name is a DNS-1035 label of at most 63 characters."""
    return k8s.MAX_LABEL - len(longest_pod(spec))


def job_name(spec: ClusterSpec, name: str | None) -> str:
    return k8s.object_name(spec, name, longest_name(spec), KIND,
                           f'the operator names pods and services NAME{longest_pod(spec)}')


def _replica(spec: ClusterSpec, job: str, count: int, image: str, claim: str | None) -> dict:
    # The operator's TF_CONFIG names no evaluator but to the evaluator itself (module doc), so the
    # other pods' spec has none, and train.evaluator there would be a setting for a task that is not.
    leave_out = () if job == 'evaluator' else ('evaluator',)
    container: dict[str, Any] = {'name': CONTAINER, 'image': image, 'command': list(k8s.COMMAND),
                                 'args': k8s.train_args(spec, leave_out),
                 'ports': [{'name': PORT_NAME, 'containerPort': PORT}]}
    env = k8s.container_env(spec, job)
    if env:
        container['env'] = k8s.env_list(env)
    pod: dict = {'containers': [container]}
    grace = preemption.kill_after(spec)
    if grace is not None:
        pod['terminationGracePeriodSeconds'] = grace
    resources = k8s.gpu_resources(spec) if job == 'worker' else None
    if resources:
        container['resources'] = resources
    if job in k8s.train_dir_jobs(spec):
        container['volumeMounts'] = [k8s.train_dir_mount(spec)]
        pod['volumes'] = [k8s.train_dir_volume(claim)]
    return {'replicas': count, 'restartPolicy': RESTART_POLICY[spec.supervise.restart], 'template': {'spec': pod}}


def tfjob(spec: ClusterSpec, name: str | None = None, image: str | None = None,
          namespace: str | None = None, pvc: str | None = None) -> dict:
    """The TFJob as a dict, in the field names and order of the kubeflow.org/v1 API; `pvc` puts
    the workers' train_dir on that PersistentVolumeClaim instead of an emptyDir."""
    k8s.check_train_dir(spec)
    metadata = {'name': job_name(spec, name)}
    checked = k8s.check_namespace(namespace)
    if checked is not None:
        metadata['namespace'] = checked
    image, claim = k8s.check_image(image), k8s.check_claim(pvc)
    run_policy: dict = {'cleanPodPolicy': CLEAN_POD_POLICY}
    if spec.supervise.restart == 'on-failure':
        run_policy['backoffLimit'] = spec.supervise.max_restarts
    return {'apiVersion': API_VERSION, 'kind': KIND, 'metadata': metadata,
            'spec': {'runPolicy': run_policy,
                     'tfReplicaSpecs': {kind: _replica(spec, job, count, image, claim)
                                        for kind, job, count in replicas(spec)}}}


def header(spec: ClusterSpec, job: dict, claim: str | None = None) -> str:
    name = job['metadata']['name']
    image = job['spec']['tfReplicaSpecs']['Worker']['template']['spec']['containers'][0]['image']
    ns = f' -n {job["metadata"]["namespace"]}' if 'namespace' in job['metadata'] else ''
    if spec.supervise.restart == 'on-failure':
        restart = (f'a failed task\'s container is restarted in its pod (OnFailure), at most '
                   f'{spec.supervise.max_restarts} time(s) over the job (runPolicy.backoffLimit)')
    else:
        restart = 'none (restartPolicy Never, as supervise.restart is never): a failed task fails the job'
    pods = ', '.join(f'{count} {job_} pod(s)' for _, job_, count in replicas(spec))
    lead = f'{name}-chief-0' if spec.coordinator else f'{name}-worker-0'
    done = ('The job succeeds when the Chief does; the operator then removes the pods still running (cleanPodPolicy '
            'Running).' if spec.coordinator else '')
    lines = [
        *k8s.wrap(f'A Kubeflow TFJob rendered by `launch render --format tfjob` from {k8s.source_name(spec)}: {pods}, '
                  'each running `python -m cluster.task`, which takes its cluster and task from the TF_CONFIG the '
                  'training operator sets.'),
        *k8s.role_lines(spec),
        *k8s.wrap(done),
        'For a cluster without the Training Operator (v1.9), render --format jobset instead.',
        '',
        f'  start:   kubectl apply{ns} -f <this file>      (needs the Kubeflow training operator)',
        f'  follow:  kubectl logs{ns} -f {lead}',
        f'  remove:  kubectl delete{ns} tfjob {name}',
        '',
        *k8s.image_lines(image),
        '',
        'The spec\'s host:port addresses, hosts, gpus and isolation are not used: the operator gives every',
        f'task a pod and a service, {name}-ps-0:{PORT}, {name}-worker-0:{PORT} and so on.',
        f'Restarts: {restart}.',
        '',
        *([*k8s.wrap(notice), ''] if (notice := preemption.tfjob_text(spec)) else []),
        *k8s.train_dir_lines(spec, claim, restart_keeps_pods=True),
        *k8s.user_lines(spec),
    ]
    return k8s.comment(lines)


def render(spec: ClusterSpec, opts: RenderOptions | None) -> str:
    """The TFJob as YAML for `kubectl apply -f`, with a comment header saying how to run it."""
    job, claim, _ = k8s.build(spec, opts, tfjob, KIND)
    return header(spec, job, claim) + k8s.dump(job)
