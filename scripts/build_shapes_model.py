#!/usr/bin/env python
"""Rebuild the demo's shapes model (``hf_precision/apps/shapes_sdxl/``) from scratch, deterministically.

    python scripts/build_shapes_model.py                 # rewrites the shipped folder (12-40 minutes on 2 CPU cores, by load)
    python scripts/build_shapes_model.py --out /tmp/m    # somewhere else, to compare

What it builds and how: ``hf_precision/apps/shapes_model.py`` (SPEC, TRAINING, build()).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> int:
    from hf_precision.apps import shapes_model

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(shapes_model.FOLDER), help="where to write the pipeline folder (default: the "
                   "shipped one, hf_precision/apps/shapes_sdxl)")
    args = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    record = shapes_model.build(args.out)
    print(json.dumps({k: record[k] for k in ("fingerprint", "vae", "unet", "decoder_peak", "seconds")}, indent=2))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
