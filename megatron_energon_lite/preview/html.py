"""Samples as one self-contained HTML page: thumbnails and video frames as ``data:`` images,
audio as ``<audio controls>`` over a ``data:`` WAV, every field in a table row.

The page loads nothing from the network and runs no script. Everything from the dataset (keys,
shard names, text, error messages) is escaped, and a Content-Security-Policy that allows only
``data:`` images and media and the page's own style is a second fence, should escaping ever miss.
"""

from __future__ import annotations

import base64
import html
import io
import wave
from collections.abc import Iterable

import numpy as np
from PIL import Image

from ..storage import AnyPath, atomic_write_bytes
from .collect import PreviewField, PreviewSample, Section
from .views import (
    AudioView,
    ErrorView,
    ImageView,
    TextView,
    ValueView,
    VideoView,
    View,
    fit,
    waveform,
)

__all__ = ["render_html", "write_html"]

#: Long side of an image thumbnail; video frames are a little smaller.
THUMB_SIDE = 256
FRAME_THUMB_SIDE = 160
#: Small images are shown up to this many times larger (pixelated), not stored larger.
MAX_UPSCALE = 4
#: Longest text shown in full.
MAX_TEXT_CHARS = 2000

_CSP = "default-src 'none'; img-src data:; media-src data:; style-src 'unsafe-inline'"
_STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 16px; color: #222; background: #fff; }
h1 { font-size: 18px; margin: 0 0 4px; } h2 { font-size: 16px; margin: 24px 0 8px; }
.leaf { color: #555; font-size: 14px; margin: 24px 0 0; }
.sample { border: 1px solid #ddd; border-radius: 4px; margin: 8px 0; padding: 6px 10px; }
.sample h3 { font-size: 14px; margin: 0 0 6px; }
.key, .shard { font-family: monospace; font-weight: normal; color: #036; margin-left: 8px; }
.shard { color: #666; }
table { border-collapse: collapse; } th, td { text-align: left; vertical-align: top; padding: 2px 8px 2px 0; }
th { font-family: monospace; font-weight: 600; } .type { color: #777; font-family: monospace; font-size: 12px; }
img { image-rendering: pixelated; display: block; } .frames { display: flex; gap: 4px; }
pre { margin: 0; white-space: pre-wrap; word-break: break-word; max-width: 900px; }
.wave { font-family: monospace; color: #246; } .error { color: #b00020; } .note { color: #777; }
"""


def render_html(sections: Iterable[Section], *, title: str) -> str:
    """The whole page; ``title`` (the dataset path) heads it."""
    body = [f"<h1>energon-lite preview</h1>\n<p class=\"path\">{_esc(title)}</p>"]
    for section in sections:
        body.append(_section(section))
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
        f"<meta http-equiv=\"Content-Security-Policy\" content=\"{_CSP}\">\n"
        f"<title>energon-lite preview: {_esc(title)}</title>\n<style>{_STYLE}</style></head>\n<body>\n"
        + "\n".join(body)
        + "\n</body></html>\n"
    )


def write_html(path: AnyPath, sections: Iterable[Section], *, title: str) -> int:
    """Writes the page to ``path`` (local or remote); returns how many samples it shows."""
    sections = list(sections)
    # errors="replace": a lone surrogate in a JSON string must not stop the page
    atomic_write_bytes(path, render_html(sections, title=title).encode("utf-8", "replace"))
    return sum(len(section.samples) for section in sections)


def _esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def _section(section: Section) -> str:
    out = ["<section>"]
    if section.leaf is not None:
        out.append(f"<h2 class=\"leaf\">{_esc(section.leaf)}</h2>")
    out.append(f"<h2>{_esc(section.title)}</h2>")
    if section.note is not None:
        out.append(f"<p class=\"note\">{_esc(section.note)}</p>")
    out.extend(_sample(sample) for sample in section.samples)
    out.append("</section>")
    return "\n".join(out)


def _sample(sample: PreviewSample) -> str:
    heading = f"Sample {sample.index}"
    if sample.key is not None:
        heading += f"<span class=\"key\">{_esc(sample.key)}</span>"
    if sample.shard is not None:
        heading += f"<span class=\"shard\">{_esc(sample.shard)}</span>"
    if sample.excluded:
        return f"<div class=\"sample\"><h3>{heading}</h3><p class=\"note\">excluded by split.yaml</p></div>"
    if sample.error is not None:
        return f"<div class=\"sample\"><h3>{heading}</h3><pre class=\"error\">cannot load this sample: {_esc(sample.error)}</pre></div>"
    rows = "".join(_row(field) for field in sample.fields)
    return f"<div class=\"sample\"><h3>{heading}</h3><table>{rows}</table></div>"


def _row(field: PreviewField) -> str:
    kind = f"<div class=\"type\">{_esc(field.type_name)}</div>" if field.type_name is not None else ""
    return f"<tr><th>{_esc(field.name)}{kind}</th><td>{_cell(field.name, field.view)}</td></tr>"


def _cell(name: str, view: View) -> str:
    if isinstance(view, ErrorView):
        return f"<pre class=\"error\">error: {_esc(view.summary)}</pre>"
    if isinstance(view, ImageView):
        return _img(view.image, THUMB_SIDE, name, "thumb") + f"<div class=\"type\">{_esc(view.summary)}</div>"
    if isinstance(view, VideoView):
        frames = "".join(_img(frame, FRAME_THUMB_SIDE, f"{name} frame {i}", "frame") for i, frame in enumerate(view.frames))
        return f"<div class=\"frames\">{frames}</div><div class=\"type\">{_esc(view.summary)}</div>"
    if isinstance(view, AudioView):
        player = f"<audio controls preload=\"metadata\" src=\"data:audio/wav;base64,{_wav(view)}\"></audio>" if view.rate > 0 else ""
        return f"{player}<div class=\"wave\">{_esc(waveform(view.samples, 64))}</div><div class=\"type\">{_esc(view.summary)}</div>"
    if isinstance(view, TextView):
        text = view.text if len(view.text) <= MAX_TEXT_CHARS else view.text[:MAX_TEXT_CHARS]
        cut = f"<div class=\"note\">... (cut: {len(view.text)} chars in all)</div>" if len(view.text) > MAX_TEXT_CHARS else ""
        return f"<pre class=\"text\">{_esc(text)}</pre>{cut}"
    if isinstance(view, ValueView) and view.detail is not None:
        return f"<details><summary><code>{_esc(view.summary)}</code></summary><pre>{_esc(view.detail)}</pre></details>"
    return f"<code>{_esc(view.summary)}</code>"


def _img(image: Image.Image, side: int, alt: str, css_class: str) -> str:
    """An ``<img>`` of ``image`` shrunk to ``side``: PNG where it has transparency, else JPEG.
    A small image is stored at its size and shown larger (``width``/``height``, pixelated)."""
    thumb = fit(image, side, side, max_upscale=1)
    shown = fit(thumb, side, side, max_upscale=MAX_UPSCALE).size
    buffer = io.BytesIO()
    if thumb.mode == "RGBA":
        thumb.save(buffer, format="PNG")
        mime = "image/png"
    else:
        thumb.convert("RGB").save(buffer, format="JPEG", quality=88)
        mime = "image/jpeg"
    data = base64.b64encode(buffer.getvalue()).decode("ascii")
    return f"<img class=\"{css_class}\" src=\"data:{mime};base64,{data}\" width=\"{shown[0]}\" height=\"{shown[1]}\" alt=\"{_esc(alt)}\">"


def _wav(view: AudioView) -> str:
    """16-bit PCM WAV of the view's samples (browsers play WAV everywhere, unlike FLAC or AAC)."""
    pcm = (np.clip(view.samples, -1.0, 1.0) * 32767).round().astype("<i2")
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(pcm.shape[0])
        out.setsampwidth(2)
        out.setframerate(view.rate)
        out.writeframes(np.ascontiguousarray(pcm.T).tobytes())
    return base64.b64encode(buffer.getvalue()).decode("ascii")
