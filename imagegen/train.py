"""imagegen-train: train a PixelTransformer (Hydra app; see conf/train.yaml)."""
from omegaconf import OmegaConf

from .cli import hydra_entry, resolve_device
from .trainer import train


def task(cfg):
    plain = OmegaConf.to_container(cfg, resolve=True)
    train(plain, resolve_device(plain["device"], plain["threads"]))


main = hydra_entry("train", task, groups=("model", "data", "preset"))

if __name__ == "__main__":
    main()
