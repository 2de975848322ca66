"""The catalogue of datasets: DatasetInfo (size, channels, class names), the class names of the
standard sets and of the downsampled ImageNet, the table of sets by name. A leaf: it imports nothing
from imagegen.data (nor numpy or torch): every other data module may import it.
"""
from dataclasses import dataclass

from ..errors import UserError


@dataclass(frozen=True)
class DatasetInfo:
    name: str
    height: int
    width: int
    channels: int
    class_names: tuple = ()

    @property
    def num_classes(self):
        return len(self.class_names)

    @property
    def length(self):  # D, the number of sub-pixels per image
        return self.height * self.width * self.channels


FASHION_CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
                   "Ankle boot")
CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
# CIFAR-100's fine labels, in the order of the official meta file's fine_label_names
CIFAR100_CLASSES = ("apple", "aquarium_fish", "baby", "bear", "beaver", "bed", "bee", "beetle", "bicycle", "bottle",
                    "bowl", "boy", "bridge", "bus", "butterfly", "camel", "can", "castle", "caterpillar", "cattle",
                    "chair", "chimpanzee", "clock", "cloud", "cockroach", "couch", "crab", "crocodile", "cup",
                    "dinosaur", "dolphin", "elephant", "flatfish", "forest", "fox", "girl", "hamster", "house",
                    "kangaroo", "keyboard", "lamp", "lawn_mower", "leopard", "lion", "lizard", "lobster", "man",
                    "maple_tree", "motorcycle", "mountain", "mouse", "mushroom", "oak_tree", "orange", "orchid",
                    "otter", "palm_tree", "pear", "pickup_truck", "pine_tree", "plain", "plate", "poppy", "porcupine",
                    "possum", "rabbit", "raccoon", "ray", "road", "rocket", "rose", "sea", "seal", "shark", "shrew",
                    "skunk", "skyscraper", "snail", "snake", "spider", "squirrel", "streetcar", "sunflower",
                    "sweet_pepper", "table", "tank", "telephone", "television", "tiger", "tractor", "train", "trout",
                    "tulip", "turtle", "wardrobe", "whale", "willow_tree", "wolf", "woman", "worm")
IMAGENET_CLASSES = tuple(str(k) for k in range(1, 1001))      # the downsampled files' 1-based label numbers
DATASETS = {"mnist": DatasetInfo("mnist", 28, 28, 1, tuple(str(d) for d in range(10))),
            "fashion_mnist": DatasetInfo("fashion_mnist", 28, 28, 1, FASHION_CLASSES),
            "cifar10": DatasetInfo("cifar10", 32, 32, 3, CIFAR10_CLASSES),
            "cifar100": DatasetInfo("cifar100", 32, 32, 3, CIFAR100_CLASSES),
            "imagenet32": DatasetInfo("imagenet32", 32, 32, 3, IMAGENET_CLASSES),   # imagegen/data/imagenet.py
            "imagenet64": DatasetInfo("imagenet64", 64, 64, 3, IMAGENET_CLASSES)}
CACHED = ("folder", "imagenet32", "imagenet64")     # read from a memory-mapped cache (imagegen/data/source.py)


def info(name):
    """DatasetInfo of a set in the table by its name (mnist, cifar10, imagenet32, ...); a folder's comes
    from its config (imagegen/data/sets.py: dataset_info)."""
    if name not in DATASETS:
        raise UserError(f"unknown dataset {name!r}; choose one of {sorted(DATASETS) + ['folder']} (data=mnist, "
                        f"data=cifar100, data=imagenet32, or data=folder data.root=DIR for a folder of images).")
    return DATASETS[name]
