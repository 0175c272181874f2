#!/usr/bin/env bash
# local_test.sh, named after the original DeepLab's script: `demo.sh --quick`,
# a short run of the PASCAL VOC scripts (convert, train a few steps,
# evaluate, visualise, export) on the bundled sample data. See demo.sh.
set -euo pipefail

if [[ ${1:-} == -h || ${1:-} == --help ]]; then
  printf 'Usage: %s (runs demo.sh --quick)\n\n' "$(basename "$0")"
fi
exec bash "$(dirname "${BASH_SOURCE[0]}")/demo.sh" --quick "$@"
