#!/usr/bin/env python
"""`accelerate launch [--config_file accelerate_configs/X.yaml] train.py --config FILE [--flag value ...]`

The same trainer as `yxanul train`; with no --config it runs the embedded demo default.
"""
import sys

from yxanul.cli import run, train_main

if __name__ == "__main__":
    sys.exit(run(train_main, sys.argv[1:], process_exit=True))
