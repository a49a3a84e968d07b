"""The site's pictures (docs/hooks/diagram.py): the architecture diagram is drawn from the code, so
a layer, a module, a backend or a renderer added to the code is in the picture at the next build
(and tests/unit/docs/test_docs.py fails until the committed copy is redrawn); the pages' parts show the
pictures, with paths that hold from any page's folder."""
from __future__ import annotations

import importlib.util
import os
import re
import shutil
import xml.etree.ElementTree as ET

import pytest

from tests.conftest import REPO


@pytest.fixture(scope='module')
def hook():
    spec = importlib.util.spec_from_file_location('diagram_hook', os.path.join(REPO, 'docs', 'hooks', 'diagram.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def texts(svg: str) -> list[str]:
    root = ET.fromstring(svg)       # well-formed, or this raises
    assert root.get('width') and root.get('height')         # sized: an <img> of it has a natural size
    return [''.join(t.itertext()) for t in root.iter('{http://www.w3.org/2000/svg}text')]


def test_the_diagram_names_every_layer_module_backend_and_renderer_the_code_has(hook):
    from launch.render import RENDERERS
    from launch.run.registry import KINDS
    shown = texts(hook.architecture_svg())
    layers, forbidden = hook.contracts()
    assert set(layers) == {'cluster', 'launch'} and ('cluster', 'launch') in forbidden
    for rows in layers.values():
        for row in rows:
            for module in row:
                name = module.split('.')[-1]
                assert name + '/' in shown or name + '.py' in shown, module
    assert {'launch/', 'cluster/', 'cluster never', 'imports launch', 'launch imports'} <= set(shown)
    words = set(' '.join(shown).split())
    for package in ('launch/run', 'launch/backends', 'cluster/training'):     # a package's own modules, from its files
        folder = os.path.join(REPO, package)
        for name in os.listdir(folder):
            if name.endswith('.py') and not name.startswith('_'):
                assert name[:-3] in words, (package, name)
            elif os.path.isfile(os.path.join(folder, name, '__init__.py')):
                assert name + '/' in words, (package, name)
    for name in list(KINDS) + list(RENDERERS):
        assert name in shown, name
    assert any(t.startswith('python -m cluster.task') for t in shown)


def test_a_layer_added_to_the_contracts_is_drawn(hook, tmp_path):
    """The picture reads setup.cfg, as lint-imports does: it cannot keep an old layering."""
    cfg = tmp_path / 'setup.cfg'
    text = open(os.path.join(REPO, 'setup.cfg')).read()
    cfg.write_text(text.replace('    launch.records\n', '    launch.records\n    launch.records2 | launch.extra\n'))
    layers, _ = hook.contracts(str(cfg))
    assert ['launch.records2', 'launch.extra'] in layers['launch']
    assert layers['launch'].index(['launch.records2', 'launch.extra']) == layers['launch'].index(['launch.records']) + 1


def test_the_parts_show_the_pictures_with_paths_from_the_page_folder(hook, tmp_path, monkeypatch):
    docs = tmp_path / 'docs'
    (docs / 'images' / 'perf').mkdir(parents=True)
    monkeypatch.setattr(hook, 'DOCS', str(docs))
    spec = importlib.util.spec_from_file_location('plots', os.path.join(REPO, 'benchmarks', 'plots.py'))
    plots = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plots)
    figures = {'cores': 2, 'bytes': {'model_bytes': 4_270_000, 'ps_bytes': {'1': [4_270_000], '2': [2, 2]}}}
    plots.draw(figures, str(docs / 'images' / 'perf'), 'python benchmarks/bench.py --only bytes --plots D', '2026-11-26')
    assert os.listdir(docs / 'images' / 'perf') == ['5-placement.png']

    md = hook.diagram_markdown('backends')
    assert '[![The packages' in md and '(../images/architecture.svg)](../images/architecture.svg)' in md
    md = hook.plots_markdown('.')
    assert '![Variable placement: the bytes each ps task holds](images/perf/5-placement.png)' in md
    assert re.search(r'Measured by `python benchmarks/bench.py --only bytes --plots D` on 2026-11-26\.', md), md
    # the report's screenshot, once there is one; until then the part says how to take it
    assert 'No report screenshot in this checkout' in hook.report_markdown('.')
    shutil.copy(docs / 'images' / 'perf' / '5-placement.png', docs / 'images' / 'report.png')
    assert '](images/report.png)' in hook.report_markdown('.')
    # a checkout with no plots says how to draw them
    os.remove(docs / 'images' / 'perf' / '5-placement.png')
    assert 'No performance plots in this checkout' in hook.plots_markdown('.')
