"""The plain-``split.yaml`` reader agrees with YAML, or declines and leaves the file to YAML.

``metadata._plain_split_yaml`` reads the shape prepare writes without building YAML nodes (every
rank of a job reads a split of 10,000s of shards).  PyYAML is the oracle: for any text, the fast
reader returns exactly ``yaml.safe_load(text)`` or None.
"""

from __future__ import annotations

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from megatron_energon_lite.format.metadata import (
    SplitConfig,
    _plain_split_yaml,
    read_split_config,
    split_config_text,
    write_split_config,
)

# Names prepare writes, and plain scalars YAML reads as something other than a string.
PLAIN_NAMES = st.from_regex(r"[a-z0-9_][a-z0-9_./-]{0,12}\.tar", fullmatch=True)
TRICKY = st.sampled_from(["yes", "no", "on", "null", "~", "1e3", "0x1f", "12", "1_000", ".inf", "2001-12-14", "a b", "a: b", "#c", "-x", "{a}", "[a]", "'q'", "a{0..2}.tar", "true", "Off"])
NAMES = st.one_of(PLAIN_NAMES, TRICKY)
SPLIT_NAMES = st.one_of(st.sampled_from(["train", "val", "test", "y", "null", "1", "holdout-2"]), st.from_regex(r"[a-z_][a-z0-9_-]{0,6}", fullmatch=True))


def _yaml_or_error(text: str):
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return "<error>"


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(SPLIT_NAMES, st.lists(NAMES, max_size=6), min_size=1, max_size=4), st.lists(NAMES, max_size=4))
def test_prepare_output_reads_as_yaml_reads_it(parts: dict, exclude: list) -> None:
    text = split_config_text(SplitConfig(split_parts=parts, exclude=exclude))
    fast = _plain_split_yaml(text)
    assert fast is None or fast == yaml.safe_load(text)
    names = [*parts, *exclude, *(n for split in parts.values() for n in split)]
    if all(_is_plain(n) for n in names):
        assert fast is not None, text  # prepare's own output must take the fast path


def _is_plain(name: str) -> bool:
    return yaml.safe_load(name) == name and all(c.isalnum() or c in "_./-" for c in name) and not name.startswith(("-", "."))


LINE = st.one_of(
    st.sampled_from(["split_parts:", "exclude:", "exclude: []", "split_parts: []", "", "# note", "---", "...", "\ttrain:"]),
    st.builds(lambda indent, key, empty: " " * indent + key + (": []" if empty else ":"), st.integers(0, 5), SPLIT_NAMES, st.booleans()),
    st.builds(lambda indent, name: " " * indent + "- " + name, st.integers(0, 6), NAMES),
)


@st.composite
def split_texts(draw) -> str:
    """A split file of the usual shape with varied indents, then a few lines swapped for others."""
    split_indent = draw(st.integers(1, 4))
    lines = ["split_parts:"]
    for name in draw(st.lists(SPLIT_NAMES, min_size=1, max_size=3)):
        items = draw(st.lists(NAMES, max_size=4))
        lines.append(" " * split_indent + name + (":" if items else draw(st.sampled_from([":", ": []"]))))
        item_indent = split_indent + draw(st.integers(0, 2))
        lines += [" " * item_indent + "- " + item for item in items]
    exclude = draw(st.lists(NAMES, max_size=3))
    tail = ["exclude:"] + [" " * draw(st.integers(0, 2)) + "- " + e for e in exclude] if exclude else [draw(st.sampled_from(["exclude: []", "exclude:"]))]
    lines = tail + lines if draw(st.booleans()) else lines + tail
    for _ in range(draw(st.integers(0, 2))):
        lines[draw(st.integers(0, len(lines) - 1))] = draw(LINE)
    return "\n".join(lines) + "\n"


@settings(max_examples=600, deadline=None)
@given(split_texts())
def test_varied_split_files_read_as_yaml_reads_them_or_are_declined(text: str) -> None:
    fast = _plain_split_yaml(text)
    if fast is not None:
        assert fast == _yaml_or_error(text), text


def test_hand_indented_lists_take_the_fast_path() -> None:
    text = "split_parts:\n    train:\n        - a/0.tar\n        - a/1.tar\n    val: []\nexclude:\n  - a/0.tar/key_1\n"
    assert _plain_split_yaml(text) == yaml.safe_load(text)


def test_read_split_config_gives_the_same_config_either_way(tmp_path) -> None:
    (tmp_path / ".nv-meta").mkdir()
    config = SplitConfig(split_parts={"train": [f"shards/{i:05d}.tar" for i in range(50)], "val": ["yes"]}, exclude=["shards/00001.tar"])
    write_split_config(tmp_path, config)
    text = (tmp_path / ".nv-meta/split.yaml").read_text()
    assert _plain_split_yaml(text) is None  # "yes" is a bool to YAML: the file goes to YAML
    slow = read_split_config(tmp_path)
    assert slow.split_parts["val"] == ["yes"]  # quoted by the writer, so a string either way
    config.split_parts["val"] = ["shards/val.tar"]
    write_split_config(tmp_path, config)
    assert _plain_split_yaml((tmp_path / ".nv-meta/split.yaml").read_text()) is not None
    fast = read_split_config(tmp_path)
    assert (fast.split_parts, fast.exclude) == (config.split_parts, config.exclude)
