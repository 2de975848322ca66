"""data=imagenet32/64: the downsampled ImageNet's npz files through the cache, in the official layout."""

import numpy as np
import pytest

from fixtures import write_imagenet
from imagegen.data import imagenet, source
from imagegen.data.sets import dataset_info, load_from_config
from imagegen.errors import UserError


def cfg(root, name="imagenet32"):
    return {"name": name, "root": str(root), "download": False, "val_fraction": 0.25, "split_seed": 0}


def test_rows_in_raster_order_with_labels(tmp_path, monkeypatch):
    monkeypatch.setattr(imagenet, "_CHUNK_ROWS", 2)          # several chunks per file
    monkeypatch.setitem(imagenet.SIZES, "imagenet32", 8)     # 8x8 fixtures stand in for 32x32
    files = write_imagenet(tmp_path, size=8)
    (train, ytr), (val, yv), (test, yte) = load_from_config(cfg(tmp_path), ("train", "val", "test"), labels=True)
    data = np.concatenate([files[k][0] for k in sorted(files) if "train" in k])
    labels = np.concatenate([files[k][1] for k in sorted(files) if "train" in k]) - 1
    assert (len(train), len(val), len(test)) == (6, 2, 4)
    # channel-planar R(64) G(64) B(64) -> r, g, b per pixel
    want = data.reshape(-1, 3, 64).transpose(0, 2, 1).reshape(-1, 192)
    got = np.concatenate([train[:].numpy(), val[:].numpy()])
    got_labels = np.concatenate([ytr.numpy(), yv.numpy()])
    order = np.argsort(np.concatenate([source.split_rows(np.zeros(8, np.int8), ("train", "val"), 0.25, 0, 0)[s]
                                       for s in ("train", "val")]))
    assert np.array_equal(got[order], want) and np.array_equal(got_labels[order], labels)
    val_data, val_labels = files["val_data.npz"]
    assert np.array_equal(test[:].numpy(), val_data.reshape(-1, 3, 64).transpose(0, 2, 1).reshape(-1, 192))
    assert yte.tolist() == [v - 1 for v in val_labels]


def test_info_and_errors(tmp_path):
    info = dataset_info({"name": "imagenet64"})
    assert (info.height, info.width, info.channels, info.num_classes) == (64, 64, 3, 1000)
    with pytest.raises(UserError, match="image-net.org"):
        load_from_config(cfg(tmp_path), ("train",))
    write_imagenet(tmp_path, size=8)                      # 8x8 files read as imagenet32: one sentence
    with pytest.raises(UserError, match="not the 32x32 downsampled ImageNet"):
        load_from_config(cfg(tmp_path), ("train",))
    bad = tmp_path / "Imagenet_train_npz" / "train_data_batch_1.npz"
    bad.write_bytes(b"not a zip")
    with pytest.raises(UserError, match="not a readable npz"):
        load_from_config(cfg(tmp_path), ("train",))
    assert not list((tmp_path / ".imagegen-cache").glob("*.npy"))
