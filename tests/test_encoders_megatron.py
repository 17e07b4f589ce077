"""Megatron-shaped encoding: packing samples that carry token ids, the boolean attention mask
(causal within each packed sample, True = masked) and GPT windows of seq_length + 1 tokens."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from megatron_energon_lite import (
    ConfigError,
    TextSample,
    WorkerConfig,
    get_savable_loader,
    get_train_dataset,
)
from megatron_energon_lite.encoders import (
    GPTWindowTaskEncoder,
    TextPackingTaskEncoder,
    TokenizedSample,
)
from megatron_energon_lite.format.indexed import IndexedWriter
from megatron_energon_lite.samples import TokensSample


def byte_tokenizer(text: str) -> list[int]:
    return [b + 1 for b in text.encode("utf-8")]


def tokens_sample(key: str, tokens) -> TokensSample:
    return TokensSample(__key__=key, tokens=tokens)


def text_sample(key: str, text: str) -> TextSample:
    return TextSample(__key__=key, text=text)


def tokenized(key: str, length: int) -> TokenizedSample:
    return TokenizedSample(__key__=key, tokens=list(range(1, length + 1)))


def expected_mask(lengths: list[int], seq_length: int) -> np.ndarray:
    """Built from the sample lengths alone: True where token i must not see token j."""
    segment = []
    for index, length in enumerate(lengths):
        segment += [index] * length
    segment += [len(lengths)] * (seq_length - len(segment))  # padding: one more segment
    mask = np.ones((seq_length, seq_length), dtype=bool)
    for i in range(seq_length):
        for j in range(seq_length):
            if j <= i and segment[i] == segment[j]:
                mask[i, j] = False
    return mask


def test_token_samples_pack_without_the_tokenizer_next_to_text_samples() -> None:
    def tokenizer(text: str) -> list[int]:
        assert text == "ab", "the tokenizer must only see the text sample"
        return byte_tokenizer(text)

    encoder = TextPackingTaskEncoder(tokenizer, 12)
    encoded = [
        encoder.encode_sample(tokens_sample("np", np.array([5, 6, 7], dtype=np.int32))),
        encoder.encode_sample(tokens_sample("pt", torch.tensor([8, 9], dtype=torch.int64))),
        encoder.encode_sample(text_sample("txt", "ab")),
        encoder.encode_sample(tokens_sample("u16", np.array([300, 301, 302], dtype=np.uint16))),
    ]
    assert [list(map(int, s.tokens)) for s in encoded] == [[5, 6, 7], [8, 9], [98, 99], [300, 301, 302]]
    pack = encoder.pack_selected_samples(encoded)
    assert pack.tokens.tolist() == [5, 6, 7, 8, 9, 98, 99, 300, 301, 302, 0, 0]
    assert pack.labels.tolist() == [6, 7, 0, 9, 0, 99, 0, 301, 302, 0, 0, 0]
    assert pack.loss_mask.tolist() == [1, 1, 0, 1, 0, 1, 0, 1, 1, 0, 0, 0]
    assert pack.position_ids.tolist() == [0, 1, 2, 0, 1, 0, 1, 0, 1, 2, 0, 0]
    assert pack.cu_seqlens.tolist() == [0, 3, 5, 7, 10, 12] and pack.sample_keys == ["np", "pt", "txt", "u16"]
    assert pack.tokens.dtype == torch.int64 and pack.loss_mask.dtype == torch.float32 and pack.attention_mask is None
    # First fit decreasing sees token arrays' lengths as it sees token lists': 10 tokens, one pack.
    assert [[s.__key__ for s in g] for g in encoder.select_samples_to_pack(encoded)] == [["np", "u16", "pt", "txt"]]


def test_long_token_arrays_are_cut_or_refused_and_cost_their_length() -> None:
    document = np.arange(1, 100_001, dtype=np.int32)
    encoder = TextPackingTaskEncoder(None, 16)
    cut = encoder.encode_sample(tokens_sample("doc", document))
    assert isinstance(cut.tokens, np.ndarray) and cut.tokens.dtype == np.int64 and cut.tokens.tolist() == list(range(1, 17))
    assert encoder.sample_cost(tokens_sample("doc", document)) == 16
    assert encoder.sample_cost(tokens_sample("short", torch.arange(1, 6))) == 5
    with pytest.raises(ConfigError, match="longer than seq_length"):
        TextPackingTaskEncoder(None, 16, truncate=False).encode_sample(tokens_sample("doc", document))


def test_without_a_tokenizer_text_is_an_error_and_bad_token_arrays_too() -> None:
    encoder = TextPackingTaskEncoder(None, 16)
    with pytest.raises(ConfigError, match="no tokenizer") as error:
        encoder.encode_sample(text_sample("t1", "hello"))
    assert "t1" in str(error.value)
    with pytest.raises(ConfigError, match="integer token ids"):
        encoder.encode_sample(tokens_sample("f", np.array([1.5, 2.0])))
    with pytest.raises(ConfigError, match="integer token ids"):
        encoder.encode_sample(tokens_sample("2d", np.ones((2, 3), dtype=np.int64)))
    assert encoder.encode_sample(tokens_sample("empty", np.array([], dtype=np.int64))).tokens.tolist() == []


@pytest.mark.parametrize("lengths", [[3, 0, 4, 2], [5, 7], [12], [1, 1, 1]])
def test_attention_mask_is_causal_within_each_packed_sample(lengths: list[int]) -> None:
    seq_length = 12
    encoder = TextPackingTaskEncoder(byte_tokenizer, seq_length, attention_mask=True)
    pack = encoder.pack_selected_samples([tokenized(str(i), n) for i, n in enumerate(lengths)])
    mask = pack.attention_mask
    assert mask.dtype == torch.bool and mask.shape == (1, seq_length, seq_length)
    assert np.array_equal(mask[0].numpy(), expected_mask(lengths, seq_length))
    assert not mask[0].all(dim=1).any()  # no fully masked row: padding rows see the padding
    used = sum(lengths)
    assert mask[0, :used, used:].all() and mask[0, used:, :used].all()  # real and padding never meet


def test_padding_rows_give_no_nan_in_a_minus_inf_softmax() -> None:
    encoder = TextPackingTaskEncoder(byte_tokenizer, 10, attention_mask=True)
    mask = encoder.pack_selected_samples([tokenized("a", 3), tokenized("b", 4)]).attention_mask
    q = k = v = torch.randn(1, 2, 10, 8)
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=~mask)  # SDPA: True = attend
    assert torch.isfinite(out).all()
    # Row 0 (first token of sample a) attends only to itself.
    assert torch.allclose(out[0, :, 0], v[0, :, 0], atol=1e-6)


def test_batch_stacks_the_masks() -> None:
    encoder = TextPackingTaskEncoder(byte_tokenizer, 8, attention_mask=True)
    packs = [encoder.pack_selected_samples([tokenized("a", 3), tokenized("b", 4)]), encoder.pack_selected_samples([tokenized("c", 8)])]
    batch = encoder.batch(packs)
    assert batch.attention_mask.shape == (2, 1, 8, 8) and batch.attention_mask.dtype == torch.bool
    assert np.array_equal(batch.attention_mask[0, 0].numpy(), expected_mask([3, 4], 8))
    assert np.array_equal(batch.attention_mask[1, 0].numpy(), expected_mask([8], 8))
    assert batch.cu_seqlens.tolist() == [0, 3, 7, 8, 16]
    plain = TextPackingTaskEncoder(byte_tokenizer, 8)
    assert plain.batch([plain.pack_selected_samples([tokenized("a", 3)])]).attention_mask is None


def test_gpt_window_is_shifted_by_one_with_a_causal_mask() -> None:
    seq_length = 8
    window = np.array([11, 12, 13, 14, 15, 16, 17, 18, 19], dtype=np.int32)  # seq_length + 1 tokens
    sample = GPTWindowTaskEncoder(seq_length).encode_sample(tokens_sample("w0", window))
    assert sample.tokens.tolist() == [11, 12, 13, 14, 15, 16, 17, 18]
    assert sample.labels.tolist() == [12, 13, 14, 15, 16, 17, 18, 19]
    assert sample.loss_mask.tolist() == [1.0] * 8 and sample.position_ids.tolist() == list(range(8))
    causal = np.array([[j > i for j in range(8)] for i in range(8)])
    assert np.array_equal(sample.attention_mask[0].numpy(), causal)
    assert sample.cu_seqlens.tolist() == [0, 8] and sample.sample_keys == ["w0"]
    assert (sample.tokens.dtype, sample.labels.dtype, sample.position_ids.dtype, sample.loss_mask.dtype) == (torch.int64, torch.int64, torch.int64, torch.float32)


def test_gpt_window_batches_own_their_tensors() -> None:
    """Full windows share their loss mask and position ids (a speed-up); a batch must not."""
    encoder = GPTWindowTaskEncoder(4, attention_mask=False)
    windows = [encoder.encode_sample(tokens_sample(f"w{i}", np.arange(i, i + 5))) for i in range(3)]
    batch = encoder.batch(windows)
    batch.loss_mask[0, 0] = 0.0
    batch.position_ids[1, 1] = 99
    batch.tokens[2, 0] = -1
    fresh = encoder.encode_sample(tokens_sample("w9", np.arange(9, 14)))
    assert fresh.loss_mask.tolist() == [1.0] * 4 and fresh.position_ids.tolist() == [0, 1, 2, 3]
    assert windows[2].tokens.tolist() == [2, 3, 4, 5]
    assert batch.cu_seqlens.tolist() == [0, 4, 8, 12]


def test_short_gpt_window_is_padded_and_its_padding_masked() -> None:
    encoder = GPTWindowTaskEncoder(8, pad_id=-1)
    short = encoder.encode_sample(tokens_sample("last", torch.tensor([21, 22, 23, 24, 25])))
    assert short.tokens.tolist() == [21, 22, 23, 24, -1, -1, -1, -1]
    assert short.labels.tolist() == [22, 23, 24, 25, -1, -1, -1, -1]
    assert short.loss_mask.tolist() == [1, 1, 1, 1, 0, 0, 0, 0]
    assert np.array_equal(short.attention_mask[0].numpy(), expected_mask([4], 8))
    full = encoder.encode_sample(tokens_sample("w", np.arange(9)))
    batch = encoder.batch([full, short])
    assert batch.tokens.shape == (2, 8) and batch.attention_mask.shape == (2, 1, 8, 8)
    assert batch.labels[1].tolist() == short.labels.tolist() and batch.sample_keys == [["w"], ["last"]]
    assert GPTWindowTaskEncoder(8, attention_mask=False).encode_sample(tokens_sample("w", np.arange(9))).attention_mask is None


def test_gpt_window_errors() -> None:
    encoder = GPTWindowTaskEncoder(8)
    with pytest.raises(ConfigError, match="longer than seq_length \\+ 1") as error:
        encoder.encode_sample(tokens_sample("big", np.arange(10)))
    assert "10 tokens" in str(error.value)
    with pytest.raises(ConfigError, match="token ids"):
        encoder.encode_sample(text_sample("t", "text"))
    with pytest.raises(ConfigError, match="seq_length"):
        GPTWindowTaskEncoder(1)


def test_loss_on_a_window_is_ln_vocab_for_uniform_logits() -> None:
    """The window's labels and mask plug into a masked cross entropy as Megatron computes it."""
    encoder = GPTWindowTaskEncoder(8)
    sample = encoder.encode_sample(tokens_sample("last", np.array([1, 2, 3, 4])))
    logits = torch.zeros(8, 50)
    losses = torch.nn.functional.cross_entropy(logits, sample.labels, reduction="none")
    loss = (losses * sample.loss_mask).sum() / sample.loss_mask.sum()
    assert math.isclose(loss.item(), math.log(50), rel_tol=1e-6) and sample.loss_mask.sum() == 3


@pytest.fixture(scope="module")
def indexed(tmp_path_factory):
    """A Megatron .bin/.idx dataset of 40 documents, and the documents."""
    rng = np.random.default_rng(7)
    docs = [rng.integers(1, 60000, size=int(rng.integers(3, 50))).astype(np.uint16) for _ in range(40)]
    prefix = tmp_path_factory.mktemp("bin") / "web_text_document"
    writer = IndexedWriter(prefix, dtype=np.uint16)
    for doc in docs:
        writer.add_document(doc)
    writer.finalize()
    return prefix, docs


def test_bin_idx_documents_pack_through_the_loader(indexed) -> None:

    prefix, docs = indexed
    written = {tuple(doc.tolist()[:32]) for doc in docs}
    encoder = TextPackingTaskEncoder(None, 32, attention_mask=True)
    dataset = get_train_dataset(str(prefix), worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0), batch_size=2, shuffle_buffer_size=None, max_samples_per_sequence=None, packing_buffer_size=8, task_encoder=encoder)
    for _, batch in zip(range(5), get_savable_loader(dataset)):
        assert batch.attention_mask.shape == (2, 1, 32, 32)
        for row, keys in enumerate(batch.sample_keys):
            bounds = [int(b) - row * 32 for b in batch.cu_seqlens.tolist() if row * 32 <= b <= (row + 1) * 32][: len(keys) + 1]
            for start, end in zip(bounds[:-1], bounds[1:]):
                assert tuple(batch.tokens[row, start:end].tolist()) in written  # a whole document (cut to 32)
            lengths = [end - start for start, end in zip(bounds[:-1], bounds[1:])]
            assert np.array_equal(batch.attention_mask[row, 0].numpy(), expected_mask(lengths, 32))


def test_bin_idx_windows_through_the_loader(indexed, tmp_path: Path) -> None:

    prefix, docs = indexed
    stream = np.concatenate(docs).tolist()
    windows = {tuple(stream[start : start + 17]) for start in range(0, len(stream) - 1, 16)}  # 17 tokens, one shared
    yaml = tmp_path / "windows.yaml"
    yaml.write_text(f"__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    path: {prefix}\n    sequence_length: 16\n")
    dataset = get_train_dataset(yaml, worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0), batch_size=4, shuffle_buffer_size=None, max_samples_per_sequence=None, task_encoder=GPTWindowTaskEncoder(16))
    for _, batch in zip(range(3), get_savable_loader(dataset)):
        assert batch.tokens.shape == (4, 16) and batch.attention_mask.shape == (4, 1, 16, 16)
        for row in range(4):
            real = int(batch.loss_mask[row].sum())
            assert tuple(batch.tokens[row, :real].tolist() + [int(batch.labels[row, real - 1])]) in windows
            assert batch.labels[row, : real - 1].tolist() == batch.tokens[row, 1:real].tolist()
