"""MkDocs hooks (mkdocs.yml ``hooks:``).

- The docstrings use Sphinx roles (``:class:`Blender```), which mkdocstrings renders as text; the
  site shows the name alone, in code.
- A heading's anchor never starts with a digit (``## 0.1.0`` gets ``#v010``): the theme's
  scrollspy looks anchors up as CSS selectors, and ``#010`` is not one (a script error)."""

import re

from markdown.extensions.toc import slugify

SPHINX_ROLE = re.compile(r":(?:py:)?(?:class|meth|func|attr|data|mod|exc|obj|const):(<code>)~?")


def css_safe_slugify(value: str, separator: str) -> str:
    slug = slugify(value, separator)
    return f"v{slug}" if slug[:1].isdigit() else slug


def on_config(config, **kwargs):
    config["mdx_configs"].setdefault("toc", {})["slugify"] = css_safe_slugify
    return config


def on_page_content(html: str, **kwargs) -> str:
    return SPHINX_ROLE.sub(r"\1", html)
