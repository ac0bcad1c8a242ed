"""Writes the generated pages at every `mkdocs build` (mkdocs-gen-files): the reference comes from the code."""

from pathlib import Path

import mkdocs_gen_files

from clusterctl.docsgen import images, pages

ROOT = Path(__file__).resolve().parent.parent
for path, text in pages(ROOT).items():
    with mkdocs_gen_files.open(path, "w") as fh:
        fh.write(text)
for path, data in images(ROOT).items():
    with mkdocs_gen_files.open(path, "wb") as fh:
        fh.write(data)
