"""Compare post-cycle episodes of the two memory arms of a demo run (throwaway)."""
import json, sys
from pathlib import Path
from memory import MemoryService

out = Path(sys.argv[1])
rep = json.loads((out / "report.json").read_text())
c = rep["cycle_at"]
def trajs(d):
    m = MemoryService(d / "memory")
    ts = m.trajectories().trajectories
    res = []
    for t in ts:
        rec = []
        for i in t.metadata.get("recalled", []):
            try:
                it = m.get(i, t.tenant); rec.append(f"[{it.status[:3]}] {it.text[:110]}")
            except Exception as e:
                rec.append(f"? {i}")
        acts = [s.action_text if hasattr(s, "action_text") else "" for s in t.steps]
        res.append((t, rec))
    return m, res
me, a = trajs(out / "service")
mo, b = trajs(out / "service-memory-only")
print(len(a), len(b), "cycle at", c)
a, b = a[c:], b[c:]
nomem = rep["curves"]["memory + evolve"]
for k, ((ta, ra), (tb, rb)) in enumerate(zip(a, b)):
    if ta.outcome != tb.outcome or ta.outcome != "success":
        print(f"--- ep {c+k} task {ta.task_id} evolve={ta.outcome} memonly={tb.outcome} v={ta.policy_version}")
        print("  evolve recalled:", *ra, sep="\n    ")
        for s in ta.steps: print("    E", s.action_text[:90], "=>", s.observation[:70])
        for s in tb.steps: print("    M", s.action_text[:90], "=>", s.observation[:70])
        print("  feedback E:", [(f.kind, str(f.payload)[:120]) for f in ta.feedback])
print("live items evolve:", len(me.items("demo") if False else []))
