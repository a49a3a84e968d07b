"""The test sshd is real: OpenSSH and Fabric/paramiko clients, strict host keys,
quoting, detached tasks, and nothing left running afterwards."""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
import time

import fabric
import paramiko
import pytest

from tests.harness.sshd import SSHDError, SSHHosts, process_table

pytestmark = pytest.mark.slow     # a real sshd; the autouse leftover check below runs `ps` for every test

# cd first: a sleeper is ours if its cwd is under this session's pytest basetemp
# (other pytest sessions may run the same tests at the same time).
DETACHED = "cd {dir} || exit 1; setsid nohup sleep 300 > sleep.log 2>&1 < /dev/null & echo $!"
TRICKY = """a b  "double" 'single' $HOME ${PATH} `id` $(id) \\ ; & | * ? ~ \t tab\nnewline é"""


def _cwd(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return ""


def _under(path: str, marker: str) -> bool:
    return path == marker or path.startswith(marker.rstrip("/") + "/")


def _sleepers(marker: str) -> set[int]:
    """Pids of `sleep 300` started in ``marker`` or a directory under it."""
    return {pid for pid, args in process_table()
            if args == "sleep 300" and _under(_cwd(pid), marker)}


def _leftovers(marker: str) -> set[tuple[int, str]]:
    """Processes of ours still running: sshd started from our temp dirs, and `sleep 300`."""
    return {(pid, args) for pid, args in process_table()
            if ("sshd" in args and marker.rstrip("/") + "/" in args)
            or (args == "sleep 300" and _under(_cwd(pid), marker))}


@pytest.fixture(autouse=True)
def no_leftover_processes(tmp_path_factory):
    """Autouse, so set up before ``ssh_hosts`` and checked after its teardown."""
    marker = str(tmp_path_factory.getbasetemp())
    before = _leftovers(marker)
    yield
    assert _leftovers(marker) - before == set()


def _wait_until(predicate, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return True


def _pid_alive(pid: int) -> bool:
    out = subprocess.run(["ps", "-o", "stat=", "-p", str(pid)], capture_output=True, text=True)
    return out.returncode == 0 and not out.stdout.strip().startswith("Z")


def strict_connection(hosts: SSHHosts, address: str, known_hosts=None, key_path=None,
                      **kwargs) -> fabric.Connection:
    """What the SSH backend must do: Fabric alone trusts any host key.

    ``in_stream=False``: by default invoke copies our stdin to the remote command,
    which under pytest's capture fails ("reading from stdin while output is captured").
    """
    kwargs.setdefault("config", fabric.Config(overrides={"run": {"in_stream": False}}))
    conn = fabric.Connection(
        address, port=hosts.port, user="root",
        connect_kwargs={"key_filename": str(key_path or hosts.key_path),
                        "look_for_keys": False, "allow_agent": False},
        **kwargs)
    conn.client.load_host_keys(str(known_hosts or hosts.known_hosts))
    conn.client.set_missing_host_key_policy(paramiko.RejectPolicy())
    return conn


# -- the fixture ------------------------------------------------------------

def test_fixture_files_and_startup(ssh_hosts):
    assert ssh_hosts.addresses == ("127.0.0.2", "127.0.0.3")
    assert ssh_hosts.user == "root"
    for path in (ssh_hosts.key_path, ssh_hosts.known_hosts, ssh_hosts.ssh_config, ssh_hosts.log_path):
        assert path.is_file() and path.parent == ssh_hosts.dir
    assert ssh_hosts.host_pubkey.startswith("ssh-ed25519 ")
    assert ssh_hosts.known_hosts.read_text().splitlines() == [
        f"[{a}]:{ssh_hosts.port} {ssh_hosts.host_pubkey}" for a in ssh_hosts.addresses]
    assert ssh_hosts.startup_seconds < 10, ssh_hosts.startup_seconds
    assert "Server listening on 127.0.0.3 port" in ssh_hosts.log_path.read_text()


def test_loopback_aliases_route_without_configuration():
    for address in ("127.0.0.2", "127.0.0.3"):
        with socket.socket() as server:
            server.bind((address, 0))
            server.listen()
            with socket.create_connection(server.getsockname(), timeout=2):
                conn, _ = server.accept()
                conn.close()


def test_start_failure_reports_sshd_log(tmp_path):
    class Broken(SSHHosts):
        def _write_sshd_config(self):
            super()._write_sshd_config()
            with open(self.config_path, "a") as f:
                f.write("NoSuchOption yes\n")

    with pytest.raises(SSHDError, match=r"(?s)sshd exited with status.*NoSuchOption"):
        Broken(tmp_path).start()


# -- OpenSSH client ---------------------------------------------------------

def test_ssh_client_runs_on_each_address(ssh_hosts):
    for address in ssh_hosts.addresses:
        result = ssh_hosts.ssh(address, "echo ok; id -un; echo $SSH_CONNECTION")
        assert result.returncode == 0, result.stderr
        ok, user, connection = result.stdout.splitlines()
        assert (ok, user) == ("ok", "root")
        assert connection.split()[2:] == [address, str(ssh_hosts.port)]


def test_ssh_client_rejects_changed_host_key(ssh_hosts, tmp_path):
    other = ssh_hosts.other_host_key_known_hosts(tmp_path / "known_hosts")
    result = subprocess.run(
        ["ssh", "-F", str(ssh_hosts.ssh_config), "-o", f"UserKnownHostsFile={other}",
         "127.0.0.2", "echo ok"],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30)
    assert result.returncode == 255 and "ok" not in result.stdout
    assert "Host key verification failed" in result.stderr


def test_ssh_client_session_killed_by_stop(ssh_hosts, tmp_path):
    """A session still running when the server stops is killed, and the client sees it."""
    client = subprocess.Popen(
        ["ssh", "-F", str(ssh_hosts.ssh_config), "127.0.0.3", f"cd {shlex.quote(str(tmp_path))} && sleep 300"],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert _wait_until(lambda: _sleepers(str(tmp_path)))
        ssh_hosts.stop()
        assert client.wait(10) == 255
    finally:
        client.kill()
        client.wait()
    ssh_hosts.stop()  # idempotent
    assert ssh_hosts.pid is None


# -- Fabric / paramiko ------------------------------------------------------

def test_fabric_runs_command_with_strict_host_keys(ssh_hosts):
    for address in ssh_hosts.addresses:
        with strict_connection(ssh_hosts, address) as conn:
            result = conn.run("echo ok", hide=True)
            assert result.stdout == "ok\n"
            assert conn.transport.get_remote_server_key().get_name() == "ssh-ed25519"


def test_fabric_helper_connection(ssh_hosts):
    with ssh_hosts.connection("127.0.0.3") as conn:
        assert conn.run("echo $SSH_CONNECTION", hide=True).stdout.split()[2] == "127.0.0.3"


def test_fabric_wrong_key_is_refused(ssh_hosts, tmp_path):
    wrong = ssh_hosts.wrong_key(tmp_path)
    conn = strict_connection(ssh_hosts, "127.0.0.2", key_path=wrong)
    with pytest.raises(paramiko.AuthenticationException):
        conn.open()
    conn.close()


def test_fabric_unknown_host_key_is_rejected(ssh_hosts, tmp_path):
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    conn = strict_connection(ssh_hosts, "127.0.0.2", known_hosts=empty)
    with pytest.raises(paramiko.SSHException, match="not found in known_hosts") as caught:
        conn.open()
    conn.close()
    # Both other failures are SSHException subclasses: tell them apart by type.
    assert type(caught.value) is paramiko.SSHException


def test_fabric_changed_host_key_is_rejected(ssh_hosts, tmp_path):
    other = ssh_hosts.other_host_key_known_hosts(tmp_path / "known_hosts")
    conn = strict_connection(ssh_hosts, "127.0.0.3", known_hosts=other)
    with pytest.raises(paramiko.BadHostKeyException):
        conn.open()
    conn.close()


def test_fabric_default_trusts_any_host_key(ssh_hosts):
    """Why the backend must load known_hosts and set RejectPolicy itself."""
    conn = fabric.Connection("127.0.0.2", port=ssh_hosts.port, user="root",
                             connect_kwargs=ssh_hosts.connect_kwargs())
    with conn:
        assert conn.run("echo ok", hide=True, in_stream=False).stdout == "ok\n"
        assert isinstance(conn.client._policy, paramiko.AutoAddPolicy)


def test_fabric_reads_ssh_config_but_not_its_host_key_options(ssh_hosts):
    """Port, User and IdentityFile come from ssh_config; StrictHostKeyChecking and
    UserKnownHostsFile are ignored: without our own policy, any host key is trusted."""
    config = fabric.Config(runtime_ssh_path=str(ssh_hosts.ssh_config),
                           overrides={"run": {"in_stream": False}})
    conn = fabric.Connection("127.0.0.3", config=config,
                             connect_kwargs={"look_for_keys": False, "allow_agent": False})
    assert (conn.port, conn.user) == (ssh_hosts.port, "root")
    assert conn.connect_kwargs["key_filename"] == [str(ssh_hosts.key_path)]
    assert isinstance(conn.client._policy, paramiko.AutoAddPolicy)
    assert len(conn.client.get_host_keys()) == 0
    with conn:
        assert conn.run("echo ok", hide=True).stdout == "ok\n"


def test_fabric_sftp_put(ssh_hosts, tmp_path):
    local = tmp_path / "payload.txt"
    local.write_text(TRICKY)
    remote = ssh_hosts.dir / "uploaded.txt"
    with strict_connection(ssh_hosts, "127.0.0.2") as conn:
        conn.put(str(local), str(remote))
    assert remote.read_text() == TRICKY


def test_many_channels_on_one_connection(ssh_hosts):
    from concurrent.futures import ThreadPoolExecutor

    with strict_connection(ssh_hosts, "127.0.0.2") as conn:
        conn.open()
        with ThreadPoolExecutor(12) as pool:
            outs = list(pool.map(lambda i: conn.run(f"echo {i}", hide=True).stdout, range(24)))
    assert outs == [f"{i}\n" for i in range(24)]


# -- environment ------------------------------------------------------------

def test_env_inline_quoted_round_trips(ssh_hosts):
    command = f"env TF_TEST_VAR={shlex.quote(TRICKY)} printenv TF_TEST_VAR"
    result = ssh_hosts.ssh("127.0.0.2", command)
    assert result.returncode == 0, result.stderr
    assert result.stdout == TRICKY + "\n"
    with strict_connection(ssh_hosts, "127.0.0.3") as conn:
        assert conn.run(command, hide=True).stdout == TRICKY + "\n"


def test_fabric_env_is_not_quoted_nor_accepted(ssh_hosts):
    """Fabric's ``env=`` inlines ``export K=V`` unquoted; without inlining, sshd drops it."""
    with strict_connection(ssh_hosts, "127.0.0.2") as conn:
        inlined = conn.run("printenv TF_TEST_VAR", env={"TF_TEST_VAR": "a b"}, hide=True)
        assert inlined.stdout == "a\n"
    with strict_connection(ssh_hosts, "127.0.0.2", inline_ssh_env=False) as conn:
        sent = conn.run("printenv TF_TEST_VAR", env={"TF_TEST_VAR": "a b"}, hide=True, warn=True)
        assert (sent.exited, sent.stdout) == (1, "")


# -- detached processes -----------------------------------------------------

def test_detached_process_survives_session_and_is_killed(ssh_hosts, tmp_path):
    result = ssh_hosts.ssh("127.0.0.2", DETACHED.format(dir=shlex.quote(str(tmp_path))), timeout=10)
    assert result.returncode == 0, result.stderr
    pid = int(result.stdout)
    assert _pid_alive(pid)
    assert ssh_hosts.ssh("127.0.0.3", f"ps -o sid=,args= -p {pid}").stdout.split() == \
        [str(pid), "sleep", "300"]  # own session: setsid did not fork, $! is sleep
    assert pid in ssh_hosts.session_processes()

    assert ssh_hosts.ssh("127.0.0.3", f"kill {pid}").returncode == 0
    assert _wait_until(lambda: not _pid_alive(pid))
    assert _sleepers(str(tmp_path)) == set()


def test_detached_process_over_fabric_killed_by_stop(ssh_hosts, tmp_path):
    with strict_connection(ssh_hosts, "127.0.0.3") as conn:
        pid = int(conn.run(DETACHED.format(dir=shlex.quote(str(tmp_path))), hide=True, timeout=10).stdout)
    assert _wait_until(lambda: _sleepers(str(tmp_path)) == {pid})     # setsid/nohup may not have exec'd yet
    ssh_hosts.stop()
    assert not _pid_alive(pid)
    assert _sleepers(str(tmp_path)) == set()
