#!/usr/bin/env python
"""Image-to-video with Stable Video Diffusion in the dtypes the svd recipe picks for your device.

A thin wrapper: the logic lives in ``hf_precision.apps.video`` (also ``hf-precision video``). Run with ``--help``, or
``python scripts/generate_video.py --demo --out demo.mp4`` offline. Several processes:
``accelerate launch --multi_gpu --num_processes 2 scripts/generate_video.py --image photos/ --out videos/``.
"""

import sys

try:
    from hf_precision.cli.video import main
except ModuleNotFoundError as err:  # run with a Python that lacks the package: say which one, and the fix
    print(f"generate_video.py: error: {err.name} is not installed in {sys.executable}. After `make demo`, activate "
          f"its environment (source .venv/bin/activate) or run .venv/bin/python scripts/generate_video.py ...; "
          f"elsewhere: pip install -e '.[video]'", file=sys.stderr)
    sys.exit(2)

if __name__ == "__main__":
    sys.exit(main(prog="generate_video.py"))
