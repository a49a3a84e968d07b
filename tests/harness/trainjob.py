"""Helpers of the tests of trainjob, used by
tests/unit/launch/render/test_render_roles.py, tests/unit/launch/render/test_trainjob.py: here, since no test
module imports another."""
from __future__ import annotations



ANCESTOR = 'trainer.kubeflow.org/trainjob-ancestor-step'


def check_trainer_rules(runtime: dict, train_job: dict) -> None:
    """What the Trainer's runtime webhook and its plugins require or do, for a plainML runtime."""
    assert runtime['apiVersion'] == train_job['apiVersion'] == 'trainer.kubeflow.org/v1alpha1'
    assert (runtime['kind'], train_job['kind']) == ('TrainingRuntime', 'TrainJob')
    assert train_job['spec']['runtimeRef'] == {'apiGroup': 'trainer.kubeflow.org', 'kind': 'TrainingRuntime',
                                               'name': runtime['metadata']['name']}
    assert runtime['metadata'].get('namespace') == train_job['metadata'].get('namespace')
    policy = runtime['spec']['mlPolicy']
    assert not {'torch', 'mpi', 'jax', 'xgboost', 'flux'} & set(policy)      # plainML
    rjobs = runtime['spec']['template']['spec']['replicatedJobs']
    trainer = [r for r in rjobs if r['template'].get('metadata', {}).get('labels', {}).get(ANCESTOR) == 'trainer']
    assert len(trainer) == 1
    assert trainer[0]['replicas'] == 1                                  # the webhook: "always must be 1"
    assert 'node' in [c['name'] for c in trainer[0]['template']['spec']['template']['spec']['containers']]
    # plainML sets the trainer job's pod count to numNodes; every other job keeps its parallelism
    assert trainer[0]['template']['spec']['parallelism'] == policy['numNodes']
    for rjob in rjobs:
        names = [c['name'] for c in rjob['template']['spec']['template']['spec']['containers']]
        assert rjob is trainer[0] or 'node' not in names      # TrainJob.trainer's image, args and GPUs go to `node`

