"""Render a spec for Kubeflow Trainer v2: `launch render SPEC --format trainjob` writes a
TrainingRuntime and a TrainJob (trainer.kubeflow.org/v1alpha1) that refers to it.

Can a TrainJob express a ps + worker cluster? Yes, with the ps count fixed in the runtime. What
the Trainer's sources say (kubeflow/trainer, pkg/runtime/core/trainingruntime.go and the plainml
and jobset plugins):
- A runtime's template is a JobSet spec, and its replicated jobs may be any number: only those
  labelled `trainer.kubeflow.org/trainjob-ancestor-step` (trainer, dataset-initializer,
  model-initializer) are checked by the runtime webhook; others pass through to the JobSet.
- The TrainJob has one count, `trainer.numNodes` (or the runtime's `mlPolicy.numNodes`), and the
  plainML plugin (an mlPolicy without torch or mpi) applies it to the one replicated job labelled
  as the trainer ancestor, here the workers; its image, command, args, env and resourcesPerNode
  go to containers named `node`. Every other replicated job keeps the pod count of its template
  (parallelism), which the TrainJob cannot change: runtimePatches may touch a pod template's
  metadata, env, volumes and scheduling, not a Job's parallelism.
- Every replicated job becomes one Job of `count` pods (replicas pinned to 1, kubeflow/trainer
  #2318), the layout launch/render/jobset.py writes too, so cluster/env/jobset.py places the tasks the
  same way; plainML sets no TF_CONFIG (kubeflow/trainer#2699: "set TF_CONFIG yourself"), and
  cluster.task --jobset needs none.
So the runtime holds every role: `ps` (num_ps pods, container `tfcluster`) and `node` (the workers,
container `node`, the trainer ancestor), and in a coordinator run `chief` and `evaluator` (a pod
each, with JobSet's success and failure rules for such a run, launch/render/jobset.py), and the
TrainJob only names it. The chief is not the trainer ancestor: numNodes counts the workers, the
one role whose size a run may change. Every count, the image
and the train settings live in the runtime, one source of truth; the TFCLUSTER_JOBSET_NUM_*
values there must match the pod counts, so change the spec and render again rather than
editing numNodes.

Why a namespaced TrainingRuntime, not a ClusterTrainingRuntime: the runtime carries this run's
ps count, image and arguments, so it belongs beside the TrainJob in the user's namespace; a
ClusterTrainingRuntime is a shared template an administrator installs (cluster-wide rights to
create), and the two kinds have the same spec, so one can be made from the other by hand.
Pure: a spec in, two dicts (`objects`) or YAML text (`render`) out.
"""
from __future__ import annotations

from cluster.spec import ClusterSpec
from launch.render import jobset
from launch.render import k8s
from launch.render.options import RenderOptions

API_VERSION = 'trainer.kubeflow.org/v1alpha1'
GROUP = 'trainer.kubeflow.org'
RUNTIME_KIND, KIND = 'TrainingRuntime', 'TrainJob'
NODE = 'node'       # the Trainer's name for the trainer ancestor's container (and our worker job)
ANCESTOR_LABEL = 'trainer.kubeflow.org/trainjob-ancestor-step'
ANCESTOR_TRAINER = 'trainer'


def objects(spec: ClusterSpec, name: str | None = None, image: str | None = None, namespace: str | None = None,
            pvc: str | None = None) -> tuple[dict, dict]:
    """(the TrainingRuntime, the TrainJob), in the field names of trainer.kubeflow.org/v1alpha1."""
    k8s.check_train_dir(spec)
    layout = jobset.roles(spec, worker_rjob=NODE, worker_container=NODE)
    meta = jobset.metadata(spec, name, namespace, layout, KIND)
    template = jobset.set_spec(spec, layout, k8s.check_image(image), k8s.check_claim(pvc),
                               worker_job_labels={ANCESTOR_LABEL: ANCESTOR_TRAINER})
    runtime = {'apiVersion': API_VERSION, 'kind': RUNTIME_KIND, 'metadata': dict(meta),
               'spec': {'mlPolicy': {'numNodes': spec.num_workers}, 'template': {'spec': template}}}
    train_job = {'apiVersion': API_VERSION, 'kind': KIND, 'metadata': dict(meta),
                 'spec': {'runtimeRef': {'apiGroup': GROUP, 'kind': RUNTIME_KIND, 'name': meta['name']}}}
    return runtime, train_job


def header(spec: ClusterSpec, runtime: dict, claim: str | None, unused: list[str]) -> str:
    name = runtime['metadata']['name']
    layout = jobset.roles(spec, worker_rjob=NODE, worker_container=NODE)
    ns = f' -n {runtime["metadata"]["namespace"]}' if 'namespace' in runtime['metadata'] else ''
    others = ''.join(f', {r.rjob} ({r.count} pod(s))' for r in layout if r.job in ('chief', 'evaluator'))
    lines = [
        *k8s.wrap(f'A Kubeflow Trainer v2 TrainingRuntime and TrainJob rendered by `launch render --format trainjob` '
                  f'from {k8s.source_name(spec)}: the runtime\'s JobSet template holds the replicated jobs ps '
                  f'({spec.num_ps} pod(s)){others} and node (the {spec.num_workers} worker(s), the trainer ancestor, '
                  'numNodes), each pod running `python -m cluster.task --jobset`. The TrainJob only names the '
                  'runtime: every count, the image and the train settings are in the runtime (a TrainJob cannot set '
                  'the ps count), so render again to change them.'),
        *k8s.role_lines(spec),
        '',
        f'  start:   kubectl apply{ns} -f <this file>      (needs Kubeflow Trainer v2 and JobSet)',
        f'  follow:  kubectl logs{ns} -f -l {jobset.chief_selector(name, spec, layout)}',
        f'  state:   kubectl get{ns} trainjob {name}',
        f'  remove:  kubectl delete{ns} trainjob {name} && kubectl delete{ns} trainingruntime {name}',
        '',
        *jobset.body_lines(spec, name, layout, claim, jobset.image_of(runtime['spec']['template']['spec']), unused),
    ]
    return k8s.comment(lines)


def render(spec: ClusterSpec, opts: RenderOptions | None) -> str:
    """Both objects as one YAML stream for `kubectl apply -f`, the runtime first."""
    (runtime, train_job), claim, unused = k8s.build(spec, opts, objects, KIND)
    jobset.warn_restarts(spec, claim)
    return header(spec, runtime, claim, unused) + k8s.dump(runtime) + '---\n' + k8s.dump(train_job)
