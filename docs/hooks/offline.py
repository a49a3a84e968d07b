"""MkDocs hook: a site that works opened from the file system (site/index.html, no server).

mkdocs.yml gives the pages file names (use_directory_urls: false), so a link goes to a page, not
to a folder that a browser would list; docs/javascripts/file-worker.js lets the theme's search
worker run on a file:// page. What is left is the search index: a file:// page may not fetch
search_index.json, so the theme, on such a page, loads search/search_index.js instead and reads
its `__index`. This hook writes that file after the search plugin has written the index. (The
theme's own `offline` plugin does the same but also adds a script from unpkg.com to every page;
the site is read without network, so it is not used.) It also gives 404.html links relative to
the site's top, where it lies, like every other page's (see on_template_context).
"""
from __future__ import annotations

import os

from mkdocs.plugins import event_priority


@event_priority(-100)           # after the search plugin's on_post_build, which writes the index
def on_post_build(config) -> None:
    folder = os.path.join(config['site_dir'], 'search')
    index = os.path.join(folder, 'search_index.json')
    if not os.path.isfile(index):
        return
    with open(index, encoding='utf-8') as f:
        data = f.read()
    with open(os.path.join(folder, 'search_index.js'), 'w', encoding='utf-8') as f:
        f.write(f'var __index = {data};\n')


def on_template_context(context, template_name, config):
    """404.html's links relative to the site's top, not root-absolute (/assets/...): MkDocs makes an
    error page's links root-absolute unless site_url says where the site lives, and from the file
    system, or served below a path (a project's pages), those lead nowhere. Relative, they hold
    wherever the site is, for a server's 404 at the site's top level."""
    if template_name != '404.html':
        return context
    context['base_url'] = '.'
    for key in ('extra_css', 'extra_javascript'):
        context[key] = ['.' + url if url.startswith('/') else url for url in context.get(key) or []]
    return context
