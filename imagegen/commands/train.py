"""imagegen-train: train a PixelTransformer (Hydra app; see conf/train.yaml and imagegen/config/schema.py)."""
from .cli import hydra_entry
from ..training.trainer import train

main = hydra_entry("train", train)

if __name__ == "__main__":
    main()
