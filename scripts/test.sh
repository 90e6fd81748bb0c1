#!/usr/bin/env bash
# README command two: set up, then run the whole test suite (pytest exit code 5, "no tests", fails).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
set +e
python -m pytest tests
rc=$?
set -e
if [ "$rc" -eq 5 ]; then echo "pytest collected no tests: failing" >&2; exit 1; fi
exit "$rc"
