"""Image folders: find every image under a folder and read one as the model will see it.

Layout (torchvision's ImageFolder convention):
  DIR/<class>/**/<image>        labels from the first level of subfolders, named by them; a class
                                folder without images is refused (its class would vanish unsaid)
  DIR/**/<image>                no class folders: unlabelled
  DIR/{train,test,val}/...      with train/ and test/ (or val/) beside it, these subfolders are the
                                splits, each laid out as above with the same class folders
Candidates are the files whose suffix Pillow registers (.png, .jpg, .webp, .bmp, .gif, ...); hidden
files and folders (.name) are left out. Symbolic links are followed, each folder once, so a link
loop ends where it comes back.

`read_image` turns one file into a uint8 (H, W, C) array: EXIF orientation applied, any mode
(palette, RGBA, 16-bit, CMYK, ...) brought to grey (C = 1) or RGB (C = 3), transparency laid over
a background grey, resized on the shorter side and centre-cropped to H x W (fit="crop"), or
resized on the longer side and padded with the background (fit="pad"). Pillow's decompression-bomb
limit (Image.MAX_IMAGE_PIXELS) refuses an image before it is decoded.
"""
import math
import os
import stat
import warnings
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageOps

from ..errors import UserError

SPLIT_FOLDERS = ("train", "val", "test")
SIXTEEN_BIT = ("I;16", "I;16L", "I;16B", "I;16N", "I")       # scaled by 1/257 to 0..255


def image_suffixes():
    """Lower-case suffixes of every format Pillow can open here ('.png', '.jpg', ...)."""
    Image.init()
    return frozenset(ext.lower() for ext, fmt in Image.registered_extensions().items() if fmt in Image.OPEN)


@dataclass(frozen=True)
class Entry:
    """One candidate file: path relative to the root (posix), size, mtime (ns), split folder or None,
    class folder or None."""
    path: str
    size: int
    mtime_ns: int
    split: str = None
    cls: str = None


@dataclass(frozen=True)
class Scan:
    """What a folder holds: its candidates (sorted by path), class names (sorted) and the images left
    out because they lie outside the class folders beside which they sit."""
    entries: tuple
    class_names: tuple
    outside: tuple


def _files(top, rel, suffixes, seen):
    """Candidate files under folder `top` (its path relative to the root: `rel`), depth first,
    following links to folders once per (device, inode)."""
    try:
        with os.scandir(top) as it:
            items = sorted(it, key=lambda e: e.name)
    except OSError:
        return                                             # unreadable folder: nothing from it
    for item in items:
        if item.name.startswith("."):
            continue
        path = f"{rel}/{item.name}" if rel else item.name
        try:
            st = item.stat()                               # follows links
        except OSError:
            continue                                       # a dangling link
        if stat.S_ISDIR(st.st_mode):
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                yield from _files(item.path, path, suffixes, seen)
        elif stat.S_ISREG(st.st_mode) and os.path.splitext(item.name)[1].lower() in suffixes:
            yield path, st.st_size, st.st_mtime_ns


def _subfolders(folder):
    try:
        with os.scandir(folder) as it:
            return sorted(e.name for e in it if not e.name.startswith(".") and e.is_dir())
    except OSError:
        return []


def scan(root):
    """The Scan of folder `root` (see the module's docstring for the layout)."""
    root = os.fspath(root)
    if not os.path.isdir(root):
        what = "is a file, not a folder" if os.path.exists(root) else "does not exist"
        raise UserError(f"data.root {root} {what}; point data.root at a folder of images (data=folder "
                        f"data.root=DIR).")
    top = _subfolders(root)
    splits = [s for s in SPLIT_FOLDERS if s in top] if "train" in top and ("test" in top or "val" in top) else [None]
    suffixes = image_suffixes()
    st = os.stat(root)
    seen = {(st.st_dev, st.st_ino)}
    entries, outside, labelled = [], [], {}
    for split in splits:
        base = os.path.join(root, split) if split else root
        st = os.stat(base)
        seen.add((st.st_dev, st.st_ino))
        files = list(_files(base, split or "", suffixes, seen))
        depth = 1 if split else 0                          # where the class folder sits in the path
        in_class = [f for f in files if f[0].count("/") > depth]
        labelled[split] = bool(in_class)
        for path, size, mtime in files:
            parts = path.split("/")
            if in_class and len(parts) == depth + 1:
                outside.append(path)                       # beside the class folders, in none
                continue
            entries.append(Entry(path, size, mtime, split, parts[depth] if in_class else None))
    if len(set(labelled.values())) > 1:
        have = [s for s, v in labelled.items() if v]
        lack = [s for s, v in labelled.items() if not v]
        raise UserError(f"{root}/{have[0]} has class folders but {root}/{lack[0]} has none; give every split "
                        f"folder the same class folders, or none.")
    classes = tuple(sorted({e.cls for e in entries if e.cls is not None}))
    for split in (s for s in splits if labelled[s]):     # a class folder without images: never a silent drop
        base = os.path.join(root, split) if split else root
        empty = [c for c in _subfolders(base) if c not in classes]
        if empty:
            raise UserError(f"the class folder {os.path.join(base, empty[0])} holds no images (each folder at the "
                            f"first level is a class, and a class needs images to learn from); put images in it "
                            f"or move it out of {base}.")
    return Scan(tuple(sorted(entries, key=lambda e: e.path)), classes, tuple(outside))


# ---------------------------------------------------------------- one image
def _orientation(img):
    try:
        return img.getexif().get(0x0112, 1)
    except Exception:                                       # a broken EXIF block: read the pixels as stored
        return 1


def _scale(w, h, width, height, fit):
    """The factor that makes (w, h) cover (crop) or fit inside (pad) (width, height)."""
    return max(width / w, height / h) if fit == "crop" else min(width / w, height / h)


def _to_mode(img, channels, background):
    """img in mode L (channels 1) or RGB (channels 3); alpha laid over the background grey."""
    if img.mode in SIXTEEN_BIT or img.mode == "F":
        a = np.asarray(img, dtype=np.float64)
        a = a / 257 if img.mode in SIXTEEN_BIT else a
        img = Image.fromarray(np.clip(np.rint(a), 0, 255).astype(np.uint8), "L")
    if img.mode in ("RGBA", "LA", "PA", "La", "RGBa") or (img.mode == "P" and "transparency" in img.info):
        img = img.convert("RGBA")
        under = Image.new("RGBA", img.size, (background, background, background, 255))
        img = Image.alpha_composite(under, img)
    return img.convert("L" if channels == 1 else "RGB")


def read_image(path, height, width, channels, fit="crop", background=255):
    """uint8 (height, width, channels) of the image file at path (see the module's docstring).
    Raises whatever Pillow raises for a file it cannot read (and DecompressionBombWarning as an error)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        with Image.open(path) as img:
            img.seek(0)                                     # GIF, APNG, TIFF: the first frame
            o = _orientation(img)
            w, h = img.size
            if o in (5, 6, 7, 8):                           # stored on its side: the target turns too
                w, h = h, w
            s = _scale(w, h, width, height, fit)
            if img.format == "JPEG" and s < 1:              # let the decoder shrink by 1/2, 1/4 or 1/8
                stored = (math.ceil(img.size[0] * s), math.ceil(img.size[1] * s))
                img.draft("L" if channels == 1 else "RGB", stored)
            img.load()
            img = ImageOps.exif_transpose(img) if o != 1 else img
            img = _to_mode(img, channels, background)
    w, h = img.size
    s = _scale(w, h, width, height, fit)
    if fit == "crop":
        size = (max(width, round(w * s)), max(height, round(h * s)))
    else:
        size = (max(1, min(width, round(w * s))), max(1, min(height, round(h * s))))
    if size != (w, h):
        img = img.resize(size, Image.LANCZOS, reducing_gap=3.0)
    if fit == "crop":
        left, top = (size[0] - width) // 2, (size[1] - height) // 2
        img = img.crop((left, top, left + width, top + height))
    else:
        canvas = Image.new(img.mode, (width, height), background if channels == 1 else (background,) * 3)
        canvas.paste(img, ((width - size[0]) // 2, (height - size[1]) // 2))
        img = canvas
    a = np.asarray(img, dtype=np.uint8)
    return a.reshape(height, width, channels)


def convert(job):
    """(row bytes (H*W*C), None) or (None, why) of one file; job = (path, height, width, channels, fit,
    background). Runs in the conversion workers."""
    path, *settings = job
    try:
        return read_image(path, *settings).tobytes(), None
    except Exception as e:                                  # Pillow raises many types on bad files
        why = " ".join(str(e).split())[:200] or "unreadable"
        return None, f"{type(e).__name__}: {why}"
