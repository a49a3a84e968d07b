"""The `launch` command line: argparse and dispatch. cli.py turns argparse's namespace into typed
flags (launch/commands/flags.py) and nothing past it sees the namespace; the commands themselves
are in launch/commands/; each backend the registry lists (launch/run/registry.py) adds and reads
its own flags, and the formats of `launch render` are in launch/render/__init__.py."""
from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections.abc import Callable

from cluster.runtime import runjson
from cluster.runtime.rundir import EXIT_USAGE
from cluster.spec import ClusterSpec, SpecError, load_spec
from cluster.spec.load import take_overrides
from launch.commands import COMMANDS, Request, check_request, cmd_download, cmd_list, load_target
from launch.commands.flags import (DownloadFlags, EvalFlags, JsonFlags, ListFlags, LogsFlags, NoFlags, OutputFlags,
                                   PlanFlags, PreemptFlags, RenderFlags, ScaleFlags, StatusFlags, UpFlags)
from launch.errors import LaunchError, NoSuchRun
from launch.records.runs import RunNotFound
from launch.render import RENDERERS, RenderOptions, takers
from launch.backends.kind import FlagPlace
from launch.run import registry
from launch.run.launching import backend_help


RUN_COMMANDS = ('status', 'down', 'logs', 'eval', 'report', 'scale', 'debug', 'preempt')     # they take a run id or train_dir too
# The commands that hand the tasks their environment, or show or write it: every `{from_env: NAME}`
# of the spec must have its value (the others, `down` of a run included, work without).
VALUE_COMMANDS = ('up', 'plan', 'check', 'compose', 'render')


def _spec_args(p: argparse.ArgumentParser, run: bool = False) -> None:
    p.add_argument('spec', metavar='SPEC|RUN' if run else 'SPEC',
                   help='cluster spec, e.g. specs/local2.yaml' + (', or a run: its id (as `launch list` shows it, '
                                                                  'found under . or among the runs you started) or '
                                                                  'its train_dir' if run else ''))
    p.add_argument('--set', dest='overrides', action='append', default=[], metavar='KEY=VALUE',
                   help='override a spec key, e.g. --set train.steps=50 (repeatable)')
    _backend_flags(p, FlagPlace.SPEC)
    p.add_argument('--backend', choices=registry.names(), default=None, help=backend_help())


def _backend_flags(p: argparse.ArgumentParser, place: FlagPlace) -> None:
    """Each backend's own flags at this place of a command, in the registry's order."""
    for backend in registry.BACKENDS:
        backend.add_flags(p, place)


def _readers(option: str) -> str:
    """'jobset, trainjob, tfjob: ': the formats that read a render option, as its help begins."""
    return f'{", ".join(takers(option))}: '


def build_parser() -> argparse.ArgumentParser:
    """The whole command line, parsing nothing: parse_args uses it, and the site's command-line
    reference (docs/reference/cli.md) is made from it at build time."""
    p = argparse.ArgumentParser(prog='launch', description='Launch and manage TensorFlow parameter-server clusters.')
    p.add_argument('--version', action='version', version=f'%(prog)s {_version()}')
    sub = p.add_subparsers(dest='command', required=True, metavar='COMMAND')
    _add_run_commands(sub)
    _add_reading_commands(sub)
    _add_file_commands(sub)
    for choice in sub._choices_actions:        # `launch up -h` opens with what the command list says of it
        command = sub.choices[choice.dest]
        command.description = command.description or choice.help
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = build_parser()
    rest, overrides = take_overrides(sys.argv[1:] if argv is None else list(argv))
    args = p.parse_args(rest)
    if overrides:       # taken out before argparse, which is quadratic in the options (take_overrides)
        if not hasattr(args, 'overrides'):
            p.error(f'unrecognized arguments: --set {overrides[0]}')
        args.overrides = overrides + args.overrides
    return args


def _add_run_commands(sub: argparse._SubParsersAction) -> None:
    """up, scale, status, down, logs, debug: the commands that start, change, watch or stop a run."""
    up = sub.add_parser('up', help='start every task, train to the end, tear down')
    _spec_args(up)
    up.add_argument('--start-timeout', type=float, default=120.0, metavar='SECS',
                    help='how long every server may take to accept connections (default 120)')
    up.add_argument('-v', '--verbose', action='store_true',
                    help="also show TensorFlow's C++ start-up messages and, in a run of more than 50 tasks, every "
                         "task's progress lines (only the chief's otherwise); the log files keep every line")
    up.add_argument('--finish-timeout', type=float, default=60.0, metavar='SECS',
                    help='how long the tasks left may run once one side finished: the ps tasks after the workers, '
                         'an evaluator (its last evaluation) after the chief (default 60)')
    up.add_argument('--workers', type=int, default=None, metavar='N',
                    help='start the first N workers of the spec\'s list (a pool; default: all); '
                         '`launch scale` changes the number while the run goes on')
    up.add_argument('--rehearse', action='store_true',
                    help='a dress rehearsal: every task a light stand-in (no TensorFlow) on its real host and backend '
                         'that serves, reaches its peers and reports the links, then ends at train.steps')
    _backend_flags(up, FlagPlace.UP)
    sc = sub.add_parser('scale', help='change the number of running workers of a run (async: live)')
    _spec_args(sc, run=True)
    sc.add_argument('--workers', type=int, required=True, metavar='M', help='how many workers should run (1..the pool)')
    st = sub.add_parser('status', help="a run's state and each task's pid, whether it is alive and listening "
                                       '(exit 0: running or done, 1: failed or interrupted, 3: no such run)')
    _spec_args(st, run=True)
    _json_arg(st)
    st.add_argument('--all', action='store_true',
                    help='a row per task, however many (a run of more than 12 tasks is shown one line per job: '
                         'its tasks counted by state, those to look at named)')
    down = sub.add_parser('down', help="stop whatever is left of the spec's cluster")
    _spec_args(down, run=True)
    logs = sub.add_parser('logs', help="print a task's log (all tasks when none is named)")
    _spec_args(logs, run=True)
    logs.add_argument('task', nargs='?', help='job:index, e.g. worker:1')
    logs.add_argument('-f', '--follow', action='store_true', help='keep printing new lines until Ctrl-C')
    logs.add_argument('--attempt', type=int, metavar='N', help="attempt N's logs (default: the newest attempt's)")
    debug = sub.add_parser('debug', help="every task of a running run writes its Python stacks (every thread's) "
                                         'to <train_dir>/stacks/attempt-N/ (exit 1: none answered, 2: not running)')
    _spec_args(debug, run=True)
    preempt = sub.add_parser('preempt', help='give a task of a running run the preemption notice a spot watcher would: '
                                             'it has supervise.preemption_grace seconds to save and go, and no fault '
                                             'is counted')
    _spec_args(preempt, run=True)
    preempt.add_argument('task', help='job:index, e.g. ps:0')


def _add_reading_commands(sub: argparse._SubParsersAction) -> None:
    """plan, eval, check, report, list: the commands that look and tell, changing no run."""
    plan = sub.add_parser('plan', help='print what `up` would run for each task, starting nothing')
    _spec_args(plan)
    _json_arg(plan)
    plan.add_argument('--link', type=_link_rate, metavar='RATE',
                      help="predict a step on links of RATE each way, one per host (1gbit, 10gbit, 100mbit)")
    plan.add_argument('--from-run', metavar='RUN',
                      help="a run of this spec (id or folder): its images/s is --link's compute, and for your own "
                           "program where each variable went (its variables.json, or its checkpoint's .meta); "
                           "default: the spec's train_dir")
    ev = sub.add_parser('eval', help="precision@1 on the test split from the newest checkpoint (moving averages)")
    _spec_args(ev, run=True)
    ev.add_argument('--checkpoint', help='a checkpoint prefix (default: the newest in train_dir)')
    ev.add_argument('-v', '--verbose', action='store_true', help="also show TensorFlow's C++ start-up messages")
    check = sub.add_parser('check', help='pre-flight every host: reachable, TensorFlow and tfcluster import, '
                                         'ports free')
    _spec_args(check)
    _json_arg(check)
    rep = sub.add_parser('report', help="write a run's report: one self-contained HTML page (timeline, loss and "
                                        'images/s, attempts, the result)')
    _spec_args(rep, run=True)
    rep.add_argument('-o', '--output', metavar='FILE', help='where to write it (default: <train_dir>/report.html)')
    ls = sub.add_parser('list', help='the runs you started with `launch up`, from anywhere (or those under DIR)')
    ls.add_argument('dir', nargs='?', default=None, metavar='DIR',
                    help='list the runs found in DIR and a few levels below it instead (e.g. `.`), also those '
                         'your index of runs does not hold (copied, or started by someone else)')
    _json_arg(ls)


def _add_file_commands(sub: argparse._SubParsersAction) -> None:
    """compose, render, download: the commands that write files."""
    comp = sub.add_parser('compose', help='write the compose file `up --backend compose` runs, starting nothing')
    _spec_args(comp)
    comp.add_argument('-o', '--output', metavar='FILE', help='where to write it (default: standard output)')
    _add_render(sub)
    dl = sub.add_parser('download', help='download and verify the real CIFAR-10 (binary version, 170 MB); '
                                         'the only command that uses the network')
    dl.add_argument('dest', nargs='?', default='data', help='where to put it (default: ./data); the files land '
                                                            'in DEST/cifar-10-batches-bin')
    dl.add_argument('--url', default=None, help='a mirror of cifar-10-binary.tar.gz')
    dl.add_argument('--md5', default=None, help="the archive's MD5 (default: the published one)")


def _add_render(sub: argparse._SubParsersAction) -> None:
    """render: its formats and the options each reads come from the renderer table."""
    ren = sub.add_parser('render', help='write the spec as a Slurm batch script or a Kubernetes object (JobSet, '
                                        'Kubeflow TrainJob or TFJob), starting nothing')
    _spec_args(ren)
    ren.add_argument('--format', required=True, choices=tuple(RENDERERS),
                     help='; '.join(f'{r.name}: {r.description}' for r in RENDERERS.values()))
    ren.add_argument('-o', '--output', metavar='FILE', help='where to write it (default: standard output)')
    ren.add_argument('--name', help='the job name (default: from the spec file name)')
    ren.add_argument('--image', help=f'{_readers("image")}the container image (default: the compose image, '
                                     'tfcluster:latest)')
    ren.add_argument('--namespace', help=f'{_readers("namespace")}the Kubernetes namespace (default: none, '
                                         'kubectl\'s current one)')
    ren.add_argument('--pvc', metavar='CLAIM',
                     help=f'{_readers("pvc")}the workers\' train_dir on this PersistentVolumeClaim (ReadWriteMany '
                          'when workers can land on different nodes), so checkpoints outlive the pods (default: an '
                          'emptyDir)')
    _backend_flags(ren, FlagPlace.RENDER)


def _json_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument('--json', action='store_true', help='print JSON instead of text (its fields: docs/runs.md)')


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version('tfcluster')
    except PackageNotFoundError:
        return 'unknown (not installed)'


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.command != 'up':        # `launch plan ... | head` ends quietly; `up` must always tear down
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    logging.basicConfig(level=logging.WARNING, format='launch: %(levelname)s: %(message)s')
    runjson.forget_warnings()       # once per command, not once per process (commands run in one test process)
    once = [(handler, Once()) for handler in logging.getLogger().handlers]
    for handler, each in once:
        handler.addFilter(each)
    try:
        return dispatch(args)
    except LaunchError as e:
        return _fail(e, e.exit_code)
    except SpecError as e:          # the spec's user error (cluster/ never imports launch/): exit 2
        return _fail(e, EXIT_USAGE)
    finally:
        for handler, each in once:
            handler.removeFilter(each)


class Once(logging.Filter):
    """Each message once per command: several readers of one run's files (its id resolved, its
    description, its report) each skip the same damaged line with a warning, and saying it two or
    three times tells the user nothing more."""

    def __init__(self) -> None:
        super().__init__()
        self._seen: set[tuple[int, str]] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.levelno, record.getMessage())
        if key in self._seen:
            return False
        self._seen.add(key)
        return True


def _fail(error: Exception, code: int) -> int:
    print(f'launch: error: {error}', file=sys.stderr)
    return code


def dispatch(args: argparse.Namespace) -> int:
    """Run the command the namespace names, with its flags typed; its exit code."""
    if args.command == 'download':
        return cmd_download(DownloadFlags(args.dest, args.url, args.md5))
    if args.command == 'list':
        return cmd_list(ListFlags(args.dir, args.json))
    given = options(args)       # each backend reads its flags (and refuses a bad one) before the spec is read
    spec, remembered = _target(args)
    if args.command in VALUE_COMMANDS:
        spec.check_references()
    flags = FLAGS[args.command](args)
    request = check_request(spec, Request(args.command, args.backend or remembered, given, flags))
    return COMMANDS[args.command](spec, request)


def _target(args: argparse.Namespace) -> tuple[ClusterSpec, str | None]:
    """The spec the command acts on, and the backend its run remembers (None: as the hosts say)."""
    if args.command not in RUN_COMMANDS:
        return load_spec(args.spec, args.overrides), None
    try:
        return load_target(args.spec, args.overrides)
    except RunNotFound as e:
        if args.command == 'status':        # exit 3: no such run, as `systemctl status` says
            raise NoSuchRun(str(e)) from None
        raise


def options(args: argparse.Namespace) -> registry.Options:
    """Every backend's options, each read by the backend from its own flags (a flag the command
    lacks: that option's default)."""
    read = {k.name: k.read_flags(args) for k in registry.BACKENDS}
    return registry.Options({name: value for name, value in read.items() if value is not None})


def _render_flags(args: argparse.Namespace) -> RenderFlags:
    return RenderFlags(args.format, args.output, RenderOptions(
        name=args.name, image=args.image, namespace=args.namespace, pvc=args.pvc, partition=args.partition,
        time_limit=args.time_limit, port_base=args.port_base))


def _link_rate(text: str) -> float:
    from launch.planning.link_time import parse_rate
    try:
        return parse_rate(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix('--link: ')) from None


def _json_flags(args: argparse.Namespace) -> JsonFlags:
    return JsonFlags(args.json)


def _output_flags(args: argparse.Namespace) -> OutputFlags:
    return OutputFlags(args.output)


# a command on a spec or run -> its flags, typed, from argparse's namespace
FLAGS: dict[str, Callable[[argparse.Namespace], object]] = {
    'up': lambda a: UpFlags(workers=a.workers, verbose=a.verbose, start_timeout=a.start_timeout,
                            finish_timeout=a.finish_timeout, overrides=tuple(a.overrides), rehearse=a.rehearse),
    'scale': lambda a: ScaleFlags(a.workers),
    'status': lambda a: StatusFlags(a.json, a.all), 'check': _json_flags,
    'plan': lambda a: PlanFlags(a.json, a.link, a.from_run),
    'down': lambda a: NoFlags(), 'debug': lambda a: NoFlags(), 'preempt': lambda a: PreemptFlags(a.task),
    'logs': lambda a: LogsFlags(task=a.task, follow=a.follow, attempt=a.attempt),
    'eval': lambda a: EvalFlags(a.checkpoint, a.verbose),
    'report': _output_flags, 'compose': _output_flags,
    'render': _render_flags,
}
