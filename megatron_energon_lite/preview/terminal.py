"""Samples as terminal lines: Energon's ``Sample <index>`` / `` - name (type): value`` layout,
with images drawn under their line.

Images are drawn with the kitty graphics protocol or sixel where the terminal says it supports
them, else as colour half-blocks (``▀``: 24-bit foreground = upper pixel, background = lower
pixel), which every modern terminal shows. Video is a strip of frames, audio a one-line waveform.
Nothing is drawn when the output is not a terminal, so a pipe gets plain text. Text from the
dataset is untrusted: control characters are shown escaped, never sent to the terminal.
"""

from __future__ import annotations

import base64
import io
import itertools
import os
import re
import textwrap
from collections.abc import Iterator, Mapping

import numpy as np
from PIL import Image

from .collect import PreviewField, PreviewSample, Section
from .views import (
    AudioView,
    ErrorView,
    ImageView,
    TextView,
    VideoView,
    fit,
    flatten,
    strip,
    waveform,
)

__all__ = ["GRAPHICS", "TerminalRenderer", "detect_graphics", "half_blocks", "kitty", "sixel"]

#: The ``--graphics`` choices; "auto" picks one of the others with :func:`detect_graphics`.
GRAPHICS = ("auto", "kitty", "sixel", "blocks", "none")
#: Most terminal cells an image takes (columns; rows of two pixels each).
MAX_COLUMNS = 96
MAX_ROWS = 16
#: Pixel box of a kitty or sixel image (terminals draw pixels, not cells).
MAX_PIXELS = (384, 256)
#: Lines of a long text shown before it is cut.
MAX_TEXT_LINES = 8
#: Characters of an audio waveform.
WAVEFORM_COLUMNS = 64
INDENT = "   "


def detect_graphics(isatty: bool, environ: Mapping[str, str] | None = None) -> str:
    """What "auto" means here: "none" when not writing to a terminal (or for ``TERM=dumb`` and
    ``NO_COLOR``), kitty where kitty says it runs, sixel only where ``TERM`` names it (terminals
    cannot be asked without reading from the tty), else colour half-blocks."""
    env = os.environ if environ is None else environ
    term = env.get("TERM", "")
    if not isatty or term == "dumb" or env.get("NO_COLOR"):
        return "none"
    if term == "xterm-kitty" or env.get("KITTY_WINDOW_ID"):
        return "kitty"
    if "sixel" in term:
        return "sixel"
    return "blocks"


class TerminalRenderer:
    """Lines for sections and samples; ``graphics`` is one of :data:`GRAPHICS` but "auto"."""

    def __init__(self, graphics: str = "none", columns: int = 80) -> None:
        self.graphics = graphics
        self.columns = max(columns, 20)

    def section_lines(self, section: Section) -> Iterator[str]:
        if section.leaf is not None:
            yield f"== {section.leaf}"
        if section.note is not None:
            yield section.note
            return
        yield section.title
        for sample in section.samples:
            yield from self.sample_lines(sample)

    def sample_lines(self, sample: PreviewSample) -> list[str]:
        lines = [f"Sample {sample.index}"]
        if sample.excluded:
            return [*lines, " (excluded by split.yaml)"]
        if sample.error is not None:
            where = ", ".join(f"{k} {_safe(v)!r}" for k, v in (("key", sample.key), ("shard", sample.shard)) if v is not None)
            return [*lines, f" ! cannot load this sample{' (' + where + ')' if where else ''}:", *_indented(sample.error)]
        for field in sample.fields:
            lines.extend(self.field_lines(field))
        return lines

    def field_lines(self, field: PreviewField) -> list[str]:
        view = field.view
        label = f" - {field.name}" + (f" ({field.type_name})" if field.type_name is not None else "")
        if isinstance(view, ErrorView):
            first, *rest = view.summary.splitlines() or [""]
            return [f"{label}: error: {_safe(first)}", *_indented("\n".join(rest))]
        if isinstance(view, TextView) and (len(view.text) > 80 or "\n" in view.text):
            return [f"{label}: text, {len(view.text)} chars", *self._text(view.text)]
        lines = [f"{label}: {view.summary}"]
        if isinstance(view, AudioView):
            lines.append(INDENT + waveform(view.samples, min(WAVEFORM_COLUMNS, self.columns - len(INDENT))))
        elif isinstance(view, (ImageView, VideoView)) and self.graphics != "none":
            image = flatten(view.image) if isinstance(view, ImageView) else strip(view.frames)
            lines.extend(self.draw(image))
        return lines

    def draw(self, image: Image.Image) -> list[str]:
        if self.graphics == "kitty":
            return [INDENT + kitty(image, *MAX_PIXELS)]
        if self.graphics == "sixel":
            return [INDENT + sixel(fit(image, *MAX_PIXELS))]
        return [INDENT + line for line in half_blocks(image, min(MAX_COLUMNS, self.columns - len(INDENT)), MAX_ROWS)]

    def _text(self, text: str) -> list[str]:
        width = self.columns - len(INDENT) - 1
        wrapped = [piece for line in _safe(text).splitlines() for piece in (textwrap.wrap(line, width) or [""])]
        shown = [INDENT + line for line in wrapped[:MAX_TEXT_LINES]]
        if len(wrapped) > MAX_TEXT_LINES:
            shown.append(f"{INDENT}... (cut: {len(text)} chars in all)")
        return shown


# Every C0/C1 control but newline and tab (ESC starts terminal commands: an untrusted caption
# could otherwise retitle the window or rewrite the screen).
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _safe(text: str) -> str:
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], text)


def _indented(text: str) -> list[str]:
    return [INDENT + _safe(line) for line in text.splitlines()]


# -- drawing ---------------------------------------------------------------------------------------


_UNSET = object()  # no colour sent yet on this line


def half_blocks(image: Image.Image, columns: int, rows: int) -> list[str]:
    """``image`` (RGB) as lines of ``▀``: foreground = the upper pixel, background = the lower one
    (an odd last pixel row gets the terminal's own background), at most ``columns`` x ``rows``
    cells. Colour codes are sent only where the colour changes."""
    pixels = np.asarray(fit(image.convert("RGB"), columns, 2 * rows))
    lines = []
    for y in range(0, pixels.shape[0], 2):
        out, fg, bg = [], _UNSET, _UNSET
        for x in range(pixels.shape[1]):
            top = tuple(int(v) for v in pixels[y, x])
            bottom = tuple(int(v) for v in pixels[y + 1, x]) if y + 1 < pixels.shape[0] else None
            if top != fg:
                out.append("\x1b[38;2;{};{};{}m".format(*top))
                fg = top
            if bottom != bg:
                out.append("\x1b[49m" if bottom is None else "\x1b[48;2;{};{};{}m".format(*bottom))
                bg = bottom
            out.append("▀")
        lines.append("".join(out) + "\x1b[0m")
    return lines


def kitty(image: Image.Image, max_width: int, max_height: int) -> str:
    """The kitty graphics protocol: a PNG sent in base64 chunks of 4096 (``a=T``: transmit and
    show; ``q=2``: no reply, which would otherwise arrive on the shell's input)."""
    buffer = io.BytesIO()
    fit(image, max_width, max_height).save(buffer, format="PNG")
    data = base64.standard_b64encode(buffer.getvalue()).decode("ascii")
    chunks = [data[i : i + 4096] for i in range(0, len(data), 4096)] or [""]
    out = []
    for i, chunk in enumerate(chunks):
        more = int(i < len(chunks) - 1)
        control = f"a=T,f=100,q=2,m={more}" if i == 0 else f"m={more}"
        out.append(f"\x1b_G{control};{chunk}\x1b\\")
    return "".join(out)


def sixel(image: Image.Image) -> str:
    """DEC sixel: at most 256 colours (Pillow's median cut), bands of six pixel rows, each colour
    of a band as one run-length encoded pass over the band (``$`` returns, ``-`` next band)."""
    rgb = image.convert("RGB")
    quantized = rgb.quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    indices = np.asarray(quantized)
    palette = quantized.getpalette() or []
    height, width = indices.shape
    out = [f'\x1bPq"1;1;{width};{height}']
    for colour in np.unique(indices):
        r, g, b = palette[3 * colour : 3 * colour + 3]
        out.append(f"#{colour};2;{round(r * 100 / 255)};{round(g * 100 / 255)};{round(b * 100 / 255)}")
    weights = (1 << np.arange(6, dtype=np.uint8))[:, None]
    for top in range(0, height, 6):
        band = indices[top : top + 6]
        passes = []
        for colour in np.unique(band):
            bits = ((band == colour) * weights[: band.shape[0]]).sum(axis=0)
            passes.append(f"#{colour}" + _run_length("".join(chr(63 + int(v)) for v in bits)))
        out.append("$".join(passes) + "-")
    out.append("\x1b\\")
    return "".join(out)


def _run_length(text: str) -> str:
    return "".join(f"!{n}{c}" if (n := len(list(group))) > 3 else c * n for c, group in itertools.groupby(text))
