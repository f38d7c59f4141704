#!/bin/bash
# One rank of a 2-rank job fails (throws, is killed, hangs): the job must end, non-zero, within
# a bound, with a message that says which rank and why. Run by ctest (dist.failure).
# usage: failure_test.sh MPIEXEC FAILURE_PROGRAM [MPIEXEC FLAGS...]
set -u
mpiexec=$1 program=$2
shift 2
bound_s=60  # a hang is stopped by MIXPREC_DIST_TIMEOUT_S=3; everything else ends at once
fail=0
check() {  # mode, then a pattern the output must contain
  local mode=$1 pattern=$2 out start rc elapsed
  shift 2
  start=$(date +%s)
  out=$(MIXPREC_DIST_TIMEOUT_S=3 timeout -k 5 $((bound_s * 2)) "$mpiexec" -np 2 "$@" "$program" "$mode" 2>&1)
  rc=$?
  elapsed=$(($(date +%s) - start))
  if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ] || [ "$elapsed" -gt "$bound_s" ] || ! grep -Eq "$pattern" <<<"$out"; then
    echo "FAIL $mode: exit $rc after ${elapsed}s (bound ${bound_s}s), expected a non-zero exit and /$pattern/ in:"
    echo "$out" | tail -20
    fail=1
  else
    echo "ok   $mode: the job ended in ${elapsed}s, exit $rc: $(grep -Em1 "$pattern" <<<"$out")"
  fi
}
check throw "rank 1 of 2 .*uncaught exception: injected failure at step 3; aborting the job" "$@"
check kill "rank 1 .*(signal 9|Killed)" "$@"
check hang "rank 0 of 2 .*waited 3 s for the other ranks" "$@"
exit $fail
