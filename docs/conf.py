"""Sphinx configuration of django-jobs' documentation (pages in Markdown, read by MyST)."""

project = "django-jobs"
author = "django-jobs developers"
copyright = "django-jobs developers"

extensions = ["myst_parser"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]

# Anchors for `page.md#a-heading` links, spelled as GitHub spells them, so that one link
# works both on the site and when the Markdown is read on a forge.
myst_heading_anchors = 4

html_theme = "furo"
html_title = "django-jobs"
# furo loads no fonts or scripts from other hosts: the site works offline.
html_theme_options = {"navigation_with_keys": True}
html_static_path: list[str] = []
html_show_sourcelink = False
