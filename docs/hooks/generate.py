"""The parts of the documentation made from the code, committed so that the pages read on GitHub too.

A generated part of a page is a block between two comment lines:

    <!-- generated: NAME (...) -->
    ...what PARTS[NAME] makes...
    <!-- end of generated: NAME -->

and the architecture diagram is the file docs/images/architecture.svg. Committing them keeps
GitHub's view of docs/ whole (a placeholder that only the site build fills shows as nothing
there); the cost is that they can go stale, so:

    python docs/hooks/generate.py           rewrites every part (and the diagram) that differs
    python docs/hooks/generate.py --check   lists the stale ones and exits 1 if there are any

tests/unit/docs/test_docs.py fails, naming the command, when a committed part is not what the code makes
now. A lone opening line (no end line yet) is a part still to be written: the script fills it.

As an MkDocs hook (mkdocs.yml) it fills every block afresh at build time and draws the diagram
again, so a site always describes the code it was built from, whether or not the files were
rewritten; the comment lines themselves never reach the site. The parts are made by the modules
beside this one (reference.py, errors.py, diagram.py), loaded by path as MkDocs loads a hook.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import posixpath
import re
import sys
from collections.abc import Callable
from types import ModuleType

HERE = os.path.dirname(os.path.abspath(__file__))
DOCS = os.path.dirname(HERE)
COMMAND = 'python docs/hooks/generate.py'
BLOCK = re.compile(r'^<!-- generated: (?P<name>[\w-]+)(?: \([^\n]*\))? -->\n'
                   r'(?:(?P<body>.*?)^<!-- end of generated: (?P=name) -->\n?)?', re.M | re.S)


def _sibling(name: str) -> ModuleType:
    """docs/hooks/NAME.py as a module, loaded once (it is no package)."""
    key = f'tfcluster_docs_{name}'
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, os.path.join(HERE, f'{name}.py'))
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module
        spec.loader.exec_module(module)
    return sys.modules[key]


def _errors(page_dir: str) -> str:
    errors = _sibling('errors')
    return errors.render(errors.load(os.path.join(DOCS, 'errors.yaml')))


# name -> what makes it, given the folder of the page it is on (relative to docs/, '.' at the top).
PARTS: dict[str, Callable[[str], str]] = {
    'cli': lambda page_dir: _sibling('reference').cli_markdown(),
    'spec': lambda page_dir: _sibling('reference').spec_markdown(),
    'events': lambda page_dir: _sibling('reference').events_markdown(),
    'errors': _errors,
    'diagram': lambda page_dir: _sibling('diagram').diagram_markdown(page_dir),
    'plots': lambda page_dir: _sibling('diagram').plots_markdown(page_dir),
    'report': lambda page_dir: _sibling('diagram').report_markdown(page_dir),
}


def block(name: str, body: str) -> str:
    """A part as it is committed: its opening line, what it holds, its end line."""
    return (f'<!-- generated: {name} (`{COMMAND}` writes it from the code: edit the code, not this) -->\n\n'
            f'{body.strip()}\n\n<!-- end of generated: {name} -->\n')


def _made(name: str, where: str, page_dir: str) -> str:
    if name not in PARTS:
        raise ValueError(f'{where}: no generated part {name!r}; there are {", ".join(PARTS)}')
    return PARTS[name](page_dir)


def filled(markdown: str, src_uri: str, committed: bool = True) -> str:
    """The page with every part made afresh: as committed (comment lines kept), or as the site
    shows it (committed=False: the parts alone)."""
    page_dir = posixpath.dirname(src_uri) or '.'

    def fill(match: re.Match) -> str:
        body = _made(match.group('name'), src_uri, page_dir)
        return block(match.group('name'), body) if committed else body.strip() + '\n'
    return BLOCK.sub(fill, markdown)


def pages(docs: str = DOCS) -> list[str]:
    """The pages (paths relative to docs/) that have a generated part."""
    out = []
    for folder, _, names in os.walk(docs):
        for name in names:
            path = os.path.join(folder, name)
            if name.endswith('.md') and BLOCK.search(open(path, encoding='utf-8').read()):
                out.append(os.path.relpath(path, docs).replace(os.sep, '/'))
    return sorted(out)


def architecture_svg() -> str:
    return _sibling('diagram').architecture_svg()


def stale(docs: str = DOCS) -> dict[str, str]:
    """{path relative to docs/: what it should hold now} of every generated file that differs."""
    out = {}
    for src_uri in pages(docs):
        with open(os.path.join(docs, src_uri), encoding='utf-8') as f:
            text = f.read()
        if filled(text, src_uri) != text:
            out[src_uri] = filled(text, src_uri)
    svg = os.path.join(docs, *_sibling('diagram').ARCHITECTURE.split('/'))
    drawn = architecture_svg()
    if not os.path.isfile(svg) or open(svg, encoding='utf-8').read() != drawn:
        out[os.path.relpath(svg, docs).replace(os.sep, '/')] = drawn
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=COMMAND, description='Rewrite the committed parts of docs/ made from '
                                     'the code (reference pages, error list, diagram, plots).')
    parser.add_argument('--check', action='store_true', help='only list the stale files; exit 1 if any')
    args = parser.parse_args(argv)
    found = stale()
    for path, text in sorted(found.items()):
        print(f'docs/{path}: ' + ('stale' if args.check else 'rewritten'))
        if not args.check:
            with open(os.path.join(DOCS, path), 'w', encoding='utf-8') as f:
                f.write(text)
    if not found:
        print('docs/: every generated part is current')
    return 1 if args.check and found else 0


# -- the MkDocs hook -------------------------------------------------------------------------------------
def on_files(files, config):
    """The diagram as drawn now, in place of the committed copy."""
    from mkdocs.structure.files import File
    uri = _sibling('diagram').ARCHITECTURE
    committed = files.get_file_from_path(uri)
    if committed is not None:
        files.remove(committed)
    files.append(File.generated(config, uri, content=architecture_svg()))
    return files


def on_page_markdown(markdown: str, page, config, files) -> str:
    from mkdocs.exceptions import PluginError
    try:
        return filled(markdown, page.file.src_uri, committed=False)
    except (OSError, ValueError) as e:
        raise PluginError(str(e)) from None


if __name__ == '__main__':
    sys.exit(main())
