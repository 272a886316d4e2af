#!/usr/bin/env bash
# Device check of the CUDA path (TorchEngine, learner, train_rl on one GPU), for a bare GPU machine
# that has python3 with torch (CUDA), transformers, peft, tokenizers, numpy, tqdm, matplotlib, typer,
# rich, networkx and pyyaml, but not the rest of what training/, dynamic_bench/ and runtime/scaffolds
# import. Those come as wheels in .whl/ (not in git): pydantic and its parts, pytest and its parts,
# and transformers/tokenizers/huggingface_hub/safetensors/peft/accelerate pinned to our versions, so
# the model code that runs is the code the CPU tests run. If the pinned stack does not import next to
# the machine's packages, only the missing packages are kept and the machine's transformers is used.
#
#   bash benchmarks/gpu_check.sh        (repository root; every step under `timeout`, all within 9 minutes)
#
# Carry along (both ignored by git): .whl/ and the policy folder. Measured on one H200 (random-weight
# small base, RL_MINUTES=1.5): 3.5 minutes; CUDA vs CUDA logprob mismatch max 9.5e-7, mean 1.7e-7.
#
# Env: OUT (results, default runs/gpu_check), POLICY (default runs/bench_cold_start/small/policy, else
# the small preset's random-weight base next to it: speed figures only), RL_MINUTES (bench_rl_shift's
# learner-step budget, both arms together; default 3, less when the 9 minutes would not hold it).
timeout 60 python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 1
DEADLINE=510  # seconds since the script started ($SECONDS): the last step ends by then, the script by 8.8 minutes
left() { local r=$((DEADLINE - SECONDS)); [ "$r" -gt "$1" ] && r=$1; [ "$r" -lt 5 ] && r=5; echo "$r"; }  # step cap within the deadline
set -x
set -o pipefail
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false MPLBACKEND=Agg
OUT=${OUT:-runs/gpu_check}  # 6 files land there (a device run brings back 8 at most)
mkdir -p "$OUT"
timeout 20 nvidia-smi

# what the runs import, the versions, and whether the service-side packages stay out
cat > /tmp/gpu_check_imports.py <<'EOF'
import sys
sys.path.insert(0, "benchmarks")
import torch, transformers, peft, tokenizers, pydantic, pytest  # noqa: F401
import dynamic_bench, runtime.scaffolds, training.rl.trainer, training.engines.torch_engine, rl_bench_tasks  # noqa: F401
print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda,
      "transformers", transformers.__version__, "peft", peft.__version__, "tokenizers", tokenizers.__version__,
      "pydantic", pydantic.__version__, "pytest", pytest.__version__)
print("cuda available:", torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
print("service packages imported:", [m for m in ("langgraph", "chromadb", "sqlmodel", "sqlalchemy", "ray", "fastapi")
                                     if m in sys.modules])
EOF
if ! timeout "$(left 60)" python3 /tmp/gpu_check_imports.py; then
    # the pinned stack clashes with this machine's packages: keep only what is missing here
    rm -rf /tmp/site
    timeout "$(left 60)" python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
        $(ls .whl/*.whl | grep -E '/(pydantic|pydantic_core|annotated_types|typing_inspection|typing_extensions|pytest|pluggy|iniconfig|pygments|packaging)-') || exit 1
    timeout "$(left 60)" python3 /tmp/gpu_check_imports.py || exit 1
fi

POLICY=${POLICY:-runs/bench_cold_start/small/policy}
if [ ! -f "$POLICY/config.json" ]; then
    echo "no policy at $POLICY: using the small preset's random-weight base (speed figures only)"
    POLICY=runs/bench_cold_start/small/base
fi
failed=""

# CUDA conformance (engine) and CUDA engine vs CUDA learner/trainer logprobs; the CPU mismatch test as reference
timeout "$(left 110)" python3 -m pytest -q -rs -p no:cacheprovider \
    tests/training/test_engine_conformance.py tests/training/test_rl_learner.py tests/training/test_rl_train.py \
    -k "cuda or test_trainer_logprobs_match_engine" 2>&1 | tee "$OUT/pytest_cuda.log" || failed="$failed pytest"

timeout "$(left 90)" python3 benchmarks/bench_engines.py --device cuda --model "$POLICY" \
    --out "$OUT/bench_engines_cuda.json" || failed="$failed bench_engines"

# bench_rl_shift: at most 6 minutes; its learner steps get what is left after ~2.5 minutes of loading and scoring
RL_LEFT=$(left 360)
RL_MIN=$(awk -v r="$RL_LEFT" -v m="${RL_MINUTES:-3}" 'BEGIN { x = (r - 150) / 60; if (x > m) x = m; if (x < 0.5) x = 0.5; printf "%.2f", x }')
timeout "$RL_LEFT" python3 benchmarks/bench_rl_shift.py --device cuda --model "$POLICY" --minutes "$RL_MIN" \
    --work /tmp/bench_rl_shift_work --out "$OUT/bench_rl_shift_cuda.json" 2>&1 \
    | tee "$OUT/bench_rl_shift_cuda.log" || failed="$failed bench_rl_shift"

timeout 10 nvidia-smi --query-gpu=name,memory.used,memory.total,utilization.gpu --format=csv
set +x
if [ -n "$failed" ]; then echo "FAILED:$failed"; exit 1; fi
echo "all steps passed; results in $OUT"
