"""The SSH backend, in three layers: `connections` (one Fabric connection and SFTP client per
host, host keys, SSHError), `scripts` (the remote shell scripts as pure text, every value quoted),
and `backend` (SSHBackend: start, status, stop, logs and leases over those).

The names other modules import from `launch.backends.ssh` stay here; the backend's tunables
(SNAPSHOT_TTL and the like) are read from `launch.backends.ssh.backend`, so patch them there.
"""
from launch.backends.ssh.backend import RemoteState, SSHBackend, SSHHandle
from launch.backends.ssh.connections import SSHError, host_addresses, load_ssh_config, ssh_target

__all__ = ['RemoteState', 'SSHBackend', 'SSHError', 'SSHHandle', 'host_addresses', 'load_ssh_config', 'ssh_target']
