"""Every ``nobackfill ...`` command shown in README.md and docs/ parses against the real command line.

Each command line of a fenced code block (line continuations joined, ``$ `` prompts and comments
dropped, ``.venv/bin/nobackfill`` spelled either way) is resolved through the typer app's click
tree and parsed with ``make_context`` without running it: a renamed command, a renamed or removed
option, a missing required argument or a value of the wrong type fails here with the file and line.
The README's quick start is also *run*, in order, by tests/test_readme_quickstart.py; the last test
below checks that it runs every command of that block.

Placeholders (``<item id>``, ``[--limit 5000]``, ``...``) are the only liberties, listed in
:data:`PLACEHOLDERS` and :func:`_fill`.
"""

from __future__ import annotations

import functools
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest
import typer

from nobackfill.cli import app
from nobackfill.cli._common import normalise_json_args

try:  # typer >= 0.2x parses with its own copy of click; older typers with click itself
    from typer._click import exceptions as cli_errors
except ImportError:  # pragma: no cover
    from click import exceptions as cli_errors

ROOT = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})(?P<info>[^\n]*)$")
PROGRAMS = ("nobackfill", ".venv/bin/nobackfill")
# the only liberties a documented command may take, each standing for something the reader fills in:
PLACEHOLDERS = {
    "angle": re.compile(r"<[^<>\n]+>"),               # `--space <old space id>`: a value to look up first
    "optional": re.compile(r"\[(--[^\[\]\n]+)\]"),     # `[--limit 5000]`: an option one may add, parsed as written
    "ellipsis": "...",                                 # `--show-config ...`: "plus the required options"
}


@dataclass(frozen=True)
class DocCommand:
    path: Path
    line: int  # 1-based line of the command's first line
    text: str  # as written, continuations joined

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _strip_comment(line: str) -> str:
    """The line without its shell comment: ``#`` at the start of a word, outside quotes (so
    ``milvus://host#photos`` and ``"...#photos"`` keep theirs)."""
    quote, prev = None, " "
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and prev.isspace():
            return line[:i].rstrip()
        prev = ch
    return line.rstrip()


def _command_lines(block: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """Shell command lines of a code block: continuations joined, comments and prompts dropped."""
    out, buf, start = [], "", 0
    for lineno, raw in block:
        line = raw.strip()
        if not buf:
            if line.startswith("$ "):
                line = line[2:]
            start = lineno
        line = _strip_comment(line)
        if line.endswith("\\"):
            buf += line[:-1].rstrip() + " "
            continue
        buf += line
        if buf.strip():
            out.append((start, buf.strip()))
        buf = ""
    if buf.strip():
        out.append((start, buf.strip()))
    return out


def code_blocks(path: Path) -> list[tuple[str, list[tuple[int, str]]]]:
    """``(info string, [(line number, line), ...])`` of every fenced code block of a Markdown file."""
    blocks, current, fence, info = [], None, "", ""
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        m = FENCE.match(line)
        if current is None:
            if m:
                current, fence, info = [], m.group("fence"), m.group("info").strip()
        elif m and m.group("fence").startswith(fence) and not m.group("info").strip():
            blocks.append((info, current))
            current = None
        else:
            current.append((lineno, line))
    return blocks


def doc_commands(paths: list[Path] | None = None) -> list[DocCommand]:
    """Every ``nobackfill`` command line in the fenced code blocks of ``paths`` (default: README.md
    and docs/**/*.md). Blocks of another language (python, json, toml) hold none."""
    found = []
    for path in paths or documents():
        for info, block in code_blocks(path):
            if info.split()[:1] and info.split()[0] not in ("bash", "sh", "shell", "console", "text"):
                continue
            for lineno, text in _command_lines(block):
                if text.split()[0] in PROGRAMS:
                    found.append(DocCommand(path, lineno, text))
    return found


def _fill(text: str) -> tuple[list[str], bool]:
    """The argument list of a documented command (program name dropped), and whether it ends in
    ``...`` (then required options may be left out)."""
    text = PLACEHOLDERS["optional"].sub(r"\1", text)
    text = PLACEHOLDERS["angle"].sub("PLACEHOLDER", text)
    words = shlex.split(text)
    elided = PLACEHOLDERS["ellipsis"] in words
    words = [w for w in words if w != PLACEHOLDERS["ellipsis"]]
    for sep in ("|", "&&", ";", ">", ">>"):  # only the nobackfill part of a pipeline
        if sep in words:
            words = words[:words.index(sep)]
    return words[1:], elided


def _is_group(cmd) -> bool:
    return hasattr(cmd, "list_commands") and hasattr(cmd, "get_command")


def _group_options(group, args: list[str]) -> list[str]:
    """Consume a group's own leading options (``nobackfill -v COMMAND``), refusing unknown ones."""
    while args and args[0].startswith("-"):
        opt = next((p for p in group.params if p.param_type_name == "option"
                    and args[0] in [*p.opts, *p.secondary_opts]), None)
        if opt is None:
            raise cli_errors.UsageError(f"no such option of {group.name!r}: {args[0]}")
        args = args[1:] if opt.is_flag or opt.count else args[2:]
    return args


@functools.cache
def _root():
    return typer.main.get_command(app)


def parse(args: list[str], *, elided: bool = False) -> list[str]:
    """Resolve ``args`` through the CLI's click tree and parse them for the leaf command without
    running it; returns the command's path (``["nobackfill", "collection", "add"]``). Raises the
    CLI's usage errors (``cli_errors.UsageError``: no such command or option, a missing or bad value)."""
    cmd = _root()
    args, path = normalise_json_args(list(args)), ["nobackfill"]
    while _is_group(cmd):
        args = _group_options(cmd, args)
        if not args:
            raise cli_errors.UsageError(f"{' '.join(path)}: a command is missing")
        sub = cmd.get_command(cmd.context_class(cmd, info_name=path[-1]), args[0])
        if sub is None:
            raise cli_errors.UsageError(f"{' '.join(path)}: no such command {args[0]!r}")
        path.append(args[0])
        cmd, args = sub, args[1:]
    try:
        cmd.make_context(" ".join(path), args, resilient_parsing=False)
    except typer.Exit as e:  # --help
        if e.exit_code:
            raise
    except cli_errors.MissingParameter:
        if not elided:
            raise
    return path


COMMANDS = doc_commands()


def test_the_docs_show_commands():
    """The extraction finds the commands (a broken fence parser would make the test below vacuous)."""
    per_file = {c.path.name for c in COMMANDS}
    assert len(COMMANDS) >= 40, [c.where for c in COMMANDS]
    assert {"README.md", "index.md", "guide.md", "upgrade.md", "import.md", "methods.md"} <= per_file, per_file


@pytest.mark.parametrize("command", COMMANDS, ids=[c.where for c in COMMANDS])
def test_documented_command_parses(command: DocCommand):
    args, elided = _fill(command.text)
    try:
        parse(args, elided=elided)
    except cli_errors.ClickException as e:
        pytest.fail(f"{command.where}: `{command.text}` does not parse against the CLI: {e.format_message()}")


@pytest.mark.parametrize("text", [
    "nobackfill collection serch photos --text x",         # renamed command
    "nobackfill collection search photos --txt x",          # renamed option
    "nobackfill collection search --text x",                # missing argument
    "nobackfill collection search photos --k many",         # wrong type
    "nobackfill --no-such-flag verify photos",              # unknown root option
])
def test_a_wrong_command_fails(text):
    """The check can fail: each kind of mistake it is there for is reported."""
    args, elided = _fill(text)
    with pytest.raises(cli_errors.UsageError):
        parse(args, elided=elided)


def test_placeholders_and_shell_syntax(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("```bash\n$ nobackfill collection delete photos --id <item id>   # one item\n"
                    "nobackfill collection backfill photos \\\n    --order random [--limit 5000]\n"
                    "nobackfill collection create \"milvus-lite:/d/x.db#photos\" --model m # comment\n"
                    "echo nobackfill\n```\n```python\nnobackfill = 1\n```\n")
    cmds = doc_commands([page])
    assert [(c.line, _fill(c.text)[0]) for c in cmds] == [
        (2, ["collection", "delete", "photos", "--id", "PLACEHOLDER"]),
        (3, ["collection", "backfill", "photos", "--order", "random", "--limit", "5000"]),
        (5, ["collection", "create", "milvus-lite:/d/x.db#photos", "--model", "m"]),
    ]
    for c in cmds:
        parse(_fill(c.text)[0])


def test_the_readme_quickstart_is_run_by_a_test():
    """tests/test_readme_quickstart.py runs the quick start block's commands; it reads the block
    with its own parser, so both must see the same ``nobackfill`` commands, every one of them."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("_quickstart", ROOT / "tests" / "test_readme_quickstart.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    ran = [c for c in mod._quickstart_commands() if c[0] == "nobackfill"]
    text = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    start = text.index("<!-- quickstart -->") + 1
    end = text.index("<!-- /quickstart -->") + 1
    ours = [shlex.split(c.text) for c in COMMANDS
            if c.path.name == "README.md" and start < c.line < end]
    assert ours and ours == ran


def test_the_home_page_quickstart_is_the_readmes():
    """docs/index.md repeats the README's quick start; it must stay the same commands, so the run
    of the README's block (tests/test_readme_quickstart.py) covers the site's copy too."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    start, end = readme.index("<!-- quickstart -->") + 1, readme.index("<!-- /quickstart -->") + 1
    quick = [c.text for c in COMMANDS if c.path.name == "README.md" and start < c.line < end]
    home = [c.text for c in COMMANDS if c.path == ROOT / "docs" / "index.md"]
    assert any(home[i:i + len(quick)] == quick for i in range(len(home))), \
        "docs/index.md's quick start differs from README.md's"
