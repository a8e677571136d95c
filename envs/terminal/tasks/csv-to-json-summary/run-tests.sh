#!/bin/bash
cd /app
python3 -m pytest "$TEST_DIR/test_outputs.py" -rA -p no:cacheprovider
