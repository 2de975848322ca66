"""imagegen-train: train a PixelTransformer (Hydra app; see conf/train.yaml)."""
from .cli import hydra_entry
from .trainer import train

main = hydra_entry("train", train, groups=("model", "data", "preset"))

if __name__ == "__main__":
    main()
