"""The Slurm backend: `launch up --backend slurm` hands the whole cluster to Slurm as one batch
job (the sbatch renderer's script, launch/render/sbatch.py), which places and runs the tasks: a
delegated backend. `Slurm` is what the launcher knows of it (launch/backends/kind.py); `job`
submits, follows and cancels the job."""
from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from typing import Any

from cluster.env.slurm import DEFAULT_PORT_BASE
from cluster.spec import ClusterSpec
from launch.backends.kind import DELEGATED, FlagPlace, Kind, Options
from launch.backends.strategy import Strategy
from launch.render import takers
from launch.render.options import RenderOptions

__all__ = ['Slurm', 'SlurmOptions']


@dataclass(frozen=True)
class SlurmOptions:
    """How to submit the job; also the sbatch renderer's options of `launch render`."""
    partition: str | None = None
    time_limit: str | None = None
    port_base: int | None = None

    def render_options(self) -> RenderOptions:
        """The options the batch script of `up --backend slurm` is rendered with."""
        return RenderOptions(partition=self.partition, time_limit=self.time_limit, port_base=self.port_base)


def slurm_options(opts: Options) -> SlurmOptions:
    return opts.of(Slurm.name, SlurmOptions)


class Slurm(Kind):
    """One batch job of a Slurm cluster: Slurm owns the tasks; the launcher submits, watches and cancels."""
    name = 'slurm'
    mode = DELEGATED
    summary = 'slurm (up only): one batch job of a Slurm cluster, which places the tasks'
    remembered = True
    logs_here = True
    standby_refusal = 'a restart is a requeue into a new allocation, where no warm process can wait'
    netns_refusal = ('isolation: netns is for local processes; Slurm places the tasks on its nodes: drop '
                     'isolation (--set isolation=none) to use --backend slurm')
    exclusive = ('partition', 'time_limit', 'port_base')
    options_label = 'Slurm jobs'

    def add_flags(self, parser: argparse.ArgumentParser, place: FlagPlace) -> None:
        if place is FlagPlace.SPEC:
            return
        what = 'with --backend slurm: ' if place is FlagPlace.UP else f'{", ".join(takers("partition"))}: '
        parser.add_argument('--partition', help=f'{what}the Slurm partition (default: the cluster\'s default)')
        parser.add_argument('--time-limit', metavar='TIME', help=f'{what}the job\'s time limit, e.g. 1:00:00')
        parser.add_argument('--port-base', type=int, default=None, metavar='PORT',
                            help=f'{what}each node\'s tasks listen on PORT, PORT+1, ... (default {DEFAULT_PORT_BASE})')

    def read_flags(self, args: argparse.Namespace) -> SlurmOptions:
        return SlurmOptions(*(getattr(args, f, None) for f in self.exclusive))

    def check(self, spec: ClusterSpec, opts: Options) -> str | None:
        from launch.render.sbatch import option_problem
        return option_problem(spec, slurm_options(opts).render_options())

    def unsupported(self, command: str, spec: ClusterSpec) -> str | None:
        """Slurm runs the tasks of `up --backend slurm`; the commands that would find or stop them
        through the launcher's state do not know its jobs: say where to look instead."""
        if command in ('up', 'render', 'eval', 'report'):
            return None
        if command == 'scale':
            return ('launch scale: the Slurm scheduler owns the size of the job (the spec\'s worker list): stop it '
                    'and submit it again with another worker list to change it')
        if command in ('plan', 'check', 'compose'):
            return (f'launch {command} --backend slurm is not supported: Slurm places the tasks when the job starts; '
                    f'`launch render {spec.path} --format sbatch` shows what the job runs')
        from cluster.runtime import rundir
        from launch.render.sbatch import job_name
        if command == 'debug':      # its tasks install the dump all the same (not scancel --signal: it reaches
            # the shell a coordinator run's chief rank waits in, which SIGUSR1 would end)
            return (f'launch debug --backend slurm is not supported: Slurm runs that job; on a task\'s node, '
                    f'`kill -USR1 PID` of its Python process writes its stacks under '
                    f'{os.path.join(os.path.abspath(spec.train.train_dir), rundir.STACKS_DIR)}')
        return (f'launch {command} --backend slurm is not supported: Slurm runs that job; '
                f'`squeue --name {job_name(spec)}` shows it, `scancel --name {job_name(spec)}` stops it, '
                f'and its logs are in {rundir.logs_dir(os.path.abspath(spec.train.train_dir))}')

    def delegate(self, spec: ClusterSpec, opts: Options) -> tuple[Strategy[Any], str]:
        from launch.backends.slurm.job import make_strategy
        run = make_strategy(spec, slurm_options(opts).render_options())
        return run, run.effective_spec
