"""What ``energon-lite preview`` shows: samples collected into views (``collect``, ``views``) and
drawn in the terminal (``terminal``), as one HTML page (``html``) or as a contact sheet (``grid``).
"""

from .collect import PreviewField, PreviewSample, Section, collect
from .grid import render_grid, write_grid
from .html import render_html, write_html
from .terminal import GRAPHICS, TerminalRenderer, detect_graphics

__all__ = [
    "GRAPHICS",
    "PreviewField",
    "PreviewSample",
    "Section",
    "TerminalRenderer",
    "collect",
    "detect_graphics",
    "render_grid",
    "render_html",
    "write_grid",
    "write_html",
]
