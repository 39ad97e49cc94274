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
grep -q "== torchtitan Trainer.Config ==" plan1.txt
grep -q "KernelGroupedExperts\|nki_moe" plan2.txt
echo "wheel install: qwen3-trn and python -m qwen3_trn planned runs from $work/elsewhere"
