"""Once per round of the loop (launch/run/supervised/loop.py), and at once after a plan that
asks for it (plan.py Plan.start): the desired set held against what was started, as a plan.

The plans of recovery, failover and scaling change only what should run (state.py
SupervisorState: the live set, the tasks let go, the retired, what is due and when); starting
and stopping between two starts of the whole cluster follows from that here:

- a task whose time has come (`attempt.due`: a worker or evaluator started again after its
  backoff, a spare in a lost worker's place, a worker that joins a scale) is started, the
  earliest first. A plan puts a task in `due` only as it makes it desired, so what is due is
  desired by definition;
- a task started and failed over (`retired`) is stopped in the background, once: it is never
  started again, and its host may hang;
- a task let go (lost and tolerated) is left as it is: it ended, or cannot be asked;
- a worker a scale took out of the live set is left to go by itself: its lease tells it to
  finish its step and stop (cluster/runtime/membership.py), and the scale's reply waits for it.

Pure: it reads the state and the time and changes nothing; the loop applies what it returns.
"""
from __future__ import annotations

from launch.run.supervised.plan import Plan
from launch.run.supervised.state import SupervisorState


def ready(state: SupervisorState, now: float) -> tuple[str, ...]:
    """The due tasks whose time has come by `now`, the earliest first."""
    due = sorted(state.attempt.due.items(), key=lambda item: item[1])
    return tuple(name for name, at in due if now >= at)


def strays(state: SupervisorState) -> tuple[str, ...]:
    """Tasks started that should never run again (failed over) and were not stopped yet, in the
    order they were started."""
    return tuple(r.name for r in state.records if r.name in state.retired and r.name not in state.dropped)


def reconcile(state: SupervisorState, now: float) -> Plan:
    """What to start and stop now for the started tasks to be the desired ones (the empty plan
    when they are): the strays stopped in the background, then the tasks due by `now` started."""
    return Plan(drop=strays(state), starts=ready(state, now))
