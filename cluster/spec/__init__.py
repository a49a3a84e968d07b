"""The cluster spec: the user-facing contract, parsed and validated once at the edge.

Everything downstream takes the frozen types of `model`, never raw dicts. A spec error is a
`SpecError` whose message is one line naming where the bad value came from (`file:line` or the
`--set` argument), the dotted key and what was expected.

model: the frozen types and the small helpers both sides share; load: file, TF_CONFIG and `--set`
to a ClusterSpec; reader: the file's text and YAML, read within limits; errors: SpecError and
where each key was given; validate: the checks, section by section (labels: a host's Ray node
labels); environ: env: values taken
from the launcher's environment, the values never shown, and the OS's limits on them; keys: every
key with its type, default and text, which the spec reference page is made of.
"""
from cluster.spec.errors import SpecError
from cluster.spec.load import TF_CONFIG_ENV, load_spec, parse_override, read_tf_config
from cluster.spec.model import (DEFAULT_SPEC, HOST_SETTINGS, ISOLATION_MODES, JOBS, LOOPBACK_NAMES,
                                RESTART_POLICIES, TRANSFER_DTYPES, ClusterSpec, HostConfig, SuperviseConfig, TaskSpec,
                                TrainConfig, address, is_chief, same_machine_key)
from cluster.spec.reader import MAX_SPEC_BYTES, MAX_SPEC_VALUES, SPEC_READ_SECS
from cluster.spec.validate import LAUNCHER_ENV, SECTIONS, parse_address

__all__ = [
    'DEFAULT_SPEC', 'HOST_SETTINGS', 'ISOLATION_MODES', 'JOBS', 'LAUNCHER_ENV', 'LOOPBACK_NAMES',
    'MAX_SPEC_BYTES', 'MAX_SPEC_VALUES', 'RESTART_POLICIES', 'SECTIONS', 'SPEC_READ_SECS', 'TF_CONFIG_ENV',
    'TRANSFER_DTYPES', 'ClusterSpec', 'HostConfig', 'SpecError', 'SuperviseConfig', 'TaskSpec', 'TrainConfig',
    'address', 'is_chief', 'load_spec', 'parse_address', 'parse_override', 'read_tf_config', 'same_machine_key',
]
