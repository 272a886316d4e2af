"""Helper process for the crash-safety test: bulk-writes batches forever, printing each
committed batch's ids; the test kills it with SIGKILL at an arbitrary point. Its texts come
from `TEXTS`, which the test embeds into the ledger's cache first, so this process never needs
to load the embedding model (it writes at full speed)."""
import sys

TEXTS = [f"customer C-{i} asked about {['refunds', 'shipping', 'returns', 'invoices'][i % 4]} "
         f"number {i}" for i in range(160)]

if __name__ == "__main__":
    from memory import MemoryService

    svc = MemoryService(sys.argv[1])
    batch = int(sys.argv[2])
    b = 0
    while True:
        specs = [{"tenant": "crash", "text": TEXTS[(b * batch + i) % len(TEXTS)],
                  "trajectory_id": f"batch-{b}", "step": i} for i in range(batch)]
        items = svc.add_many(specs, dedup=False)
        assert svc.embedder.misses == 0
        print(" ".join(it.id for it in items), flush=True)
        b += 1
