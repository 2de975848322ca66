"""Render a folder of 28x28 grey shapes, ten classes, for training on a set that is neither MNIST nor CIFAR-10.

    python tools/shapes.py OUT_DIR [--train 2000] [--test 200] [--seed 0]

OUT_DIR/train/<class>/NNNNN.png and OUT_DIR/test/<class>/NNNNN.png (imagegen's folder layout,
docs/data.md). Each image is one outlined or filled shape, of random size, place, rotation and stroke,
drawn white on black at 4x and reduced with Lanczos (grey edges, as MNIST's), seeded: the same command
gives the same bytes. The speedrun's check that a recipe is not tuned to MNIST alone trains on it.
"""
import argparse
import math
import random
from pathlib import Path

from PIL import Image, ImageDraw

SIZE, SCALE = 28, 4
CLASSES = ("circle", "ring", "square", "frame", "triangle", "diamond", "plus", "cross", "bar", "star")


def polygon(n, radius, cx, cy, angle, inner=None):
    """Corners of a regular n-gon (or a 2n-pointed star with `inner` radius) around (cx, cy)."""
    points = []
    for i in range(n * (2 if inner else 1)):
        r = inner if inner and i % 2 else radius
        a = angle + math.pi * 2 * i / (n * (2 if inner else 1))
        points.append((cx + r * math.cos(a), cy + r * math.sin(a)))
    return points


def draw(name, rng):
    """One shape of class `name`: a 28x28 grey PIL image."""
    big = SIZE * SCALE
    image = Image.new("L", (big, big), 0)
    d = ImageDraw.Draw(image)
    r = rng.uniform(0.22, 0.4) * big
    cx, cy = (rng.uniform(r + 4, big - r - 4) for _ in range(2))
    angle, width = rng.uniform(0, 2 * math.pi), int(rng.uniform(0.06, 0.12) * big)
    box = (cx - r, cy - r, cx + r, cy + r)
    if name in ("circle", "ring"):
        d.ellipse(box, fill=255 if name == "circle" else None, outline=255, width=width)
    elif name in ("square", "frame"):
        d.polygon(polygon(4, r * 1.2, cx, cy, angle), fill=255 if name == "square" else None, outline=255,
                  width=width)
    elif name == "triangle":
        d.polygon(polygon(3, r * 1.2, cx, cy, angle), fill=255)
    elif name == "diamond":
        d.polygon([(cx, cy - r * 1.2), (cx + r * 0.7, cy), (cx, cy + r * 1.2), (cx - r * 0.7, cy)], fill=255)
    elif name in ("plus", "cross"):
        base = (0.0 if name == "plus" else math.pi / 4) + rng.uniform(-0.2, 0.2)
        for a in (base, base + math.pi / 2):
            dx, dy = r * math.cos(a), r * math.sin(a)
            d.line((cx - dx, cy - dy, cx + dx, cy + dy), fill=255, width=width)
    elif name == "bar":
        dx, dy = r * math.cos(angle), r * math.sin(angle)
        d.line((cx - dx, cy - dy, cx + dx, cy + dy), fill=255, width=2 * width)
    elif name == "star":
        d.polygon(polygon(5, r * 1.2, cx, cy, angle, inner=r * 0.5), fill=255)
    return image.resize((SIZE, SIZE), Image.LANCZOS)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--train", type=int, default=2000, help="images per class in train/")
    p.add_argument("--test", type=int, default=200, help="images per class in test/")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    rng = random.Random(a.seed)
    for split, n in (("train", a.train), ("test", a.test)):
        for name in CLASSES:
            folder = Path(a.out) / split / name
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(n):
                draw(name, rng).save(folder / f"{i:05d}.png")
    print(f"wrote {len(CLASSES) * (a.train + a.test)} images into {a.out}")


if __name__ == "__main__":
    main()
