import sys
from memory import MemoryService
from evolve.simulator.ledger import task_of
from training.engines import make_engine
from training.rollout import RolloutConfig, rollout
from training.sft_data import pack_notes
from dynamic_bench.streams import rule_change_notes
import torch; torch.set_num_threads(1)
m = MemoryService("runs/demo6/service/memory")
ts = m.trajectories().trajectories
eng = make_engine("torch:runs/bench_cold_start/small/policy", seed=0)
rc = RolloutConfig(temperature=0.0, max_steps=8, seed=0)
tasks, recalled = [], []
for t in ts[30:72]:
    task = task_of(t)
    if task is None: continue
    tasks.append(task)
    rec = []
    for i in t.metadata.get("recalled", []):
        rec.append(m.get(i, t.tenant).text)
    recalled.append(rec)
full = [pack_notes(rule_change_notes("retail", 1, t.params["rules"])) for t in tasks]
rules = [[f"Rule: {n}." for n in rule_change_notes("retail", 1, t.params["rules"])] for t in tasks]
for name, notes in [("none", None), ("recalled", recalled), ("bench-format", full), ("rule-items", rules)]:
    r = rollout(eng, eng.tokenizer, tasks, rc, memory=notes)
    print(name, sum(x.outcome == "success" for x in r), "/", len(r), flush=True)
print(recalled[:3]); print(full[:2]); print(set(str(t.params["rules"]) for t in tasks))
