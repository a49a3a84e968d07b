"""The supervised strategy of `launch up` (local processes, SSH, compose): the loop that starts
every task through its Backend, observes, decides, applies plans and tears down (loop.py), over
one state object (state.py) that only it writes. Recovery, failover and scaling say what to do as
plans (plan.py); startup.py waits for the servers."""
from launch.run.supervised.faults import TaskFailed
from launch.run.supervised.loop import SupervisedRun
from launch.run.supervised.startup import wait_for_servers

__all__ = ['SupervisedRun', 'TaskFailed', 'wait_for_servers']
