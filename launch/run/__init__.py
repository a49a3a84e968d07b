"""Running a cluster: the one lifecycle of `launch up`, its two strategies (supervised over a
backend; delegated to Slurm), the supervisor's pure policy, scaling, failover, the checks before
anything starts, and the registry that builds a strategy for each backend."""
