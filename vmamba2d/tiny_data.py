"""Small datasets in the layouts the quick starts read, written in seconds (``vmamba2d-tiny-data``).

Examples:

    vmamba2d-tiny-data                      # imagenet, ade, coco, mil under data/tiny
    vmamba2d-tiny-data out/tiny --only coco mil
    vmamba2d-tiny-data --only slides        # 8 small whole-slide images + labels.csv

Under the output folder (default ``data/tiny``, where the shipped ``tiny-data_*`` configs look):

* ``imagenet/{train,val}/<class>/*.jpg``: an ImageFolder of 4 classes (64 x 64 px; each class a
  colour and a stripe direction, plus noise), 8 training and 4 validation images per class.
* ``ade/{images,annotations}/{training,validation}/``: ADE20K's layout, 8 + 4 images (96-128 px,
  non-square) with label maps of blocks of classes 1-6 (0 is ADE20K's ignored "other").
* ``coco/{train2017,val2017}/*.jpg`` and ``coco/annotations/instances_{train,val}2017.json``:
  COCO's layout with its 80 categories (so mmdet's COCO classes match), 8 + 4 images each with 1-3
  filled rectangles (box and polygon) of the categories person, car, dog and chair.
* ``mil/features/<slide_id>.pt`` and ``mil/labels.csv`` (``slide_id,label,split``): per-slide
  patch features and coordinates of the synthetic 2D-arrangement task
  (:mod:`vmamba2d.mil.synthetic`, docs/mil.md#synthetic-task), 24 / 8 / 8 slides.
* ``slides/images/s<i>.tif`` and ``slides/labels.csv``: 8 small pyramidal TIFF slides (768 x 640
  px at 0.5 um/px, 3 levels, tissue-coloured ellipses on white) for the from-slides quick start
  (``vmamba2d-mil-extract`` -> ``vmamba2d-mil-train`` -> ``vmamba2d-mil-predict``), 4 / 2 / 2
  slides; only with ``--only slides`` (it needs the ``slides`` extra).

Everything is drawn from one seeded generator per dataset: the same seed writes the same files.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np
from PIL import Image

DEFAULT_OUT = Path("data") / "tiny"
IMAGENET_CLASSES = ("red_vertical", "green_horizontal", "blue_vertical", "yellow_horizontal")
COCO_CATEGORIES = (
    "person", "bicycle", "car", "motorcycle", "airplane", "bus", "train", "truck", "boat", "traffic light",
    "fire hydrant", "stop sign", "parking meter", "bench", "bird", "cat", "dog", "horse", "sheep", "cow",
    "elephant", "bear", "zebra", "giraffe", "backpack", "umbrella", "handbag", "tie", "suitcase", "frisbee",
    "skis", "snowboard", "sports ball", "kite", "baseball bat", "baseball glove", "skateboard", "surfboard",
    "tennis racket", "bottle", "wine glass", "cup", "fork", "knife", "spoon", "bowl", "banana", "apple",
    "sandwich", "orange", "broccoli", "carrot", "hot dog", "pizza", "donut", "cake", "chair", "couch",
    "potted plant", "bed", "dining table", "toilet", "tv", "laptop", "mouse", "remote", "keyboard",
    "cell phone", "microwave", "oven", "toaster", "sink", "refrigerator", "book", "clock", "vase",
    "scissors", "teddy bear", "hair drier", "toothbrush",
)
COCO_USED = ("person", "car", "dog", "chair")
SPLIT_COUNTS = {"train": 8, "val": 4}
MIL_SPLITS = {"train": 24, "val": 8, "test": 8}


def _noisy(rng: np.random.Generator, base: np.ndarray) -> Image.Image:
    """``base`` (H, W, 3) float in [0, 255] plus Gaussian noise, as an RGB image."""
    image = base + rng.normal(0.0, 12.0, base.shape)
    return Image.fromarray(np.clip(image, 0, 255).astype(np.uint8), "RGB")


def write_imagenet(root: Path, seed: int = 0, size: int = 64) -> Path:
    """``root/{train,val}/<class>/<n>.jpg``: :data:`IMAGENET_CLASSES`; returns ``root``."""
    rng = np.random.default_rng(seed)
    colours = np.array([[200, 40, 40], [40, 180, 40], [40, 60, 200], [210, 200, 40]], np.float64)
    stripes = (np.arange(size) // 8) % 2
    for split, per_class in SPLIT_COUNTS.items():
        for index, name in enumerate(IMAGENET_CLASSES):
            folder = root / split / name
            folder.mkdir(parents=True, exist_ok=True)
            pattern = stripes[None, :] if index % 2 == 0 else stripes[:, None]
            for n in range(per_class):
                shade = 0.6 + 0.4 * np.broadcast_to(pattern, (size, size))[..., None]
                _noisy(rng, colours[index] * shade).save(folder / f"{split}_{n}.jpg", quality=95)
    return root


def _block_labels(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """(height, width) uint8 label map: a 2 x 3 grid of blocks with classes from 1..6, some 0."""
    labels = np.zeros((height, width), np.uint8)
    rows, cols = np.array_split(np.arange(height), 2), np.array_split(np.arange(width), 3)
    for r in rows:
        for c in cols:
            labels[np.ix_(r, c)] = rng.integers(0, 7)
    return labels


def write_ade(root: Path, seed: int = 0) -> Path:
    """ADE20K's layout under ``root``: images (.jpg) and label maps (.png, values 0..6)."""
    rng = np.random.default_rng(seed)
    palette = rng.uniform(20, 235, (7, 3))
    for split, count in (("training", SPLIT_COUNTS["train"]), ("validation", SPLIT_COUNTS["val"])):
        images, annotations = root / "images" / split, root / "annotations" / split
        images.mkdir(parents=True, exist_ok=True)
        annotations.mkdir(parents=True, exist_ok=True)
        for n in range(count):
            height, width = (96, 128) if n % 2 else (128, 96)
            labels = _block_labels(rng, height, width)
            _noisy(rng, palette[labels]).save(images / f"ade_{split}_{n}.jpg", quality=95)
            Image.fromarray(labels, "L").save(annotations / f"ade_{split}_{n}.png")
    return root


def _coco_split(rng: np.random.Generator, folder: Path, count: int, first_image_id: int,
                first_annotation_id: int) -> dict:
    """Write ``count`` images to ``folder``; return their COCO ``images`` and ``annotations``."""
    folder.mkdir(parents=True, exist_ok=True)
    category_ids = {name: COCO_CATEGORIES.index(name) + 1 for name in COCO_USED}
    colours = {name: rng.uniform(60, 255, 3) for name in COCO_USED}
    images, annotations = [], []
    annotation_id = first_annotation_id
    for n in range(count):
        image_id = first_image_id + n
        height, width = (96, 128) if n % 2 else (128, 96)
        canvas = np.full((height, width, 3), 30.0)
        for _ in range(int(rng.integers(1, 4))):
            name = COCO_USED[int(rng.integers(len(COCO_USED)))]
            w, h = int(rng.integers(16, width // 2)), int(rng.integers(16, height // 2))
            x, y = int(rng.integers(0, width - w)), int(rng.integers(0, height - h))
            canvas[y:y + h, x:x + w] = colours[name]
            polygon = [x, y, x + w, y, x + w, y + h, x, y + h]
            annotations.append({"id": annotation_id, "image_id": image_id, "category_id": category_ids[name],
                                "bbox": [x, y, w, h], "area": w * h, "segmentation": [polygon], "iscrowd": 0})
            annotation_id += 1
        file_name = f"{image_id:012d}.jpg"
        _noisy(rng, canvas).save(folder / file_name, quality=95)
        images.append({"id": image_id, "file_name": file_name, "height": height, "width": width})
    return {"images": images, "annotations": annotations}


def write_coco(root: Path, seed: int = 0) -> Path:
    """COCO's layout under ``root`` (mmdetection's: ``train2017/``, ``val2017/``, ``annotations/``)."""
    rng = np.random.default_rng(seed)
    categories = [{"id": i + 1, "name": name, "supercategory": "thing"} for i, name in enumerate(COCO_CATEGORIES)]
    (root / "annotations").mkdir(parents=True, exist_ok=True)
    image_id, annotation_id = 1, 1
    for split, count in SPLIT_COUNTS.items():
        content = _coco_split(rng, root / f"{split}2017", count, image_id, annotation_id)
        image_id += count
        annotation_id += len(content["annotations"])
        content["categories"] = categories
        with open(root / "annotations" / f"instances_{split}2017.json", "w") as handle:
            json.dump(content, handle)
    return root


def write_mil(root: Path, seed: int = 0) -> Path:
    """``root/features/<slide_id>.pt`` and ``root/labels.csv`` of the synthetic MIL task (32-d features)."""
    from vmamba2d.mil.synthetic import write_synthetic_dataset

    write_synthetic_dataset(root, MIL_SPLITS, min_size=12, max_size=20, in_dim=32, seed=seed, fmt="pt")
    return root


SLIDE_SPLITS = ("train",) * 4 + ("val",) * 2 + ("test",) * 2
SLIDE_SIZE = (768, 640)  # (width, height) at level 0


def write_slides(root: Path, seed: int = 0) -> Path:
    """``root/images/s<i>.tif`` (pyramidal TIFFs, 0.5 um/px) and ``root/labels.csv`` (``slide_id,
    label,split``): one tissue ellipse per slide, labels alternating ``normal`` / ``tumour``."""
    import csv

    import numpy as np

    from vmamba2d.mil.slides.synthetic import Blob, write_synthetic_slide

    rng = np.random.default_rng(seed)
    images = root / "images"
    images.mkdir(parents=True)
    rows = []
    for index, split in enumerate(SLIDE_SPLITS):
        blob = Blob(*(float(v) for v in (rng.uniform(180, 560), rng.uniform(180, 450),
                                          rng.uniform(110, 170), rng.uniform(110, 170))))
        write_synthetic_slide(images / f"s{index}.tif", SLIDE_SIZE, [blob], mpp=0.5, seed=seed + index)
        rows.append((f"s{index}", "tumour" if index % 2 else "normal", split))
    with open(root / "labels.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(("slide_id", "label", "split"))
        writer.writerows(rows)
    return root


WRITERS: dict[str, tuple[str, Callable[[Path, int], Path]]] = {
    "imagenet": ("imagenet", write_imagenet),
    "ade": ("ade", write_ade),
    "coco": ("coco", write_coco),
    "mil": ("mil", write_mil),
    "slides": ("slides", write_slides),
}
# Written when no --only is given (the slides need the `slides` extra: asked for by name)
DEFAULT_DATASETS = ("imagenet", "ade", "coco", "mil")


def write_tiny_data(out: Path, only: Sequence[str] = DEFAULT_DATASETS, seed: int = 0,
                    overwrite: bool = False) -> dict[str, Path]:
    """Write the datasets named in ``only`` under ``out``; returns ``{name: folder}``.

    Raises FileExistsError when a dataset's folder exists and ``overwrite`` is false.
    """
    unknown = sorted(set(only) - set(WRITERS))
    if unknown:
        raise ValueError(f"only: unknown dataset(s) {unknown}; expected some of {list(WRITERS)}")
    written = {}
    for name in only:
        folder_name, writer = WRITERS[name]
        folder = Path(out) / folder_name
        if folder.exists():
            if not overwrite:
                raise FileExistsError(f"{folder} exists; pass --overwrite to replace it")
            shutil.rmtree(folder)
        written[name] = writer(folder, seed)
    return written


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="vmamba2d-tiny-data", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", nargs="?", type=Path, default=DEFAULT_OUT,
                        help=f"output folder (default: {DEFAULT_OUT})")
    parser.add_argument("--only", nargs="+", choices=list(WRITERS), default=list(DEFAULT_DATASETS),
                        help=f"write only these datasets (default: {' '.join(DEFAULT_DATASETS)}; "
                             "slides needs the slides extra)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--overwrite", action="store_true", help="replace datasets that exist")
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    try:
        written = write_tiny_data(args.out, args.only, args.seed, args.overwrite)
    except FileExistsError as error:
        print(f"vmamba2d-tiny-data: error: {error}", file=sys.stderr)
        return 2
    for name, folder in written.items():
        print(f"{name:<9} {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
