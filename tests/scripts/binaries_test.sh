#!/bin/bash
# Every binary local_cluster.sh starts is in scripts/binaries.sh (what scripts/build.sh builds),
# and the main job builds through scripts/build.sh, so the lists cannot drift apart again.
set -euo pipefail
. scripts/binaries.sh
fail=0
for path in $(grep -o '\$BIN/[A-Za-z0-9_/.-]*' scripts/local_cluster.sh | sed 's#^\$BIN/##' | sort -u); do
  name=$(basename "$path")
  if ! want=$(loom_binary_path "$name" .); then
    echo "local_cluster.sh starts $path, which scripts/binaries.sh does not list"; fail=1; continue
  fi
  if [ "$want" != "./$path" ]; then
    echo "local_cluster.sh starts $path but scripts/binaries.sh builds $want"; fail=1
  fi
done
n=$(grep -c '\$BIN/' scripts/local_cluster.sh)
[ "$n" -ge 4 ] || { echo "expected local_cluster.sh to start at least 4 binaries, found $n"; fail=1; }
grep -q 'scripts/build.sh' scripts/run_main_job.sh || { echo "run_main_job.sh does not build with scripts/build.sh"; fail=1; }
grep -q 'loom_missing_binaries' scripts/local_cluster.sh || { echo "local_cluster.sh does not check the list before starting"; fail=1; }
[ $fail -eq 0 ] && echo "binaries_test: ok"
exit $fail
