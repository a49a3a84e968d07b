"""The bodies of the `launch` commands. launch/cli.py parses the command line and calls one of
these with the loaded spec; the backends they need come from launch/run/registry.py."""
from __future__ import annotations

import dataclasses
import functools
import json
import os
import shlex
import signal
import sys
import threading
import time
from dataclasses import dataclass

from cluster.runtime import rundir
from cluster.runtime.rundir import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from cluster.spec import ClusterSpec, SpecError, load_spec
from launch.planning import gpus
from launch.backends import netns
from launch.run import registry
from launch.records import runs
from launch.backends.base import BackendError, HostCheck, stop_all
from launch.errors import EXIT_NO_RUN, LaunchError, UsageError
from launch.run.lifecycle import Console, Lifecycle
from launch.planning.plan import TaskPlan, effective_spec_path, log_path, state_path
from launch.run.preflight import check_isolation, checks_before_up, launcher_alive, warn_exposure
from launch.records.events import read_events
from launch.run.state import LaunchState, StateError

@dataclass(frozen=True)
class Request:
    """One command as the command line gave it, parsed: what the bodies below take."""
    command: str
    backend: str | None
    options: registry.Options
    args: object        # the command's own flags (argparse's namespace), read by its body only


def load_target(ref: str, overrides: list[str]) -> tuple[ClusterSpec, str | None]:
    """The spec a command acts on, and the backend its run remembers (None: as the hosts say):
    a spec file as given; or a run (its id, or its train_dir), loaded as it was started (its spec
    file and --set options; relative paths in them as seen from the directory it ran in), with
    its train_dir where it is now. A run whose spec file is gone falls back on the effective spec
    it left in its train_dir (without SSH settings). Raises runs.RunNotFound."""
    if os.path.isfile(ref) or ref.endswith(('.yaml', '.yml')):
        return load_spec(ref, overrides), None
    train_dir = runs.resolve(ref)
    started = [e for e in read_events(rundir.events_path(train_dir)) if e.get('event') == 'run_started']
    first = started[-1] if started else {}
    remembered = registry.remembered([first.get('backend')])
    if os.path.isfile(str(first.get('spec'))):
        path, given = first['spec'], list(first.get('overrides') or []) + overrides
    else:
        path, given = rundir.spec_path(train_dir), overrides
    given.append(f'train.train_dir={train_dir}')
    spec = load_spec(path, given)
    cwd = str(first.get('cwd') or '')
    if spec.train.data != 'synthetic' and not os.path.isabs(spec.train.data) and os.path.isdir(cwd):
        spec = load_spec(path, given + [f'train.data={os.path.join(cwd, spec.train.data)}'])
    return spec, remembered


def plans_of(spec: ClusterSpec, req: Request) -> list[TaskPlan]:
    return registry.plans(spec, req.backend, req.options)


def backends_for(spec: ClusterSpec, req: Request, plans: list[TaskPlan], state: LaunchState | None = None):
    """The backends the plans need, and those of any task the state file remembers."""
    names = {p.backend for p in plans} | {r.backend for r in (state.tasks if state else [])}
    return registry.make_backends(spec, req.options, names)


def check_request(spec: ClusterSpec, req: Request) -> Request:
    """Options a backend does not take, commands it cannot serve, isolation it cannot give:
    UsageError. Returns the request with the backend the state file remembers filled in."""
    registry.check_options(spec, req.command, req.backend, req.options)
    check_isolation(spec, req.command, req.backend)
    if req.backend is None and req.command in ('status', 'down', 'logs', 'scale'):
        state = LaunchState.load(state_path(spec))
        remembered = registry.remembered({r.backend for r in state.tasks}) if state else None
        if remembered:
            return Request(req.command, remembered, req.options, req.args)
    return req


# -- up ----------------------------------------------------------------------------------------
def check_workers(spec: ClusterSpec, workers: int | None, flag: str = '--workers') -> None:
    """A worker count for `up --workers` or `scale --workers`: 1..the spec's pool, else UsageError."""
    if workers is not None and not 1 <= workers <= spec.num_workers:
        raise UsageError(f'{flag} {workers}: expected 1..{spec.num_workers}, the workers {spec.path} lists '
                         '(the pool; worker 0, the chief, always runs)')


def cmd_up(spec: ClusterSpec, req: Request) -> int:
    args = req.args
    check_workers(spec, args.workers)
    console = Console(verbose=args.verbose)
    kind = registry.kind(req.backend)
    if args.workers not in (None, spec.num_workers):
        if kind.mode == registry.DELEGATED:
            raise UsageError(f'--workers {args.workers}: the {kind.name} scheduler runs every worker of the spec; '
                             'change the spec\'s worker list instead')
        r = spec.train.replicas_to_aggregate
        if spec.train.sync and r and args.workers < r:
            raise UsageError(f'--workers {args.workers}: fewer than train.replicas_to_aggregate ({r}), which each '
                             'sync step needs')
        if spec.train.command:
            raise UsageError(f'--workers {args.workers}: a train.command gets every worker of the spec')
    settings = registry.UpSettings(workers=args.workers, start_timeout=args.start_timeout,
                                   finish_timeout=args.finish_timeout, say=console.say, checks=checks_before_up,
                                   warn=functools.partial(warn_exposure, short=True))
    with registry.strategy(spec, req.backend, req.options, settings) as launch:
        life = Lifecycle(spec, console, launch.backend, launch.spec_yaml, overrides=args.overrides)
        return life.up(launch.strategy).exit_code


def cmd_scale(spec: ClusterSpec, req: Request) -> int:
    """Ask the running launcher of the run for M workers; wait until the change took effect."""
    from launch.run import control
    from launch.run.state import LockBusy, TrainDirLock
    workers = req.args.workers
    check_workers(spec, workers)
    train_dir = spec.train.train_dir
    if registry.kind(req.backend).mode == registry.DELEGATED:
        raise UsageError(f'launch scale: the {registry.kind(req.backend).name} scheduler owns the size of the job')
    if TrainDirLock.held(train_dir) is None:
        raise UsageError(f'launch scale: no launcher runs {spec.path} (train_dir {train_dir}); '
                         f'`launch up {spec.path} --workers {workers}` starts it with {workers}')
    lock = TrainDirLock(train_dir, control.LOCK_FILE)
    try:
        lock.acquire(f'launch scale (pid {os.getpid()}) to {workers} workers')
    except LockBusy as e:
        raise UsageError(f'launch scale: another scale of this run is under way ({e})') from None
    try:
        ident = control.send(train_dir, workers)
        reply = control.wait(train_dir, ident, lambda: TrainDirLock.held(train_dir) is not None)
    finally:
        lock.release()
    if reply is None:
        print(f'launch: error: the launcher of {spec.path} ended before it carried out the change', file=sys.stderr)
        return EXIT_FAILED
    for line in reply['lines']:
        print(line)
    return EXIT_OK if reply['state'] == control.DONE else EXIT_FAILED


# -- status, down, logs --------------------------------------------------------------------------
def _no_state(spec: ClusterSpec) -> str:
    return (f'no cluster of {spec.path} is known here (no {os.path.abspath(state_path(spec))}; a relative '
            'train_dir is relative to the directory `launch up` ran in)')


def cmd_status(spec: ClusterSpec, req: Request) -> int:
    """The run's state and its tasks. Exit code 0: running or done; 1: failed or interrupted;
    3: no run of this spec is known in its train_dir."""
    plans = plans_of(spec, req)
    state = LaunchState.load(state_path(spec))
    info = runs.describe(spec.train.train_dir)
    tasks = _task_status(spec, req, plans, state)
    code = EXIT_NO_RUN if info is None and state is None else \
        EXIT_OK if info is None or info.state in ('running', 'done') else EXIT_FAILED
    if req.args.json:
        print(json.dumps({'run': info.to_json() if info else None,
                          'launcher': {'pid': state.launcher_pid, 'alive': launcher_alive(state)} if state else None,
                          'progress': state.progress if state else None, 'restarts': state.restarts if state else 0,
                          'workers': state.workers if state else None, 'tasks': tasks}, indent=1))
        return code
    if info is not None:
        print(f'run {info.id}: {info.state}, attempt {info.attempts}'
              + (f', global step {info.global_step}' if info.global_step is not None else '')
              + f' ({os.path.abspath(spec.train.train_dir)})')
    if state is None:
        print(f'no cluster of {spec.path} is running: no task of it is left to show' if info else _no_state(spec))
    elif launcher_alive(state):
        restarts = f', {state.restarts} restart(s)' if state.restarts else ''
        print(f'launcher pid {state.launcher_pid}, started {time.ctime(state.started)}{restarts}')
        w = state.workers
        if w and len(w.get('live', [])) != w.get('pool'):
            print(f'workers: {len(w["live"])} of a pool of {w["pool"]} run '
                  f'({", ".join(f"worker:{i}" for i in w["live"])})'
                  + (f'; scaling to {w["scaling"]}' if w.get('scaling') else ''))
    else:
        cleaned = _clean_up_after(spec, req, plans, state, tasks)
        print(f'launcher pid {state.launcher_pid} is gone; '
              + (cleaned or f'`launch down {spec.path}` stops what is left'))
    if state is not None:
        p = state.progress
        if p:
            print(f'global step {p["global_step"]}/{p["steps"]}, seen {max(0.0, time.time() - p["at"]):.0f}s ago')
        else:
            print('global step: none seen yet')
    print(f'{"TASK":<10} {"ADDRESS":<22} {"BACKEND":<7} {"PID":>7}  {"ALIVE":<5}  {"LISTENING":<9}  NOTE')
    for t in tasks:
        shown = {True: 'yes', False: 'no', None: '?'}[t['alive']]
        print(f'{t["task"]:<10} {t["address"]:<22} {t["backend"]:<7} {t["pid"] or "-":>7}  '
              f'{shown:<5}  {"yes" if t["listening"] else "no":<9}  {t["note"]}'.rstrip())
    return code


def _clean_up_after(spec: ClusterSpec, req: Request, plans: list[TaskPlan], state: LaunchState,
                    tasks: list[dict]) -> str:
    """A dead launcher whose tasks have all ended (by their lease) may have left resources behind
    (a compose project's exited containers and network): remove them, idempotently. Returns what
    was done, in words, or ''."""
    if any(t['alive'] is not False for t in tasks):
        return ''
    kinds = {r.backend for r in state.tasks if registry.kind(r.backend).leaves_resources}
    if not kinds:
        return ''
    with backends_for(spec, req, plans, state) as backends:
        try:
            stop_all([r for r in state.tasks if r.backend in kinds], backends)
        except BackendError as e:
            return f'could not remove what it left ({e}); `launch down {spec.path}` tries again'
    return f'its tasks have ended, and what they left on {", ".join(sorted(kinds))} is removed'


def _task_status(spec: ClusterSpec, req: Request, plans: list[TaskPlan], state: LaunchState | None) -> list[dict]:
    """Each task as `launch status` shows it: alive (None: cannot tell), listening, a note."""
    records = {r.name: r for r in (state.tasks if state else [])}
    out = []
    with backends_for(spec, req, plans, state) as backends:
        for plan in plans:
            r = records.get(plan.name)
            backend = backends[r.backend if r else plan.backend]
            # compose: the record has its container's address; SSH: the address tasks reach it at; a
            # private network namespace: asked from inside
            seen = backend.status(r) if r else None
            listening = backend.probe(r or backend.log_record(plan), 0.5, handshake=False)
            alive = {None: False, 'running': True, 'ended': False, 'unknown': None}[seen and seen.state]
            note = (seen.stopped or '') if alive else f'unknown: {seen.error}' if alive is None else ''
            live = state.workers.get('live') if state and state.workers else None
            if not note and plan.task.job == 'worker' and live is not None and plan.task.index not in live:
                note = 'spare: in the pool, not running (`launch scale`)'
            out.append({'task': plan.name, 'address': plan.task.address, 'backend': plan.backend,
                        'pid': r.pid if r else None, 'alive': alive, 'listening': listening, 'note': note})
    return out


def cmd_down(spec: ClusterSpec, req: Request) -> int:
    plans = plans_of(spec, req)
    state = LaunchState.load(state_path(spec))
    if state is None:
        with backends_for(spec, req, []) as backends:
            if not _release(backends, plans):     # a namespace a launcher killed early may have left
                return 1
        print(f'nothing to stop: {_no_state(spec)}')
        return 0
    if launcher_alive(state):       # the launcher tears its own cluster down on SIGTERM
        try:
            os.kill(state.launcher_pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + 45       # the chief's checkpoint (25 s), then the rest (5 + 5 s)
        while launcher_alive(state) and time.monotonic() < deadline:
            time.sleep(0.1)
    with backends_for(spec, req, plans, state) as backends:
        # A backend that leaves resources behind (a compose project's containers and network) is
        # always stopped, whether or not its tasks still run.
        left = [r for r in state.tasks
                if registry.kind(r.backend).leaves_resources or backends[r.backend].status(r).alive]
        stop_all(left, backends)
        still = [r.name for r in state.tasks if backends[r.backend].status(r).alive]
        if not still and not _release(backends, plans):
            return 1
    if still:
        print(f'launch: error: could not stop {", ".join(still)}', file=sys.stderr)
        return 1
    if os.path.exists(state_path(spec)):
        os.remove(state_path(spec))
    print(f'stopped {len(left)} task(s) of {spec.path}' if left else f'nothing left running of {spec.path}')
    return 0


def _release(backends, plans: list[TaskPlan]) -> bool:
    """Remove what the run's backends put in place besides its tasks (a network namespace) once
    its tasks are gone; False, after one error line, if it cannot be."""
    try:
        for name, backend in backends.items():
            backend.release([p for p in plans if p.backend == name])
        return True
    except BackendError as e:
        print(f'launch: error: {e}', file=sys.stderr)
        return False


def cmd_logs(spec: ClusterSpec, req: Request) -> int:
    args = req.args
    plans = plans_of(spec, req)
    if args.task:
        chosen = [p for p in plans if p.name == args.task]
        if not chosen:
            raise UsageError(f'{spec.path}: no task {args.task!r}; tasks are {", ".join(p.name for p in plans)}')
        plans = chosen
    state = LaunchState.load(state_path(spec))
    records = {r.name: r for r in (state.tasks if state else [])}
    if args.attempt is not None:        # an earlier attempt's files, not what the running tasks write
        attempts = rundir.attempts(spec.train.train_dir)
        here = all(registry.kind(p.backend).logs_here for p in plans)
        if args.attempt not in attempts and (attempts or here):
            held = f'the logs hold attempt(s) {", ".join(map(str, attempts))}' if attempts else 'no attempt is kept here'
            raise UsageError(f'{spec.path}: no attempt {args.attempt}: {held}')
        plans = [dataclasses.replace(p, log_path=dataclasses.replace(p, attempt=args.attempt).attempt_log_path)
                 for p in plans]
        records = {}
    logs_dir = os.path.dirname(log_path(spec, spec.tasks[0]))
    if state is None and all(registry.kind(p.backend).logs_here for p in plans) and not os.path.isdir(logs_dir):
        raise UsageError(f'{spec.path}: no logs in {os.path.abspath(logs_dir)}: this spec was never started '
                         'here (a relative train_dir is relative to the directory `launch up` ran in)')
    console = Console()
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *a: stop.set())
    signal.signal(signal.SIGTERM, lambda *a: stop.set())

    def show(plan):
        record = records.get(plan.name) or backends[plan.backend].log_record(plan)  # where a started task logs
        while True:
            moved = threading.Event()       # following: a cluster restart moved the task to a new log
            if args.follow and plan.name in records:
                threading.Thread(target=_watch_moves, args=(spec, record, stop, moved), daemon=True).start()
            for line in backends[record.backend].read_log(record, follow=args.follow, stop=_either(stop, moved)):
                if len(plans) > 1:
                    console.line(plan.name, line)
                else:
                    print(line, flush=True)
            if not moved.is_set() or stop.is_set():
                return
            record = _current_record(spec, plan.name) or record

    with backends_for(spec, req, plans, state) as backends:
        threads = [threading.Thread(target=show, args=(p,), daemon=True) for p in plans]
        for t in threads:
            t.start()
            if not args.follow:
                t.join()
        while any(t.is_alive() for t in threads):
            time.sleep(0.1)
    return 0


def _current_record(spec: ClusterSpec, task: str):
    """The task's record in the state file now (None once the run is over)."""
    try:
        state = LaunchState.load(state_path(spec))
    except StateError:
        return None
    return next((r for r in (state.tasks if state else []) if r.name == task), None)


def _watch_moves(spec: ClusterSpec, record, stop: threading.Event, moved: threading.Event) -> None:
    """Set `moved` once the launcher has started the task anew with another log file."""
    while not stop.wait(1.0):
        now = _current_record(spec, record.name)
        if now is not None and now.log != record.log:
            moved.set()
            return


def _either(*events: threading.Event) -> threading.Event:
    """An event set as soon as any of `events` is."""
    both = threading.Event()

    def wait():
        while not any(e.wait(0.2) for e in events):
            pass
        both.set()
    threading.Thread(target=wait, daemon=True).start()
    return both


# -- list, report -------------------------------------------------------------------------------
def cmd_list(args) -> int:
    found = runs.find_runs(args.dir)
    if args.json:
        print(json.dumps([r.to_json() for r in found], indent=1))
    else:
        print(runs.table(found, args.dir))
    return 0


def cmd_report(spec: ClusterSpec, req: Request) -> int:
    from launch.records import report
    train_dir = spec.train.train_dir
    if runs.describe(train_dir) is None:
        raise runs.RunNotFound(f'{os.path.abspath(train_dir)} holds no run (no events.jsonl or run.json)')
    try:
        path = report.write(train_dir, req.args.output)
    except OSError as e:
        raise UsageError(f'{req.args.output or rundir.report_path(train_dir)}: cannot write: {e.strerror}') from None
    print(f'wrote {path}')
    return 0


# -- eval, check, plan ------------------------------------------------------------------------
def cmd_eval(spec: ClusterSpec, req: Request) -> int:
    from cluster import eval as evaluation
    try:
        result = evaluation.evaluate(spec, req.args.checkpoint)
    except ValueError as e:       # no checkpoint, no test data
        raise UsageError(str(e)) from None
    print(evaluation.report(result))
    return 0


def cmd_check(spec: ClusterSpec, req: Request) -> int:
    plans = plans_of(spec, req)
    with backends_for(spec, req, plans) as backends:
        checks = [c for name, b in backends.items()
                  for c in b.check([p for p in plans if p.backend == name], imports=True)]
        try:
            given = [p for p in registry.with_gpus(spec, req.backend, req.options, plans, backends)
                     if p.slot and p.slot.gpus]
            if given:
                checks.append(HostCheck('gpus', True, '; '.join(f'{p.name} {p.slot.describe()}' for p in given)))
        except gpus.GPUShortage as e:     # said in the host's own line where it has one
            for machine, names, text in e.problems:
                problem = f'train.devices: {names}: {text}'
                same = next((i for i, c in enumerate(checks) if c.host == machine), None)
                if same is None:
                    checks.append(HostCheck(machine, False, problem))
                else:
                    c = checks[same]
                    checks[same] = HostCheck(machine, False, problem if c.ok else f'{c.detail}; {problem}')
        except SpecError as e:
            checks.append(HostCheck('gpus', False, str(e)))
    code = 0 if all(c.ok for c in checks) else 1
    if req.args.json:
        print(json.dumps({'ok': code == 0, 'hosts': [dataclasses.asdict(c) for c in checks]}, indent=1))
        return code
    for c in checks:
        print(c.line())
    warn_exposure(plans)
    return code


def cmd_plan(spec: ClusterSpec, req: Request) -> int:
    plans = plans_of(spec, req)
    if req.args.json:
        print(json.dumps([_plan_json(task, plan, req) for task, plan in zip(spec.tasks, plans)], indent=1))
        return 0
    print(f'# {spec.path}: {spec.num_ps} ps, {spec.num_workers} workers, '
          f'{"sync" if spec.train.sync else "async"}; `launch up` writes the effective spec to '
          f'{effective_spec_path(spec)} (nothing is written now)')
    if spec.train.program:
        print(f'# every worker calls {spec.train.program}(ctx) instead of the built-in CIFAR-10 trainer')
    if spec.train.command:
        print(f'# every task runs `{shlex.join(spec.train.command)}` plus --job_name, --task_index, --ps_hosts and '
              '--worker_hosts (python: the task\'s own interpreter); the ps tasks are stopped once every worker '
              'exited 0')
    for task, plan in zip(spec.tasks, plans):
        where = registry.kind(plan.backend).where(plan, task, req.options)
        reach = f' -> {plan.endpoint}' if plan.endpoint != plan.task.address else ''
        print(f'{plan.name}  {plan.task.address}{reach}  ({where})')
        print(f'  cwd:  {plan.cwd}')
        print(f'  run:  {shlex.join(netns.wrap(plan.netns, plan.argv) if plan.netns else plan.argv)}')
        if plan.slot is not None and plan.task.job == 'worker':
            print(f'  gpus: {plan.slot.describe()}')
        for k, v in plan.env.items():
            print(f'  env:  {k}={shlex.quote(v)}')
        print(f'  log:  {plan.log_path}')
    return 0



def _plan_json(task, plan: TaskPlan, req: Request) -> dict:
    """One task of `launch plan --json`."""
    return {'task': plan.name, 'address': task.address, 'endpoint': plan.endpoint, 'backend': plan.backend,
            'where': registry.kind(plan.backend).where(plan, task, req.options), 'cwd': plan.cwd,
            'argv': list(netns.wrap(plan.netns, plan.argv) if plan.netns else plan.argv), 'env': dict(plan.env),
            'gpus': None if plan.slot is None or plan.slot.gpus is None else list(plan.slot.gpus),
            'log': plan.log_path}


# -- files: compose, render, download -------------------------------------------------------------
def cmd_compose(spec: ClusterSpec, req: Request) -> int:
    from launch.render.compose import render
    from launch.planning.plan import compose_spec, plan_compose
    text = render(compose_spec(spec), list(plan_compose(spec)), spec.path)
    if write_output(text, req.args.output):
        print(f'wrote {req.args.output}: {spec.num_ps + spec.num_workers} services; run it with '
              f'`launch up {spec.path} --backend compose`')
    return 0


def write_output(text: str, path: str | None) -> bool:
    """`text` to the file at `path` (True), or to standard output when there is none (False)."""
    if not path:
        sys.stdout.write(text)
        return False
    try:
        with open(path, 'w') as f:
            f.write(text)
    except OSError as e:
        raise UsageError(f'{path}: cannot write: {e.strerror}') from None
    return True


def cmd_render(spec: ClusterSpec, req: Request) -> int:
    """The spec in a scheduler's own format, by the renderer launch/render/__init__.py names."""
    from launch.render import RENDERERS, RenderOptions, option_refusal
    from launch.render.sbatch import option_problem     # the --partition, --time-limit, --port-base given
    args = req.args
    opts = RenderOptions(name=args.name, image=args.image, namespace=args.namespace, pvc=args.pvc,
                         partition=args.partition, time_limit=args.time_limit, port_base=args.port_base)
    problem = option_problem(spec, opts) or option_refusal(args.format, opts)
    if problem:
        raise UsageError(problem)
    if write_output(RENDERERS[args.format].render(spec, opts), args.output):
        print(f'wrote {args.output} ({args.format})')
    return 0


def cmd_download(args) -> int:
    from cluster.training import download
    url, md5 = args.url or download.CIFAR10_URL, args.md5 or download.CIFAR10_MD5
    try:
        download.check_arguments(url, md5)
    except ValueError as e:
        print(f'launch: error: {e}', file=sys.stderr)
        return EXIT_USAGE
    try:
        target = download.download_cifar10(args.dest, url=url, md5=md5)
    except download.DownloadError as e:
        print(f'launch: error: {e}', file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print('launch: interrupted; run the same command again to resume the download', file=sys.stderr)
        return 130
    except OSError as e:        # the destination: not writable, a full disk
        print(f'launch: error: {args.dest}: {e.strerror or e}', file=sys.stderr)
        return EXIT_USAGE
    print(f'CIFAR-10 is in {target}; train on it with --set train.data={shlex.quote(target)} '
          f'or `data: {target}` in the spec')
    return 0


COMMANDS = {'up': cmd_up, 'scale': cmd_scale, 'status': cmd_status, 'down': cmd_down, 'logs': cmd_logs, 'plan': cmd_plan,
            'check': cmd_check, 'eval': cmd_eval, 'compose': cmd_compose, 'render': cmd_render, 'report': cmd_report}
ERRORS = (SpecError, LaunchError)     # one line; a LaunchError's class carries its exit code, a SpecError's is 2
