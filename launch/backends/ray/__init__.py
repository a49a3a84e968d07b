"""The Ray backend (issue #40): a run's tasks on the nodes of a Ray cluster, one Ray actor per task
starting and watching it there. So far only its pure parts: what it knows of the nodes and the checks
it makes of a spec against them (`nodes`), and the environment a task starts with (`childenv`).

Nothing in this package imports Ray at module level: Ray takes over a second to import, and every
command but a Ray run must work where it is not installed.
"""
