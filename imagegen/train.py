"""imagegen-train: train a PixelTransformer (Hydra app; see conf/train.yaml and imagegen/config.py)."""
from .cli import hydra_entry
from .trainer import train

main = hydra_entry(
    "train", train, groups=("model", "data", "preset"),
    description="train a pixel-level autoregressive transformer; the same command again resumes from "
                "run_dir/last.pt.",
    examples=["imagegen-train model=linear data.root=../shared/data/mnist train.max_minutes=15",
              "imagegen-train model=softmax data=cifar10 data.root=../shared/data/cifar10 preset=paper_cifar",
              "torchrun --standalone --nproc_per_node=2 --no-python imagegen-train threads=1"])

if __name__ == "__main__":
    main()
