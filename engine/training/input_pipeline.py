"""Where a step's batch comes from, and how long the loop waited for it.

Three sources, one interface (`next(step)` -> (inputs, targets) on the device, plus the
seconds spent waiting and copying, summed since the start):
  - SyntheticSource: engine.training.data.SyntheticTask, generated on the device;
  - FunctionSource: a custom workload's `batches(step)`;
  - LoaderSource: a torch.utils.data.DataLoader over a host Dataset, with the run's
    num_workers / pin_memory / persistent_workers / prefetch_factor. The built-in
    datasets are real files that every machine has offline: the Python standard
    library's own source, byte-tokenised, for sequence models; JPEG images written once
    under <data dir>/cache/ and decoded by PIL at every read, for image models.

`data_wait` is the time from asking for the next batch until it is in hand (the
DataLoader's workers, or the main process's own loading with 0 workers); `h2d_copy` the
host time of moving it to the GPU (with pin_memory the copy itself is asynchronous and
overlaps compute, so this is what it still costs the loop). A source's DataLoader worker
processes end with `close()`: a run never leaves them behind.
"""

from __future__ import annotations

import os
import sysconfig
import time
from pathlib import Path
from typing import Any, Callable

import torch
from torch.utils.data import DataLoader, Dataset

from engine.architectures import CAUSAL_LM, IMAGE, MASKED_LM, VECTOR
from engine.config import RunConfig
from engine.store.db import default_home
from engine.training.data import SyntheticTask
from engine.training.models import MASK_PROB, TaskShape, task_shape

IMAGE_FILES = 512          # JPEGs per image size: an epoch of the image dataset
IMAGE_DATA_SEED = 1234     # the dataset is the same for every run (the run seed shuffles it)
JPEG_QUALITY = 90
MAX_TEXT_BYTES = 8 << 20   # the first 8 MiB of the standard library's sources
CACHE_DIRNAME = "cache"    # <data dir>/cache/images/<side>px/
# ImageNet's per-channel statistics, as torchvision's recipes normalise.
IMAGE_MEAN, IMAGE_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
_STREAM_STRIDE = 1_000_003  # rank r's shuffle: seed + r * stride


# ---------------------------------------------------------------------------------------
# sources


class BatchSource:
    """Cumulative seconds: waiting for batches, and copying them to the device (None
    when batches never need a copy: generated on the device, or training on the CPU)."""
    wait_s: float = 0.0
    copy_s: float | None = None

    def next(self, step: int) -> tuple[Any, Any]:
        raise NotImplementedError

    def close(self) -> None:
        """Release worker processes; idempotent."""


class SyntheticSource(BatchSource):
    def __init__(self, task: SyntheticTask):
        self.task = task

    def next(self, step: int) -> tuple[Any, Any]:
        start = time.perf_counter()
        batch = self.task.batch()
        self.wait_s += time.perf_counter() - start
        return batch


class FunctionSource(BatchSource):
    """A custom workload's batches(step): its time is data wait, moving it is the copy."""

    def __init__(self, function: Callable[[int], Any], device: torch.device):
        self.function, self.device = function, device
        self.copy_s = 0.0 if device.type == "cuda" else None

    def next(self, step: int) -> tuple[Any, Any]:
        start = time.perf_counter()
        inputs, targets = self.function(step)
        self.wait_s += time.perf_counter() - start
        return _copied(self, (inputs, targets), non_blocking=False)


class LoaderSource(BatchSource):
    """A DataLoader over `dataset`, iterated from construction on (its workers start
    loading while the model is being set up, as in a real training script)."""

    def __init__(self, dataset: Dataset, cfg: RunConfig, device: torch.device,
                 channels_last: bool = False):
        self.device = device
        self.channels_last = channels_last
        self.pin = cfg.pin_memory and device.type == "cuda"  # pinning is for GPU copies
        workers = cfg.num_workers
        self.loader = DataLoader(
            dataset, batch_size=cfg.batch_size, shuffle=False, drop_last=True,
            num_workers=workers, pin_memory=self.pin,
            persistent_workers=cfg.persistent_workers and workers > 0,
            # DataLoader refuses a prefetch_factor without workers
            prefetch_factor=cfg.prefetch_factor if workers > 0 else None)
        self.copy_s = 0.0 if device.type == "cuda" else None
        self._iterator = iter(self.loader)

    def next(self, step: int) -> tuple[Any, Any]:
        start = time.perf_counter()
        try:
            batch = next(self._iterator)
        except StopIteration:  # an epoch is over: the next one (workers restart unless persistent)
            if not self.loader.persistent_workers:
                # The finished epoch's workers end now, waited for: left to the garbage
                # collector they were terminated without a wait and outlived the run.
                _shut_down(self._iterator)
            self._iterator = iter(self.loader)
            batch = next(self._iterator)
        self.wait_s += time.perf_counter() - start
        inputs, targets = _copied(self, batch, non_blocking=self.pin)
        if self.channels_last and isinstance(inputs, torch.Tensor) and inputs.dim() == 4:
            inputs = inputs.contiguous(memory_format=torch.channels_last)
        return inputs, targets

    def close(self) -> None:
        iterator, self._iterator = self._iterator, None
        # Shut the workers down now rather than whenever the iterator is collected; the
        # DataLoader keeps its own reference to a persistent_workers iterator.
        _shut_down(iterator)
        self.loader._iterator = None


def _shut_down(iterator) -> None:
    if iterator is not None and hasattr(iterator, "_shutdown_workers"):
        iterator._shutdown_workers()
        _end_workers(getattr(iterator, "_workers", []))


WORKER_EXIT_WAIT_S = 2.0


def _end_workers(workers: list) -> None:
    """DataLoader's shutdown terminates a worker that did not exit in time but does not
    wait for it: on a loaded machine one was still running seconds after its run had
    ended. Wait for each, and kill what a terminate did not end."""
    for worker in workers:
        try:
            worker.join(timeout=WORKER_EXIT_WAIT_S)
            if worker.is_alive():
                worker.kill()
                worker.join(timeout=WORKER_EXIT_WAIT_S)
        except (AssertionError, ValueError, OSError):  # not started here, or already closed
            continue


def _copied(source: BatchSource, batch: Any, non_blocking: bool) -> tuple[Any, Any]:
    if source.copy_s is None:
        return to_device(batch, source.device, non_blocking)
    start = time.perf_counter()
    moved = to_device(batch, source.device, non_blocking)
    source.copy_s += time.perf_counter() - start
    return moved


def to_device(obj: Any, device: torch.device, non_blocking: bool = False) -> Any:
    """Tensors (also inside tuples, lists, dicts) moved to `device`; anything else as is."""
    if isinstance(obj, torch.Tensor):
        return obj.to(device, non_blocking=non_blocking)
    if isinstance(obj, (tuple, list)):
        return type(obj)(to_device(item, device, non_blocking) for item in obj)
    if isinstance(obj, dict):
        return {key: to_device(value, device, non_blocking) for key, value in obj.items()}
    return obj


def builtin_source(cfg: RunConfig, device: torch.device, stream: int = 0) -> BatchSource:
    """The batches of a home-made or known architecture: synthetic, or real data through
    the DataLoader (RunConfig.data)."""
    if cfg.data == "synthetic":
        return SyntheticSource(SyntheticTask(cfg, device, stream=stream))
    return LoaderSource(builtin_dataset(cfg, stream), cfg, device, cfg.channels_last)


def builtin_dataset(cfg: RunConfig, stream: int = 0) -> Dataset:
    shape = task_shape(cfg)
    seed = cfg.seed + _STREAM_STRIDE * stream
    if shape.kind == IMAGE:
        return JpegImages(cfg.image_size, shape.classes, seed)
    if shape.kind == VECTOR:
        return TeacherVectors(shape, cfg.seed, seed)
    return StdlibText(cfg.seq_len, shape, seed)


# ---------------------------------------------------------------------------------------
# datasets


def _shuffle(count: int, seed: int) -> torch.Tensor:
    return torch.randperm(count, generator=torch.Generator().manual_seed(seed))


def stdlib_source_bytes(limit: int = MAX_TEXT_BYTES) -> bytes:
    """The standard library's top-level .py files, in name order, up to `limit` bytes."""
    folder = Path(sysconfig.get_paths()["stdlib"])
    chunks, total = [], 0
    for path in sorted(folder.glob("*.py")):
        try:
            data = path.read_bytes()
        except OSError:
            continue
        chunks.append(data)
        total += len(data)
        if total >= limit:
            break
    text = b"\n".join(chunks)[:limit]
    if len(text) < 4096:
        raise RuntimeError(f"the Python standard library's sources were not found under "
                           f"{folder} (found {len(text)} bytes); use data synthetic")
    return text


class StdlibText(Dataset):
    """Windows of seq_len + 1 bytes of stdlib source: (ids, next ids) for a causal LM, or
    (ids with 15 % masked, original ids there and -100 elsewhere) for a masked LM."""

    def __init__(self, seq_len: int, shape: TaskShape, seed: int):
        self.shape, self.seed = shape, seed
        self.window = seq_len + 1
        raw = stdlib_source_bytes()
        self.tokens = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
        self.order = _shuffle(len(raw) // self.window, seed)

    def __len__(self) -> int:
        return len(self.order)

    def __getitem__(self, index: int):
        start = int(self.order[index]) * self.window
        ids = self.tokens[start:start + self.window].long() + self.shape.token_offset
        if self.shape.kind == CAUSAL_LM:
            return ids[:-1], ids[1:]
        assert self.shape.kind == MASKED_LM
        ids = ids[:-1]
        gen = torch.Generator().manual_seed(self.seed * 7919 + index)
        masked = torch.rand(ids.shape, generator=gen) < MASK_PROB
        masked[0] = True  # never a sample without a masked position
        return torch.where(masked, self.shape.mask_id, ids), torch.where(masked, ids, -100)


class TeacherVectors(Dataset):
    """The mlp's task on the host: sample i is a seeded random vector and the argmax of a
    fixed random linear teacher of it."""

    def __init__(self, shape: TaskShape, rule_seed: int, seed: int, count: int = 1 << 16):
        self.seed, self.count, self.dim = seed, count, shape.input_dim
        self.teacher = torch.randn(shape.input_dim, shape.classes,
                                   generator=torch.Generator().manual_seed(rule_seed))

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int):
        x = torch.randn(self.dim, generator=torch.Generator().manual_seed(self.seed * 7919 + index))
        return x, (x @ self.teacher).argmax()


class JpegImages(Dataset):
    """IMAGE_FILES JPEGs of `side` px (smooth class templates plus noise), written once
    under the data directory's cache and decoded by PIL at every read."""

    def __init__(self, side: int, classes: int, seed: int, cache_root: Path | None = None):
        self.folder = ensure_image_files(side, classes, cache_root)
        self.files = sorted(self.folder.glob("*.jpg"))
        self.order = _shuffle(len(self.files), seed)
        self.mean = torch.tensor(IMAGE_MEAN).view(3, 1, 1)
        self.std = torch.tensor(IMAGE_STD).view(3, 1, 1)

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int):
        from PIL import Image  # Pillow: loaded by the processes that decode images

        path = self.files[int(self.order[index])]
        with Image.open(path) as image:
            pixels = torch.frombuffer(bytearray(image.convert("RGB").tobytes()), dtype=torch.uint8)
        side = int(self.folder.name.removesuffix("px"))
        chw = pixels.view(side, side, 3).permute(2, 0, 1).float().div_(255.0)
        label = int(path.stem.rsplit("_c", 1)[1])
        return (chw - self.mean) / self.std, label


def image_cache_dir(side: int, cache_root: Path | None = None) -> Path:
    return (cache_root or default_home() / CACHE_DIRNAME) / "images" / f"{side}px"


def ensure_image_files(side: int, classes: int, cache_root: Path | None = None) -> Path:
    """The folder of JPEGs for `side`, written at first use. Written into a temporary
    folder and renamed into place, so a process racing this one (or killed half-way)
    never sees a partial set."""
    folder = image_cache_dir(side, cache_root)
    if folder.is_dir():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = folder.parent / f".{folder.name}-{os.getpid()}"
    staging.mkdir(exist_ok=True)
    _write_images(staging, side, classes)
    try:
        staging.rename(folder)
    except OSError:  # another process finished first: use its folder, drop ours
        for path in staging.iterdir():
            path.unlink()
        staging.rmdir()
    return folder


def _write_images(folder: Path, side: int, classes: int) -> None:
    from PIL import Image  # Pillow: only the first run at an image size writes the files

    gen = torch.Generator().manual_seed(IMAGE_DATA_SEED)
    coarse = torch.rand(classes, 3, 4, 4, generator=gen)
    templates = torch.nn.functional.interpolate(coarse, size=(side, side), mode="bilinear",
                                                align_corners=False)
    for index in range(IMAGE_FILES):
        label = index % classes
        noisy = templates[label] + 0.15 * torch.randn(3, side, side, generator=gen)
        pixels = (noisy.clamp(0, 1) * 255).to(torch.uint8).permute(1, 2, 0).contiguous()
        Image.fromarray(pixels.numpy(), "RGB").save(folder / f"img{index:05d}_c{label}.jpg",
                                                    quality=JPEG_QUALITY)
