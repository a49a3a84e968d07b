"""What `pip install -e .` promises: every command the README tells a new user to run comes with
the package, and the TensorFlow it claims to work with is the TensorFlow the suite runs on.

TensorFlow 2.21 stopped bringing TensorBoard along, so `tensorboard --logdir runs/local2` (the
README's next step) failed on a fresh install until setup.cfg named it. These tests read setup.cfg,
the README and the installed distributions' metadata; they start nothing.
"""
from __future__ import annotations

import configparser
import re
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.harness.parts import REPO
from tests.harness.docs import _shell_lines

ROOT = Path(REPO)
THE_PACKAGE = 'tfcluster'


def install_requires() -> dict[str, Requirement]:
    """setup.cfg's install_requires: canonical name -> requirement."""
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / 'setup.cfg')
    lines = [line.strip() for line in cfg['options']['install_requires'].splitlines()]
    return {canonicalize_name(r.name): r for r in map(Requirement, (line for line in lines if line))}


def extra(name: str) -> dict[str, Requirement]:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / 'setup.cfg')
    lines = [line.strip() for line in cfg['options.extras_require'][name].splitlines()]
    return {canonicalize_name(r.name): r for r in map(Requirement, (line for line in lines if line))}


NEXT = 'Where to look next'


def readme_user_commands() -> set[str]:
    """The programs (the first word of each command of a line) that the sh blocks of the README's
    section NEXT run: what it has a user who ran only its first command do next."""
    text = (ROOT / 'README.md').read_text(encoding='utf-8')
    section = re.search(rf'\n## {NEXT}\n(.*?)(\n## |$)', text, re.S)
    assert section, f'README.md has no section "## {NEXT}"'
    blocks = '\n'.join(re.findall(r'```sh\n.*?```', section.group(1), re.S))
    programs = set()
    for _, line in _shell_lines(blocks):
        for command in re.split(r'&&|\|\||;|\|', re.sub(r'\s+#.*$', '', line)):
            words = [w for w in command.split() if not re.fullmatch(r'[A-Za-z_]\w*=.*', w)]
            if words:
                programs.add(words[0])
    return programs


def providers() -> dict[str, str]:
    """console script -> the canonical name of the installed distribution that provides it."""
    out = {}
    for dist in metadata.distributions():
        for ep in dist.entry_points:
            if ep.group == 'console_scripts':
                out.setdefault(ep.name, canonicalize_name(dist.metadata['Name']))
    return out


def floor(requirement: Requirement) -> Version:
    found = [Version(s.version) for s in requirement.specifier if s.operator == '>=']
    assert found, f'{requirement}: no >= floor'
    return found[0]


def test_every_command_the_readme_has_a_user_run_comes_with_the_package():
    """`launch` is the package's own; any other program (tensorboard) must be the console script of
    a distribution setup.cfg installs, not of one that only happens to be here."""
    programs = readme_user_commands()
    assert {'launch', 'tensorboard'} <= programs, programs
    required = set(install_requires()) | {THE_PACKAGE}
    by_script = providers()
    missing = {p: by_script.get(p) for p in programs if by_script.get(p) not in required}
    assert not missing, (f'the README runs programs that `pip install -e .` does not install (program: the '
                         f'distribution that has it here): {missing}; add them to install_requires in setup.cfg')


def test_the_tensorflow_claimed_is_the_tensorflow_tested():
    """setup.cfg's floor for TensorFlow is the release docs/index.md says the suite is run on, the
    TensorFlow installed here (which the suite runs on) is at least that, and so is the image's; its
    companions (tf-keras, TensorBoard) have the same floor."""
    tf_floor = floor(install_requires()['tensorflow'])
    tested = re.search(r'Tested with TensorFlow (\d+\.\d+)', (ROOT / 'docs' / 'index.md').read_text())
    assert tested, 'docs/index.md says nowhere "Tested with TensorFlow X.Y"'
    assert tf_floor == Version(tested.group(1)), f'setup.cfg claims tensorflow>={tf_floor}; tested: {tested.group(1)}'
    installed = Version(metadata.version('tensorflow'))
    assert installed >= tf_floor, f'the suite runs on TensorFlow {installed}, below the floor {tf_floor}'
    image = re.search(r'^tensorflow==(\S+)$', (ROOT / 'docker' / 'requirements.txt').read_text(), re.M)
    assert image and Version(image.group(1)) >= tf_floor, image
    companions = {'tensorboard': install_requires().get('tensorboard'), 'tf-keras (keras)': extra('keras')['tf-keras'],
                  'tf-keras (test)': extra('test')['tf-keras']}
    for name, requirement in companions.items():
        assert requirement is not None, f'{name} not required'
        assert floor(requirement) == tf_floor, f'{name}: floor {floor(requirement)}, TensorFlow\'s {tf_floor}'
