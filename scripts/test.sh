#!/usr/bin/env bash
# README command two: set up (with the [verl] extra), then run the whole test suite (pytest exit code 5, "no tests", fails).
set -euo pipefail
cd "$(dirname "$0")/.."
# the verl plugin's tests run against a real verl (the [verl] extra); without it they would be skipped,
# so here a missing verl fails them instead
EXTRAS=${EXTRAS:-verl} bash scripts/setup.sh
. .venv/bin/activate
export CRITIC_AUDIT_REQUIRE_VERL=1
set +e
python -m pytest tests
rc=$?
set -e
if [ "$rc" -eq 5 ]; then echo "pytest collected no tests: failing" >&2; exit 1; fi
exit "$rc"
