"""Render a spec as a Kubeflow TFJob (kubeflow.org/v1): `launch render SPEC --format tfjob`.

Pure: a spec in, a dict (`tfjob`) or YAML text (`render`) out; nothing is started or checked
against a cluster. The training operator creates one pod per task and sets TF_CONFIG in each
(cluster and task), which is exactly what `python -m cluster.task` reads when it is given no
--job/--index; the train settings travel as `--set train.KEY=VALUE` arguments, so a pod needs no
spec file. The spec's host:port addresses, `hosts` and `isolation` have no meaning there (the
operator names every task `<job>-<type>-<index>:2222`) and are left out, not refused.

Choices, and why:
- restartPolicy: `on-failure` is OnFailure, with runPolicy.backoffLimit = supervise.max_restarts (the
  operator sums container restarts over the job's pods, like the launcher's per-run budget); `never`
  is Never. Not ExitCode: it treats exit codes 1-127 as permanent, and 1 is what cluster.task exits
  with when it loses a peer, the very failure a restart mends.
- cleanPodPolicy Running: the job has succeeded once worker 0 (the chief; there is no Chief replica)
  has, but ps tasks end only when every worker reported done, and a late worker may still be saving;
  those pods go, while finished ones stay so that `kubectl logs` still shows them.
- Workers mount an emptyDir at their train_dir, so the chief's checkpoints survive a container
  restart (OnFailure restarts it in place) and the chief resumes from them; the header says how to
  swap in a PersistentVolumeClaim to keep them after the job.
- GPUs: a worker asks for as many `nvidia.com/gpu` as train.devices lists gpu:N entries (cluster.task
  numbers them from 0 among the GPUs it sees). ps tasks keep the variables in host memory: no GPU.
"""
from __future__ import annotations

import dataclasses
import json
import os
import posixpath
import re

import yaml

from cluster.spec import ClusterSpec, TrainConfig
from launch.compose_file import DEFAULT_IMAGE
from launch.gpus import scheduler_request
from launch.errors import UsageError
from launch.plan import COMPOSE_WORKDIR

API_VERSION = 'kubeflow.org/v1'
KIND = 'TFJob'
CONTAINER = 'tensorflow'        # the operator sets TF_CONFIG in (and only knows) the container of this name
PORT, PORT_NAME = 2222, 'tfjob-port'    # the operator's default; TF_CONFIG names every task at this port
COMMAND = ('python', '-m', 'cluster.task')   # the image's entry point, given so its CMD (--help) never runs
REPLICAS = (('PS', 'ps'), ('Worker', 'worker'))   # TFJob replica type, tfcluster job
RESTART_POLICY = {'never': 'Never', 'on-failure': 'OnFailure'}
CLEAN_POD_POLICY = 'Running'
GPU_RESOURCE = 'nvidia.com/gpu'
TRAIN_DIR_VOLUME = 'train-dir'
MAX_LABEL = 63
DNS1035 = re.compile(r'[a-z]([-a-z0-9]*[a-z0-9])?')
DNS1123 = re.compile(r'[a-z0-9]([-a-z0-9]*[a-z0-9])?')


def longest_name(spec: ClusterSpec) -> int:
    """How long the job name may be: the operator names each pod and its service
    `<name>-<type>-<index>`, and a service name is a DNS-1035 label of at most 63 characters."""
    suffix = max(len(f'-{job}-{spec.num_ps - 1 if job == "ps" else spec.num_workers - 1}') for _, job in REPLICAS)
    return MAX_LABEL - suffix


def default_name(spec: ClusterSpec) -> str:
    """The spec file's name as a DNS-1035 label: specs/Local_2.yaml -> local-2."""
    stem = os.path.splitext(os.path.basename(spec.path))[0].lower()
    name = re.sub(r'[^a-z0-9]+', '-', stem).strip('-')
    if not name[:1].isalpha():
        name = f'tf-{name}'.rstrip('-')
    return name[:longest_name(spec)].rstrip('-')


def job_name(spec: ClusterSpec, name: str | None) -> str:
    if name is None:
        return default_name(spec)
    limit = longest_name(spec)
    if not DNS1035.fullmatch(name) or len(name) > limit:
        raise UsageError(f'--name {name!r}: a TFJob name must be a DNS-1035 label: lower-case letters, digits '
                           f'and "-", starting with a letter and ending with a letter or digit, at most {limit} '
                           f'characters here (the operator names pods and services NAME-worker-{spec.num_workers - 1}, '
                           f'at most {MAX_LABEL})')
    return name


def check_namespace(namespace: str | None) -> str | None:
    if namespace is not None and (not DNS1123.fullmatch(namespace) or len(namespace) > MAX_LABEL):
        raise UsageError(f'--namespace {namespace!r}: a Kubernetes namespace is a DNS-1123 label: lower-case '
                           f'letters, digits and "-", starting and ending with a letter or digit, at most '
                           f'{MAX_LABEL} characters')
    return namespace


def check_image(image: str | None) -> str:
    if image is None:
        return DEFAULT_IMAGE
    if not image or any(c.isspace() for c in image):
        raise UsageError(f'--image {image!r}: expected an image reference like registry.example/tfcluster:1.0')
    return image


def set_value(value) -> str:
    """`value` as the YAML text after `--set train.KEY=`, such that cluster.task reads back the very
    same value: plain where YAML keeps it as it is, quoted where it would read another type (a path
    `2024-01-01` is a date, `on` a boolean), floats as YAML 1.1 floats (1.0e-05, not 1e-05)."""
    wanted = list(value) if isinstance(value, tuple) else value
    if isinstance(wanted, str):
        candidates = [wanted, json.dumps(wanted, ensure_ascii=False)]
    else:
        flow = yaml.safe_dump(wanted, default_flow_style=True, width=1 << 20).strip()
        candidates = [flow.removesuffix('\n...').strip()]
    for text in candidates:
        try:
            if text.strip() and '\n' not in text and yaml.safe_load(text) == wanted:
                return text
        except yaml.YAMLError:
            pass
    raise ValueError(f'cannot write {value!r} as a one-line YAML value')


def train_args(spec: ClusterSpec) -> list[str]:
    """`--set train.KEY=VALUE` for every train setting that differs from cluster.task's default."""
    out = []
    for f in dataclasses.fields(TrainConfig):
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        value = getattr(spec.train, f.name)
        if value == default and type(value) is type(default):
            continue
        try:
            out += ['--set', f'train.{f.name}={set_value(value)}']
        except ValueError as e:
            raise spec.error(f'train.{f.name}', f'cannot be passed to the pods: {e}') from None
    return out


def in_pod(path: str) -> str:
    """Where a spec path is inside a pod: relative ones are below the image's WORKDIR."""
    return posixpath.normpath(posixpath.join(COMPOSE_WORKDIR, path))


def _replica(spec: ClusterSpec, job: str, image: str) -> dict:
    container = {'name': CONTAINER, 'image': image, 'command': list(COMMAND), 'args': train_args(spec),
                 'ports': [{'name': PORT_NAME, 'containerPort': PORT}]}
    env = spec.task_env(job)
    if env:
        container['env'] = [{'name': k, 'value': v} for k, v in env.items()]
    pod: dict = {'containers': [container]}
    if job == 'worker':
        gpus = scheduler_request(spec)
        if gpus:
            container['resources'] = {'limits': {GPU_RESOURCE: str(gpus)}}
        container['volumeMounts'] = [{'name': TRAIN_DIR_VOLUME, 'mountPath': in_pod(spec.train.train_dir)}]
        pod['volumes'] = [{'name': TRAIN_DIR_VOLUME, 'emptyDir': {}}]
    count = spec.num_ps if job == 'ps' else spec.num_workers
    return {'replicas': count, 'restartPolicy': RESTART_POLICY[spec.supervise.restart], 'template': {'spec': pod}}


def tfjob(spec: ClusterSpec, name: str | None = None, image: str | None = None,
          namespace: str | None = None) -> dict:
    """The TFJob as a dict, in the field names and order of the kubeflow.org/v1 API."""
    if in_pod(spec.train.train_dir) == '/':
        raise spec.error('train.train_dir', 'is / inside the pods; a volume cannot be mounted there')
    metadata = {'name': job_name(spec, name)}
    if check_namespace(namespace) is not None:
        metadata['namespace'] = namespace
    image = check_image(image)
    run_policy: dict = {'cleanPodPolicy': CLEAN_POD_POLICY}
    if spec.supervise.restart == 'on-failure':
        run_policy['backoffLimit'] = spec.supervise.max_restarts
    return {'apiVersion': API_VERSION, 'kind': KIND, 'metadata': metadata,
            'spec': {'runPolicy': run_policy,
                     'tfReplicaSpecs': {kind: _replica(spec, job, image) for kind, job in REPLICAS}}}


def header(spec: ClusterSpec, job: dict) -> str:
    name, train = job['metadata']['name'], spec.train
    image = job['spec']['tfReplicaSpecs']['Worker']['template']['spec']['containers'][0]['image']
    ns = f' -n {job["metadata"]["namespace"]}' if 'namespace' in job['metadata'] else ''
    source = spec.path if spec.path.isprintable() else repr(spec.path)
    if spec.supervise.restart == 'on-failure':
        restart = (f'a failed task\'s container is restarted in its pod (OnFailure), at most '
                   f'{spec.supervise.max_restarts} time(s) over the job (runPolicy.backoffLimit)')
    else:
        restart = 'none (restartPolicy Never, as supervise.restart is never): a failed task fails the job'
    lines = [
        f'A Kubeflow TFJob rendered by `launch render --format tfjob` from {source}:',
        f'{spec.num_ps} ps and {spec.num_workers} worker pod(s), each running `python -m cluster.task`, which takes',
        'its cluster and task from the TF_CONFIG the training operator sets; worker 0 is the chief.',
        '',
        f'  start:   kubectl apply{ns} -f <this file>      (needs the Kubeflow training operator)',
        f'  follow:  kubectl logs{ns} -f {name}-worker-0',
        f'  remove:  kubectl delete{ns} tfjob {name}',
        '',
        f'Image {image}: every node must be able to pull it. Build docker/Dockerfile, push it to a',
        'registry, and render with --image REGISTRY/tfcluster:TAG, e.g.',
        '  docker build -f docker/Dockerfile -t REGISTRY/tfcluster:TAG . && docker push REGISTRY/tfcluster:TAG',
        '',
        'The spec\'s host:port addresses, hosts, gpus and isolation are not used: the operator gives every',
        f'task a pod and a service, {name}-ps-0:{PORT}, {name}-worker-0:{PORT} and so on.',
        f'Restarts: {restart}.',
        '',
        f'train_dir {train.train_dir} is {in_pod(train.train_dir)} in the pods, an emptyDir volume on each worker:',
        'checkpoints survive a container restart but are deleted with the pod. To keep them, replace',
        '`emptyDir: {}` below with `persistentVolumeClaim: {claimName: CLAIM}` (ReadWriteMany when',
        'workers can land on different nodes: every worker writes there, the chief its checkpoints).',
    ]
    if train.data != 'synthetic':
        lines.append(f'train.data {train.data} must exist in every worker pod ({in_pod(train.data)}): put it in the '
                     'image or mount it.')
    user = f'train.program {train.program}' if train.program else \
        f'train.command `{" ".join(train.command)}`' if train.command else None
    if user:
        lines.append(f'{user} runs your code, which the stock image does not hold: build an image FROM it with your '
                     f'code under {COMPOSE_WORKDIR} and render with --image.')
    return ''.join(f'# {line}'.rstrip() + '\n' for line in lines)


def render(spec: ClusterSpec, args) -> str:
    """The TFJob as YAML for `kubectl apply -f`, with a comment header saying how to run it."""
    job = tfjob(spec, name=getattr(args, 'name', None), image=getattr(args, 'image', None),
                namespace=getattr(args, 'namespace', None))
    return header(spec, job) + yaml.safe_dump(job, sort_keys=False, default_flow_style=False, width=120)
