"""The test harness: the real parts the tests run against and the checks they share, kept apart
from the tests themselves.

    parts       the repository's root, free ports, a run's processes, the skip that fails under CI
    sshd        a real OpenSSH server on 127.0.0.2/.3 (the `ssh_hosts` fixture)
    slurm       a real single-node Slurm (the `slurm_cluster` fixture)
    dockerd     a real Docker engine and the image of this tree (`docker_engine`, `compose_image`,
                `compose_project`)
    chaos       the chaos harness (`python -m tests.harness.chaos`)
    k8s_models  checks of rendered Kubernetes objects without a cluster

The modules that define fixtures are pytest plugins, named in tests/conftest.py's
`pytest_plugins`: a test asks for a fixture by its argument's name and imports none.
"""
