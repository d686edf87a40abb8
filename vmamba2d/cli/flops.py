"""Parameters and FLOPs (fvcore convention: one multiply-add = one flop) of timm models.

Example:

    vmamba2d-flops --models vmamba_tiny vmamba2d_tiny convnext_tiny \
        --input-sizes 224 512x2048 --breakdown --out benchmarks/flops.md

Counts come from ``vmamba2d.flops.flops_by_operator`` (the analysis behind
``vmamba2d.count_flops``, with the scan op's FLOP handle); ``--breakdown`` also prints them per
operator.
Prints markdown tables and, with --out, writes them to a file.
"""
from __future__ import annotations

import argparse
from pathlib import Path


from torch import nn


def parse_input_size(text: str) -> tuple[int, int]:
    """``"224"`` -> (224, 224); ``"512x2048"`` -> (512, 2048) (height x width)."""
    parts = text.lower().split("x")
    try:
        sides = [int(p) for p in parts]
    except ValueError:
        sides = []
    if len(sides) not in (1, 2) or min(sides) < 1:
        raise argparse.ArgumentTypeError(f"input size must be N or HxW (positive integers), got {text!r}")
    return (sides[0], sides[-1])


def create_model(name: str, input_size: tuple[int, int]) -> nn.Module:
    """timm model ``name`` (random init, eval mode) for inputs of ``input_size`` (height, width).

    ``img_size`` is passed to models that take it (Swin, ViT); convolutional models reject it.
    """
    import timm

    import vmamba2d.models  # noqa: F401  (registers our models with timm)

    try:
        model = timm.create_model(name, img_size=input_size)
    except TypeError as error:
        if "img_size" not in str(error):
            raise
        model = timm.create_model(name)
    return model.eval()


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def measure(name: str, input_size: tuple[int, int], breakdown: bool) -> dict:
    """Params, total FLOPs and (optionally) FLOPs by operator of ``name`` at ``input_size``."""
    from vmamba2d.flops import flops_by_operator

    model = create_model(name, input_size)
    by_operator = flops_by_operator(model, (3, *input_size))
    row = {"model": name, "input": f"{input_size[0]}x{input_size[1]}",
           "params": count_params(model), "flops": sum(by_operator.values())}
    if breakdown:
        row["by_operator"] = by_operator
    return row


def totals_table(rows: list[dict]) -> str:
    lines = ["| model | input | params (M) | GFLOPs |", "|---|---|---:|---:|"]
    lines += [f"| {r['model']} | {r['input']} | {r['params'] / 1e6:.2f} | {r['flops'] / 1e9:.2f} |" for r in rows]
    return "\n".join(lines) + "\n"


def breakdown_table(row: dict) -> str:
    total = sum(row["by_operator"].values())
    lines = [f"**{row['model']} @ {row['input']}** (total {total / 1e9:.3f} GFLOPs)", "",
             "| operator | GFLOPs | share |", "|---|---:|---:|"]
    for op, flops in sorted(row["by_operator"].items(), key=lambda item: -item[1]):
        lines.append(f"| {op} | {flops / 1e9:.3f} | {100 * flops / total:.1f}% |")
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["vmamba_tiny", "vmamba2d_tiny"], help="timm model names")
    parser.add_argument("--input-sizes", nargs="+", type=parse_input_size, default=[(224, 224)],
                        help="N or HxW, e.g. 224 512x2048")
    parser.add_argument("--breakdown", action="store_true", help="also print FLOPs per operator")
    parser.add_argument("--out", default=None, help="write the tables to this markdown file")
    return parser.parse_args(argv)


def run(args: argparse.Namespace) -> list[dict]:
    """Measures every (model, input size) pair; prints (and writes) the markdown tables."""
    rows = [measure(name, size, args.breakdown) for name in args.models for size in args.input_sizes]
    text = totals_table(rows)
    if args.breakdown:
        text += "\n" + "\n".join(breakdown_table(row) for row in rows)
    print(text)
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        print(f"wrote {out}")
    return rows


def main(argv: list[str] | None = None) -> None:
    run(parse_args(argv))


if __name__ == "__main__":
    main()
