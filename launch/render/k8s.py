"""What the Kubernetes renderers share (launch/render/tfjob.py, launch/render/jobset.py, launch/render/trainjob.py).

Every format runs the same image and the same `python -m cluster.task` in its pods, with the
train settings as `--set train.KEY=VALUE` arguments (a pod needs no spec file), the train_dir on a
volume of the workers, and the same checks of the names a user gives. Pure: nothing here starts
anything or talks to a cluster.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import posixpath
import re
import textwrap
from typing import Any
from collections.abc import Callable

import yaml

from cluster.runtime.tfenv import coordinator_env
from cluster.env.jobset import DNS1035, MAX_LABEL  # noqa: F401  (a label's rules, one definition)
from cluster.spec import ClusterSpec, TrainConfig
from launch.render.compose import DEFAULT_IMAGE
from launch.errors import UsageError
from launch.planning.gpus import scheduler_request
from launch.planning.plan import COMPOSE_WORKDIR
from launch.render.options import RenderOptions

log = logging.getLogger(__name__)

COMMAND = ('python', '-m', 'cluster.task')   # the image's entry point, given so its CMD (--help) never runs
GPU_RESOURCE = 'nvidia.com/gpu'
TRAIN_DIR_VOLUME = 'train-dir'
MAX_SUBDOMAIN = 253         # a DNS-1123 subdomain: most object names, a PersistentVolumeClaim's
DNS1123 = re.compile(r'[a-z0-9]([-a-z0-9]*[a-z0-9])?')
DNS1123_SUBDOMAIN = re.compile(r'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')


def default_name(spec: ClusterSpec, limit: int) -> str:
    """The spec file's name as a DNS-1035 label of at most `limit` characters:
    specs/Local_2.yaml -> local-2."""
    stem = os.path.splitext(os.path.basename(spec.path))[0].lower()
    name = re.sub(r'[^a-z0-9]+', '-', stem).strip('-')
    if not name[:1].isalpha():
        name = f'tf-{name}'.rstrip('-')
    return name[:limit].rstrip('-')


def object_name(spec: ClusterSpec, name: str | None, limit: int, kind: str, derived: str) -> str:
    """--name, or the spec file's name: a DNS-1035 label short enough for the names the
    controller derives from it (`derived` says which, for the error line)."""
    if name is None:
        return default_name(spec, limit)
    if not DNS1035.fullmatch(name) or len(name) > limit:
        raise UsageError(f'--name {name!r}: a {kind} name must be a DNS-1035 label: lower-case letters, digits '
                         f'and "-", starting with a letter and ending with a letter or digit, at most {limit} '
                         f'characters here ({derived}, at most {MAX_LABEL})')
    return name


def _check(value: str | None, pattern: re.Pattern[str], limit: int, flag: str, what: str) -> str | None:
    if value is not None and (not pattern.fullmatch(value) or len(value) > limit):
        raise UsageError(f'{flag} {value!r}: {what}, starting and ending with a letter or digit, at most {limit} '
                         'characters')
    return value


def check_namespace(namespace: str | None) -> str | None:
    return _check(namespace, DNS1123, MAX_LABEL, '--namespace',
                  'a Kubernetes namespace is a DNS-1123 label: lower-case letters, digits and "-"')


def check_image(image: str | None) -> str:
    if image is None:
        return DEFAULT_IMAGE
    if not image or any(c.isspace() for c in image):
        raise UsageError(f'--image {image!r}: expected an image reference like registry.example/tfcluster:1.0')
    return image


def check_claim(claim: str | None) -> str | None:
    """--pvc: a PersistentVolumeClaim's name is a DNS-1123 subdomain."""
    return _check(claim, DNS1123_SUBDOMAIN, MAX_SUBDOMAIN, '--pvc',
                  'a PersistentVolumeClaim name is a DNS-1123 subdomain: lower-case letters, digits, "-" and "."')


def build(spec: ClusterSpec, opts: RenderOptions | None, make: Callable[..., Any],
          kind: str) -> tuple[Any, str | None, list[str]]:
    """What a renderer's `render` starts with: `make(spec, name=, image=, namespace=, pvc=)` with
    the render command's options (None: all defaults), then the warning about settings Kubernetes
    does not use. Returns (the object(s), the claim, those settings)."""
    opts = opts or RenderOptions()
    made = make(spec, name=opts.name, image=opts.image, namespace=opts.namespace, pvc=opts.pvc)
    warn_evaluator(spec, opts.pvc)
    return made, opts.pvc, warn_unused(spec, kind)


def set_value(value: Any) -> str:
    """`value` as the YAML text after `--set train.KEY=`, such that cluster.task reads back the very
    same value: plain where YAML keeps it as it is, quoted where it would read another type (a path
    `2024-01-01` is a date, `on` a boolean), floats as YAML 1.1 floats (1.0e-05, not 1e-05)."""
    wanted = list(value) if isinstance(value, tuple) else value
    if isinstance(wanted, str):
        candidates = [wanted, json.dumps(wanted, ensure_ascii=False, allow_nan=False)]
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


def train_args(spec: ClusterSpec, leave_out: tuple[str, ...] = ()) -> list[str]:
    """`--set train.KEY=VALUE` for every train setting that differs from cluster.task's default,
    but those named in `leave_out`."""
    out: list[str] = []
    defaults = TrainConfig()
    for f in dataclasses.fields(TrainConfig):
        if f.name in leave_out:
            continue
        default = getattr(defaults, f.name)
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


def check_train_dir(spec: ClusterSpec) -> None:
    if in_pod(spec.train.train_dir) == '/':
        raise spec.error('train.train_dir', 'is / inside the pods; a volume cannot be mounted there')


def train_dir_jobs(spec: ClusterSpec) -> tuple[str, ...]:
    """The jobs whose pods mount the train_dir: those that write or read its checkpoints. TF1: the
    workers (worker 0 is the chief); a coordinator run: the chief, which saves, and the evaluator,
    which reads them (its workers and ps only serve)."""
    return tuple(job for job in ('chief', 'evaluator') if spec.job_tasks(job)) if spec.coordinator else ('worker',)


def _pods(spec: ClusterSpec) -> str:
    """'worker', 'chief', 'chief and evaluator': the pods train_dir_jobs names, for the header."""
    return ' and '.join(train_dir_jobs(spec))


def container_env(spec: ClusterSpec, job: str) -> dict[str, str]:
    """A container's own variables: in a coordinator run what ParameterServerStrategy needs in every
    task before TensorFlow starts (cluster/runtime/tfenv.py coordinator_env: GRPC_FAIL_FAST=use_caller,
    TF_USE_LEGACY_KERAS=1; cluster.task sets them too, but a pod should say what it runs with), then
    the spec's `env:` for `job`, which cannot name those (the spec refuses them)."""
    return {**(coordinator_env() if spec.coordinator else {}), **spec.task_env(job)}


def train_dir_volume(claim: str | None) -> dict:
    """The workers' train_dir volume: the claim when there is one, else an emptyDir (lost with the pod)."""
    source = {'persistentVolumeClaim': {'claimName': claim}} if claim else {'emptyDir': {}}
    return {'name': TRAIN_DIR_VOLUME, **source}


def train_dir_mount(spec: ClusterSpec) -> dict:
    return {'name': TRAIN_DIR_VOLUME, 'mountPath': in_pod(spec.train.train_dir)}


def warn_evaluator(spec: ClusterSpec, claim: str | None) -> None:
    """An evaluator on an emptyDir has a directory of its own, never the chief's checkpoints."""
    if spec.job_tasks('evaluator') and not claim:
        log.warning('%s: the evaluator reads the chief\'s checkpoints, but without --pvc each pod has an emptyDir of '
                    'its own: render with --pvc CLAIM (ReadWriteMany) so that the evaluator sees them', spec.path)


def gpu_resources(spec: ClusterSpec) -> dict | None:
    """A worker's `resources`: as many nvidia.com/gpu as train.devices lists gpu:N towers
    (cluster.task numbers them from 0 among the GPUs it sees); None for CPU towers or `auto`."""
    gpus = scheduler_request(spec)
    return {'limits': {GPU_RESOURCE: str(gpus)}} if gpus else None


def env_list(values: dict[str, str]) -> list[dict]:
    return [{'name': k, 'value': v} for k, v in values.items()]


def warn_unused(spec: ClusterSpec, kind: str) -> list[str]:
    """Warn (one line) about the spec settings that mean nothing on Kubernetes: the controller
    places and names the pods, so `hosts` and `isolation: netns` are left out, not refused (the
    same spec still runs elsewhere). Returns the settings, for the file's header."""
    unused = (['hosts'] if spec.hosts else []) + (['isolation: netns'] if spec.isolation == 'netns' else [])
    if unused:
        log.warning('%s: %s not used by a %s: Kubernetes places and names the pods', spec.path,
                    ' and '.join(unused), kind)
    return unused


def image_lines(image: str) -> list[str]:
    return [f'Image {image}: every node must be able to pull it. Build docker/Dockerfile, push it to a',
            'registry, and render with --image REGISTRY/tfcluster:TAG, e.g.',
            '  docker build -f docker/Dockerfile -t REGISTRY/tfcluster:TAG . && docker push REGISTRY/tfcluster:TAG']


def wrap(text: str, width: int = 100) -> list[str]:
    """A paragraph of a header as lines of at most `width` characters."""
    return textwrap.wrap(text, width, break_long_words=False, break_on_hyphens=False)


def train_dir_lines(spec: ClusterSpec, claim: str | None, restart_keeps_pods: bool) -> list[str]:
    """What becomes of the train_dir: on a claim it outlives everything; an emptyDir lives as long
    as its pod, which a container restart keeps (TFJob's OnFailure) and a JobSet restart does not."""
    pods = _pods(spec)
    where = f'train_dir {spec.train.train_dir} is {in_pod(spec.train.train_dir)} in the {pods} pods'
    rwx = ('ReadWriteMany when workers can land on different nodes' if not spec.coordinator else
           'ReadWriteMany: the chief writes it and the evaluator reads it' if spec.job_tasks('evaluator') else
           'ReadWriteOnce is enough for the chief alone')
    if claim:
        return wrap(f'{where}, on the PersistentVolumeClaim {claim} ({rwx}): checkpoints survive restarts and the '
                    'job, and `launch eval` can read them on a machine that mounts the same volume.')
    kept = ('checkpoints survive a container restart but are deleted with the pod' if restart_keeps_pods else
            'checkpoints are deleted with the pod, so a restart of the set starts again from step 0')
    alone = (' The evaluator\'s emptyDir is its own: it never sees the chief\'s checkpoints.'
             if spec.job_tasks('evaluator') else '')
    on = 'each worker' if not spec.coordinator else 'each' if spec.job_tasks('evaluator') else 'the chief'
    return wrap(f'{where}, an emptyDir volume on {on}: {kept}.{alone} Render with --pvc CLAIM to keep them on a '
                f'PersistentVolumeClaim ({rwx}).')


def user_lines(spec: ClusterSpec) -> list[str]:
    """What a pod needs besides the stock image: the data directory, the user's code."""
    train, lines = spec.train, []
    if train.data != 'synthetic':
        pods = 'every pod' if spec.coordinator else 'every worker pod'    # PSS datasets are made on the workers
        lines += wrap(f'train.data {train.data} must exist in {pods} ({in_pod(train.data)}): put it in the '
                      'image or mount it.')
    parts = [f'train.program {train.program}' if train.program else
             f'train.command `{" ".join(train.command)}`' if train.command else '',
             f'train.evaluator {train.evaluator}' if isinstance(train.evaluator, str) else
             f'train.evaluator `{" ".join(train.evaluator)}`' if train.evaluator else '']
    user = ' and '.join(part for part in parts if part)
    if user:
        lines += wrap(f'{user} {"run" if " and " in user else "runs"} your code, which the stock image does not '
                      f'hold: build an image FROM it with your code under {COMPOSE_WORKDIR} and render with --image.')
    return lines


def role_lines(spec: ClusterSpec) -> list[str]:
    """Who does what: worker 0 is the chief, or a coordinator run's roles."""
    if not spec.coordinator:
        return ['Worker 0 is the chief.']
    code = f'train.program {spec.train.program}' if spec.train.program else 'train.command'
    evaluator = ', the evaluator runs train.evaluator beside it (never in the training cluster)' \
        if spec.job_tasks('evaluator') else ''
    return wrap(f'A coordinator run (TF2 ParameterServerStrategy): the chief runs {code}, the ps and workers only '
                f'serve{evaluator}; the run is done when the chief is, and the others are then stopped (they never '
                'end by themselves). Every container has GRPC_FAIL_FAST=use_caller and TF_USE_LEGACY_KERAS=1.')


def source_name(spec: ClusterSpec) -> str:
    return spec.path if spec.path.isprintable() else repr(spec.path)


def comment(lines: list[str]) -> str:
    return ''.join(f'# {line}'.rstrip() + '\n' for line in lines)


def dump(obj: dict) -> str:
    return yaml.safe_dump(obj, sort_keys=False, default_flow_style=False, width=120)
