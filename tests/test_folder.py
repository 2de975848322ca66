"""data=folder: reading any image (mode, format, orientation), the folder layout, bad files, the cache."""
import io
import os

import numpy as np
import pytest
from PIL import Image

from fixtures import one_sentence, solid, write_class_folder, write_png_header
from imagegen.data import source
from imagegen.errors import UserError
from imagegen.data.folder import read_image, scan

RGB = (200, 100, 50)
GREY = round(0.299 * 200 + 0.587 * 100 + 0.114 * 50)        # ITU-R 601 luma, as Pillow converts


def save(img, path, **kw):
    path.parent.mkdir(parents=True, exist_ok=True)
    img.save(path, **kw)
    return path


def palette_image(size, colour, transparent=False):
    img = Image.new("P", size, 1)
    img.putpalette([0, 0, 0, *colour] + [0] * (256 * 3 - 6))
    if transparent:
        img.info["transparency"] = 1
    return img


# (name, image, suffix, expected RGB, tolerance): every mode and format the issue names
CASES = [
    ("rgb-png", lambda: solid("RGB", (9, 7), RGB), ".png", RGB, 0),
    ("grey-png", lambda: solid("L", (9, 7), 77), ".png", (77,) * 3, 0),
    ("bilevel-png", lambda: solid("1", (9, 7), 1), ".png", (255,) * 3, 0),
    ("palette-png", lambda: palette_image((9, 7), RGB), ".png", RGB, 0),
    ("palette-transparent-png", lambda: palette_image((9, 7), RGB, True), ".png", (255,) * 3, 0),
    ("rgba-png-opaque", lambda: solid("RGBA", (9, 7), RGB + (255,)), ".png", RGB, 0),
    ("rgba-png-clear", lambda: solid("RGBA", (9, 7), RGB + (0,)), ".png", (255,) * 3, 0),
    ("la-png-half", lambda: solid("LA", (9, 7), (0, 128)), ".png", (127,) * 3, 1),
    ("grey16-png", lambda: Image.fromarray(np.full((7, 9), 200 * 257, np.uint16)), ".png", (200,) * 3, 0),
    ("int32-tiff", lambda: solid("I", (9, 7), 100 * 257), ".tiff", (100,) * 3, 0),
    ("cmyk-jpeg", lambda: solid("CMYK", (16, 16), (0, 255, 255, 0)), ".jpg", (255, 0, 0), 6),
    ("rgb-jpeg", lambda: solid("RGB", (16, 16), RGB), ".jpeg", RGB, 4),
    ("grey-jpeg", lambda: solid("L", (16, 16), 77), ".jpg", (77,) * 3, 2),
    ("rgb-webp-lossless", lambda: solid("RGB", (9, 7), RGB), ".webp", RGB, 0),
    ("rgb-bmp", lambda: solid("RGB", (9, 7), RGB), ".bmp", RGB, 0),
    ("palette-gif", lambda: solid("RGB", (9, 7), RGB).quantize(4), ".gif", RGB, 0),
]


@pytest.mark.parametrize("name,make,suffix,expected,tol", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("channels", [3, 1])
def test_every_mode_and_format(tmp_path, name, make, suffix, expected, tol, channels):
    kw = {"lossless": True} if suffix == ".webp" else {}
    path = save(make(), tmp_path / f"{name}{suffix}", **kw)
    out = read_image(path, 4, 5, channels)
    assert out.shape == (4, 5, channels) and out.dtype == np.uint8
    want = expected if channels == 3 else (round(0.299 * expected[0] + 0.587 * expected[1] + 0.114 * expected[2]),)
    assert np.abs(out.astype(int) - np.array(want)).max() <= tol + (1 if channels == 1 else 0), (out[0, 0], want)


def test_gif_first_frame(tmp_path):
    frames = [solid("RGB", (8, 8), c).quantize(4) for c in (RGB, (0, 0, 255))]
    path = tmp_path / "anim.gif"
    frames[0].save(path, save_all=True, append_images=frames[1:], duration=100)
    assert Image.open(path).n_frames == 2
    assert np.abs(read_image(path, 4, 4, 3).astype(int) - RGB).max() == 0


def test_background_under_alpha_and_padding(tmp_path):
    path = save(solid("RGBA", (8, 8), RGB + (0,)), tmp_path / "clear.png")
    assert (read_image(path, 4, 4, 1, background=0) == 0).all()
    wide = save(solid("RGB", (20, 10), RGB), tmp_path / "wide.png")
    padded = read_image(wide, 10, 10, 3, fit="pad", background=9)
    assert (padded[:2] == 9).all() and (padded[-2:] == 9).all() and (padded[3:7] == RGB).all()


def test_crop_keeps_the_centre(tmp_path):
    a = np.zeros((10, 30), np.uint8)
    a[:, 10:20] = 255                                    # a white centre third
    path = save(Image.fromarray(a), tmp_path / "wide.png")
    out = read_image(path, 10, 10, 1)
    assert out.shape == (10, 10, 1) and (out == 255).all()


@pytest.mark.parametrize("suffix", [".png", ".jpg"])
def test_exif_orientation_applied(tmp_path, suffix):
    """Stored 40 wide x 20 high, left half black; EXIF orientation 6 (turn 90 degrees clockwise to
    show): shown 20 wide x 40 high with the black half on top."""
    a = np.full((20, 40), 255, np.uint8)
    a[:, :20] = 0
    img = Image.fromarray(a)
    exif = Image.Exif()
    exif[0x0112] = 6
    path = save(img, tmp_path / f"turned{suffix}", exif=exif.tobytes())
    out = read_image(path, 8, 4, 1)[..., 0]              # 8 high, 4 wide: the shown shape
    assert out[:3].max() < 40 and out[5:].min() > 215, out


def test_large_jpeg_shrunk_by_the_decoder_matches(tmp_path):
    """The JPEG draft (decoder-side 1/8 scaling) gives nearly what a full decode and resize gives."""
    rng = np.random.default_rng(0)
    a = np.kron(rng.integers(0, 256, (8, 8, 3)), np.ones((64, 64, 1))).astype(np.uint8)   # 512 x 512 blocks
    path = save(Image.fromarray(a), tmp_path / "big.jpg", quality=95)
    out = read_image(path, 8, 8, 3).astype(int)
    full = np.asarray(Image.open(path).convert("RGB").resize((8, 8), Image.LANCZOS), dtype=int)
    assert np.abs(out - full).mean() < 2 and np.abs(out - full).max() <= 8


# ---------------------------------------------------------------- layout
def test_scan_classes_nested_hidden_links_unicode(tmp_path):
    root = tmp_path / "pics"
    save(solid("RGB", (4, 4), RGB), root / "cat" / "a.png")
    save(solid("RGB", (4, 4), RGB), root / "cat" / "deeper" / "still" / "b.jpg")
    save(solid("RGB", (4, 4), RGB), root / "日本" / "猫 ü.png")
    save(solid("RGB", (4, 4), RGB), root / ".hidden" / "c.png")
    save(solid("RGB", (4, 4), RGB), root / "cat" / ".d.png")
    save(solid("RGB", (4, 4), RGB), root / "loose.png")          # beside the class folders
    (root / "cat" / "notes.txt").write_text("not an image by name")
    os.symlink(root, root / "cat" / "loop")                       # a link back up: followed once only
    os.symlink(root / "nowhere", root / "cat" / "dangling.png")
    s = scan(root)
    assert [(e.path, e.cls) for e in s.entries] == [("cat/a.png", "cat"), ("cat/deeper/still/b.jpg", "cat"),
                                                     ("日本/猫 ü.png", "日本")]
    assert s.class_names == ("cat", "日本") and s.outside == ("loose.png",)


def test_scan_split_folders_and_mixed_refused(tmp_path):
    for split in ("train", "test"):
        write_class_folder(tmp_path / split, per_class=2)
    s = scan(tmp_path)
    assert {(e.split, e.cls) for e in s.entries} == {(a, b) for a in ("train", "test") for b in ("cat", "dog")}
    save(solid("RGB", (4, 4), RGB), tmp_path / "val" / "x.png")      # val/ without class folders
    with pytest.raises(UserError, match="same class folders"):
        scan(tmp_path)


def test_missing_root_is_one_sentence(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        scan(tmp_path / "nope")


# ---------------------------------------------------------------- cache
def cfg(root, **kw):
    return {"name": "folder", "root": str(root), "image_size": 6, "channels": 3, "workers": 1, **kw}


def lines():
    said = []
    return said, said.append


def test_bad_files_skipped_counted_and_listed(tmp_path):
    root = tmp_path / "pics"
    write_class_folder(root, per_class=2)
    (root / "cat" / "empty.png").write_bytes(b"")
    (root / "cat" / "text.jpg").write_text("hello, I am not a JPEG")
    good = io.BytesIO()
    solid("RGB", (64, 64), RGB).save(good, "JPEG")
    (root / "dog" / "truncated.jpg").write_bytes(good.getvalue()[: len(good.getvalue()) // 2])
    write_png_header(root / "dog" / "bomb.png", 100_000, 100_000)           # past 2x Pillow's limit: an error
    write_png_header(root / "dog" / "big.png", 10_000, 10_000)              # past the limit: Pillow warns
    said, say = lines()
    cache, _ = source.open_cache(cfg(root), progress=False, say=say)
    assert len(cache.images) == 4 and cache.manifest["skipped"] == 5
    listed = (cache.folder / "skipped.txt").read_text().splitlines()
    assert sorted(line.split("\t")[0] for line in listed) == ["cat/empty.png", "cat/text.jpg", "dog/big.png",
                                                              "dog/bomb.png", "dog/truncated.jpg"]
    assert any("DecompressionBomb" in line for line in listed)
    assert len(said) == 1 and "5 unreadable files skipped" in said[0]


def test_no_readable_image_is_one_sentence(tmp_path):
    (tmp_path / "a.png").write_bytes(b"")
    (tmp_path / "b.jpg").write_text("no")
    with pytest.raises(UserError, match="none of the 2 image files") as e:
        source.open_cache(cfg(tmp_path), progress=False, say=lambda s: None)
    assert "\n" not in str(e.value)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(UserError, match="no image files under"):
        source.open_cache(cfg(empty), progress=False, say=lambda s: None)


def test_cache_reused_then_rebuilt_with_one_line(tmp_path):
    root = tmp_path / "pics"
    paths = write_class_folder(root, per_class=3)
    said, say = lines()
    first, _ = source.open_cache(cfg(root), progress=False, say=say)
    assert len(said) == 1 and said[0].startswith("converted 6 images")
    images = first.folder / first.manifest["images"]
    again, why = source.open_cache(cfg(root), progress=False, say=say)
    assert len(said) == 1 and why is None and again.manifest["images"] == first.manifest["images"]
    assert np.array_equal(np.asarray(again.images), np.asarray(first.images))

    Image.fromarray(np.zeros((10, 12, 3), np.uint8)).save(paths[0])          # change one file
    os.utime(paths[0], ns=(1, 1))
    changed, _ = source.open_cache(cfg(root), progress=False, say=say)
    assert said[1] == f"rebuilding the cache {first.folder}: 1 file changed (cat/0.png)"
    assert changed.images[0].max() == 0 and not images.exists()
    source.open_cache(cfg(root, image_size=4), progress=False, say=say)
    assert said[3].endswith("data.height 6 -> 4; data.width 6 -> 4")
    paths[-1].unlink()
    smaller, _ = source.open_cache(cfg(root, image_size=4), progress=False, say=say)
    assert "1 file removed (dog/2.png)" in said[5] and len(smaller.images) == 5
    _, why = source.open_cache(cfg(root, channels=1, image_size=4), check_only=True, say=say)
    assert why == "data.channels 3 -> 1" and len(said) == 7


def test_pixels_and_labels_as_the_folder_says(tmp_path):
    root = tmp_path / "pics"
    write_class_folder(root, classes=("a", "b", "c"), per_class=2, suffix=".bmp")
    cache, _ = source.open_cache(cfg(root), progress=False, say=lambda s: None)
    assert cache.class_names == ("a", "b", "c") and list(cache.labels) == [0, 0, 1, 1, 2, 2]
    brightness = np.asarray(cache.images).reshape(6, -1).mean(1)
    assert np.allclose(brightness, 40 + 80 * cache.labels, atol=3)
    assert source.folder_info(cfg(root)).class_names == ("a", "b", "c")


def test_splits_from_folders_and_fractions(tmp_path):
    for split, n in (("train", 5), ("test", 2)):
        write_class_folder(tmp_path / "tt" / split, per_class=n)
    d = cfg(tmp_path / "tt", val_fraction=0.2)
    (train, ytr), (val, yv), (test, yte) = source.load(d, ("train", "val", "test"), labels=True, progress=False,
                                                       say=lambda s: None)
    assert (len(train), len(val), len(test)) == (8, 2, 4) and sorted(yte.tolist()) == [0, 0, 1, 1]

    for split, n in (("train", 3), ("val", 1)):                   # train/ and val/: val/ is the test split too
        write_class_folder(tmp_path / "tv" / split, per_class=n)
    val, test = source.load(cfg(tmp_path / "tv"), ("val", "test"), progress=False, say=lambda s: None)
    assert len(val) == len(test) == 2 and np.array_equal(val[:], test[:])

    write_class_folder(tmp_path / "flat", per_class=10)            # no split folders: seeded shares
    d = cfg(tmp_path / "flat", val_fraction=0.25, test_fraction=0.2)
    cache, _ = source.open_cache(d, progress=False, say=lambda s: None)
    rows = source.split_rows(cache.splits, ("train", "val", "test"), 0.25, 0.2, 0)
    assert [len(rows[s]) for s in ("train", "val", "test")] == [12, 4, 4]
    assert sorted(np.concatenate(list(rows.values())).tolist()) == list(range(20))
    assert all(np.array_equal(rows[s], source.split_rows(cache.splits, (s,), 0.25, 0.2, 0)[s]) for s in rows)
    other = source.split_rows(cache.splits, ("test",), 0.25, 0.2, 1)["test"]
    assert not np.array_equal(other, rows["test"])


def test_image_rows_index_like_a_tensor():
    import torch
    a = np.arange(7 * 5, dtype=np.uint8).reshape(7, 5)
    idx = np.array([6, 0, 3, 4])
    x, ref = source.ImageRows(a, idx), torch.from_numpy(a[idx])
    assert len(x) == 4 and x.shape == ref.shape and x.numel() == ref.numel()
    keys = (slice(None), slice(1, 3), torch.tensor([3, 0, 0]), np.array([2]), [1, 2], 2, -1, (slice(0, 2), slice(0, 3)))
    for key in keys:
        assert torch.equal(x[key], ref[key]), key
    with pytest.raises(IndexError):
        x[torch.tensor([4])]


def test_an_empty_class_folder_is_named_not_dropped(tmp_path):
    """cat/, dog/ and an empty bird/: bird vanished without a word, and dog's label number moved (issue 45)."""
    write_class_folder(tmp_path / "pics", classes=("cat", "dog"), per_class=1)
    (tmp_path / "pics" / "bird").mkdir()
    (tmp_path / "pics" / "bird" / "notes.txt").write_text("no image here")
    with pytest.raises(UserError) as e:
        scan(tmp_path / "pics")
    assert f"the class folder {tmp_path / 'pics' / 'bird'} holds no images" in one_sentence(e)


def test_a_class_empty_in_one_split_only_is_kept(tmp_path):
    write_class_folder(tmp_path / "train", classes=("cat", "dog"), per_class=1)
    write_class_folder(tmp_path / "test", classes=("cat",), per_class=1)
    (tmp_path / "test" / "dog").mkdir()                      # dog's images are all in train/
    assert scan(tmp_path).class_names == ("cat", "dog")
    (tmp_path / "test" / "bird").mkdir()                     # a class of no split
    with pytest.raises(UserError, match=f"the class folder {tmp_path / 'test' / 'bird'} holds no images"):
        scan(tmp_path)


def test_conversion_workers_capped_at_the_cores_and_never_negative(tmp_path, monkeypatch):
    """data.workers=10000 started a process per image; -1 was taken without a word (issue 45)."""
    from imagegen.data import imagecache
    write_class_folder(tmp_path / "pics", per_class=1)
    d = {"name": "folder", "root": str(tmp_path / "pics"), "image_size": 4, "cache": str(tmp_path / "cache")}
    with pytest.raises(UserError) as e:
        source.open_cache({**d, "workers": -1}, progress=False)
    assert "data.workers must be >= 0 (0: one process per core), got -1." in one_sentence(e)
    monkeypatch.setattr(imagecache, "default_workers", lambda: 1)
    said, used = [], []
    real = imagecache._convert_all
    monkeypatch.setattr(imagecache, "_convert_all", lambda jobs, workers, progress: used.append(workers)
                        or real(jobs, workers, progress))
    cache, _ = source.open_cache({**d, "workers": 10000}, progress=False, say=said.append)
    assert used == [1] and len(cache.images) == 2
    assert said[0] == "data.workers=10000, but this process may run on 1 core: 1 worker", said
