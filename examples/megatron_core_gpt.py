"""Trains a small Megatron-Core GPT model on packed text batches from megatron_energon_lite.

What it shows: the Megatron Core quick-start model (GPTModel, tensor and pipeline parallel 1,
the local layer spec, Adam, ``get_forward_backward_func``) fed by our loader instead of
Megatron's GPTDataset.  It generates a small text dataset, tokenizes it bytewise and packs it
with ``TextPackingTaskEncoder(..., attention_mask=True)``; each batch becomes Megatron's dict
(``tokens``, ``labels``, ``loss_mask``, ``attention_mask``, ``position_ids``: see
:func:`to_megatron_batch`).  The attention mask is causal within each packed sample, so no token
attends to another sample of its sequence.  It prints the loss and samples/s (packed sequences
per second) per iteration and every ``--save-interval`` iterations saves the model (``dist_checkpointing``), the optimizer and
the loader state (plain JSON, one file per data-parallel rank) into ``--save``/iter_NNNNNNN.
``--load DIR`` restores all three and continues: the loader then yields exactly the batches an
uninterrupted run would have yielded.

Run on one GPU (more ranks are data-parallel replicas, each reading its own share):

    torchrun --nproc-per-node 1 examples/megatron_core_gpt.py --iters 20

Save every 10 iterations, then resume from the last checkpoint and go on to iteration 30:

    torchrun --nproc-per-node 1 examples/megatron_core_gpt.py --iters 20 --save /tmp/gpt_ckpt
    torchrun --nproc-per-node 1 examples/megatron_core_gpt.py --iters 30 --load /tmp/gpt_ckpt --save /tmp/gpt_ckpt

Needs a CUDA GPU and ``pip install megatron-core==0.16.1`` (the newest release for Python 3.11;
no Transformer Engine or Apex needed).  The data functions (:func:`make_loader`,
:func:`to_megatron_batch`, :func:`save_loader_state`, :func:`load_loader_state`) import without
megatron-core and are tested on CPU.  For Transformer Engine layer specs, pass the packs'
``cu_seqlens`` as ``PackedSeqParams`` instead of the mask (not shown here).
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import logging
import os
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

import torch

from megatron_energon_lite import WorkerConfig, get_savable_loader, get_train_dataset
from megatron_energon_lite.encoders import PackedTextSample, TextPackingTaskEncoder
from megatron_energon_lite.errors import ConfigError, StateError, format_message
from megatron_energon_lite.format.prepare import prepare_dataset
from megatron_energon_lite.synthetic import generate_text_dataset

NEEDS = "this example needs a GPU and `pip install megatron-core==0.16.1`"
TEXT_YAML = "sample_type:\n  __module__: megatron.energon\n  __class__: TextSample\nfield_map:\n  text: txt\n"
VOCAB_SIZE = 257  # byte tokens 1..256 and the pad id 0
MEGATRON_KEYS = ("tokens", "labels", "loss_mask", "attention_mask", "position_ids")
TRACKER = "latest_checkpointed_iteration.txt"


def byte_tokenizer(text: str) -> list[int]:
    return [b + 1 for b in text.encode("utf-8")]  # 0 is the pad id


def prepare_text_dataset(root: Path, *, num_shards: int = 4, samples_per_shard: int = 200, max_words: int = 80, seed: int = 1) -> Path:
    """A prepared text dataset under ``root/texts`` (generated once, reused afterwards)."""
    data = Path(root) / "texts"
    if not (data / ".nv-meta").is_dir():
        generate_text_dataset(data, num_shards=num_shards, samples_per_shard=samples_per_shard, min_words=3, max_words=max_words, seed=seed)
        prepare_dataset(data, split_ratio=(1, 0, 0), progress=False, num_workers=1, dataset_yaml=TEXT_YAML)
    return data


def make_loader(data: Path, *, seq_length: int, batch_size: int, num_workers: int = 2, rank: int = 0, world_size: int = 1):
    """This data-parallel rank's savable loader of packed batches with Megatron's attention mask."""
    encoder = TextPackingTaskEncoder(byte_tokenizer, seq_length, attention_mask=True)
    dataset = get_train_dataset(
        data,
        worker_config=WorkerConfig(rank=rank, world_size=world_size, num_workers=num_workers),
        batch_size=batch_size,
        shuffle_buffer_size=100,
        max_samples_per_sequence=50,
        packing_buffer_size=64,
        task_encoder=encoder,
    )
    return get_savable_loader(dataset)


def to_megatron_batch(batch: PackedTextSample, device: torch.device | str) -> dict[str, torch.Tensor]:
    """Megatron GPTDataset's batch dict, on ``device``.

    ``tokens``, ``labels``, ``position_ids`` int64 ``(B, S)``; ``loss_mask`` float32 ``(B, S)``,
    0 on padding and on each packed sample's last token; ``attention_mask`` bool
    ``(B, 1, S, S)``, True = masked.
    """
    if batch.attention_mask is None:
        raise ConfigError(format_message("the batch has no attention_mask", fix="build TextPackingTaskEncoder(..., attention_mask=True)"))
    return {name: getattr(batch, name).to(device, non_blocking=True) for name in MEGATRON_KEYS}


def save_loader_state(loader, checkpoint_dir: Path, *, rank: int = 0, iteration: int | None = None) -> Path:
    """Writes this rank's loader state as JSON into ``checkpoint_dir``; returns the file."""
    path = Path(checkpoint_dir) / f"loader_state_rank{rank}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"iteration": iteration, "rank": rank, "state": loader.save_state_rank()}))
    os.replace(tmp, path)  # a crash mid-write leaves the previous file whole
    return path


def load_loader_state(loader, checkpoint_dir: Path, *, rank: int = 0) -> int | None:
    """Restores a fresh ``loader`` from :func:`save_loader_state`'s file; returns its iteration."""
    path = Path(checkpoint_dir) / f"loader_state_rank{rank}.json"
    if not path.is_file():
        raise StateError(format_message("no loader state for this data-parallel rank", where=str(path), fix="resume with as many data-parallel ranks as the saved run had"))
    saved = json.loads(path.read_text())
    loader.restore_state_rank(saved["state"])
    return saved["iteration"]


def latest_checkpoint(directory: Path) -> tuple[int, Path]:
    """The iteration and folder named by ``directory``'s tracker file."""
    tracker = Path(directory) / TRACKER
    if not tracker.is_file():
        raise StateError(format_message("not a checkpoint directory of this example", where=str(directory), expected=f"a {TRACKER} file", fix="pass --load the --save directory of an earlier run"))
    iteration = int(tracker.read_text())
    return iteration, Path(directory) / f"iter_{iteration:07d}"


def masked_loss(loss_mask: torch.Tensor, output_tensor: torch.Tensor):
    """Megatron's loss_func contract: (sum of token losses, token count, values to report)."""
    mask = loss_mask.view(-1).float()
    total = torch.sum(output_tensor.float().view(-1) * mask)
    tokens = mask.sum().to(torch.int)
    return total, tokens, {"lm loss": torch.stack([total.detach(), tokens.detach().float()])}


def forward_step(data_iterator: Iterator[dict[str, torch.Tensor]], model):
    batch = next(data_iterator)
    output = model(batch["tokens"], batch["position_ids"], batch["attention_mask"], labels=batch["labels"])
    return output, functools.partial(masked_loss, batch["loss_mask"])


def _init_distributed(device: torch.device, backend: str) -> None:
    if "RANK" not in os.environ:  # plain `python`: a world of one
        with socket.socket() as free:
            free.bind(("127.0.0.1", 0))
            port = free.getsockname()[1]
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if device.type == "cuda":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    torch.distributed.init_process_group(backend=backend, rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))


def train(args: argparse.Namespace, device: torch.device | None = None, backend: str = "nccl") -> list[float]:
    """The training loop; returns the loss of every iteration this run made."""
    from megatron.core import dist_checkpointing, parallel_state, tensor_parallel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.transformer.transformer_config import TransformerConfig

    device = device or torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    _init_distributed(device, backend)
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=1, pipeline_model_parallel_size=1)
    tensor_parallel.model_parallel_cuda_manual_seed(args.seed)
    rank, dp_rank, dp_size = torch.distributed.get_rank(), parallel_state.get_data_parallel_rank(), parallel_state.get_data_parallel_world_size()

    config = TransformerConfig(
        num_layers=args.layers,
        hidden_size=args.hidden_size,
        num_attention_heads=args.heads,
        use_cpu_initialization=True,
        pipeline_dtype=torch.float32,
        # The fused causal softmax kernel ignores the mask; unfused, the packed samples stay apart.
        masked_softmax_fusion=False,
        # No dropout, so a resumed run's losses match an uninterrupted run's.
        hidden_dropout=0.0,
        attention_dropout=0.0,
    )
    model = GPTModel(config=config, transformer_layer_spec=get_gpt_layer_local_spec(), vocab_size=VOCAB_SIZE, max_sequence_length=args.seq_length).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)

    if rank == 0:
        prepare_text_dataset(args.data_dir)
    torch.distributed.barrier()  # the other ranks wait until rank 0 has prepared the dataset
    loader = make_loader(prepare_text_dataset(args.data_dir), seq_length=args.seq_length, batch_size=args.batch_size, num_workers=args.workers, rank=dp_rank, world_size=dp_size)

    start = 0
    if args.load:
        start, folder = latest_checkpoint(args.load)
        state = dist_checkpointing.load(sharded_state_dict=model.sharded_state_dict(prefix=""), checkpoint_dir=str(folder / "model"))
        model.load_state_dict(state)
        optimizer.load_state_dict(torch.load(folder / "optimizer.pt", map_location=device))
        load_loader_state(loader, folder, rank=dp_rank)
        if rank == 0:
            print(f"resumed from {folder} at iteration {start}")

    def save(iteration: int) -> None:
        folder = Path(args.save) / f"iter_{iteration:07d}"
        (folder / "model").mkdir(parents=True, exist_ok=True)
        dist_checkpointing.save(sharded_state_dict=model.sharded_state_dict(prefix=""), checkpoint_dir=str(folder / "model"))
        if rank == 0:  # data-parallel replicas hold the same optimizer state
            torch.save(optimizer.state_dict(), folder / "optimizer.pt")
        save_loader_state(loader, folder, rank=dp_rank, iteration=iteration)
        torch.distributed.barrier()
        if rank == 0:
            tracker = Path(args.save) / TRACKER
            tracker.with_suffix(".tmp").write_text(str(iteration))
            os.replace(tracker.with_suffix(".tmp"), tracker)  # the tracker names only complete checkpoints
            print(f"saved {folder}")

    batches = (to_megatron_batch(batch, device) for batch in loader)
    forward_backward = get_forward_backward_func()
    samples_per_iteration = args.batch_size * args.micro_batches * dp_size
    losses = []
    model.train()
    for iteration in range(start + 1, args.iters + 1):
        began = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        reported = forward_backward(
            forward_step_func=forward_step,
            data_iterator=batches,
            model=model,
            num_microbatches=args.micro_batches,
            seq_length=args.seq_length,
            micro_batch_size=args.batch_size,
            decoder_seq_length=args.seq_length,
            forward_only=False,
        )
        if dp_size > 1:  # no Megatron DDP wrapper here: average the replicas' gradients by hand
            for param in model.parameters():
                if param.grad is not None:
                    torch.distributed.all_reduce(param.grad, group=parallel_state.get_data_parallel_group())
                    param.grad /= dp_size
        optimizer.step()
        total = torch.stack([r["lm loss"] for r in reported]).sum(dim=0)
        if dp_size > 1:
            torch.distributed.all_reduce(total, group=parallel_state.get_data_parallel_group())
        loss = (total[0] / total[1].clamp(min=1)).item()  # .item() waits for the GPU
        seconds = time.perf_counter() - began
        losses.append(loss)
        if rank == 0:
            print(f"iteration {iteration:4d}/{args.iters}: loss {loss:.4f}, {samples_per_iteration / seconds:.1f} samples/s")
        if args.save and (iteration % args.save_interval == 0 or iteration == args.iters):
            save(iteration)

    parallel_state.destroy_model_parallel()
    torch.distributed.destroy_process_group()
    return losses


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iters", type=int, default=20, help="train until this iteration")
    parser.add_argument("--seq-length", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=8, help="micro-batch size")
    parser.add_argument("--micro-batches", type=int, default=1, help="micro-batches per iteration (gradient accumulation)")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden-size", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--workers", type=int, default=2, help="loader worker processes per rank")
    parser.add_argument("--data-dir", type=Path, default=Path(tempfile.gettempdir()) / "megatron_core_gpt_data", help="where rank 0 generates the dataset (shared by all ranks)")
    parser.add_argument("--save", type=Path, default=None, help="checkpoint directory (model, optimizer, loader state)")
    parser.add_argument("--save-interval", type=int, default=10)
    parser.add_argument("--load", type=Path, default=None, help="resume from this checkpoint directory")
    return parser.parse_args(argv)


def main() -> None:
    args = parse_args()
    logging.basicConfig(level=logging.WARNING)
    if importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.core") is None:
        sys.exit(f"megatron-core is not installed: {NEEDS}")
    if not torch.cuda.is_available():
        sys.exit(f"no CUDA device: {NEEDS}")
    train(args)


if __name__ == "__main__":
    main()
