#!/usr/bin/env sh
# make test: the suite, with the tests against a real Milvus server (in a loopback-only network
# namespace: scripts/isolated.sh) run beside it. Those mostly wait on the server while the rest keeps
# the CPU busy; their output is printed after the suite's. Exits non-zero if either part failed.
set -u
PY="$1"
log=$(mktemp)
( sh scripts/isolated.sh "$PY" -m pytest -x -p no:cacheprovider -m milvus_server >"$log" 2>&1
  echo $? >"$log.rc" ) &
server_job=$!
trap 'kill "$server_job" 2>/dev/null; rm -f "$log" "$log.rc"; exit 130' INT TERM
"$PY" -m pytest -x -p no:cacheprovider -m "not milvus_server"
suite=$?
wait "$server_job"
echo "--- the tests against a Milvus server (run beside the suite) ---"
cat "$log"
server=$(cat "$log.rc" 2>/dev/null || echo 1)
rm -f "$log" "$log.rc"
echo "suite: exit $suite; Milvus server tests: exit $server"
[ "$suite" -eq 0 ] && [ "$server" -eq 0 ]
