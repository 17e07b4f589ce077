"""examples/megatron_core_gpt.py's data path on CPU, without megatron-core: the batch dict it
hands to Megatron (keys, dtypes, shapes, masks), its loader checkpoint, and one training step of a
plain-PyTorch causal transformer on such a batch."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch

from megatron_energon_lite import ConfigError, StateError
from megatron_energon_lite.encoders import TextPackingTaskEncoder, TokenizedSample

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
sys.path.insert(0, str(EXAMPLES))

import megatron_core_gpt as example  # noqa: E402

SEQ_LENGTH = 128
BATCH_SIZE = 3
VOCAB = 257


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return example.prepare_text_dataset(tmp_path_factory.mktemp("mcore"), num_shards=2, samples_per_shard=30, max_words=12)


@pytest.fixture(scope="module")
def texts(data: Path) -> dict[str, bytes]:
    """Each sample's text, read straight from the tar shards."""
    found = {}
    for shard in sorted((data / "shards").glob("*.tar")):
        with tarfile.open(shard) as tar:
            for member in tar.getmembers():
                if member.name.endswith(".txt"):
                    found[member.name.removesuffix(".txt")] = tar.extractfile(member).read()
    return found


def megatron_batches(data: Path, count: int, workers: int = 0) -> list[tuple[list, dict]]:
    loader = example.make_loader(data, seq_length=SEQ_LENGTH, batch_size=BATCH_SIZE, num_workers=workers)
    return [(batch.sample_keys, example.to_megatron_batch(batch, "cpu")) for _, batch in zip(range(count), loader)]


def test_batches_have_megatrons_keys_dtypes_and_shapes(data: Path, texts: dict[str, bytes]) -> None:
    packed_samples = 0
    for keys, batch in megatron_batches(data, 4):
        assert set(batch) == {"tokens", "labels", "loss_mask", "attention_mask", "position_ids"}
        assert (batch["tokens"].dtype, batch["labels"].dtype, batch["position_ids"].dtype) == (torch.int64,) * 3
        assert batch["loss_mask"].dtype == torch.float32 and batch["attention_mask"].dtype == torch.bool
        for name in ("tokens", "labels", "loss_mask", "position_ids"):
            assert batch[name].shape == (BATCH_SIZE, SEQ_LENGTH), name
        assert batch["attention_mask"].shape == (BATCH_SIZE, 1, SEQ_LENGTH, SEQ_LENGTH)
        for row, pack_keys in enumerate(keys):
            # Rebuilt from the texts in the shards: one byte per token (+1), cut at the length.
            pieces = [[b + 1 for b in texts[key]][:SEQ_LENGTH] for key in pack_keys]
            packed_samples += len(pieces)
            flat = [t for piece in pieces for t in piece]
            used = len(flat)
            assert batch["tokens"][row].tolist() == flat + [0] * (SEQ_LENGTH - used)
            assert batch["loss_mask"][row, used:].sum() == 0
            start = 0
            for piece in pieces:
                end = start + len(piece)
                assert batch["labels"][row, start : end - 1].tolist() == piece[1:]  # shifted within the sample
                assert batch["loss_mask"][row, start : end - 1].tolist() == [1.0] * (len(piece) - 1)
                assert batch["loss_mask"][row, end - 1] == 0  # the last token would predict the next sample
                assert batch["position_ids"][row, start:end].tolist() == list(range(len(piece)))
                block = batch["attention_mask"][row, 0, start:end]
                causal = np.array([[j > i for j in range(len(piece))] for i in range(len(piece))])
                assert np.array_equal(block[:, start:end].numpy(), causal)
                assert block[:, :start].all() and block[:, end:].all()  # other samples and padding: masked
                start = end
    assert packed_samples > 4 * BATCH_SIZE  # packing put several samples into some sequences


def test_a_batch_without_the_mask_is_refused() -> None:
    encoder = TextPackingTaskEncoder(example.byte_tokenizer, 16)
    plain = encoder.batch([encoder.pack_selected_samples([TokenizedSample(__key__="k", tokens=[1, 2, 3])])])
    with pytest.raises(ConfigError, match="attention_mask=True"):
        example.to_megatron_batch(plain, "cpu")


def test_saved_loader_state_resumes_exactly(data: Path, tmp_path: Path) -> None:
    loader = example.make_loader(data, seq_length=SEQ_LENGTH, batch_size=BATCH_SIZE, num_workers=2)
    seen = []
    for step, batch in zip(range(8), loader):
        seen.append((batch.sample_keys, batch.tokens.clone()))
        if step == 2:
            path = example.save_loader_state(loader, tmp_path / "iter_0000003", rank=0, iteration=3)
    assert json.loads(path.read_text())["iteration"] == 3  # plain JSON
    fresh = example.make_loader(data, seq_length=SEQ_LENGTH, batch_size=BATCH_SIZE, num_workers=2)
    assert example.load_loader_state(fresh, tmp_path / "iter_0000003", rank=0) == 3
    rest = [(batch.sample_keys, batch.tokens.clone()) for _, batch in zip(range(5), fresh)]
    assert [keys for keys, _ in rest] == [keys for keys, _ in seen[3:]]
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(rest, seen[3:]))
    with pytest.raises(StateError, match="no loader state"):
        example.load_loader_state(fresh, tmp_path / "iter_0000003", rank=1)


class TinyCausalLM(torch.nn.Module):
    """Two pre-norm transformer layers that take Megatron's mask (True = masked)."""

    def __init__(self, vocab: int, width: int = 32, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.embed = torch.nn.Embedding(vocab, width)
        self.position = torch.nn.Embedding(SEQ_LENGTH, width)
        layer = torch.nn.TransformerEncoderLayer(width, heads, dim_feedforward=64, dropout=0.0, batch_first=True, norm_first=True)
        self.layers = torch.nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        self.head = torch.nn.Linear(width, vocab)
        torch.nn.init.zeros_(self.head.bias)
        torch.nn.init.normal_(self.head.weight, std=0.02)

    def forward(self, tokens: torch.Tensor, position_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        mask = attention_mask[:, 0].repeat_interleave(self.heads, dim=0)  # (B * heads, S, S), True = masked
        hidden = self.layers(self.embed(tokens) + self.position(position_ids), mask=mask)
        return self.head(hidden)


def masked_loss(model: TinyCausalLM, batch: dict) -> torch.Tensor:
    logits = model(batch["tokens"], batch["position_ids"], batch["attention_mask"])
    losses = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), reduction="none")
    mask = batch["loss_mask"].flatten()
    return (losses * mask).sum() / mask.sum()


def test_a_training_step_on_a_batch(data: Path) -> None:
    torch.manual_seed(0)
    (_, batch), = megatron_batches(data, 1)
    model = TinyCausalLM(VOCAB)
    loss = masked_loss(model, batch)
    assert math.isfinite(loss.item()) and abs(loss.item() - math.log(VOCAB)) < 0.1
    loss.backward()
    for name, param in model.named_parameters():
        assert param.grad is not None and torch.isfinite(param.grad).all(), name
    assert model.embed.weight.grad.abs().sum() > 0 and model.layers.layers[0].self_attn.in_proj_weight.grad.abs().sum() > 0
    # Labels under loss_mask == 0 (padding, each sample's last token) do not count.
    ignored = batch["loss_mask"] == 0
    assert ignored.any()
    changed = dict(batch, labels=torch.where(ignored, torch.randint_like(batch["labels"], 1, VOCAB), batch["labels"]))
    with torch.no_grad():
        assert torch.equal(masked_loss(model, changed), masked_loss(model, batch))


def test_no_token_sees_another_sample_of_its_pack(data: Path) -> None:
    """Changing the first packed sample's tokens leaves the logits of the rest of the pack alone."""
    torch.manual_seed(1)
    model = TinyCausalLM(VOCAB).eval()
    keys, batch = next((k, b) for k, b in megatron_batches(data, 6) if len(k[0]) >= 2)
    second = int((batch["position_ids"][0, 1:] == 0).nonzero()[0]) + 1  # where the second sample starts
    altered = batch["tokens"].clone()
    altered[0, :second] = torch.randint(1, VOCAB, (second,))
    with torch.no_grad():
        before = model(batch["tokens"], batch["position_ids"], batch["attention_mask"])
        after = model(altered, batch["position_ids"], batch["attention_mask"])
    assert torch.isfinite(before).all()  # padded rows too: none is fully masked
    assert not torch.allclose(before[0, :second], after[0, :second])
    assert torch.allclose(before[0, second:], after[0, second:], atol=1e-5)
    assert torch.allclose(before[1:], after[1:], atol=1e-6)


@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU the script would train")
def test_the_script_says_what_it_needs() -> None:
    run = subprocess.run([sys.executable, str(EXAMPLES / "megatron_core_gpt.py"), "--iters", "1"], capture_output=True, text=True, timeout=120)
    assert run.returncode != 0
    assert "this example needs a GPU and `pip install megatron-core==0.16.1`" in run.stderr
