"""The SSH backend (launch/backends/ssh/backend.py); the names other modules import stay here."""
from launch.backends.ssh.backend import SSHBackend, SSHError, SSHHandle, host_addresses, load_ssh_config, ssh_target

__all__ = ['SSHBackend', 'SSHError', 'SSHHandle', 'host_addresses', 'load_ssh_config', 'ssh_target']
