#!/usr/bin/env python
"""Train a LoRA, a textual-inversion embedding or a full fine-tune in the dtypes the recipe picks for the device.

A thin wrapper: the logic lives in ``hf_precision.apps.train`` (also ``hf-precision train``). Run with ``--help``,
or ``python scripts/train.py --demo --out demo-lora`` offline. Several processes (data parallel):
``accelerate launch --num_processes 2 scripts/train.py --model ... --data ... --out ...``.
"""

import sys

from hf_precision.cli.train import main

if __name__ == "__main__":
    sys.exit(main(prog="train.py"))
