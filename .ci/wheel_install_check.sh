#!/usr/bin/env bash
# Build the wheel, install it into a clean virtual environment and plan a run from a
# directory that is not the checkout: the package must find its config groups by itself.
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python -m pip wheel --quiet --no-deps --wheel-dir "$work/dist" .
python3 -m venv "$work/venv"
"$work/venv/bin/python" -m pip install --quiet "$work"/dist/qwen3_trn-*.whl
mkdir "$work/elsewhere"
cd "$work/elsewhere"
"$work/venv/bin/qwen3-trn" mode=plan logger=none hydra.run.dir="$work/elsewhere/plan1" > plan1.txt
"$work/venv/bin/python" -m qwen3_trn mode=plan logger=none backend=nki_moe hydra.run.dir="$work/elsewhere/plan2" > plan2.txt
# the sweeper comes with the wheel too (hydra_plugins/qwen3_trn_sweeper)
"$work/venv/bin/python" -m qwen3_trn -m mode=plan logger=none training.seed=1,2 hydra.sweep.dir="$work/elsewhere/sweep" > sweep.txt
grep -q "torchtitan Trainer.Config: $work/elsewhere/plan1/trainer_config.json" plan1.txt
grep -q "KernelGroupedExperts\|nki_moe" "$work/elsewhere/plan2/trainer_config.json"
grep -q "planned sweep" "$work/elsewhere/sweep/plan.txt"
echo "wheel install: qwen3-trn, python -m qwen3_trn and a sweep planned from $work/elsewhere"
