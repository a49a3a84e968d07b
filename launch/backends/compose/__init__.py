"""The compose backend: every task in a container of one compose project on this machine, on the
project's internal network. `Compose` is what the launcher knows of it (launch/backends/kind.py);
the project is written, started, watched and removed by `backend`."""
from __future__ import annotations

from cluster.spec import ClusterSpec, TaskSpec
from launch.backends.base import Backend
from launch.backends.compose.backend import BUILD_SCRIPT, ComposeBackend, compose_path, project_name
from launch.backends.kind import Kind, Options
from launch.planning.plan import TaskPlan, plan_compose, service_name

__all__ = ['BUILD_SCRIPT', 'Compose', 'ComposeBackend', 'compose_path', 'project_name']


class Compose(Kind):
    """Containers of the tfcluster image: they see only what the image holds, their ports only
    each other, and stopping them leaves the project's containers and network for `down`."""
    name = 'compose'
    summary = 'compose: every task in a container of one compose project on this machine'
    isolates_ports = True
    logs_here = True
    remembered = True
    leaves_resources = True
    user_code_refusal = ('the compose backend runs the tfcluster image, which holds tfcluster and the examples/ '
                         'folder only, not {code}: run it with the local or SSH backend, or on Kubernetes from an '
                         'image built FROM tfcluster with your code (docs/own-code.md)')
    ships = ('examples',)
    standby_refusal = ('a container is its task: a restart starts the container again, where no warm process '
                       'can wait')
    netns_refusal = ('isolation: netns is for local processes; the compose backend runs the tasks on its own '
                     'internal network already, which nothing outside reaches: drop isolation (--set '
                     'isolation=none) to use it')

    def plan(self, spec: ClusterSpec, addresses: dict[str, str], counts: dict[str, int]) -> tuple[TaskPlan, ...]:
        return plan_compose(spec, counts)

    def where(self, plan: TaskPlan, task: TaskSpec, opts: Options) -> str:
        return f'compose service {service_name(task)}, was {task.address} in the spec'

    def make(self, spec: ClusterSpec, opts: Options) -> Backend:
        return ComposeBackend(spec)
