#!/usr/bin/env sh
# make test: the suite in two shares run beside each other (`pytest --shard K/N`, balanced by the
# seconds each test file took: tests/durations.json, scripts/test_durations.py), since most of its
# time is spent waiting on processes it starts; and the tests against a real Milvus server (in a
# loopback-only network namespace: scripts/isolated.sh) beside them, which mostly wait on the server.
# The outputs of the second share and of the server tests are printed after the first's. Exits
# non-zero if any part failed.
set -u
PY="$1"
share=$(mktemp)
log=$(mktemp)
( "$PY" -m pytest -x -p no:cacheprovider -m "not milvus_server" --shard 1/2 >"$share" 2>&1
  echo $? >"$share.rc" ) &
share_job=$!
( sh scripts/isolated.sh "$PY" -m pytest -x -p no:cacheprovider -m milvus_server >"$log" 2>&1
  echo $? >"$log.rc" ) &
server_job=$!
trap 'kill "$share_job" "$server_job" 2>/dev/null; rm -f "$share" "$share.rc" "$log" "$log.rc"; exit 130' INT TERM
"$PY" -m pytest -x -p no:cacheprovider -m "not milvus_server" --shard 0/2
first=$?
wait "$share_job"
wait "$server_job"
echo "--- the suite's second share (run beside the first) ---"
cat "$share"
echo "--- the tests against a Milvus server (run beside the suite) ---"
cat "$log"
second=$(cat "$share.rc" 2>/dev/null || echo 1)
server=$(cat "$log.rc" 2>/dev/null || echo 1)
rm -f "$share" "$share.rc" "$log" "$log.rc"
echo "suite: exit $first (first share), $second (second share); Milvus server tests: exit $server"
[ "$first" -eq 0 ] && [ "$second" -eq 0 ] && [ "$server" -eq 0 ]
