"""The documentation site in a real browser: built as a reader's `mkdocs build --strict` builds it,
served over loopback HTTP, or opened from the file system as the README says to read it, its pages
opened in headless Chromium. Every picture on a page (the
architecture diagram drawn at build time, the benchmark's plots, the report's screenshot) must
decode, and no page may ask anything of another host: the site is read offline (mkdocs.yml tells
the theme to load no web fonts).

The browser is driven over the DevTools protocol on a pipe, which reports every request a page
makes (its frames' and its workers' too) with its URL: the browser's own traffic (update checks,
network time) is not the page's and is not counted. Whatever asks another host goes to a proxy
that refuses it, so nothing leaves the machine, and a request is seen even where no network is."""
from __future__ import annotations

import fcntl
import html.parser
import http.server
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest

from tests.harness.parts import unavailable
from tests.harness.report import REPO

pytestmark = pytest.mark.slow       # a browser


def build_site(out: str) -> None:
    try:
        import mkdocs  # noqa: F401
        import material  # noqa: F401
    except ImportError as e:
        unavailable(f'{e.name} is not installed (pip install -e \'.[docs]\')', 'the site must be checked')
    got = subprocess.run([sys.executable, '-m', 'mkdocs', 'build', '--strict', '-d', out], cwd=REPO,
                         capture_output=True, text=True, timeout=120, env=dict(os.environ, NO_MKDOCS_2_WARNING='1'))
    assert got.returncode == 0, got.stdout[-3000:] + got.stderr[-3000:]


@contextmanager
def serving(handler: type[http.server.BaseHTTPRequestHandler]) -> Iterator[str]:
    """A loopback HTTP server in a thread; its host:port."""
    server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f'127.0.0.1:{server.server_address[1]}'
    finally:
        server.shutdown()
        server.server_close()


def site_handler(root: str):
    class Site(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=root, **kwargs)

        def log_message(self, format, *args):       # noqa: A002 (the base class's name)
            pass
    return Site


class Refuse(http.server.BaseHTTPRequestHandler):
    """The proxy for every other host: nothing leaves the machine."""
    def refuse(self):
        self.send_error(403, 'the documentation is read offline')
    do_GET = do_POST = do_HEAD = do_CONNECT = do_OPTIONS = refuse

    def log_message(self, format, *args):       # noqa: A002
        pass


class Fetched(html.parser.HTMLParser):
    """Every URL a page's HTML has the browser fetch by itself (not the links a reader follows)."""
    LINK_RELS = {'stylesheet', 'preload', 'modulepreload', 'prefetch', 'preconnect', 'dns-prefetch', 'icon',
                 'apple-touch-icon', 'manifest'}

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = {k: v or '' for k, v in attrs}
        if tag == 'link' and set(a.get('rel', '').split()) & self.LINK_RELS:
            self.urls.append(a.get('href', ''))
        if tag != 'a':
            self.urls += [a[k] for k in ('src', 'data', 'poster') if a.get(k)]
            self.urls += [part.split()[0] for part in a.get('srcset', '').split(',') if part.strip()]
            self.urls += re.findall(r'url\(\s*[\'"]?([^\'")]+)', a.get('style', ''))


def elsewhere(url: str, here: str) -> bool:
    """A URL of another host (protocol-relative ones too); data:, blob: and the site's own are not."""
    parts = urlsplit(url)
    return parts.scheme in ('http', 'https', 'ws', 'wss', '') and bool(parts.netloc) and parts.netloc != here


PLACE_FDS = 'import os, sys; os.dup2(int(sys.argv[1]), 3); os.dup2(int(sys.argv[2]), 4); os.execvp(sys.argv[3], sys.argv[3:])'


class DevTools:
    """Headless Chromium over --remote-debugging-pipe: commands in on fd 3, answers and events out
    on fd 4, each a JSON text ended by a NUL byte. One page target, attached in flat mode."""

    def __init__(self, binary: str, profile: str, proxy: str):
        self.log = profile + '.log'         # Chromium's stderr, for the message if it ends early
        to_browser, self._send = os.pipe()
        self._recv, from_browser = os.pipe()
        # Chromium reads fd 3 and writes fd 4: a small Python puts the pipe's ends there and execs
        # it (the ends moved above 9 first, so that neither already is 3 or 4; POSIX sh cannot
        # name an fd above 9, and preexec_fn is unsafe beside the servers' threads).
        ends = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in (to_browser, from_browser)]
        os.close(to_browser)
        os.close(from_browser)
        argv = [binary, '--headless', '--no-sandbox', '--disable-gpu', '--no-first-run', f'--user-data-dir={profile}',
                '--remote-debugging-pipe', f'--proxy-server=http://{proxy}', '--disable-background-networking',
                '--disable-component-update', '--no-default-browser-check', 'about:blank']
        with open(self.log, 'wb') as log:
            self.proc = subprocess.Popen([sys.executable, '-c', PLACE_FDS, *map(str, ends), *argv], pass_fds=ends,
                                         stdout=log, stderr=log, start_new_session=True)
        for fd in ends:
            os.close(fd)
        self._buffer, self._next = b'', 0
        self.events: list[dict] = []
        self.requests: list[tuple[str, str]] = []     # (session, URL) of every request a page made
        target = self.call('Target.createTarget', url='about:blank')['targetId']
        self.session = self.call('Target.attachToTarget', targetId=target, flatten=True)['sessionId']
        for method, params in (('Network.enable', {}), ('Page.enable', {}),
                               ('Page.setLifecycleEventsEnabled', {'enabled': True}),
                               ('Target.setAutoAttach', {'autoAttach': True, 'waitForDebuggerOnStart': False,
                                                         'flatten': True})):
            self.call(method, self.session, **params)

    def _read(self, deadline: float) -> dict:
        while b'\0' not in self._buffer:
            ready, _, _ = select.select([self._recv], [], [], max(0.0, deadline - time.monotonic()))
            chunk = os.read(self._recv, 1 << 16) if ready else b''
            if not chunk:
                with open(self.log, errors='replace') as f:
                    said = f.read()[-3000:]
                raise AssertionError(('Chromium said nothing more' if ready else 'Chromium did not answer in time') +
                                     f'; its output:\n{said}')
            self._buffer += chunk
        text, self._buffer = self._buffer.split(b'\0', 1)
        message = json.loads(text)
        if message.get('method') == 'Network.requestWillBeSent':
            self.requests.append((message.get('sessionId', ''), message['params']['request']['url']))
        elif message.get('method') == 'Target.attachedToTarget':     # a worker or frame of the page
            self._write('Network.enable', message['params']['sessionId'], {})
        return message

    def _write(self, method: str, session: str | None, params: dict) -> int:
        self._next += 1
        message = {'id': self._next, 'method': method, 'params': params, **({'sessionId': session} if session else {})}
        os.write(self._send, json.dumps(message).encode() + b'\0')
        return self._next

    def call(self, method: str, session: str | None = None, timeout: float = 60, **params) -> dict:
        ident, deadline = self._write(method, session, params), time.monotonic() + timeout
        while True:
            message = self._read(deadline)
            if message.get('id') == ident:
                assert 'error' not in message, (method, message['error'])
                return message['result']
            if 'method' in message:
                self.events.append(message)

    def open(self, url: str, timeout: float = 60) -> None:
        """Load url and wait until its network has been idle for half a second (late requests too)."""
        loader = self.call('Page.navigate', self.session, url=url)['loaderId']
        deadline = time.monotonic() + timeout
        seen = [e for e in self.events if e.get('method') == 'Page.lifecycleEvent']
        self.events.clear()
        while not any(e['params'].get('loaderId') == loader and e['params'].get('name') == 'networkIdle'
                      for e in seen):
            message = self._read(deadline)
            if message.get('method') == 'Page.lifecycleEvent':
                seen.append(message)

    def evaluate(self, expression: str):
        got = self.call('Runtime.evaluate', self.session, expression=expression, returnByValue=True, awaitPromise=True)
        assert 'exceptionDetails' not in got, got['exceptionDetails']
        return got['result'].get('value')

    def close(self) -> None:
        try:
            self._write('Browser.close', None, {})
            self.proc.wait(timeout=20)
        except (OSError, subprocess.TimeoutExpired):
            pass
        finally:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
            os.close(self._send)
            os.close(self._recv)


IMAGES = """[...document.images].map(i => [i.getAttribute('src'), i.complete && i.naturalWidth > 0 ?
                                       i.naturalWidth + 'x' + i.naturalHeight : 'broken'])"""
DECODE = """Promise.all(%s.map(src => new Promise(done => {
  const i = new Image();
  i.onload = () => done([src, i.naturalWidth > 0 ? i.naturalWidth + 'x' + i.naturalHeight : 'broken']);
  i.onerror = () => done([src, 'broken']);
  i.src = src;
})))"""


def chromium() -> str:
    binary = next((b for b in ('chromium', 'chromium-browser') if shutil.which(b)), None)
    if binary is None:
        unavailable('no chromium binary found (Debian: apt-get install -y chromium)',
                    'the documentation site must be checked in a real browser')
    return binary


def test_every_page_shows_every_picture_and_asks_nothing_of_another_host(tmp_path):
    """Every page's HTML fetches nothing of another host; in the browser, the home page and every
    page with a picture load with every picture decoded, asking nothing of another host either
    (the theme's scripts included), and every picture file of the site decodes. The theme's
    assets are the same on every page: opening each of the ~30 pages would only repeat them, at
    over a second a page."""
    binary = chromium()
    site = str(tmp_path / 'site')
    build_site(site)
    pages, pictures, fetched = {}, [], {}
    for folder, _, files in os.walk(site):
        rel = os.path.relpath(folder, site).replace(os.sep, '/')
        prefix = '/' if rel == '.' else f'/{rel}/'
        for name in files:
            if name.endswith('.html'):
                with open(os.path.join(folder, name)) as f:
                    text = f.read()
                parser = Fetched()
                parser.feed(text)
                fetched[prefix + name] = parser.urls
                if name != '404.html' and not rel.startswith(('assets', 'search')):
                    pages[prefix + name] = '<img' in text
            elif rel.split('/')[0] == 'images' and name.endswith(('.png', '.svg', '.jpg')):
                pictures.append(prefix + name)
    assert '/index.html' in pages and '/architecture.html' in pages and len(pages) >= 20, sorted(pages)
    assert '/images/architecture.svg' in pictures, pictures        # drawn at build time by docs/hooks/diagram.py
    static = {page: bad for page, urls in fetched.items() if (bad := [u for u in urls if elsewhere(u, '')])}
    assert not static, f'pages that would fetch from another host: {static}'
    opened = ['/'] + sorted(page for page, has_images in pages.items() if has_images and page != '/index.html')
    with serving(site_handler(site)) as here, serving(Refuse) as proxy:
        browser = DevTools(binary, str(tmp_path / 'profile'), proxy)
        try:
            shown = {}
            for page in opened:
                browser.open(f'http://{here}{page}')
                shown[page] = browser.evaluate(IMAGES)
            browser.open(f'http://{here}/404.html')
            decoded = dict(browser.evaluate(DECODE % json.dumps(sorted(pictures))))
        finally:
            browser.close()
    broken = {page: [src for src, size in images if size == 'broken'] for page, images in shown.items()}
    assert not any(broken.values()), f'pictures that did not decode: {broken}'
    assert not [src for src, size in decoded.items() if size == 'broken'], decoded
    outside = sorted({url for _, url in browser.requests if elsewhere(url, here)})
    assert not outside, f'the site asked other hosts for: {outside}'
    assert any('/assets/javascripts/bundle.' in url for _, url in browser.requests), browser.requests   # seen
    print(f'{len(pages)} pages fetch nothing elsewhere; opened {", ".join(opened)}: '
          f'{sum(len(i) for i in shown.values())} pictures on them decoded, and {len(decoded)} picture files '
          f'({", ".join(f"{src} {size}" for src, size in sorted(decoded.items()))}); '
          f'{len(browser.requests)} requests, none to another host')


# Every link of a page that stays in the site (its file:// links), without the part after a #.
SITE_LINKS = """[...new Set([...document.links].filter(a => a.protocol === 'file:').map(a => a.href.split('#')[0]))]"""
SHOWN = """[document.title, !!document.querySelector('article.md-content__inner h1'), location.href,
         [...document.querySelectorAll('pre > code')].filter(c => c.scrollWidth > c.clientWidth + 1)
                                                     .map(c => c.textContent.slice(0, 60))]"""
NARROW = 800        # pixels: a small laptop's window, or half of a wide screen
RESULTS = """new Promise(done => { const until = Date.now() + 30000; (function poll() {
  const items = [...document.querySelectorAll('.md-search-result__item a')].map(a => a.href);
  if (items.length || Date.now() > until)
    done([items, document.querySelector('.md-search-result__meta').textContent.trim()]);
  else setTimeout(poll, 100);
})(); })"""


def test_the_site_opened_from_the_file_system_navigates_and_searches(tmp_path):
    """As the README says to read it: site/index.html opened from the file system, no server.
    Every link of the home page and of a page one folder down (the navigation, the header, the
    footer, the text) leads to a page, a file, not a folder (which the browser would list); pages
    followed from the top, into a folder and back up show their article, and in a window NARROW
    pixels wide no code block of theirs hides the end of a line; and typing in the search
    box on a page in a folder lists results (the theme's search worker runs in a frame there,
    docs/javascripts/file-worker.js), each a page of the site."""
    binary = chromium()
    site = str(tmp_path / 'site')
    build_site(site)

    def page_of(url: str) -> str:
        assert url.startswith('file://'), url
        return os.path.relpath(url.removeprefix('file://').split('#')[0], site).replace(os.sep, '/')

    with serving(Refuse) as proxy:
        browser = DevTools(binary, str(tmp_path / 'profile'), proxy)
        try:
            browser.call('Emulation.setDeviceMetricsOverride', browser.session, width=NARROW, height=900,
                         deviceScaleFactor=1, mobile=False)
            links, shown = {}, {}
            for start in ('index.html', 'backends/ssh.html'):
                browser.open(f'file://{site}/{start}')
                links[start] = [page_of(url) for url in browser.evaluate(SITE_LINKS)]
            followed = ['getting-started.html', 'reference/cli.html', 'index.html']   # in, down a folder, back up
            for page, came_from in zip(followed, ['index.html', 'index.html', 'backends/ssh.html']):
                assert page in links[came_from], (page, came_from, links[came_from])
                browser.open(f'file://{site}/{page}')
                shown[page] = browser.evaluate(SHOWN)
            browser.call('Runtime.evaluate', browser.session, expression="document.querySelector('.md-search__input').focus()")
            browser.call('Input.insertText', browser.session, text='tensorboard')
            found, said = browser.evaluate(RESULTS)
        finally:
            browser.close()
    for start, pages in links.items():
        assert len(pages) >= 25, (start, pages)
        not_pages = sorted({p for p in pages if not (p.endswith('.html') and os.path.isfile(os.path.join(site, p)))})
        assert not not_pages, f'links of {start} that lead to no page (a folder is listed, not shown): {not_pages}'
    for page, (title, article, url, cut) in shown.items():
        assert article and not title.startswith('Index of') and page_of(url) == page, (page, title, url)
        assert not cut, f'{page}: code blocks wider than their box at {NARROW} px (line ends hidden): {cut}'
    assert 'getting-started.html' in shown      # its launch up sample has lines of 130 characters
    assert found, f'no search results from the file system: the search box says {said!r}'
    assert 'training.html' in {page_of(url) for url in found}, found
    assert all(os.path.isfile(os.path.join(site, page_of(url))) for url in found), found
    print(f'from file://: {len(set(links["index.html"]))} pages linked from the top, {len(set(links["backends/ssh.html"]))}'
          f' from backends/ssh.html, every one a file; followed {", ".join(shown)}; search "tensorboard": {said}')
