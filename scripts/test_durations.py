"""Record the seconds each test file takes, for ``pytest --shard K/N`` (tests/conftest.py) to balance
the two shares ``make test`` runs beside each other.

    PYTEST_ADDOPTS=--durations=0 make test > test.log 2>&1
    python scripts/test_durations.py test.log          # writes tests/durations.json

Reads the ``--durations=0`` lines of every pytest output in the logs given (``12.34s call
tests/test_x.py::test_y``) up to scripts/test.sh's heading of the Milvus server tests (they run
beside the shares, not in them), and writes each file's total (setup, call and teardown), rounded
to 0.1 s. A file missing from the table is counted at 0.2 s a test.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

#: scripts/test.sh's heading of the Milvus server tests' output
SERVER_PART = "--- the tests against a Milvus server"
LINE = re.compile(r"^(\d+(?:\.\d+)?)s (?:setup|call|teardown)\s+(?:\S*/)?(test_[^/:\s]+\.py)::")


def main(logs: list[str], out: Path = Path(__file__).resolve().parents[1] / "tests" / "durations.json") -> None:
    """Write the seconds of each test file in ``logs`` to ``out`` (the table ``--shard`` reads)."""
    if not logs:
        raise SystemExit(__doc__)
    seconds: dict[str, float] = {}
    for log in logs:
        for line in Path(log).read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith(SERVER_PART):
                break
            if (m := LINE.match(line.strip())):
                seconds[m.group(2)] = seconds.get(m.group(2), 0.0) + float(m.group(1))
    if not seconds:
        raise SystemExit(f"no --durations lines in {', '.join(logs)} (run pytest with --durations=0)")
    table = {name: round(s, 1) for name, s in sorted(seconds.items())}
    out.write_text(json.dumps(table, indent=1) + "\n", encoding="utf-8")
    print(f"{out}: {len(table)} files, {sum(table.values()):.0f} s")


if __name__ == "__main__":
    main(sys.argv[1:])
