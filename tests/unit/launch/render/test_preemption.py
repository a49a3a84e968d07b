"""Preemption notices in every rendered file (#41, docs/preemption.md): the batch script asks Slurm
for a SIGTERM before the time limit and a requeue and passes a SIGTERM to its tasks as a notice;
the JobSet and TrainJob give every pod the grace, fail a preempted pod's Job by its
podFailurePolicy and restart the set without counting it, and stay strictly valid; the TFJob gives
every pod the grace. A grace of 0 (and for the restarts, `restart: never`) renders none of it.
Tables, no processes (tests/system/launch/render/test_sbatch_preemption.py runs the script's trap)."""
from __future__ import annotations

import os
import re

import pytest

from cluster.runtime.contract import EXIT_PREEMPTED
from cluster.spec import load_spec
from launch.render import sbatch
from launch.render.jobset import jobset, render as render_jobset
from launch.render.options import RenderOptions
from launch.render.tfjob import render as render_tfjob, tfjob
from launch.render.trainjob import objects, render as render_trainjob
from tests.conftest import REPO
from tests.harness.jobset import check_jobset_rules, prose, validated
from tests.harness.k8s_models import check_jobset_spec, pod_templates, trainer_round_trip
from tests.harness.render_roles import pss_spec
from tests.harness.tfjob import api_model, check_operator_rules
from tests.harness.trainjob import check_trainer_rules

LOCAL2 = os.path.join(REPO, 'specs', 'local2.yaml')
RESTARTS = 'supervise.restart=on-failure'
# JobSet's rule for a failurePolicy rule's name (api/jobset/v1alpha2 FailurePolicyRule), written out here
RULE_NAME = re.compile(r'^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$')


def local2(*overrides: str):
    return load_spec(LOCAL2, list(overrides))


def script(spec, monkeypatch, tmp_path, attempt=None) -> str:
    monkeypatch.chdir(tmp_path)
    return sbatch.render(spec, RenderOptions(), attempt)


def options(text: str) -> list[str]:
    return [line.removeprefix('#SBATCH ') for line in text.splitlines() if line.startswith('#SBATCH ')]


# -- Slurm ------------------------------------------------------------------------------------------

@pytest.mark.parametrize('grace, seconds', [(30, 45), (7.5, 23), (120, 135)])
def test_sbatch_asks_for_the_signal_before_the_time_limit_and_a_requeue(tmp_path, monkeypatch, grace, seconds):
    text = script(local2(RESTARTS, f'supervise.preemption_grace={grace}'), monkeypatch, tmp_path)
    asked = options(text)
    assert asked[:3] == ['--job-name=local2', f'--signal=B:TERM@{seconds}', '--requeue']


def test_sbatch_traps_term_runs_the_step_in_the_background_and_requeues(tmp_path, monkeypatch):
    lines = script(local2(RESTARTS), monkeypatch, tmp_path).splitlines()
    trap = lines.index('trap notice TERM')
    srun = next(i for i, line in enumerate(lines) if line.startswith('srun '))
    assert trap < srun
    notice = '\n'.join(lines[lines.index('notice() {'):trap])
    assert '"$train_dir/stops/all"' in notice           # the launcher's stop mark: no notice, no requeue
    assert ': >"$preempted"' in notice
    assert 'scancel --signal=TERM "$SLURM_JOB_ID"' in notice and '--batch' not in notice
    end = next(i for i in range(srun, len(lines)) if not lines[i].endswith('\\'))
    assert lines[end].endswith(' &')        # in the background: bash runs a trap only between commands
    rest = lines[end + 1:]
    assert rest[:3] == ['step=$!', 'while kill -0 "$step" 2>/dev/null; do wait "$step" || :; done    '
                        '# the trap runs between the waits', 'wait "$step" || status=$?']
    requeue = next(line for line in rest if 'scontrol requeue' in line)
    assert 'JobState=RUNNING' in requeue    # a job cancelled meanwhile is not brought back
    assert rest[-1] == 'exit "$status"'


def test_sbatch_attempt_follows_slurm_restart_count(tmp_path, monkeypatch):
    text = script(local2(RESTARTS), monkeypatch, tmp_path, attempt=3)
    assert 'attempt=$((3 + ${SLURM_RESTART_COUNT:-0}))  # a requeued job is the next attempt' in text.splitlines()
    assert 'attempt=3' not in text.splitlines()


def test_sbatch_coordinator_still_exits_with_the_chief(tmp_path, monkeypatch):
    spec = pss_spec(tmp_path, overrides=[RESTARTS])
    lines = script(spec, monkeypatch, tmp_path).splitlines()
    assert '--requeue' in options('\n'.join(lines))
    srun = next(i for i, line in enumerate(lines) if line.startswith('srun '))
    assert lines.index('ended="$train_dir/chief-exit.$SLURM_JOB_ID"') < lines.index('trap notice TERM') < srun
    assert re.search(r'"\$ended" \\$', lines[srun + 1])
    assert lines[-2:] == ['if [ -s "$ended" ]; then status=$(cat "$ended"); rm -f "$ended"; fi', 'exit "$status"']


def test_sbatch_gpu_job_asks_in_its_first_component(tmp_path, monkeypatch):
    spec = pss_spec(tmp_path, overrides=[RESTARTS, 'train.devices=[gpu:0]'])
    asked = options(script(spec, monkeypatch, tmp_path))
    assert asked.index('--requeue') < asked.index('hetjob') and asked.count('--requeue') == 1


@pytest.mark.parametrize('overrides', [(RESTARTS, 'supervise.preemption_grace=0'), ()],
                         ids=['grace-0', 'restart-never'])
def test_sbatch_without_notices_or_restarts_is_as_before(tmp_path, monkeypatch, overrides):
    for spec in (local2(*overrides), pss_spec(tmp_path, overrides=list(overrides))):
        text = script(spec, monkeypatch, tmp_path, attempt=2)
        assert not [o for o in options(text) if o.startswith(('--signal', '--requeue'))]
        assert 'trap notice' not in text and 'scontrol' not in text and 'SLURM_RESTART_COUNT' not in text
        assert 'attempt=2' in text.splitlines()
        assert not [line for line in text.splitlines() if line.endswith(' &')]


# -- JobSet and TrainJob ------------------------------------------------------------------------------

def test_jobset_pods_have_the_grace_and_jobs_a_pod_failure_policy():
    obj = validated(jobset(local2(RESTARTS, 'supervise.max_restarts=0', 'supervise.preemption_grace=60')))
    spec = obj['spec']
    assert [t['spec']['terminationGracePeriodSeconds'] for t in pod_templates(spec)] == [75, 75]
    assert spec['failurePolicy'] == {'maxRestarts': 0, 'restartStrategy': 'BlockingRecreate', 'rules': [
        {'name': 'preempted', 'action': 'RestartJobSetAndIgnoreMaxRestarts', 'onJobFailureReasons': ['PodFailurePolicy']}]}
    assert all(RULE_NAME.match(rule['name']) for rule in spec['failurePolicy']['rules'])
    for rjob in spec['replicatedJobs']:
        job = rjob['template']['spec']
        assert job['template']['spec']['restartPolicy'] == 'Never'      # what podFailurePolicy needs
        container = job['template']['spec']['containers'][0]['name']
        assert job['podFailurePolicy'] == {'rules': [
            {'action': 'FailJob', 'onExitCodes': {'containerName': container, 'operator': 'In',
                                                  'values': [EXIT_PREEMPTED]}},
            {'action': 'FailJob', 'onPodConditions': [{'type': 'DisruptionTarget', 'status': 'True'}]}]}


def test_coordinator_replaces_a_preempted_chief_worker_or_evaluator_alone(tmp_path):
    obj = validated(jobset(pss_spec(tmp_path, overrides=[RESTARTS])))
    actions = {r['name']: {rule['action'] for rule in r['template']['spec']['podFailurePolicy']['rules']}
               for r in obj['spec']['replicatedJobs']}
    assert actions == {'ps': {'FailJob'}, 'chief': {'Ignore'}, 'evaluator': {'Ignore'}, 'worker': {'Ignore'}}


def test_a_schema_typo_in_a_pod_failure_policy_is_caught():
    obj = jobset(local2(RESTARTS))
    obj['spec']['replicatedJobs'][0]['template']['spec']['podFailurePolicy']['rules'][0]['onExitCode'] = {}
    with pytest.raises(AssertionError):
        validated(obj)


def test_trainjob_runtime_carries_the_same_and_stays_valid():
    runtime, train_job = objects(local2(RESTARTS))
    trainer_round_trip(runtime, 'TrainerV1alpha1TrainingRuntime')
    template = runtime['spec']['template']['spec']
    check_jobset_spec(template)
    check_trainer_rules(runtime, train_job)
    check_jobset_rules({'apiVersion': 'jobset.x-k8s.io/v1alpha2', 'kind': 'JobSet',
                        'metadata': train_job['metadata'], 'spec': template})
    node = next(r for r in template['replicatedJobs'] if r['name'] == 'node')['template']['spec']
    assert node['podFailurePolicy']['rules'][0]['onExitCodes']['containerName'] == 'node'
    assert node['template']['spec']['terminationGracePeriodSeconds'] == 45
    assert template['failurePolicy']['rules'][0]['name'] == 'preempted'


@pytest.mark.parametrize('render', [render_jobset, render_trainjob])
def test_kubernetes_headers_say_how_a_preemption_goes(render):
    text = prose(render(local2(RESTARTS), RenderOptions(pvc='ckpt')))
    assert 'Preemption (supervise.preemption_grace 30s): every pod has terminationGracePeriodSeconds 45' in text
    assert 'RestartJobSetAndIgnoreMaxRestarts' in text and 'DisruptionTarget' in text
    never = prose(render(local2(), RenderOptions(pvc='ckpt')))
    assert 'terminationGracePeriodSeconds 45' in never and 'a preempted task fails the JobSet' in never


def test_restart_never_gives_the_grace_but_no_restart_rules():
    spec = validated(jobset(local2()))['spec']
    assert {t['spec']['terminationGracePeriodSeconds'] for t in pod_templates(spec)} == {45}
    assert 'rules' not in spec['failurePolicy']
    assert not [r for r in spec['replicatedJobs'] if 'podFailurePolicy' in r['template']['spec']]


# -- TFJob ---------------------------------------------------------------------------------------------

def test_tfjob_pods_have_the_grace(tmp_path):
    for spec in (local2(RESTARTS, 'supervise.preemption_grace=10'), pss_spec(tmp_path, overrides=[RESTARTS])):
        job = tfjob(spec)
        api_model(job)
        check_operator_rules(job)
        graces = {kind: r['template']['spec']['terminationGracePeriodSeconds']
                  for kind, r in job['spec']['tfReplicaSpecs'].items()}
        assert set(graces.values()) == {spec.supervise.preemption_grace + 15}
        assert {r['restartPolicy'] for r in job['spec']['tfReplicaSpecs'].values()} == {'OnFailure'}
    text = prose(render_tfjob(local2(RESTARTS), None))
    assert 'kubeflow/trainer#999' in text and 'render --format jobset' in text
    never = prose(render_tfjob(local2(), None))
    assert 'terminationGracePeriodSeconds 45' in never and 'a preempted task fails the job' in never
    assert 'kubeflow/trainer#999' not in never


# -- a grace of 0 ---------------------------------------------------------------------------------------

def test_grace_0_renders_none_of_it(tmp_path):
    for spec in (local2(RESTARTS, 'supervise.preemption_grace=0'),
                 pss_spec(tmp_path, overrides=[RESTARTS, 'supervise.preemption_grace=0'])):
        js = validated(jobset(spec))
        assert 'rules' not in js['spec']['failurePolicy']
        for rjob in js['spec']['replicatedJobs']:
            assert 'podFailurePolicy' not in rjob['template']['spec']
            assert 'terminationGracePeriodSeconds' not in rjob['template']['spec']['template']['spec']
        runtime, _ = objects(spec)
        assert 'podFailurePolicy' not in str(runtime) and 'terminationGracePeriodSeconds' not in str(runtime)
        job = tfjob(spec)
        assert 'terminationGracePeriodSeconds' not in str(job)
        for text in (render_jobset(spec, None), render_trainjob(spec, None), render_tfjob(spec, None)):
            assert 'Preemption' not in text and 'terminationGracePeriodSeconds' not in text
