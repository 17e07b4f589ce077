"""The terminal preview: drawn pixels are the image's pixels (half-blocks, sixel, kitty), audio is a
waveform of the right shape, text is wrapped and made harmless, pipes get plain text."""

from __future__ import annotations

import base64
import io
import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from preview_helpers import (
    CAPTIONING_YAML,
    CRUDE_YAML,
    loud_then_silent,
    make_dataset,
    png,
    quadrants,
    run,
    wav_bytes,
)

from megatron_energon_lite.preview.collect import PreviewField, PreviewSample
from megatron_energon_lite.preview.terminal import (
    MAX_TEXT_LINES,
    TerminalRenderer,
    detect_graphics,
    half_blocks,
    kitty,
    sixel,
)
from megatron_energon_lite.preview.views import (
    ImageView,
    TextView,
    ValueView,
    VideoView,
    view_of,
)

_CELL = re.compile(r"\x1b\[38;2;(\d+);(\d+);(\d+)m|\x1b\[48;2;(\d+);(\d+);(\d+)m|\x1b\[49m|\x1b\[0m|▀")


def parse_blocks(lines: list[str]) -> np.ndarray:
    """Half-block lines back to pixels: (2 * lines, columns, 3); -1 where the terminal's own
    background shows (an odd last pixel row). Fails on anything but colour codes and ▀."""
    rows = []
    for line in lines:
        line = line.strip(" ")
        assert _CELL.sub("", line) == "", f"unexpected characters in {line!r}"
        fg = bg = None
        top, bottom = [], []
        for match in _CELL.finditer(line):
            token = match.group()
            if match.group(1):
                fg = tuple(int(v) for v in match.group(1, 2, 3))
            elif match.group(4):
                bg = tuple(int(v) for v in match.group(4, 5, 6))
            elif token == "\x1b[49m":
                bg = (-1, -1, -1)
            elif token == "▀":
                assert fg is not None and bg is not None, "a cell before its colours were set"
                top.append(fg)
                bottom.append(bg)
        rows += [top, bottom]
    return np.array(rows)


def drawn_lines(output: str, after: str) -> list[str]:
    """The lines drawn under the line that starts with ``after``."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(after)) + 1
    end = start
    while end < len(lines) and "▀" in lines[end]:
        end += 1
    return lines[start:end]


def test_half_blocks_of_a_dataset_image_are_its_pixels(tmp_path: Path) -> None:
    image = quadrants(4, 4)
    root = make_dataset(tmp_path / "ds", [("q0", {"png": png(image), "txt": b"four colours"})], CAPTIONING_YAML)
    result = run("preview", str(root), "--graphics", "blocks")
    assert result.exit_code == 0, result.output
    assert " - image: PIL.Image(size=(4, 4), mode=RGB)" in result.output.splitlines()
    pixels = parse_blocks(drawn_lines(result.output, " - image"))
    # Upscaled by whole pixels: each drawn pixel is the source pixel under it.
    height, width = pixels.shape[:2]
    assert width >= 8 and width % 4 == 0 and height == width
    expected = np.asarray(image.resize((width, height), Image.Resampling.NEAREST))
    np.testing.assert_array_equal(pixels, expected)


def test_half_blocks_odd_height_leaves_the_last_lower_half_to_the_terminal() -> None:
    image = Image.fromarray(np.array([[[10, 20, 30], [40, 50, 60]], [[70, 80, 90], [100, 110, 120]], [[130, 140, 150], [160, 170, 180]]], np.uint8))
    lines = half_blocks(image, 2, 2)
    assert len(lines) == 2
    pixels = parse_blocks(lines)
    np.testing.assert_array_equal(pixels[:3], np.asarray(image))
    assert (pixels[3] == -1).all()
    assert all(line.endswith("\x1b[0m") for line in lines)


def test_half_blocks_shrink_large_images_into_the_box() -> None:
    image = Image.new("RGB", (400, 104), (1, 2, 3))
    pixels = parse_blocks(half_blocks(image, 50, 10))
    assert pixels.shape == (14, 50, 3)  # 400x104 -> 50x13: 13 rows of pixels in 7 cells
    assert (pixels[:13] == (1, 2, 3)).all() and (pixels[13] == -1).all()
    assert parse_blocks(half_blocks(Image.new("RGB", (100, 400)), 50, 10)).shape == (20, 5, 3)  # tall: 20 pixel rows


def decode_sixel(data: str) -> np.ndarray:
    """A small sixel decoder (raster attributes, RGB percent colours, repeats, $ and -)."""
    assert data.startswith("\x1bPq") and data.endswith("\x1b\\")
    body = data[3:-2]
    raster = re.match(r'"1;1;(\d+);(\d+)', body)
    width, height = int(raster.group(1)), int(raster.group(2))
    out = np.full((height, width, 3), -1)
    palette: dict[int, tuple[int, int, int]] = {}
    token = re.compile(r"#(\d+);2;(\d+);(\d+);(\d+)|#(\d+)|!(\d+)([?-~])|([?-~])|(\$)|(-)")
    rest = body[raster.end() :]
    assert token.sub("", rest) == ""
    x, band, colour = 0, 0, None
    for m in token.finditer(rest):
        if m.group(1):
            palette[int(m.group(1))] = tuple(round(int(v) * 255 / 100) for v in m.group(2, 3, 4))
        elif m.group(5):
            colour = int(m.group(5))
        elif m.group(6) or m.group(8):
            count, char = (int(m.group(6)), m.group(7)) if m.group(6) else (1, m.group(8))
            bits = ord(char) - 63
            for _ in range(count):
                for row in range(6):
                    if bits >> row & 1:
                        out[band * 6 + row, x] = palette[colour]
                x += 1
        elif m.group(9):
            x = 0
        else:
            x, band = 0, band + 1
    return out


def test_sixel_decodes_back_to_the_image() -> None:
    image = quadrants(10, 14)  # 14 rows: two full bands and a partial one
    pixels = decode_sixel(sixel(image))
    assert pixels.shape == (14, 10, 3)
    # Colours travel in percent: within 255/200 of the original.
    assert np.abs(pixels - np.asarray(image).astype(int)).max() <= 2


def test_kitty_sends_the_png_in_chunks() -> None:
    rng = np.random.default_rng(0)
    image = Image.fromarray(rng.integers(0, 256, (200, 300, 3), dtype=np.uint8))  # noise: a big PNG
    data = kitty(image, 300, 200)
    chunks = re.findall(r"\x1b_G([^;]*);([^\x1b]*)\x1b\\", data)
    assert "".join(f"\x1b_G{c};{p}\x1b\\" for c, p in chunks) == data
    assert len(chunks) > 2 and all(len(p) <= 4096 for _, p in chunks)
    assert "a=T" in chunks[0][0] and "f=100" in chunks[0][0] and "q=2" in chunks[0][0]
    assert [c.endswith("m=1") for c, _ in chunks] == [True] * (len(chunks) - 1) + [False]
    decoded = Image.open(io.BytesIO(base64.b64decode("".join(p for _, p in chunks))))
    np.testing.assert_array_equal(np.asarray(decoded.convert("RGB")), np.asarray(image))


@pytest.mark.parametrize(
    ("isatty", "env", "expected"),
    [
        (False, {"TERM": "xterm-kitty"}, "none"),
        (True, {"TERM": "xterm-kitty"}, "kitty"),
        (True, {"TERM": "xterm-256color", "KITTY_WINDOW_ID": "1"}, "kitty"),
        (True, {"TERM": "xterm-sixel"}, "sixel"),
        (True, {"TERM": "xterm-256color"}, "blocks"),
        (True, {"TERM": "dumb"}, "none"),
        (True, {"TERM": "xterm-256color", "NO_COLOR": "1"}, "none"),
    ],
)
def test_detect_graphics(isatty: bool, env: dict[str, str], expected: str) -> None:
    assert detect_graphics(isatty, env) == expected


def test_cli_uses_kitty_and_sixel_when_asked(tmp_path: Path) -> None:
    root = make_dataset(tmp_path / "ds", [("q0", {"png": png(quadrants(8, 8)), "txt": b"x"})], CAPTIONING_YAML)
    kitty_out = run("preview", str(root), "--graphics", "kitty").output
    assert "\x1b_Ga=T,f=100,q=2" in kitty_out and "▀" not in kitty_out
    sixel_out = run("preview", str(root), "--graphics", "sixel").output
    start = sixel_out.index("\x1bPq")
    pixels = decode_sixel(sixel_out[start : sixel_out.index("\x1b\\", start) + 2])
    assert pixels.shape[0] >= 8 and (pixels[0, 0] == (255, 0, 0)).all() and (pixels[-1, -1] == (255, 255, 0)).all()


def test_piped_output_is_plain_text(colour_dataset: Path) -> None:
    result = run("preview", str(colour_dataset), "-n", "2")  # CliRunner's stdout is no terminal: auto = none
    assert result.exit_code == 0
    assert "\x1b" not in result.output and "▀" not in result.output
    assert " - image: PIL.Image(size=(40, 30), mode=RGB)" in result.output.splitlines()
    assert " - caption (<class 'str'>): 'colour 1'" in result.output.splitlines()


def test_audio_is_a_waveform_with_duration_and_rate(tmp_path: Path) -> None:
    pytest.importorskip("av")
    samples = [("a0", {"wav": wav_bytes(loud_then_silent(8000, 1.0), 8000), "txt": b"half loud"})]
    root = make_dataset(tmp_path / "audio", samples, CRUDE_YAML)
    result = run("preview", str(root))
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith(" - wav: "))
    assert lines[header].startswith(" - wav: audio 8000 Hz, 1 channel, 1.00 s, peak -0.4 dBFS")
    wave_line = lines[header + 1].strip()
    assert len(wave_line) == 64 and set(wave_line) <= set("▁▂▃▄▅▆▇█")
    assert wave_line[:31] == "█" * 31 and wave_line[33:] == "▁" * 31  # loud half, silent half


def test_video_is_a_strip_of_frames_in_order(tmp_path: Path) -> None:
    pytest.importorskip("av")
    from energon_lite_dev.synthetic import make_video

    root = make_dataset(tmp_path / "video", [("v0", {"mp4": make_video(frames=16, fps=8, size=(32, 24))})], CRUDE_YAML)
    result = run("preview", str(root), "--graphics", "blocks")
    assert result.exit_code == 0, result.output
    assert " - mp4: video 32x24, 8 fps, 2.00 s, 16 frames" in result.output.splitlines()
    pixels = parse_blocks(drawn_lines(result.output, " - mp4"))
    # make_video's frame i is a flat gray of 8 * i; four frames spread over 16 are 8 * (0, 5, 10, 15)
    # (H.264 rounding: +-2), two black pixels apart.
    middle = pixels[pixels.shape[0] // 2, :, 0]
    runs = [int(np.median(group)) for group in np.split(middle, np.flatnonzero(np.abs(np.diff(middle)) > 4) + 1) if len(group) > 1]
    grays = [value for value in runs if value > 4]
    assert len(grays) == 3 and all(abs(a - b) <= 3 for a, b in zip(grays, (40, 80, 120))), runs


def test_long_text_is_wrapped_and_cut_and_control_characters_are_escaped(tmp_path: Path) -> None:
    text = "word " * 400 + "\x1b]0;pwned\x07 end"
    two_lines = "line one\n\x1b[2Jline two"
    root = make_dataset(tmp_path / "text", [("t0", {"txt": text.encode()}), ("t1", {"txt": two_lines.encode()})], CRUDE_YAML)
    result = run("preview", str(root), "--graphics", "blocks")
    assert result.exit_code == 0
    assert "\x1b]" not in result.output and "\x07" not in result.output and "\x1b[2J" not in result.output
    lines = result.output.splitlines()
    first = lines.index(f" - txt: text, {len(text)} chars")
    body = lines[first + 1 : first + 2 + MAX_TEXT_LINES]
    assert all(line.startswith("   word") for line in body[:MAX_TEXT_LINES]) and all(len(line) <= 80 for line in body)
    assert body[MAX_TEXT_LINES] == f"   ... (cut: {len(text)} chars in all)"
    second = lines.index(f" - txt: text, {len(two_lines)} chars")
    assert lines[second + 1 : second + 3] == ["   line one", "   \\x1b[2Jline two"]


def test_tensors_show_shape_and_chw_images_are_drawn() -> None:
    torch = pytest.importorskip("torch")
    chw = torch.zeros((3, 6, 8), dtype=torch.uint8)
    chw[0, :3] = 255  # top half red
    chw[2, 3:] = 255  # bottom half blue
    view = view_of(chw)
    assert isinstance(view, ImageView) and view.summary == "Tensor(shape=(3, 6, 8), dtype=uint8)"
    np.testing.assert_array_equal(np.asarray(view.image), chw.permute(1, 2, 0).numpy())
    floats = view_of(chw.float() / 255)
    assert isinstance(floats, ImageView) and np.asarray(floats.image)[0, 0].tolist() == [255, 0, 0]
    assert isinstance(view_of(torch.zeros((3, 2))), ValueView) and view_of(torch.zeros((3, 2))).summary == "Tensor(shape=(3, 2), dtype=float32)"
    assert isinstance(view_of(np.zeros((3, 3, 3), np.uint8)), ValueView)  # too small to be a picture
    video = view_of(torch.arange(10, dtype=torch.uint8).view(10, 1, 1, 1).expand(10, 3, 8, 8).contiguous())
    assert isinstance(video, VideoView) and [np.asarray(f)[0, 0, 0] for f in video.frames] == [0, 3, 6, 9]

    renderer = TerminalRenderer("blocks", 80)
    lines = renderer.sample_lines(PreviewSample(0, "k", "s.tar", (PreviewField("image", "Tensor", view),)))
    assert lines[:2] == ["Sample 0", " - image (Tensor): Tensor(shape=(3, 6, 8), dtype=uint8)"]
    pixels = parse_blocks(lines[2:])
    assert (pixels[: pixels.shape[0] // 2] == (255, 0, 0)).all() and (pixels[pixels.shape[0] // 2 :] == (0, 0, 255)).all()


def test_none_graphics_draws_nothing_but_keeps_text() -> None:
    renderer = TerminalRenderer("none", 80)
    fields = (PreviewField("image", None, view_of(Image.new("RGB", (8, 8)))), PreviewField("txt", None, TextView("'hi'", "hi")))
    assert renderer.sample_lines(PreviewSample(3, "k", None, fields)) == ["Sample 3", " - image: PIL.Image(size=(8, 8), mode=RGB)", " - txt: 'hi'"]
