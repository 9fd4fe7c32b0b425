#!/usr/bin/env sh
# Run a command with only a loopback network: a new network namespace whose "lo" is up, so a server
# it starts (the Milvus standalone server of the milvus_server tests listens on every interface) is
# reachable on 127.0.0.1 and nowhere else. Without namespaces (no unshare / ip, not permitted), it
# says so and runs the command as is.
if command -v unshare >/dev/null 2>&1 && command -v ip >/dev/null 2>&1 && unshare -n true 2>/dev/null; then
    exec unshare -n sh -c 'ip link set lo up && exec "$@"' sh "$@"
fi
echo "scripts/isolated.sh: no network namespace available; running without isolation" >&2
exec "$@"
