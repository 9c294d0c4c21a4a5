"""Training data for a job: synthetic batches or a local dataset, held in memory.

``--data synthetic`` (the default) draws one batch per worker from a seeded normal
distribution and reuses it every step, so no input pipeline lands in the step time.
``--data fashion-mnist`` reads Fashion-MNIST's IDX files from Debian's ``dataset-fashion-mnist``
package on this node (60,000 training and 10,000 held-out 28x28 grey images, 10 classes), as
784 floats in [0, 1] per image. ``--data PATH`` reads a local dataset once, before the first step:

* an ``.npz`` archive with ``x_train`` and ``y_train`` (the layout of the MNIST and CIFAR
  archives): uint8 images are scaled to [0, 1]; HxW images gain a channel axis; labels
  of shape (N, 1) are flattened;
* a folder holding one sub-folder of images per class (PNG, JPEG, BMP or GIF); classes
  are the sub-folder names in sorted order; images are resized to the input shape.

Each worker trains on its own shard (every W-th example from its task index) and cycles
through whole batches of it. Nothing is ever downloaded.

The pure helpers take numpy arrays; the folder reader takes the tensorflow module so
that it is only imported inside a training process.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

SYNTHETIC = "synthetic"
FASHION_MNIST = "fashion-mnist"
# where Debian's dataset-fashion-mnist package puts the IDX files (gzipped)
FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
FASHION_MNIST_FILES = {"train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
                       "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")}
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif")
# the most classes a data set may have (the class count is its largest label + 1; --classes'
# ceiling too): one stray label must not build a layer of billions of outputs
MAX_CLASSES = 100_000


class DataError(ValueError):
    """A dataset that cannot be used; the message names the path and what is wrong."""


@dataclass(frozen=True)
class Dataset:
    """Examples in memory: x float32 (N, *shape), y int32 (N,), and the class count."""

    x: np.ndarray
    y: np.ndarray
    classes: int

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(int(d) for d in self.x.shape[1:])


# Fashion-MNIST as netbench loads it: 784 values a sample (load_fashion_mnist flattens the images)
FASHION_MNIST_SHAPE = (784,)


def check_fits(model: str, source: str) -> None:
    """Raise DataError when `model` cannot take the samples of `source` as netbench loads them
    (Fashion-MNIST is flat: only the mlp takes it; other sources are checked once loaded)."""
    from netbench.jobs.harness.models import DEFAULT_CLASSES, check_input

    if source != FASHION_MNIST:
        return
    try:
        check_input(model, FASHION_MNIST_SHAPE, DEFAULT_CLASSES)
    except ValueError:
        raise DataError(f"model {model} needs images HxWxC, and fashion-mnist gives 784 values a sample "
                        "(only the mlp takes it)") from None


def check_source(source: str) -> None:
    """Raise DataError unless `source` is "synthetic", an existing .npz file or a folder."""
    if source == SYNTHETIC:
        return
    if source == FASHION_MNIST:
        missing = [f for pair in FASHION_MNIST_FILES.values() for f in pair
                   if not os.path.isfile(os.path.join(FASHION_MNIST_DIR, f))]
        if missing:
            raise DataError(f"fashion-mnist: {FASHION_MNIST_DIR}/{missing[0]} is missing "
                            "(install Debian's dataset-fashion-mnist: apt-get install dataset-fashion-mnist)")
        return
    path = Path(source)
    if path.is_dir():
        return
    if path.is_file() and path.suffix == ".npz":
        return
    if not path.exists():
        raise DataError(f"{source}: no such file or folder (use 'synthetic', an .npz, or a folder of class folders)")
    raise DataError(f"{source}: not an .npz archive or a folder of class folders")


def synthetic(shape: tuple[int, ...], classes: int, batch_size: int, seed: int) -> Dataset:
    """One seeded batch of normal inputs and uniform labels."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch_size, *shape), dtype=np.float32)
    y = rng.integers(0, classes, size=(batch_size,), dtype=np.int32)
    return Dataset(x, y, classes)


def class_count(y: np.ndarray, where: str) -> int:
    """The class count integer labels `y` give (the largest + 1); raises DataError naming
    `where` and the label when one is negative or beyond MAX_CLASSES."""
    if y.size == 0:
        return 0
    low, high = int(y.min()), int(y.max())
    if low < 0:
        raise DataError(f"{where}: label {low} is negative (labels are 0 to classes - 1)")
    if high >= MAX_CLASSES:
        raise DataError(f"{where}: label {high} is beyond the {MAX_CLASSES:,} classes a data set may have "
                        f"(labels are 0 to classes - 1; the class count is the largest label + 1)")
    return high + 1


def from_arrays(x: np.ndarray, y: np.ndarray, where: str, classes: int | None = None) -> Dataset:
    """Normalise images and labels as described in the module docstring (`classes`: the
    count of the whole data set's labels when `y` is a shard of them)."""
    if x.ndim < 2 or len(x) == 0:
        raise DataError(f"{where}: x_train must hold at least one example, got shape {x.shape}")
    y = np.asarray(y)
    if y.ndim == 2 and y.shape[1] == 1:  # CIFAR keeps labels as (N, 1)
        y = y[:, 0]
    if y.ndim != 1:
        raise DataError(f"{where}: y_train must hold one integer label per example, got shape {y.shape}")
    if len(y) != len(x):
        raise DataError(f"{where}: x_train has {len(x)} examples but y_train has {len(y)} labels")
    if not np.issubdtype(y.dtype, np.integer):
        if not np.all(np.equal(np.mod(y, 1), 0)):
            raise DataError(f"{where}: y_train must hold integer class labels")
    y = y.astype(np.int64)
    count = class_count(y, where) if classes is None else classes
    if x.dtype == np.uint8:
        x = x.astype(np.float32) / 255.0
    else:
        x = x.astype(np.float32)
    if x.ndim == 3:  # N x H x W grey images (MNIST)
        x = x[..., np.newaxis]
    return Dataset(x, y.astype(np.int32), count)


def load_npz(path: str) -> Dataset:
    """Read x_train / y_train from an .npz archive."""
    try:
        with np.load(path, allow_pickle=False) as archive:
            missing = [key for key in ("x_train", "y_train") if key not in archive.files]
            if missing:
                raise DataError(f"{path}: missing {', '.join(missing)} (has {', '.join(archive.files) or 'nothing'})")
            return from_arrays(archive["x_train"], archive["y_train"], path)
    except (OSError, ValueError) as exc:
        if isinstance(exc, DataError):
            raise
        raise DataError(f"{path}: not a readable .npz archive ({exc})") from None


def class_folders(path: str) -> list[tuple[str, list[str]]]:
    """(class name, sorted image files) for each sub-folder of `path`, in sorted order."""
    root = Path(path)
    classes = []
    for sub in sorted(p for p in root.iterdir() if p.is_dir()):
        files = sorted(str(f) for f in sub.iterdir() if f.suffix.lower() in IMAGE_SUFFIXES)
        if files:
            classes.append((sub.name, files))
    if len(classes) < 2:
        raise DataError(f"{path}: needs at least two class folders holding images ({', '.join(IMAGE_SUFFIXES)})")
    return classes


def load_folder(tf: Any, path: str, input_shape: tuple[int, ...] | None) -> Dataset:
    """Decode every image of a class-folder dataset, resized to HxW of `input_shape`.

    Without an input shape the first image's size and channel count are used.
    """
    classes = class_folders(path)
    height = width = channels = None
    if input_shape is not None:
        if len(input_shape) != 3:
            raise DataError(f"{path}: images need an input shape HxWxC, got {input_shape}")
        height, width, channels = input_shape
    xs, ys = [], []
    for label, (_, files) in enumerate(classes):
        for name in files:
            try:
                image = tf.io.decode_image(tf.io.read_file(name), channels=channels or 0,
                                           expand_animations=False)
            except Exception as exc:  # noqa: BLE001 - TF raises several kinds for a bad file
                raise DataError(f"{name}: cannot decode image ({type(exc).__name__})") from None
            if height is None:
                height, width, channels = (int(d) for d in image.shape)
            image = tf.image.resize(tf.cast(image, tf.float32) / 255.0, (height, width))
            xs.append(image.numpy())
            ys.append(label)
    return Dataset(np.stack(xs).astype(np.float32), np.asarray(ys, dtype=np.int32), len(classes))


def read_idx(path: str) -> np.ndarray:
    """The array in an IDX file (gzipped or not): unsigned bytes, dimensions from its header."""
    import gzip

    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as fh:
            raw = fh.read()
    except OSError as exc:
        raise DataError(f"{path}: cannot read ({exc})") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        raise DataError(f"{path}: not an IDX file of unsigned bytes")
    dims = raw[3]
    shape = tuple(int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(dims))
    body = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * dims)
    if body.size != int(np.prod(shape)):
        raise DataError(f"{path}: header says {shape}, the file holds {body.size} bytes")
    return body.reshape(shape)


def load_fashion_mnist(split: str) -> Dataset:
    """Fashion-MNIST's "train" or "test" split, images flattened to 784 floats in [0, 1]."""
    images, labels = (os.path.join(FASHION_MNIST_DIR, f) for f in FASHION_MNIST_FILES[split])
    x = read_idx(images)
    return from_arrays(x.reshape(len(x), -1), read_idx(labels), labels)


def load_test(source: str, input_shape: tuple[int, ...] | None = None) -> Dataset | None:
    """The held-out split of `source`: Fashion-MNIST's test set, an .npz's x_test/y_test;
    None when the data has none (synthetic data, a folder, an .npz without them)."""
    if source == FASHION_MNIST:
        return load_fashion_mnist("test")
    if source.endswith(".npz") and os.path.isfile(source):
        with np.load(source, allow_pickle=False) as archive:
            if "x_test" in archive.files and "y_test" in archive.files:
                return from_arrays(archive["x_test"], archive["y_test"], source)
    return None


def load(tf: Any, source: str, input_shape: tuple[int, ...] | None) -> Dataset:
    """The local dataset at `source` (fashion-mnist, an .npz or a class-folder tree)."""
    check_source(source)
    if source == FASHION_MNIST:
        return load_fashion_mnist("train")
    if os.path.isdir(source):
        return load_folder(tf, source, input_shape)
    return load_npz(source)


def shard(data: Dataset, index: int, count: int) -> Dataset:
    """Every `count`-th example from `index`: the part one of `count` workers trains on."""
    if not 0 <= index < count:
        raise ValueError(f"shard {index} out of range for {count} shards")
    if len(data.x) < count:
        raise DataError(f"the dataset has {len(data.x)} examples, fewer than the {count} workers")
    return Dataset(data.x[index::count], data.y[index::count], data.classes)


def batches(data: Dataset, batch_size: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Whole batches of `batch_size` cycling over the data; a small shard wraps around."""
    n = len(data.x)
    count = max(1, n // batch_size)
    out = []
    for b in range(count):
        idx = np.arange(b * batch_size, (b + 1) * batch_size) % n
        out.append((data.x[idx], data.y[idx]))
    return out
