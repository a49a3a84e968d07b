"""A task's place in the cluster, from the environment of a JobSet pod alone.

`launch render --format jobset` (and `--format trainjob`, whose TrainJob becomes a JobSet) writes
each tfcluster job as one replicated job holding a single Indexed Job of N pods: `ps` with
num_ps pods, the workers (`worker`, or `node` under Kubeflow Trainer) with num_workers pods, and
in a coordinator run `chief` and, where the spec has one, `evaluator`, one pod each.
A pod then knows everything it needs without talking to the others:

- which replicated job and JobSet it belongs to: the JobSet controller labels every pod with
  `jobset.sigs.k8s.io/replicatedjob-name` and `jobset.sigs.k8s.io/jobset-name`, which the
  rendered container reads into TFCLUSTER_JOBSET_REPLICATED_JOB and TFCLUSTER_JOBSET_NAME
  through the downward API;
- its index within that job: JOB_COMPLETION_INDEX, which Kubernetes itself sets in every
  container of an Indexed Job (0..completions-1);
- every task's stable DNS name: with `network.enableDNSHostnames` JobSet gives the pods of the
  Job `<jobset>-<rjob>-<jobIndex>` the hostnames `<jobset>-<rjob>-<jobIndex>-<podIndex>` under a
  headless service named after the subdomain (the JobSet's name unless `network.subdomain` says
  otherwise); jobIndex is always 0 here, as there is one Job per replicated job;
- the shape of the cluster, which no label carries: the rendered values TFCLUSTER_JOBSET_PS_JOB,
  TFCLUSTER_JOBSET_NUM_PS, TFCLUSTER_JOBSET_WORKER_JOB, TFCLUSTER_JOBSET_NUM_WORKERS and
  TFCLUSTER_JOBSET_PORT, and for a coordinator run TFCLUSTER_JOBSET_CHIEF_JOB and
  TFCLUSTER_JOBSET_EVALUATOR_JOB (the replicated jobs of the chief and the evaluator, a pod
  each: a spec has at most one of either, so a name is all there is to say).

A Place's cluster is the spec's (every task, the evaluator too: cluster.task loads the spec from
it); its tf_config is what TensorFlow is told, the training cluster without the evaluator, and an
evaluator's naming only itself (the rule of ClusterSpec.tf_config).

Why one Job of N pods per role rather than N one-pod Jobs: Kubeflow Trainer v2 builds every
replicated job that way (its JobSet plugin pins replicas to 1 and sets parallelism, kubeflow/trainer
#2318), so one layout and this one function serve both renderers; and the index then comes from
Kubernetes' own JOB_COMPLETION_INDEX.

The names are short, `<host>.<subdomain>`, resolved through the pod's DNS search path within its
namespace, as JobSet's own coordinator annotation writes them.

TFCLUSTER_JOBSET_RESOLVE is a hook for running a JobSet's pods as local processes (the tests do,
and so can a user debugging the layout): `NAME=HOST:PORT,...` gives the task that the layout names
NAME that address instead, like an /etc/hosts entry with a port (tasks on one machine cannot all
listen on the same port). Every NAME must be a task of the cluster, and every task must be named,
so a layout that is wrong still fails.

Pure: an environment mapping in, a Place out; nothing is read from the system.
"""
from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping

NAME_ENV = 'TFCLUSTER_JOBSET_NAME'
REPLICATED_JOB_ENV = 'TFCLUSTER_JOBSET_REPLICATED_JOB'
INDEX_ENV = 'JOB_COMPLETION_INDEX'
PS_JOB_ENV, NUM_PS_ENV = 'TFCLUSTER_JOBSET_PS_JOB', 'TFCLUSTER_JOBSET_NUM_PS'
WORKER_JOB_ENV, NUM_WORKERS_ENV = 'TFCLUSTER_JOBSET_WORKER_JOB', 'TFCLUSTER_JOBSET_NUM_WORKERS'
CHIEF_JOB_ENV = 'TFCLUSTER_JOBSET_CHIEF_JOB'             # optional: a coordinator run's chief, one pod
EVALUATOR_JOB_ENV = 'TFCLUSTER_JOBSET_EVALUATOR_JOB'     # optional: its evaluator, one pod
PORT_ENV = 'TFCLUSTER_JOBSET_PORT'
SUBDOMAIN_ENV = 'TFCLUSTER_JOBSET_SUBDOMAIN'     # optional: JobSet's default is the JobSet's name
RESOLVE_ENV = 'TFCLUSTER_JOBSET_RESOLVE'         # optional: local addresses for the DNS names
# Every variable this module reads; a spec's `env:` must not set them (launch/render/jobset.py refuses).
VARIABLES = (NAME_ENV, REPLICATED_JOB_ENV, INDEX_ENV, PS_JOB_ENV, NUM_PS_ENV, WORKER_JOB_ENV, NUM_WORKERS_ENV,
             CHIEF_JOB_ENV, EVALUATOR_JOB_ENV, PORT_ENV, SUBDOMAIN_ENV, RESOLVE_ENV)
SINGLE_JOB_ENV = {'chief': CHIEF_JOB_ENV, 'evaluator': EVALUATOR_JOB_ENV}
ORDER = ('chief', 'ps', 'worker', 'evaluator')      # a Place's cluster, in the spec's order of jobs

JOBSET_NAME_LABEL = 'jobset.sigs.k8s.io/jobset-name'
REPLICATED_JOB_LABEL = 'jobset.sigs.k8s.io/replicatedjob-name'
MAX_LABEL = 63
DNS1035 = re.compile(r'[a-z]([-a-z0-9]*[a-z0-9])?')


class JobSetEnvError(ValueError):
    """The environment is not that of a pod of a JobSet rendered by tfcluster; one line."""


@dataclasses.dataclass(frozen=True)
class Place:
    """The whole cluster (job -> ["host:port", ...]) and this pod's task in it."""
    cluster: dict
    job: str
    index: int

    def tf_config(self) -> str:
        """The TF_CONFIG this place is, for showing it (cluster.task does not need it set): the
        training cluster, or for the evaluator only itself."""
        if self.job == 'evaluator':
            cluster = {'evaluator': [self.cluster['evaluator'][self.index]]}
        else:
            cluster = {job: addresses for job, addresses in self.cluster.items() if job != 'evaluator'}
        return json.dumps({'cluster': cluster, 'task': {'type': self.job, 'index': self.index}}, allow_nan=False)


def hostname(jobset: str, replicated_job: str, index: int) -> str:
    """The pod's hostname JobSet gives task `index` of a replicated job holding one Job."""
    return f'{jobset}-{replicated_job}-0-{index}'


def _required(env: Mapping[str, str], name: str) -> str:
    value = env.get(name, '')
    if not value.strip():
        raise JobSetEnvError(f'${name} is not set: not in a pod of a JobSet rendered by `launch render --format '
                             f'jobset` (or trainjob), or its container lost the variable')
    return value.strip()


def _number(env: Mapping[str, str], name: str, low: int, high: int | None = None) -> int:
    text = _required(env, name)
    if not text.isdigit() or int(text) < low or (high is not None and int(text) > high):
        upto = f'..{high}' if high is not None else ' or more'
        raise JobSetEnvError(f'${name}={text!r}: expected a whole number {low}{upto}')
    return int(text)


def _label(env: Mapping[str, str], name: str, what: str) -> str:
    value = _required(env, name)
    if not DNS1035.fullmatch(value) or len(value) > MAX_LABEL:
        raise JobSetEnvError(f'${name}={value!r}: {what} must be a DNS-1035 label (lower-case letters, digits '
                             f'and "-", at most {MAX_LABEL} characters)')
    return value


def _resolve(cluster: dict, text: str) -> dict:
    """The cluster with each DNS name replaced as TFCLUSTER_JOBSET_RESOLVE says (see the module doc)."""
    given: dict[str, str] = {}
    for item in text.split(','):
        name, sep, address = item.strip().partition('=')
        host, colon, port = address.rpartition(':')
        if not sep or not colon or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
            raise JobSetEnvError(f'${RESOLVE_ENV}: {item.strip()!r}: expected NAME=HOST:PORT')
        given[name] = address
    names = {address.rpartition(':')[0] for addresses in cluster.values() for address in addresses}
    unknown, missing = sorted(set(given) - names), sorted(names - set(given))
    if unknown or missing:
        raise JobSetEnvError(f'${RESOLVE_ENV}: ' + '; '.join(
            part for part in (f'no task is named {", ".join(unknown)}' if unknown else '',
                              f'no address for {", ".join(missing)}' if missing else '') if part))
    return {job: [given[a.rpartition(':')[0]] for a in addresses] for job, addresses in cluster.items()}


def _roles(env: Mapping[str, str]) -> dict[str, tuple[str, int]]:
    """job -> (its replicated job, its pod count), in ORDER, from the rendered variables."""
    found = {'ps': (_label(env, PS_JOB_ENV, 'a replicated job name'), _number(env, NUM_PS_ENV, 1)),
             'worker': (_label(env, WORKER_JOB_ENV, 'a replicated job name'), _number(env, NUM_WORKERS_ENV, 1))}
    for job, name in SINGLE_JOB_ENV.items():
        if env.get(name, '').strip():
            found[job] = (_label(env, name, 'a replicated job name'), 1)
    if 'evaluator' in found and 'chief' not in found:
        raise JobSetEnvError(f'${EVALUATOR_JOB_ENV} is set without ${CHIEF_JOB_ENV}: an evaluator belongs to a '
                             'coordinator run, which has a chief')
    roles = {job: found[job] for job in ORDER if job in found}
    seen: dict[str, str] = {}
    for job, (rjob, _) in roles.items():
        other = seen.setdefault(rjob, job)
        if other != job:
            raise JobSetEnvError(f'${_job_env(other)} and ${_job_env(job)} are both {rjob!r}: the {other} and the '
                                 f'{_plural(job)} need replicated jobs of their own')
    return roles


def _job_env(job: str) -> str:
    return {'ps': PS_JOB_ENV, 'worker': WORKER_JOB_ENV, **SINGLE_JOB_ENV}[job]


def _plural(job: str) -> str:
    return {'ps': 'ps', 'worker': 'workers'}.get(job, job)


def _none_of(roles: dict[str, tuple[str, int]]) -> str:
    """'neither the ps job (ps) nor the worker job (worker)', or 'none of ...' for more jobs."""
    jobs = [f'the {job} job ({rjob})' for job, (rjob, _) in sorted(roles.items(), key=lambda r: _SAY.index(r[0]))]
    if len(jobs) == 2:
        return f'neither {jobs[0]} nor {jobs[1]}'
    return f'none of {", ".join(jobs[:-1])} and {jobs[-1]}'


_SAY = ('ps', 'worker', 'chief', 'evaluator')       # how an error lists the jobs


def place(env: Mapping[str, str]) -> Place:
    """This pod's task and every task's address, from a JobSet pod's environment. Raises
    JobSetEnvError (one line, naming the variable) when a variable is missing or wrong."""
    name = _label(env, NAME_ENV, 'a JobSet name')
    subdomain = _label(env, SUBDOMAIN_ENV, 'a subdomain') if env.get(SUBDOMAIN_ENV, '').strip() else name
    roles = _roles(env)
    port = _number(env, PORT_ENV, 1, 65535)
    mine = _required(env, REPLICATED_JOB_ENV)
    job = next((j for j, (rjob, _) in roles.items() if rjob == mine), None)
    if job is None:
        raise JobSetEnvError(f'${REPLICATED_JOB_ENV}={mine!r}: this pod belongs to {_none_of(roles)}')
    index = _number(env, INDEX_ENV, 0, roles[job][1] - 1)
    for rjob, count in roles.values():
        longest = hostname(name, rjob, count - 1)
        if len(longest) > MAX_LABEL:
            raise JobSetEnvError(f'${NAME_ENV}={name!r}: the hostname {longest} is longer than {MAX_LABEL} '
                                 'characters; give the JobSet a shorter name')
    cluster = {j: [f'{hostname(name, rjob, i)}.{subdomain}:{port}' for i in range(count)]
               for j, (rjob, count) in roles.items()}
    if env.get(RESOLVE_ENV, '').strip():
        cluster = _resolve(cluster, env[RESOLVE_ENV])
    return Place(cluster, job, index)
