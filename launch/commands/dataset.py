"""`launch download` (the real CIFAR-10) and `launch eval` (precision@1 of a checkpoint on its
test split): the commands about the data set rather than a cluster."""
from __future__ import annotations

import shlex
import sys

from cluster.spec import ClusterSpec
from launch.commands.flags import DownloadFlags, EvalFlags
from launch.commands.request import Request
from launch.errors import CommandFailed, UsageError

EXIT_INTERRUPTED = 130      # as a shell reports a command ended by Ctrl-C


def cmd_eval(spec: ClusterSpec, req: Request[EvalFlags]) -> int:
    from cluster import eval as evaluation
    try:
        result = evaluation.evaluate(spec, req.flags.checkpoint)
    except ValueError as e:       # no checkpoint, no test data
        raise UsageError(str(e)) from None
    print(evaluation.report(result))
    return 0


def cmd_download(flags: DownloadFlags) -> int:
    """Fetch, verify and unpack CIFAR-10 into DEST; an interrupted download resumes when run again."""
    from cluster.training import download
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
