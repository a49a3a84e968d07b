"""Where a task is, from a scheduler's environment instead of a spec's `host:port` list: Slurm's
variables (`slurm`) and a JobSet pod's (`jobset`). Pure functions of an environment mapping."""
