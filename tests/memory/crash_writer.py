"""Helper process for the crash-safety test: bulk-writes batches forever, printing each
committed batch's ids; the test kills it with SIGKILL at an arbitrary point."""
import sys

import torch

from memory import MemoryService

torch.set_num_threads(1)
svc = MemoryService(sys.argv[1])
batch = int(sys.argv[2])
b = 0
while True:
    specs = [{"tenant": "crash", "text": f"batch {b} note {i}: customer C-{b * 1000 + i} asked about "
              f"{['refunds', 'shipping', 'returns', 'invoices'][i % 4]} number {i}",
              "trajectory_id": f"traj-{b}", "step": i} for i in range(batch)]
    items = svc.add_many(specs, dedup=False)
    print(" ".join(it.id for it in items), flush=True)
    b += 1
