"""`launch download` (the real CIFAR-10) and `launch eval` (precision@1 of a checkpoint on its
test split): the commands about the data set rather than a cluster."""
from __future__ import annotations

import contextlib
import os
import shlex
import sys
import threading
from collections.abc import Iterator

from cluster.spec import ClusterSpec
from launch.commands.flags import DownloadFlags, EvalFlags
from launch.commands.request import Request
from launch.errors import CommandFailed, UsageError
from launch.run.console import is_noise

EXIT_INTERRUPTED = 130      # as a shell reports a command ended by Ctrl-C


@contextlib.contextmanager
def quiet_tensorflow(verbose: bool) -> Iterator[None]:
    """TensorFlow in this process, as quiet as `launch up` keeps its tasks on the console: the
    tasks' TF_CPP_MIN_LOG_LEVEL (launch/planning/plan.py), and the start-up chatter that level
    does not reach (oneDNN, cuInit: C++ writes it to file descriptor 2 before absl logging is
    set up) left out by the console's own test (launch/run/console.py is_noise). Every other
    line of this process's stderr passes; -v (`verbose`) shows everything."""
    if verbose:
        yield
        return
    os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')     # (a user's own level is kept)
    sys.stderr.flush()
    stderr = os.dup(2)
    read, write = os.pipe()
    os.dup2(write, 2)
    os.close(write)

    def pump() -> None:
        with os.fdopen(read, 'rb') as lines:
            for line in lines:
                if not is_noise(line.decode('utf-8', 'replace').rstrip('\n')):
                    os.write(stderr, line)
    thread = threading.Thread(target=pump, name='stderr', daemon=True)
    thread.start()
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(stderr, 2)          # the pipe's last writer closed: the pump reads to its end
        thread.join(timeout=5)
        os.close(stderr)


def cmd_eval(spec: ClusterSpec, req: Request[EvalFlags]) -> int:
    from cluster import eval as evaluation
    try:
        with quiet_tensorflow(req.flags.verbose):
            result = evaluation.evaluate(spec, req.flags.checkpoint)
    except ValueError as e:       # no checkpoint, no test data
        raise UsageError(str(e)) from None
    print(evaluation.report(result))
    return 0


def cmd_download(flags: DownloadFlags) -> int:
    """Fetch, verify and unpack CIFAR-10 into DEST; an interrupted download resumes when run again."""
    from cluster.checks import download
    url, md5 = flags.url or download.CIFAR10_URL, flags.md5 or download.CIFAR10_MD5
    try:
        download.check_arguments(url, md5)
    except ValueError as e:
        raise UsageError(str(e)) from None
    try:
        target = download.download_cifar10(flags.dest, url=url, md5=md5)
    except download.DownloadError as e:
        raise CommandFailed(str(e)) from None
    except KeyboardInterrupt:
        print('launch: interrupted; run the same command again to resume the download', file=sys.stderr)
        return EXIT_INTERRUPTED
    except OSError as e:        # the destination: not writable, a full disk
        raise UsageError(f'{flags.dest}: {e.strerror or e}') from None
    print(f'CIFAR-10 is in {target}; train on it with --set train.data={shlex.quote(target)} '
          f'or `data: {target}` in the spec')
    return 0
