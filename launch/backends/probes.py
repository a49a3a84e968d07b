"""What the launcher asks of a host before it starts anything there, as code run on the host:
HOST_PROBE (Python, the tasks' own interpreter) and GPU_COUNT_SH (POSIX sh). Shared by the local,
SSH and compose backends; pure text and one parser, nothing run here."""
from __future__ import annotations

# Run by the tasks' Python on each host (over SSH, or as a local subprocess) for a check: what is
# installed, which of the ports given are taken; prints one JSON line. With --import it imports
# TensorFlow and this package for real (seconds per host: `launch check` does it); without, it
# only locates TensorFlow (`launch up`, where a broken install still shows as a task dying during
# start-up, with its log lines).
HOST_PROBE = r'''
import errno, json, socket, sys
args = sys.argv[1:]
deep = args[:1] == ["--import"]
out = {"python": sys.version.split()[0], "executable": sys.executable, "missing": [], "busy": []}
try:
    import importlib.util, importlib.metadata
    if deep:
        try:
            import tensorflow
            out["tensorflow"] = tensorflow.__version__
        except Exception as e:
            why = "" if isinstance(e, ImportError) and e.name == "tensorflow" else " (%s: %s)" % (
                type(e).__name__, str(e).splitlines()[0] if str(e) else "")
            out["missing"].append("tensorflow" + why)
    elif importlib.util.find_spec("tensorflow") is None:
        out["missing"].append("tensorflow")
    else:
        try:
            out["tensorflow"] = importlib.metadata.version("tensorflow")
        except Exception:
            out["tensorflow"] = "?"
    try:
        module = args[args.index("--module") + 1] if "--module" in args else "cluster.task"
        task = importlib.import_module(module)       # the module the tasks run (a rehearsal: cluster.rehearsal)
        if deep and "tensorflow" in out and module == "cluster.task":
            import cluster.training.train        # the model and input pipeline too: all a worker imports
        out["cluster"] = task.__file__
    except ImportError as e:
        out["missing"].append("cluster" if e.name == "cluster" else "cluster (%s)" % e)
except Exception as e:
    out["missing"].append("module check failed: %s" % e)
for port in [a for a in args if a.isdigit()]:
    try:
        s = socket.socket(socket.AF_INET6)
    except OSError:         # IPv6 disabled on the host
        s = socket.socket(socket.AF_INET)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("", int(port)))
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            out["busy"].append(int(port))
    finally:
        s.close()
print(json.dumps(out, allow_nan=False))
'''

# How many NVIDIA GPUs a host has, as one line `tfcluster-gpus N` (read back with parse_gpu_count):
# the driver's /proc entries first (no process started), else `nvidia-smi -L`; 0 without either.
# POSIX sh, cheap: it runs in every pre-flight, before anything starts.
GPU_COUNT_SH = ('n=$(ls /proc/driver/nvidia/gpus 2>/dev/null | wc -l); '
                'if [ "$n" -eq 0 ] && command -v nvidia-smi >/dev/null 2>&1; then '
                'n=$(nvidia-smi -L 2>/dev/null | grep -c "^GPU "); fi; '
                'echo "tfcluster-gpus ${n:-0}"')


def parse_gpu_count(output: str) -> int | None:
    """The count GPU_COUNT_SH printed somewhere in `output`, or None if it is not there."""
    for line in output.splitlines():
        word, _, count = line.strip().partition(' ')
        if word == 'tfcluster-gpus' and count.strip().isdigit():
            return int(count)
    return None
