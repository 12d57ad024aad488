# Sphinx configuration: the docs are Markdown pages (MyST), built with
# warnings as errors in CI (tests/test_docs.py):
#   pip install '.[docs]' && sphinx-build -W -b html docs docs/_build/html
project = "pump"
author = "the pump developers"
copyright = "the pump developers; Apache-2.0"

extensions = ["myst_parser"]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build"]
root_doc = "index"

# Headings get anchors (#the-extent-rule) that links between pages may name.
myst_heading_anchors = 3
myst_enable_extensions = ["deflist"]

html_theme = "furo"
html_title = "pump"
