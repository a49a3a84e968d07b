"""`python -m cluster.rehearsal --spec S --job J --index I`: one task's stand-in (standin.py)."""
from __future__ import annotations

from cluster.rehearsal.standin import main
from cluster.runtime.contract import run_to_exit

if __name__ == '__main__':
    run_to_exit(main)      # as cluster.task ends: no gRPC teardown racing the interpreter's
