"""Validating a grid loads neither the engine nor transformers: a ``kdeval submit`` (or a driver joining a
cluster) checks every model, policy, task and engine setting before Ray starts, and pays only for torch."""
from __future__ import annotations

import json
import os
import subprocess
import sys

GRID = """
name: imports
models: [{id: smollm2-135m, dtype: float32, attn_implementation: sdpa}, random:llama-tiny]
policies: [full, keydiff, {name: snapkv, params: {window: 16}}, ada-snapkv, pyramidkv, expected-attention,
           {name: chunkkv, params: {inner: {name: snapkv, params: {pooling: avg}}}}, h2o, tova]
budgets: [64]
chunk_sizes: [32, whole]
tasks: [{name: needle, lengths: [256], samples: 2}, {name: ruler.niah_single_1, lengths: [256], samples: 1}]
engine: {cuda_graphs: false}
"""

CODE = f"""
import json, sys
from kdeval.jobs.grid.cells import expand
from kdeval.jobs.grid.load import parse_grid
cells = expand(parse_grid({GRID!r}))
print(json.dumps({{"cells": len(cells), "loaded": sorted(m for m in ("transformers", "kdeval.keydiff.engine",
                                                                  "kdeval.zoo.loading") if m in sys.modules)}}))
"""


def test_validating_and_expanding_a_grid_loads_no_transformers(data_dir):
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=180, check=True,
                         env={**os.environ, "KDEVAL_DATA_DIR": str(data_dir)})
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["cells"] > 0
    assert got["loaded"] == []
