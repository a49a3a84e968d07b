"""The site's pictures, made as parts of pages by docs/hooks/generate.py (which commits them).

- The architecture diagram, drawn as an SVG from the code itself, so it cannot drift: the layers
  of `cluster` and `launch` come from setup.cfg's import-linter contracts (the ones `lint-imports`
  enforces), each layer's modules from the files on disk, which `cluster` modules `launch`
  imports from launch's own import statements, the backends and renderers from the backend
  registry and the renderer table. It is committed as docs/images/architecture.svg and drawn again
  at each build; the part `diagram` shows it.
- The benchmark's plots (docs/images/perf/N-name.png, drawn by `benchmarks/bench.py --plots`):
  the part `plots` is every one of them, each captioned from the text the PNG carries (what it
  shows, the command that measured it and when).
- A real run's report (docs/images/report.png, refreshed by tests/system/launch/records/test_run_story.py with
  TFCLUSTER_DOCS_IMAGES=1): the part `report`.

No network, no TensorFlow, no MkDocs: the registry and the renderer table import the spec model
and the planning code only (well under a second).
"""
from __future__ import annotations

import ast
import configparser
import os
import pkgutil
import posixpath
import re
import struct
import sys
import textwrap
import zlib
from xml.sax.saxutils import escape


REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOCS = os.path.join(REPO, 'docs')
ARCHITECTURE = 'images/architecture.svg'
PERF = 'images/perf'
REPORT = 'images/report.png'



# ---------------------------------------------------------------------------------------------
# What the diagram shows, read from the code

def contracts(setup_cfg: str = os.path.join(REPO, 'setup.cfg')) -> tuple[dict[str, list[list[str]]], list[tuple]]:
    """({root package: its layers top to bottom, each a list of modules}, [(source, forbidden)])
    from the import-linter contracts. A layer line's modules are split at `|` (independent) or `:`."""
    cfg = configparser.ConfigParser()
    cfg.read(setup_cfg)
    roots = cfg['importlinter']['root_packages'].split()
    layers: dict[str, list[list[str]]] = {}
    forbidden = []
    for name in cfg.sections():
        if not name.startswith('importlinter:contract:'):
            continue
        c = cfg[name]
        if c.get('type') == 'layers':
            rows = [[m.strip() for m in re.split(r'[|:]', line) if m.strip()] for line in c['layers'].splitlines()
                    if line.strip()]
            root = rows[0][0].split('.')[0]
            if root in roots and all(m.split('.')[0] == root for row in rows for m in row):
                layers[root] = rows
        elif c.get('type') == 'forbidden':
            forbidden += [(s, f) for s in c['source_modules'].split() for f in c['forbidden_modules'].split()]
    return {root: layers[root] for root in roots if root in layers}, forbidden


def module_path(module: str) -> str:
    return os.path.join(REPO, *module.split('.'))


def is_package(module: str) -> bool:
    return os.path.isfile(os.path.join(module_path(module), '__init__.py'))


def submodules(module: str) -> list[str]:
    """The public modules and packages inside a package, from its files (nothing imported)."""
    if not is_package(module):
        return []
    return sorted(m.name + ('/' if m.ispkg else '') for m in pkgutil.iter_modules([module_path(module)])
                  if not m.name.startswith('_'))


def first_sentence(module: str) -> str:
    """The first sentence of a module's or package's docstring, without Markdown's backticks."""
    path = os.path.join(module_path(module), '__init__.py') if is_package(module) else module_path(module) + '.py'
    with open(path) as f:
        doc = ast.get_docstring(ast.parse(f.read())) or ''
    return re.split(r'(?<=\.)\s', ' '.join(doc.split()), maxsplit=1)[0].replace('`', '')


def imported(source: str, target: str) -> list[str]:
    """The modules of `target` (one level down) that `source`'s files import, most imported first."""
    counts: dict[str, int] = {}
    for root, _, files in os.walk(module_path(source)):
        for name in files:
            if not name.endswith('.py'):
                continue
            with open(os.path.join(root, name)) as f:
                tree = ast.parse(f.read())
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module + '.' + a.name if node.module == target else node.module for a in node.names]
                else:
                    continue
                for n in names:
                    parts = n.split('.')
                    if parts[0] == target and len(parts) > 1:
                        key = '.'.join(parts[:2])
                        counts[key] = counts.get(key, 0) + 1
    return sorted(counts, key=lambda k: -counts[k])


def ways_to_run() -> tuple[list[tuple[str, str]], list[tuple[str, str]], tuple[str, ...]]:
    """([(backend, mode)], [(render format, what it writes)], the task jobs) from the registry,
    the renderer table and the spec model."""
    if REPO not in sys.path:
        sys.path.insert(0, REPO)
    from cluster.spec.model import JOBS
    from launch.render import RENDERERS
    from launch.run.registry import KINDS
    backends = [(k.name, str(k.mode)) for k in KINDS.values()]
    formats = [(r.name, re.split(r' \(| to `', r.description)[0]) for r in RENDERERS.values()]
    return backends, formats, JOBS


# What a mode and a job mean, in a few words; a new one is drawn with its name alone.
MODES = {'supervised': 'supervised: the launcher starts, watches and restarts every task',
         'delegated': 'delegated: the scheduler owns the tasks (one batch job)'}
JOB_ROLES = {'chief': 'runs your TF2 coordinator program', 'ps': 'serves the variables',
             'worker': 'trains: the built-in CNN or train.program', 'evaluator': 'evaluates each new checkpoint'}


# ---------------------------------------------------------------------------------------------
# Drawing: plain SVG text, sized in pixels, fonts the reader's system has

MONO = "DejaVu Sans Mono, Menlo, Consolas, monospace"
SANS = "DejaVu Sans, Helvetica, Arial, sans-serif"
SIDE, COLUMN, GAP = 40, 370, 150          # the margin that holds the layer arrow, a package's width, between
WIDTH = 2 * SIDE + 2 * COLUMN + GAP
NAME, SMALL, PROSE, NOTE = 16, 13, 14, 13  # font sizes: a layer's name, its modules, sentences, notes
COLORS = {'launch': ('#e3f2fd', '#1565c0'), 'cluster': ('#e8f5e9', '#2e7d32')}
OTHER = ('#f3e5f5', '#6a1b9a')
GREY, RED = '#455a64', '#c62828'


class Svg:
    def __init__(self) -> None:
        self.parts: list[str] = []

    def rect(self, x, y, w, h, fill, stroke, dash=False, radius=6):
        extra = ' stroke-dasharray="5 4"' if dash else ''
        self.parts.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h:.1f}" rx="{radius}" '
                          f'fill="{fill}" stroke="{stroke}" stroke-width="1.5"{extra}/>')

    def text(self, x, y, s, size=PROSE, font=SANS, weight='normal', color='#212121', anchor='start', rotate=None):
        turn = f' transform="rotate({rotate} {x:.1f} {y:.1f})"' if rotate else ''
        self.parts.append(f'<text x="{x:.1f}" y="{y:.1f}" font-family="{font}" font-size="{size}" '
                          f'font-weight="{weight}" fill="{color}" text-anchor="{anchor}"{turn}>{escape(s)}</text>')

    def arrow(self, x1, y1, x2, y2, color=GREY, dash=False, width=1.6):
        extra = ' stroke-dasharray="6 4"' if dash else ''
        marker = 'head-red' if color == RED else 'head'
        self.parts.append(f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" stroke="{color}" '
                          f'stroke-width="{width}"{extra} marker-end="url(#{marker})"/>')

    def line(self, x1, y1, x2, y2, color=GREY, width=1.6):
        self.parts.append(f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" stroke="{color}" '
                          f'stroke-width="{width}"/>')

    def render(self, height: float, title: str) -> str:
        head = ''.join(f'<marker id="{name}" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="8" markerHeight="8" '
                       f'orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="{color}"/></marker>'
                       for name, color in (('head', GREY), ('head-red', RED)))
        return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height:.0f}" '
                f'viewBox="0 0 {WIDTH} {height:.0f}" role="img">\n<title>{escape(title)}</title>\n'
                f'<defs>{head}</defs>\n<rect width="100%" height="100%" fill="white"/>\n' +
                '\n'.join(self.parts) + '\n</svg>\n')


def wrap(s: str, width_px: float, size: float, mono: bool = False) -> list[str]:
    """Lines of `s` that fit width_px at `size` (a monospace glyph is 0.6 em; sans about 0.55)."""
    return textwrap.wrap(s, max(8, int(width_px / (size * (0.6 if mono else 0.55))))) or ['']


def layer_box(svg: Svg | None, x: float, y: float, w: float, module: str, colors: tuple[str, str],
              height: float = 0) -> float:
    """One module of a layer: its name (a package ends in /) and, for a package, the modules in
    it, in a box at least `height` tall; the box's height (svg None: only measure it)."""
    label = module.split('.')[-1] + ('/' if is_package(module) else '.py')
    size = min(NAME, (w - 16) / (0.6 * len(label)))
    inner = wrap('  '.join(submodules(module)), w - 18, SMALL, mono=True) if is_package(module) else []
    h = max(height, 30 + 16 * len(inner))
    if svg is not None:
        svg.rect(x, y, w, h, *colors)
        svg.text(x + 9, y + 21, label, size=round(size, 1), font=MONO, weight='bold', color=colors[1])
        for i, line in enumerate(inner):
            svg.text(x + 9, y + 40 + 16 * i, line, size=SMALL, font=MONO, color=GREY)
    return h


def package_column(svg: Svg, x: float, y: float, root: str, rows: list[list[str]], outside: int) -> dict:
    """A package: its header, then its layers top to bottom, with the rule drawn beside them on
    the `outside` (-1 left, +1 right). {module: (top, bottom)} of every box, and 'bottom'."""
    colors = COLORS.get(root, OTHER)
    about = wrap(first_sentence(root), COLUMN - 20, PROSE)
    header = 36 + 17 * len(about)
    svg.rect(x, y, COLUMN, header, colors[1], colors[1])
    svg.text(x + 10, y + 26, root + '/', size=20, font=MONO, weight='bold', color='white')
    for i, line in enumerate(about):
        svg.text(x + 10, y + 48 + 17 * i, line, color='white')
    y += header + 14
    top, where = y, {}
    for row in rows:
        weights = [len(m.split('.')[-1]) + 3 for m in row]
        free = COLUMN - 8 * (len(row) - 1)
        boxes, at = [], x
        for module, weight in zip(row, weights):
            w = free * weight / sum(weights)
            boxes.append((module, at, w))
            at += w + 8
        height = max(layer_box(None, at, y, w, module, colors) for module, at, w in boxes)   # one per layer
        for module, at, w in boxes:
            layer_box(svg, at, y, w, module, colors, height)
            where[module] = (y, y + height)
        y += height + 12
    arrow_x = x - 20 if outside < 0 else x + COLUMN + 20
    svg.arrow(arrow_x, top + 4, arrow_x, y - 16)
    mid = (top + y) / 2
    svg.text(arrow_x + (-6 if outside < 0 else 6), mid, 'a layer imports only the layers below it', size=NOTE,
             color=GREY, anchor='middle', rotate=-90 if outside < 0 else 90)
    where['bottom'] = y
    return where


def chips(svg: Svg, x: float, y: float, names: list[str], colors: tuple[str, str], dash: bool = False) -> float:
    """A row of small named boxes; the x after the last."""
    for name in names:
        w = 0.6 * 14 * len(name) + 18
        svg.rect(x, y, w, 26, *colors, dash=dash, radius=4)
        svg.text(x + 9, y + 18, name, size=14, font=MONO, weight='bold', color=colors[1])
        x += w + 8
    return x


def architecture_svg() -> str:
    layers, forbidden = contracts()
    (left, left_rows), (right, right_rows) = sorted(layers.items(), key=lambda kv: kv[0] != 'launch')
    backends, formats, jobs = ways_to_run()
    svg = Svg()
    lx, rx, y0 = SIDE, SIDE + COLUMN + GAP, 16
    lwhere = package_column(svg, lx, y0, left, left_rows, -1)
    rwhere = package_column(svg, rx, y0, right, right_rows, +1)

    # Between the packages: what launch imports of cluster, and the import never allowed back.
    header_mid = y0 + 52
    cx = lx + COLUMN + GAP / 2
    if (right, left) in forbidden:
        svg.arrow(rx - 4, header_mid, lx + COLUMN + 4, header_mid, color=RED)
        svg.text(cx, header_mid + 8, '✕', size=22, color=RED, anchor='middle', weight='bold')
        svg.text(cx, header_mid - 24, f'{right} never', size=NOTE, color=RED, anchor='middle')
        svg.text(cx, header_mid - 9, f'imports {left}', size=NOTE, color=RED, anchor='middle')
        svg.text(cx, header_mid + 28, '(setup.cfg contract)', size=NOTE, color=RED, anchor='middle')
    used = set(imported(left, right))
    targets = [m for row in right_rows for m in row if m in used]
    if targets:
        bus = rx - 26
        ys = [(rwhere[m][0] + rwhere[m][1]) / 2 for m in targets]
        mid = (min(ys) + max(ys)) / 2
        svg.line(lx + COLUMN, mid, bus, mid)
        svg.line(bus, min(ys), bus, max(ys))
        for yy in ys:
            svg.arrow(bus, yy, rx - 2, yy)
        svg.text(lx + COLUMN + 8, mid - 8, f'{left} imports', size=NOTE, color=GREY)

    # Below: how the tasks start.
    y = max(lwhere['bottom'], rwhere['bottom']) + 12
    band_top = y
    svg.text(lx, y + 20, 'How the tasks start', size=17, weight='bold')
    y += 40
    svg.text(lx, y + 14, f'{left} up --backend', size=14, font=MONO, color=COLORS[left][1], weight='bold')
    y += 24
    by_mode: dict[str, list[str]] = {}
    for name, mode in backends:
        by_mode.setdefault(mode, []).append(name)
    starts_at = y + 13
    for mode, names in by_mode.items():
        end = chips(svg, lx, y, names, COLORS[left])
        said = wrap(MODES.get(mode, mode), lx + COLUMN - end, NOTE)
        for i, line in enumerate(said):
            svg.text(end + 2, y + 11 + 15 * i, line, size=NOTE, color=GREY)
        y += max(40, 15 * len(said) + 10)
    svg.text(lx, y + 14, f'{left} render --format', size=14, font=MONO, color=COLORS[left][1], weight='bold')
    y += 24
    chips(svg, lx, y, [n for n, _ in formats], COLORS[left], dash=True)
    files_at = y + 13
    y += 34
    for name, what in formats:
        svg.text(lx, y + 12, f'{name}: {what}', size=NOTE, color=GREY)
        y += 17
    for line in wrap('files to submit (sbatch) or apply (kubectl apply -f): nothing starts', COLUMN, NOTE):
        svg.text(lx, y + 14, line, size=NOTE, color=GREY)
        y += 17
    y += 10

    # The one entry point every way runs.
    colors = COLORS.get(right, OTHER)
    tx, ty = rx, band_top + 40
    task = [(f'python -m {right}.task', MONO, 14, 'bold'), ('--spec SPEC --job JOB --index N', MONO, 12.5, 'normal'),
            ('(or the task from TF_CONFIG, Slurm or a JobSet pod)', SANS, NOTE, 'normal')]
    task += [(f'{job}: {JOB_ROLES.get(job, "")}'.rstrip(': '), SANS, NOTE, 'normal') for job in jobs]
    th = 16 + 19 * len(task)
    svg.rect(tx, ty, COLUMN, th, *colors)
    for i, (line, font, size, weight) in enumerate(task):
        svg.text(tx + 10, ty + 24 + 19 * i, line, size=size, font=font, weight=weight,
                 color=colors[1] if i == 0 else '#212121')
    svg.text(tx, ty + th + 18, 'one entry point on every host, however it was started', size=NOTE, color=GREY)
    svg.arrow(lx + COLUMN + 4, starts_at, tx - 4, ty + 20)
    svg.text(cx, min(starts_at, ty + 20) - 14, 'starts each task', size=NOTE, color=GREY, anchor='middle')
    svg.arrow(lx + COLUMN + 4, files_at, tx - 4, ty + th - 20, dash=True)
    svg.text(cx, max(files_at, ty + th - 20) + 22, 'the scheduler starts', size=NOTE, color=GREY, anchor='middle')
    y = max(y, ty + th + 30)
    svg.parts.insert(0, f'<rect x="{lx - 30}" y="{band_top}" width="{WIDTH - 2 * (lx - 30)}" '
                        f'height="{y - band_top:.0f}" rx="8" fill="#fafafa" stroke="#e0e0e0"/>')
    return svg.render(y + 12, f'The two packages of tfcluster, {left} and {right}, their layers, and how tasks start')


# ---------------------------------------------------------------------------------------------
# The PNGs' captions: the text chunks matplotlib writes (tEXt, or iTXt and zTXt for other text)

def png_text(path: str) -> dict[str, str]:
    out = {}
    with open(path, 'rb') as f:
        if f.read(8) != b'\x89PNG\r\n\x1a\n':
            return out
        while True:
            head = f.read(8)
            if len(head) < 8:
                return out
            length, kind = struct.unpack('>I4s', head)
            if kind == b'IDAT' or kind == b'IEND':      # matplotlib writes its text before the pixels
                return out
            data = f.read(length)
            f.read(4)
            key, _, value = data.partition(b'\0')
            if kind == b'tEXt':
                out[key.decode('latin-1')] = value.decode('latin-1')
            elif kind == b'zTXt':
                out[key.decode('latin-1')] = zlib.decompress(value[1:]).decode('latin-1')
            elif kind == b'iTXt':
                compressed, rest = value[0], value[2:]
                text = rest.split(b'\0', 2)[2]
                out[key.decode('latin-1')] = (zlib.decompress(text) if compressed else text).decode()


def plots() -> dict[str, str]:
    """{name: uri} of the benchmark's plots in reading order (N-name.png)."""
    folder = os.path.join(DOCS, *PERF.split('/'))
    found = [f for f in os.listdir(folder) if re.fullmatch(r'\d+-[\w-]+\.png', f)] if os.path.isdir(folder) else []
    found.sort(key=lambda f: int(f.split('-', 1)[0]))
    return {f.split('-', 1)[1][:-4]: f'{PERF}/{f}' for f in found}


def plot_markdown(uri: str, page_dir: str) -> str:
    meta = png_text(os.path.join(DOCS, *uri.split('/')))
    title = meta.get('Title', os.path.basename(uri))
    caption = ' '.join(t for t in (f'**{title}.**', meta.get('Description', '')) if t)
    if meta.get('Source'):
        caption += f' Measured by `{meta["Source"]}`' + (f' on {meta["Creation Time"]}.' if meta.get('Creation Time')
                                                         else '.')
    return f'![{title}]({posixpath.relpath(uri, page_dir)})\n\n{caption}\n'


# ---------------------------------------------------------------------------------------------
# The parts of pages (docs/hooks/generate.py puts each in its page): Markdown, its paths relative
# to the page's folder (page_dir, relative to docs/; '.' at the top)

def diagram_markdown(page_dir: str) -> str:
    uri = posixpath.relpath(ARCHITECTURE, page_dir)
    return (f'[![The packages cluster and launch, their layers top to bottom and how the tasks start]({uri})]({uri})'
            '\n\n*Drawn from the code by `docs/hooks/generate.py` (again at each build of the site): from setup.cfg\'s '
            'import contracts (the layers `lint-imports` enforces), the files of each package, launch\'s imports, the '
            'backend registry and the renderer table.*\n')


def plots_markdown(page_dir: str) -> str:
    """Every benchmark plot, in reading order, each with its caption."""
    found = plots()
    if not found:
        return '*No performance plots in this checkout: `python benchmarks/bench.py --plots docs/images/perf` draws them.*\n'
    return '\n'.join(plot_markdown(uri, page_dir) for uri in found.values())


def report_markdown(page_dir: str) -> str:
    if not os.path.isfile(os.path.join(DOCS, *REPORT.split('/'))):
        return ('*No report screenshot in this checkout: `TFCLUSTER_DOCS_IMAGES=1 python -m pytest '
                'tests/system/launch/records/test_run_story.py` takes it.*\n')
    uri = posixpath.relpath(REPORT, page_dir)
    return (f'[![The report of a real run: ps:0 killed with SIGKILL and the cluster restarted, the launcher '
            f'interrupted with Ctrl-C, then resumed by a second launch up]({uri})]({uri})\n\n*The report of a real '
            'run on this machine, as headless Chromium shows it (tests/system/launch/records/test_run_story.py: its ps task killed, the '
            'launcher interrupted, the run resumed; `TFCLUSTER_DOCS_IMAGES=1` makes the test refresh the '
            'picture).*\n')
