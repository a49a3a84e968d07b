"""`launch plan` (what `up` would run for each task) and `launch check` (whether every host is
ready for it): both start nothing."""
from __future__ import annotations

import os
import shlex

from cluster.runtime import placed, rundir, runjson
from cluster.spec import ClusterSpec, TaskSpec
from cluster.spec.environ import MASK, masked
from launch.backends import netns
from launch.backends.base import HostCheck
from launch.commands import load_view
from launch.commands.flags import JsonFlags, PlanFlags
from launch.commands.request import Request, backends_for, plans_of
from launch.errors import UsageError
from launch.planning import link_time, ps_load
from launch.planning.plan import TaskPlan, effective_spec_path
from launch.records import runs
from launch.records.event_types import Progress
from launch.records.events import typed_events, typed_run_record
from launch.run import launching, registry, standbys
from launch.run.preflight import preflight, warn_exposure


def cmd_check(spec: ClusterSpec, req: Request[JsonFlags]) -> int:
    """The pre-flight `launch up` runs (launch/run/preflight.py), in its order, with every host's
    verdict shown (its Python imports TensorFlow and tfcluster for real, where up only finds
    them). Exit code 0 when all is ready; else 2, with the one line `launch up` would end with."""
    plans = plans_of(spec, req)
    launching.check_limits(spec, plans)
    with backends_for(spec, req, plans) as backends:
        placed = launching.with_gpus(spec, req.backend, req.options, plans, backends)   # too few: up's line

        def show(verdicts: dict[str, list[HostCheck]]) -> None:
            checks = [c for found in verdicts.values() for c in found] + _gpu_lines(placed)
            if req.flags.json:
                print(runjson.dumps({'ok': all(c.ok for c in checks), 'hosts': [c.to_json() for c in checks]},
                                    indent=1), flush=True)
                return
            for c in checks:
                print(c.line(), flush=True)
            warn_exposure(placed)
        preflight(spec, placed, backends, show=show)
    return 0


def _gpu_lines(plans: list[TaskPlan]) -> list[HostCheck]:
    """The GPUs each worker gets, as one more line (none when no worker gets any)."""
    given = [f'{p.name} {p.slot.describe()}' for p in plans if p.slot and p.slot.gpus]
    return [HostCheck('gpus', True, '; '.join(given))] if given else []


def _shape(spec: ClusterSpec) -> str:
    """'1 ps, 2 workers, sync', or a coordinator run's roles."""
    if not spec.coordinator:
        return f'{spec.num_ps} ps, {spec.num_workers} workers, {"sync" if spec.train.sync else "async"}'
    evaluators = len(spec.job_tasks('evaluator'))
    return (f'1 chief, {spec.num_ps} ps, {spec.num_workers} workers' + (', 1 evaluator' if evaluators else '')
            + ', a coordinator run (TF2 ParameterServerStrategy)')


def _coordinator_lines(spec: ClusterSpec) -> None:
    train = spec.train
    what = f'calls {train.program}(ctx)' if train.program else \
        f'runs `{shlex.join(train.command or ())}` with TF_CONFIG (no TF1 flags; python: the task\'s own interpreter)'
    print(f'# the chief {what}; the ps and workers only serve (tf.distribute.Server), and are stopped once the '
          'chief has ended')
    if isinstance(train.evaluator, str):
        print(f'# the evaluator calls {train.evaluator}(ctx) beside the training, on the checkpoints in train_dir')
    elif train.evaluator:
        print(f'# the evaluator runs `{shlex.join(train.evaluator)}` beside the training (its TF_CONFIG names '
              'only itself)')


def cmd_plan(spec: ClusterSpec, req: Request[PlanFlags]) -> int:
    plans = plans_of(spec, req)
    launching.check_limits(spec, plans)
    run = _from_run(req.flags.from_run) if req.flags.from_run else None
    load, tip = ps_load.builtin_load(spec), ps_load.advice(spec)
    if load is None and run is not None:
        load = _run_load(spec, *run)
    elif load is None and (own := _own_run(spec)) is not None:     # the spec's train_dir: its last run, if it tells
        load = _run_load(spec, *own, asked=False)
    links = _links(spec, load, req.flags, plans, run)
    if req.flags.json:      # the tasks (each names the run's standbys too) and the ps tasks' load
        kept = standbys.summary(spec, req.backend, plans)
        linked = {'link': links[0].to_json(), 'link_advice': links[2].to_json() if links[2] else None} if links else {}
        print(runjson.dumps({'tasks': [{**_plan_json(spec, task, plan, req), 'standby': kept}
                                       for task, plan in zip(spec.tasks, plans)],
                             'load': {**load.to_json(), 'advice': tip.to_json() if tip else None, **linked}
                             if load else None},
                            indent=1))
        return 0
    print(f'# {spec.path}: {_shape(spec)}; `launch up` writes the effective spec to '
          f'{effective_spec_path(spec)} (nothing is written now)')
    if spec.coordinator:
        _coordinator_lines(spec)
    elif spec.train.program:
        print(f'# every worker calls {spec.train.program}(ctx) instead of the built-in CIFAR-10 trainer')
    elif spec.train.command:
        print(f'# every task runs `{shlex.join(spec.train.command)}` plus --job_name, --task_index, --ps_hosts and '
              '--worker_hosts (python: the task\'s own interpreter); the ps tasks are stopped once every worker '
              'exited 0')
    for task, plan in zip(spec.tasks, plans):
        where = registry.kind(plan.backend).where(plan, task, req.options)
        reach = f' -> {plan.endpoint}' if plan.endpoint != plan.task.address else ''
        print(f'{plan.name}  {plan.task.address}{reach}  ({where})')
        print(f'  cwd:  {plan.cwd}')
        print(f'  run:  {shlex.join(_argv(plan))}')
        if plan.slot is not None and plan.task.job == 'worker':
            print(f'  gpus: {plan.slot.describe()}')
        for k, v in _shown_env(spec, plan).items():
            print(f'  env:  {k}={v if v == MASK else shlex.quote(v)}')
        print(f'  log:  {plan.log_path}')
    for line in load_view.lines(load) if load else ['load: not known before the run (your own program or '
                                                      'command places its variables; a run of your program '
                                                      'tells it: --from-run RUN)']:
        print(line)
    if tip:
        print(tip.line(spec.num_ps))
    if links:
        print('\n'.join(load_view.link_lines(links[0], links[1])))
        if links[2]:
            print(links[2].line())
    print(standbys.line(spec, req.backend, plans))
    zygote = standbys.zygote_line(spec, req.backend, plans)
    if zygote:
        print(zygote)
    return 0


def _links(spec: ClusterSpec, load: ps_load.Load | None, flags: PlanFlags, plans: list[TaskPlan],
           run: tuple[str, str] | None) -> tuple[link_time.Prediction, str | None, link_time.PsAdvice | None] | None:
    """`--link`'s step on links of that rate, where its compute came from (the run's images/s),
    and a ps count that would shorten it; None without --link."""
    if flags.link is None:
        return None
    if load is None:
        raise UsageError(f'{spec.path}: --link needs the ps tasks\' load; this spec runs your own program or command, '
                         'whose variables are not known before it runs (a run of your program tells them: '
                         '--from-run RUN)')
    compute, source = _measured_compute(*run) if run else (None, None)
    worker = next((p for p in plans if p.task.job == 'worker'), None)
    images = spec.train.batch_size * _towers(spec, worker)
    now = link_time.predict(load, spec, flags.link, images, compute)
    workers = [t.host for t in spec.job_tasks('worker')][:load.workers]
    builtin = load.placement == ps_load.PLACEMENT_BY_BYTES
    advice = link_time.ps_advice(now, lambda k: ps_load.per_ps_wire_bytes(spec, k), workers, load.sync, images,
                                 compute) if builtin else None
    return now, source, advice


def _from_run(ref: str) -> tuple[str, str]:
    """The train_dir and id of the run --from-run names."""
    train_dir = runs.resolve(ref)
    info = runs.describe(train_dir)
    return train_dir, info.id if info is not None else ref


def _own_run(spec: ClusterSpec) -> tuple[str, str] | None:
    """The train_dir and id of the run the spec's own train_dir holds, if any."""
    info = runs.describe(spec.train.train_dir) if os.path.isdir(spec.train.train_dir) else None
    return (os.path.abspath(spec.train.train_dir), info.id) if info is not None else None


def _run_load(spec: ClusterSpec, train_dir: str, run: str, asked: bool = True) -> ps_load.Load | None:
    """The load of the variables a run of the user's program placed: a coordinator run's
    variables.json, else a TF1 program's newest checkpoint's graph. A run that left neither is an
    error where it was `asked` for (--from-run), else no load."""
    try:
        found = placed.recorded(train_dir)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if found is None:
        if not asked:
            return None
        raise UsageError(f'{train_dir}: run {run} left no {rundir.VARIABLES_FILE} (a coordinator run\'s chief writes '
                         'it once its program has stepped) and no checkpoint with its graph (a TF1 program\'s '
                         '.meta)')
    return ps_load.run_load(spec, found[0], f'{run} ({found[1]})')


def _towers(spec: ClusterSpec, worker: TaskPlan | None) -> int:
    """A worker's towers: each takes a batch a step."""
    devices = spec.train.devices
    if devices == 'auto':
        gpus = worker.slot.gpus if worker is not None and worker.slot is not None else None
        return max(1, len(gpus or ()))
    return devices if isinstance(devices, int) else len(devices)


def _measured_compute(train_dir: str, run: str) -> tuple[float, str]:
    """The images/s a run measured (its run.json, else its newest progress event), and a few words
    naming it; UsageError for a run that measured none."""
    record = typed_run_record(rundir.run_path(train_dir))
    rate = record.images_per_sec if record.has('images_per_sec') else None
    rate = rate or next((e.images_per_sec for e in reversed(typed_events(rundir.events_path(train_dir)))
                         if isinstance(e, Progress) and e.images_per_sec), None)
    if not rate:
        raise UsageError(f'{train_dir}: run {run} measured no images/s (it trained no steps?)')
    return float(rate), f'run {run}\'s {rate:,.0f} images/s'


def _argv(plan: TaskPlan) -> list[str]:
    """The task's command line as it is started (inside its network namespace, if it has one)."""
    return list(netns.wrap(plan.netns, plan.argv) if plan.netns else plan.argv)


def _shown_env(spec: ClusterSpec, plan: TaskPlan) -> dict[str, str]:
    """The task's environment as `plan` shows it: a secret-looking name's value, or one taken from
    the launcher's environment, as *** (cluster/spec/environ.py)."""
    return masked(plan.env, lambda name: spec.hides(plan.task.job, name))


def _plan_json(spec: ClusterSpec, task: TaskSpec, plan: TaskPlan, req: Request[PlanFlags]) -> dict:
    """One task of `launch plan --json`."""
    return {'task': plan.name, 'address': task.address, 'endpoint': plan.endpoint, 'backend': plan.backend,
            'where': registry.kind(plan.backend).where(plan, task, req.options), 'cwd': plan.cwd,
            'argv': _argv(plan), 'env': _shown_env(spec, plan),
            'gpus': None if plan.slot is None or plan.slot.gpus is None else list(plan.slot.gpus),
            'log': plan.log_path}
