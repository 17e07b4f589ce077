"""Samples as a contact sheet: one cell per sample in a grid, drawn with Pillow.

A cell shows the sample's first image (else its first video's frames, else its audio's
waveform, else its text) above a two-line caption: the sample key, and the start of its first
text field where it has one.
"""

from __future__ import annotations

import io
import math
import os
from collections.abc import Iterable

from PIL import Image, ImageDraw, ImageFont

from ..storage import AnyPath, atomic_write_bytes
from .collect import PreviewSample, Section
from .views import (
    AudioView,
    ErrorView,
    ImageView,
    TextView,
    VideoView,
    fit,
    flatten,
    peaks,
    strip,
)

__all__ = ["CELL_SIZE", "THUMB_SIZE", "cell_text", "render_grid", "write_grid"]

THUMB_SIZE = (160, 160)
_PAD = 8
_LINE = 15  # caption line height
#: Width and height of one cell: the thumbnail box, then two caption lines, with padding.
CELL_SIZE = (THUMB_SIZE[0] + 2 * _PAD, THUMB_SIZE[1] + 2 * _PAD + 2 * _LINE + 4)
BACKGROUND = (255, 255, 255)
_BOX = (238, 238, 238)  # the thumbnail box, so that an empty one is still seen as a cell
_INK = (34, 34, 34)
_MUTED = (110, 110, 110)
_ERROR = (176, 0, 32)


def render_grid(sections: Iterable[Section], *, columns: int = 5) -> Image.Image:
    """The contact sheet of every sample of ``sections`` (at least one cell: "no samples")."""
    samples = [sample for section in sections for sample in section.samples]
    columns = max(1, min(columns, len(samples)))
    rows = max(1, math.ceil(len(samples) / columns))
    sheet = Image.new("RGB", (columns * CELL_SIZE[0], rows * CELL_SIZE[1]), BACKGROUND)
    draw = ImageDraw.Draw(sheet)
    font = _font()
    if not samples:
        draw.text((_PAD, _PAD), "no samples", fill=_MUTED, font=font)
    for n, sample in enumerate(samples):
        x, y = (n % columns) * CELL_SIZE[0], (n // columns) * CELL_SIZE[1]
        _cell(sheet, draw, font, sample, x, y)
    return sheet


def write_grid(path: AnyPath, sections: Iterable[Section], *, columns: int = 5) -> int:
    """Writes the contact sheet to ``path`` (PNG, or the format its extension names); returns how
    many samples it shows."""
    sections = list(sections)
    sheet = render_grid(sections, columns=columns)
    fmt = Image.registered_extensions().get(os.path.splitext(str(path))[1].lower(), "PNG")
    buffer = io.BytesIO()
    sheet.save(buffer, format=fmt)
    atomic_write_bytes(path, buffer.getvalue())
    return sum(len(section.samples) for section in sections)


def _cell(sheet: Image.Image, draw: ImageDraw.ImageDraw, font: ImageFont.ImageFont, sample: PreviewSample, x: int, y: int) -> None:
    box = (x + _PAD, y + _PAD, x + _PAD + THUMB_SIZE[0] - 1, y + _PAD + THUMB_SIZE[1] - 1)
    draw.rectangle(box, fill=_BOX)
    views = [field.view for field in sample.fields]
    text = cell_text(sample)
    problem = sample.error or next((v.summary for v in views if isinstance(v, ErrorView)), None)
    thumb = _thumbnail(views)
    if thumb is not None:
        thumb = fit(thumb, *THUMB_SIZE)
        sheet.paste(thumb, (box[0] + (THUMB_SIZE[0] - thumb.width) // 2, box[1] + (THUMB_SIZE[1] - thumb.height) // 2))
    elif sample.error is not None or sample.excluded:
        _paragraph(draw, font, sample.error or "excluded by split.yaml", box, _ERROR if sample.error else _MUTED)
    elif text is not None:
        _paragraph(draw, font, text, box, _INK)
    else:
        summaries = "\n".join(v.summary for v in views if not isinstance(v, ErrorView))
        _paragraph(draw, font, summaries, box, _MUTED)
    width = THUMB_SIZE[0]
    caption_y = box[3] + 4
    draw.text((box[0], caption_y), _clip(draw, font, sample.key or f"#{sample.index}", width), fill=_INK, font=font)
    second, colour = (f"error: {problem}", _ERROR) if problem is not None and thumb is not None else (text, _MUTED)
    if second:
        draw.text((box[0], caption_y + _LINE), _clip(draw, font, " ".join(second.split()), width), fill=colour, font=font)


def cell_text(sample: PreviewSample) -> str | None:
    """The sample's first text field (a typed sample's ``__key__`` is one too, and is already the
    cell's first caption line)."""
    return next((f.view.text for f in sample.fields if isinstance(f.view, TextView) and not f.name.startswith("__")), None)


def _thumbnail(views: list) -> Image.Image | None:
    """The picture of a cell: the first image, else a video's frames, else a waveform."""
    for kind in (ImageView, VideoView, AudioView):
        view = next((v for v in views if isinstance(v, kind)), None)
        if view is None:
            continue
        if isinstance(view, ImageView):
            return flatten(view.image, BACKGROUND)
        if isinstance(view, VideoView):
            return strip(view.frames)
        return _waveform_image(view)
    return None


def _waveform_image(view: AudioView) -> Image.Image:
    """Bars of the per-column peak, mirrored around the middle line."""
    width, height = THUMB_SIZE[0], THUMB_SIZE[1] // 2
    image = Image.new("RGB", (width, height), _BOX)
    draw = ImageDraw.Draw(image)
    middle = height // 2
    for x, peak in enumerate(peaks(view.samples, width)):
        reach = max(1, round(float(peak) * (middle - 1)))
        draw.line([(x, middle - reach), (x, middle + reach)], fill=(36, 68, 102))
    return image


def _font() -> ImageFont.ImageFont:
    try:
        return ImageFont.load_default(size=12)  # FreeType's, with Pillow >= 10.1
    except TypeError:  # an older Pillow: its bitmap font
        return ImageFont.load_default()


def _drawable(font: ImageFont.ImageFont, text: str) -> str:
    """The bitmap font draws Latin-1 only (it raises on anything else)."""
    return text if isinstance(font, ImageFont.FreeTypeFont) else text.encode("latin-1", "replace").decode("latin-1")


def _clip(draw: ImageDraw.ImageDraw, font: ImageFont.ImageFont, text: str, width: int) -> str:
    """``text`` cut with "…" to fit ``width`` pixels."""
    text = _drawable(font, text)
    if draw.textlength(text, font=font) <= width:
        return text
    ellipsis = "..." if not isinstance(font, ImageFont.FreeTypeFont) else "…"
    low, high = 0, len(text)
    while low < high:  # the longest prefix that fits with the ellipsis
        mid = (low + high + 1) // 2
        if draw.textlength(text[:mid] + ellipsis, font=font) <= width:
            low = mid
        else:
            high = mid - 1
    return text[:low] + ellipsis


def _paragraph(draw: ImageDraw.ImageDraw, font: ImageFont.ImageFont, text: str, box: tuple[int, int, int, int], colour: tuple[int, int, int]) -> None:
    """``text`` word-wrapped inside ``box`` (what does not fit is left out)."""
    width, lines = box[2] - box[0] - 8, []
    for word in " ".join(text.split()).split(" "):
        candidate = f"{lines[-1]} {word}" if lines else word
        if lines and draw.textlength(_drawable(font, candidate), font=font) <= width:
            lines[-1] = candidate
        else:
            lines.append(word)
    for n, line in enumerate(lines[: (box[3] - box[1] - 8) // _LINE]):
        draw.text((box[0] + 4, box[1] + 4 + n * _LINE), _clip(draw, font, line, width), fill=colour, font=font)
