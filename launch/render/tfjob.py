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
- cleanPodPolicy Running: the job has succeeded once worker 0 (the chief; there is no Chief replica)
  has, but ps tasks end only when every worker reported done, and a late worker may still be saving;
  those pods go, while finished ones stay so that `kubectl logs` still shows them.
- Workers mount an emptyDir at their train_dir, so the chief's checkpoints survive a container
  restart (OnFailure restarts it in place) and the chief resumes from them; `--pvc CLAIM` mounts
  that PersistentVolumeClaim instead, to keep them after the job.
- GPUs: a worker asks for as many `nvidia.com/gpu` as train.devices lists gpu:N entries (cluster.task
  numbers them from 0 among the GPUs it sees). ps tasks keep the variables in host memory: no GPU.
"""
from __future__ import annotations

from typing import Any

from cluster.spec import ClusterSpec
from launch.render import k8s
from launch.render.options import RenderOptions

API_VERSION = 'kubeflow.org/v1'
KIND = 'TFJob'
CONTAINER = 'tensorflow'        # the operator sets TF_CONFIG in (and only knows) the container of this name
PORT, PORT_NAME = 2222, 'tfjob-port'    # the operator's default; TF_CONFIG names every task at this port
REPLICAS = (('PS', 'ps'), ('Worker', 'worker'))   # TFJob replica type, tfcluster job
RESTART_POLICY = {'never': 'Never', 'on-failure': 'OnFailure'}
CLEAN_POD_POLICY = 'Running'


def longest_name(spec: ClusterSpec) -> int:
    """How long the job name may be: the operator names each pod and its service
    `<name>-<type>-<index>`, and a service name is a DNS-1035 label of at most 63 characters."""
    suffix = max(len(f'-{job}-{spec.num_ps - 1 if job == "ps" else spec.num_workers - 1}') for _, job in REPLICAS)
    return k8s.MAX_LABEL - suffix


def job_name(spec: ClusterSpec, name: str | None) -> str:
    return k8s.object_name(spec, name, longest_name(spec), KIND,
                           f'the operator names pods and services NAME-worker-{spec.num_workers - 1}')


def _replica(spec: ClusterSpec, job: str, image: str, claim: str | None) -> dict:
    container: dict[str, Any] = {'name': CONTAINER, 'image': image, 'command': list(k8s.COMMAND), 'args': k8s.train_args(spec),
                 'ports': [{'name': PORT_NAME, 'containerPort': PORT}]}
    env = spec.task_env(job)
    if env:
        container['env'] = k8s.env_list(env)
    pod: dict = {'containers': [container]}
    if job == 'worker':
        resources = k8s.gpu_resources(spec)
        if resources:
            container['resources'] = resources
        container['volumeMounts'] = [k8s.train_dir_mount(spec)]
        pod['volumes'] = [k8s.train_dir_volume(claim)]
    count = spec.num_ps if job == 'ps' else spec.num_workers
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
                     'tfReplicaSpecs': {kind: _replica(spec, job, image, claim) for kind, job in REPLICAS}}}


def header(spec: ClusterSpec, job: dict, claim: str | None = None) -> str:
    name = job['metadata']['name']
    image = job['spec']['tfReplicaSpecs']['Worker']['template']['spec']['containers'][0]['image']
    ns = f' -n {job["metadata"]["namespace"]}' if 'namespace' in job['metadata'] else ''
    if spec.supervise.restart == 'on-failure':
        restart = (f'a failed task\'s container is restarted in its pod (OnFailure), at most '
                   f'{spec.supervise.max_restarts} time(s) over the job (runPolicy.backoffLimit)')
    else:
        restart = 'none (restartPolicy Never, as supervise.restart is never): a failed task fails the job'
    lines = [
        f'A Kubeflow TFJob rendered by `launch render --format tfjob` from {k8s.source_name(spec)}:',
        f'{spec.num_ps} ps and {spec.num_workers} worker pod(s), each running `python -m cluster.task`, which takes',
        'its cluster and task from the TF_CONFIG the training operator sets; worker 0 is the chief.',
        'For a cluster without the Training Operator (v1.9), render --format jobset instead.',
        '',
        f'  start:   kubectl apply{ns} -f <this file>      (needs the Kubeflow training operator)',
        f'  follow:  kubectl logs{ns} -f {name}-worker-0',
        f'  remove:  kubectl delete{ns} tfjob {name}',
        '',
        *k8s.image_lines(image),
        '',
        'The spec\'s host:port addresses, hosts, gpus and isolation are not used: the operator gives every',
        f'task a pod and a service, {name}-ps-0:{PORT}, {name}-worker-0:{PORT} and so on.',
        f'Restarts: {restart}.',
        '',
        *k8s.train_dir_lines(spec, claim, restart_keeps_pods=True),
        *k8s.user_lines(spec),
    ]
    return k8s.comment(lines)


def render(spec: ClusterSpec, opts: RenderOptions | None) -> str:
    """The TFJob as YAML for `kubectl apply -f`, with a comment header saying how to run it."""
    job, claim, _ = k8s.build(spec, opts, tfjob, KIND)
    return header(spec, job, claim) + k8s.dump(job)
