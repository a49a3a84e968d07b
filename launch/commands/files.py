"""`launch compose` and `launch render`: the spec as another tool's file (a compose file, a Slurm
batch script, a Kubernetes object), written or printed, starting nothing."""
from __future__ import annotations

import os
import sys

from cluster.runtime.rundir import PRIVATE
from cluster.spec import ClusterSpec
from launch.commands.flags import OutputFlags, RenderFlags
from launch.commands.request import Request
from launch.errors import UsageError
from launch.render import RENDERERS, option_refusal


def cmd_compose(spec: ClusterSpec, req: Request[OutputFlags]) -> int:
    from launch.planning.plan import compose_spec, plan_compose
    from launch.render.compose import render
    from launch.run.launching import check_limits
    output = req.flags.output
    plans = list(plan_compose(spec))
    check_limits(spec, plans)
    text = render(compose_spec(spec), plans, spec.path)
    if write_output(text, output, spec.has_hidden_env):
        print(f'wrote {output}: {len(spec.tasks)} services; run it with '
              f'`launch up {spec.path} --backend compose`')
    return 0


def write_output(text: str, path: str | None, private: bool = False) -> bool:
    """`text` to the file at `path` (True), or to standard output when there is none (False).
    `private`: the text holds values of the tasks' environment that the spec hides (a scheduler's
    file must carry them), so the file is its owner's alone (rundir.PRIVATE)."""
    if not path:
        sys.stdout.write(text)
        return False
    try:
        with open(path, 'w') as f:
            if private:
                os.fchmod(f.fileno(), PRIVATE)
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
    if write_output(RENDERERS[flags.format].render(spec, flags.render), flags.output, spec.has_hidden_env):
        print(f'wrote {flags.output} ({flags.format})')
    return 0
