"""The task side: what runs on every host of a cluster. `python -m cluster.task` is its one entry
point (and `python -m cluster.eval`); it never imports `launch`."""
