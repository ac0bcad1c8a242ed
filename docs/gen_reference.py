"""Writes the generated pages at every `mkdocs build` (mkdocs-gen-files): the reference comes from the code."""

from pathlib import Path

import mkdocs_gen_files

from clusterctl.docsgen import pages

for path, text in pages(Path(__file__).resolve().parent.parent).items():
    with mkdocs_gen_files.open(path, "w") as fh:
        fh.write(text)
