"""A distributed-training test program: examples/models/bert.py's tiny BERT (dropout included) trained
for 3 steps on a fixed batch; rank 0 saves the losses and every variable to OUT.npz.

    python bert_tiny.py OUT.npz                  # one process
    mpiexec -n 2 python bert_tiny.py OUT.npz     # the same logical job over 2 ranks
"""
import sys
from pathlib import Path

import numpy as np

import flow

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "models"))
import bert  # noqa: E402

config = bert.CONFIGS["tiny"]
train, _ = bert.make_jobs(config, total_steps=10)
batch = bert.synthetic_batch(config)
losses = [np.asarray(train(*batch)) for _ in range(3)]
values = {name: blob.numpy() for name, blob in flow.get_all_variables().items()}
np.savez(sys.argv[1], losses=np.stack(losses), **{f"var:{k}": v for k, v in values.items()})
print("bert_tiny: done", flush=True)
