"""Draws `figures/glyphs.png`: characters of the glyphs test split, a row of drawings each.

    python examples/glyphs/figure.py              # 6 characters (of different alphabets) x 10
    python examples/glyphs/figure.py --difficulty 2 --output /tmp/hard.png
"""

from __future__ import annotations

import argparse
import os

import numpy as np

import tfdml


def grid(split, characters, drawings, gap=2):
    """One row of `drawings` drawings for each character id in `characters`, on a light
    grey frame (uint8 `[rows, columns]`)."""
    size = split.images.shape[1]
    out = np.full((len(characters) * (size + gap) + gap, drawings * (size + gap) + gap), 128,
                  np.uint8)
    for row, c in enumerate(characters):
        images = split.images[split.labels == c][:drawings, :, :, 0]
        for col, image in enumerate(images):
            top, left = gap + row * (size + gap), gap + col * (size + gap)
            out[top:top + size, left:left + size] = image
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--characters", type=int, default=6)
    parser.add_argument("--drawings", type=int, default=10)
    parser.add_argument("--difficulty", type=float, default=1.0)
    parser.add_argument("--output", default=os.path.join(os.path.dirname(os.path.abspath(
        __file__)), "figures", "glyphs.png"))
    args = parser.parse_args(argv)
    if not 1 <= args.drawings <= 20 or not 1 <= args.characters <= 20:
        parser.error("--characters and --drawings must be in [1, 20]")
    test = tfdml.datasets.load("glyphs", "test", difficulty=args.difficulty)
    # One character from each of the first alphabets of the test split.
    alphabets = sorted(set(test.categories.values()))[:args.characters]
    first = {a: min(c for c, b in test.categories.items() if b == a) for a in alphabets}
    picture = grid(test, [first[a] for a in alphabets], args.drawings)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scale = 3
    fig = plt.figure(figsize=(picture.shape[1] * scale / 100, picture.shape[0] * scale / 100),
                     dpi=100)
    fig.figimage(np.kron(picture, np.ones((scale, scale), np.uint8)), cmap="gray",
                 vmin=0, vmax=255)
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    fig.savefig(args.output, dpi=100)
    print(f"wrote {args.output}: characters {sorted(first.values())}, "
          f"{args.drawings} drawings each")


if __name__ == "__main__":
    main()
