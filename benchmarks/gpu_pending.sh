#!/usr/bin/env bash
# The GPU figures still pending, measured in one go on a machine with one CUDA card, in at most 8 minutes
# of wall-clock (GPU_PENDING_BUDGET seconds, default 470) and without network access:
#
#   bash benchmarks/gpu_pending.sh
#
# Parts, each in its own process under `timeout` (a part that runs out is stopped, its process group
# with it, and reported as such; the next part still runs):
#   gpu_tests            pytest -m gpu (the tests that need a CUDA device)
#   weight_floor         benchmarks/weight_floor.py --device cuda: weight matching on the card for GPT-2 124M
#                        and a Pythia-410M shape against its measured floor
#   weight_floor_llama   the same for the 1.1B Llama shape, cut to 8 of its 22 layers
#   step_cost_vit        benchmarks/learned_step_cost.py --device cuda, the digits ViT (run.py's default)
#   step_cost_gpt2       the same on the paper-size GPT-2 shape (experiment=paper_gpt2_embedded, windows of
#                        128: device_check.py's STEP_COST), then torch.profiler's operator table of both steps
#                        (--profile 5, in its log); target: learned / plain <= 1.5x
#   ensemble_seeds       benchmarks/parallel_seeds.py --device cuda --ensemble: the same ten seeds as
#                        parallel_seeds below trained as one batched model (train.ensemble) beside one seed
#                        and one after another; target: ensemble / one seed <= 2x
#   endpoint_throughput  benchmarks/endpoint_throughput.py trainer=gpu: tokens/s of endpoint training,
#                        DataLoader path against batches sliced on the device
#   parallel_seeds       benchmarks/parallel_seeds.py --device cuda: ten seeds side by side against one seed
#                        (target: at most 3x); paper 001's Tiny Shakespeare GPT-2 shape (6 layers, width 256,
#                        GPT-2's 50,257 ids, windows of 256, batch 32, float32) trained on the embedded
#                        corpus (data=pydoc, character ids: no corpus or tokenizer download), two epochs of
#                        51 batches, near the 100 batches of the benchmark's default
# GPU_PENDING_PARTS="gpu_tests parallel_seeds" runs only the parts named. Each part's output goes to $OUT/<part>.log when OUT is set, else to outputs/gpu_pending/<part>.log; a
# summary of the measured lines ends the output (and is written to summary.txt beside the logs).
#
# Packages the machine lacks (hydra-core, omegaconf, antlr4-python3-runtime) may travel as wheels in .whl/
# at the repository root; they are installed into GLMC_SITE (default /tmp/site), which goes on PYTHONPATH
# before src/. wandb and datasets are not needed: neither is imported by these parts (logger=none).

set -u

cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
ROOT=$PWD
BUDGET=${GPU_PENDING_BUDGET:-470}   # seconds for the whole script, setup included
GRACE=10                            # seconds kept back per part for stopping it (SIGTERM, then SIGKILL 5 s later)
LOGS=${OUT:-$ROOT/outputs/gpu_pending}
SITE=${GLMC_SITE:-/tmp/site}
PY=${PYTHON:-python3}
mkdir -p "$LOGS"

# --- environment -----------------------------------------------------------------------------------
if compgen -G ".whl/*.whl" > /dev/null; then
    mkdir -p "$SITE"
    if ! "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl; then
        echo "pip could not install .whl/*.whl; unpacking them instead (pure-Python wheels)"
        for wheel in .whl/*.whl; do "$PY" -m zipfile -e "$wheel" "$SITE"; done
    fi
fi
export PYTHONPATH="$SITE:$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WANDB_MODE=disabled

echo "== machine"
nvidia-smi -L || echo "nvidia-smi -L failed"
"$PY" - <<'EOF' || echo "python could not run the checks above"
import importlib

import torch

try:
    print(f"torch {torch.__version__} (CUDA {torch.version.cuda}), device: {torch.cuda.get_device_name(0)}")
except Exception as error:  # no visible device: the parts below say what failed
    print(f"torch {torch.__version__}: no CUDA device ({error})")
# where the packages come from; pydoc_data is the embedded corpus (data=pydoc) of three parts
for name in ("transformers", "lightning", "hydra", "omegaconf", "pydoc_data.topics", "glmc"):
    try:
        module = importlib.import_module(name)
        print(f"  {name} {getattr(module, '__version__', '')} from {module.__file__}")
    except Exception as error:
        print(f"  {name}: cannot be imported ({type(error).__name__}: {error})")
EOF
echo "logs: $LOGS"

# --- parts -------------------------------------------------------------------------------------------
NAMES=()
declare -A STATUS SECS

# run_part NAME SLOT COMMAND...: COMMAND for at most SLOT seconds (less where the budget leaves less)
run_part() {
    local name=$1 slot=$2
    shift 2
    if [[ -n ${GPU_PENDING_PARTS:-} && " $GPU_PENDING_PARTS " != *" $name "* ]]; then
        return  # not asked for
    fi
    local left=$((BUDGET - SECONDS - GRACE))
    local limit=$((slot < left ? slot : left))
    NAMES+=("$name")
    SECS[$name]=0
    if ((limit < 15)); then
        STATUS[$name]="not run: the time budget was spent"
        echo "== $name: not run (the budget was spent)"
        return
    fi
    echo "== $name (at most ${limit} s): $*"
    local start=$SECONDS rc
    timeout -k 5 "$limit" "$@" > "$LOGS/$name.log" 2>&1 < /dev/null
    rc=$?
    SECS[$name]=$((SECONDS - start))
    case $rc in
        0) STATUS[$name]="ok" ;;
        124 | 137) STATUS[$name]="ran out of time after ${limit} s" ;;
        *) STATUS[$name]="failed (exit $rc)" ;;
    esac
    echo "   ${STATUS[$name]} in ${SECS[$name]} s"
}

# the test files that mark tests `gpu` (collecting only these keeps the part short; a file that does not
# import is reported and the others still run)
mapfile -t GPU_TEST_FILES < <(grep -lE "pytest\.mark\.gpu" tests/test_*.py)
run_part gpu_tests 90 "$PY" -m pytest -q -m gpu -p no:cacheprovider --continue-on-collection-errors "${GPU_TEST_FILES[@]}"

# weight matching on the card (matcher.weight.device=cuda) against the floor the same process measures
# (the 1.1B shape cut to its first 8 of 22 layers: its host-side assignments would take the rest of the budget)
run_part weight_floor 200 "$PY" benchmarks/weight_floor.py --device cuda --iterations 2 \
    --shapes gpt2-124m pythia-410m
run_part weight_floor_llama 120 "$PY" benchmarks/weight_floor.py --device cuda --iterations 2 \
    --shapes llama-1.1b --layers 8

# six steps of three interleaved repeats of ten steps each, SciPy's solver on the host
run_part step_cost_vit 150 "$PY" benchmarks/learned_step_cost.py --device cuda --repeats 3
run_part step_cost_gpt2 100 "$PY" benchmarks/learned_step_cost.py --device cuda --profile 5 \
    experiment=paper_gpt2_embedded data.seq_len=128

run_part endpoint_throughput 60 "$PY" benchmarks/endpoint_throughput.py --steps 100 --warmup 10 --repeats 3 \
    trainer=gpu

run_part ensemble_seeds 150 "$PY" benchmarks/parallel_seeds.py --device cuda --seeds 10 --ensemble \
    data=pydoc data.tokenizer=char data.seq_len=256 train.max_epochs=2 data.eval_batch_size=32

# the last part gets whatever time the others left; ten workers share the card, each with its own CUDA
# context and batches (expandable segments: less memory lost to fragmentation); evaluation in batches of
# 32 windows instead of 64 keeps ten workers' peaks on one 80 GB card (training batches are unchanged)
run_part parallel_seeds "$BUDGET" env PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True \
    "$PY" benchmarks/parallel_seeds.py --device cuda --seeds 10 --parallel 10 \
    data=pydoc data.tokenizer=char data.seq_len=256 train.max_epochs=2 data.eval_batch_size=32

# --- summary -----------------------------------------------------------------------------------------
# the lines of each log that carry its figures (the benchmarks' own wording)
KEY_LINES='GFLOP/s|^ +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+x|^== (gpt2|pythia|llama)|peak memory|passed|failed|error|skipped|^model |training step|matching step|projections|ratio|per second|^demo_text|^  (loader|sliced) |data path|torch threads|seeds? |side by side|one after another|ensemble'
{
    echo
    echo "== summary (${SECONDS} s in all; logs in $LOGS)"
    for name in "${NAMES[@]}"; do
        echo "-- $name: ${STATUS[$name]}, ${SECS[$name]} s"
        log="$LOGS/$name.log"
        [[ -f $log ]] || continue
        if [[ ${STATUS[$name]} == ok ]]; then
            grep -E "$KEY_LINES" "$log" | grep -v "^\s*File \|Warning" | tail -n 12 | sed 's/^/   /'
        else
            tail -n 15 "$log" | sed 's/^/   /'
        fi
    done
} | tee "$LOGS/summary.txt"

failed=0
for name in "${NAMES[@]}"; do [[ ${STATUS[$name]} == ok ]] || failed=1; done
exit $failed
