"""Helpers of the tests of speed, used by
tests/system/cluster/training/test_speed.py, tests/unit/cluster/training/test_speed.py: here, since no test
module imports another."""
from __future__ import annotations

import os




def assert_png(path, quick: bool = False) -> None:
    """A plot decodes, is large enough to read and small enough for the site, and carries its caption."""
    import matplotlib.image
    from PIL import Image
    pixels = matplotlib.image.imread(path)
    assert pixels.shape[0] >= 250 and pixels.shape[1] >= 800, (path, pixels.shape)
    assert 10_000 < os.path.getsize(path) < 200_000, (path, os.path.getsize(path))
    with Image.open(path) as im:
        text = im.text
    assert text['Title'] and text['Source'].startswith('python benchmarks/bench.py') and text['Creation Time'], text
    assert ('Quick mode' in text['Description']) == quick, text['Description']

