"""Datasets in IDX files (the MNIST format), read with numpy alone.

Debian's ``dataset-fashion-mnist`` installs Fashion-MNIST as IDX files under
/usr/share/datasets/fashion-mnist/: ``train-images-idx3-ubyte.gz`` (60,000 28x28 grey
images) and ``train-labels-idx1-ubyte.gz``. A folder holding a ``train-images-idx3-ubyte``
and a ``train-labels-idx1-ubyte`` file (each gzipped or not) is an IDX dataset; its training
part is read. An IDX file is a 4-byte magic (two zero bytes, a type code, the number of
dimensions), one big-endian uint32 per dimension, then the values, big-endian.
Nothing here imports a framework.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np

from netbench.jobs.harness.data import DataError, Dataset, class_count, from_arrays

TRAIN_IMAGES, TRAIN_LABELS = "train-images-idx3-ubyte", "train-labels-idx1-ubyte"
_TYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def _find(folder: Path, stem: str) -> Path | None:
    for name in (stem, stem + ".gz"):
        if (folder / name).is_file():
            return folder / name
    return None


def is_idx_folder(path: str) -> bool:
    """Whether `path` is a folder holding IDX training images and labels."""
    folder = Path(path)
    return folder.is_dir() and _find(folder, TRAIN_IMAGES) is not None and _find(folder, TRAIN_LABELS) is not None


def parse_idx(raw: bytes, where: str) -> np.ndarray:
    """The array an IDX file's bytes hold; raises DataError naming `where` when they are not one."""
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _TYPES:
        raise DataError(f"{where}: not an IDX file (bad magic)")
    ndim = raw[3]
    head = 4 + 4 * ndim
    if len(raw) < head:
        raise DataError(f"{where}: IDX header cut short")
    shape = tuple(int(d) for d in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    dtype = np.dtype(_TYPES[raw[2]])
    count = int(np.prod(shape)) if shape else 0
    if len(raw) - head != count * dtype.itemsize:
        raise DataError(f"{where}: IDX data holds {len(raw) - head} bytes, its header says {count * dtype.itemsize}")
    return np.frombuffer(raw, dtype=dtype, count=count, offset=head).reshape(shape)


def read_idx(path: Path) -> np.ndarray:
    """One IDX file (gzipped when its name ends in .gz)."""
    try:
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    except (OSError, EOFError) as exc:
        raise DataError(f"{path}: cannot read ({exc})") from None
    return parse_idx(raw, str(path))


def load_idx_folder(path: str, index: int = 0, count: int = 1) -> Dataset:
    """Shard `index` of `count` (every count-th example) of an IDX folder's training part,
    images scaled to [0, 1] with a channel axis (N, H, W, 1)."""
    folder = Path(path)
    images, labels = _find(folder, TRAIN_IMAGES), _find(folder, TRAIN_LABELS)
    if images is None or labels is None:
        raise DataError(f"{path}: no {TRAIN_IMAGES}[.gz] and {TRAIN_LABELS}[.gz] (IDX files) in it")
    x, y = read_idx(images), read_idx(labels)
    if len(x) != len(y):
        raise DataError(f"{path}: {len(x)} images but {len(y)} labels")
    if len(x) < count:
        raise DataError(f"{path}: {len(x)} examples, fewer than the {count} workers")
    # every worker counts the classes of the whole labels file (a shard may lack the largest),
    # bounded there; shard before scaling: a worker converts only its own part to float
    classes = class_count(y, str(labels)) if np.issubdtype(y.dtype, np.integer) else None
    return from_arrays(x[index::count], y[index::count], str(folder), classes)
