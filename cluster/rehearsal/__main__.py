"""`python -m cluster.rehearsal --spec S --job J --index I`: one task's stand-in (standin.py)."""
from __future__ import annotations

import logging
import os
import sys
import traceback

from cluster.rehearsal.standin import main
from cluster.runtime.contract import EXIT_FAILED

if __name__ == '__main__':
    try:
        code = main()
    except SystemExit as e:     # argparse's usage error (2) or --help (0): its message is printed
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    except KeyboardInterrupt:
        code = 130
    except BaseException:       # a bug: show it, and still end through os._exit
        traceback.print_exc()
        code = EXIT_FAILED
    for close in (logging.shutdown, sys.stdout.flush, sys.stderr.flush):
        try:
            close()
        except (OSError, ValueError):
            pass
    os._exit(code)      # as cluster.task ends: no gRPC teardown racing the interpreter's
