"""`launch compose` and `launch render`: the spec as another tool's file (a compose file, a Slurm
batch script, a Kubernetes object), written or printed, starting nothing."""
from __future__ import annotations

import sys

from cluster.spec import ClusterSpec
from launch.commands.flags import OutputFlags, RenderFlags
from launch.commands.request import Request
from launch.errors import UsageError
from launch.render import RENDERERS, option_refusal


def cmd_compose(spec: ClusterSpec, req: Request[OutputFlags]) -> int:
    from launch.planning.plan import compose_spec, plan_compose
    from launch.render.compose import render
    output = req.flags.output
    text = render(compose_spec(spec), list(plan_compose(spec)), spec.path)
    if write_output(text, output):
        print(f'wrote {output}: {len(spec.tasks)} services; run it with '
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


def cmd_render(spec: ClusterSpec, req: Request[RenderFlags]) -> int:
    """The spec in a scheduler's own format, by the renderer launch/render/__init__.py names."""
    from launch.render.sbatch import option_problem     # the --partition, --time-limit, --port-base given
    flags = req.flags
    problem = option_problem(spec, flags.render) or option_refusal(flags.format, flags.render)
    if problem:
        raise UsageError(problem)
    if write_output(RENDERERS[flags.format].render(spec, flags.render), flags.output):
        print(f'wrote {flags.output} ({flags.format})')
    return 0
