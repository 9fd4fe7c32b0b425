"""Help texts render as written. typer reads every help text as rich markup, where ``[model]`` or
``a[j,i]`` is a style tag and vanishes; none of ours is markup (the panels, colours and highlighting
are typer's own), so each help text of the command tree is escaped once, when the tree is built
(:class:`nobackfill.cli._Root`). Hard line breaks inside a paragraph are joined too: typer keeps them
in the commands table, where they break a line in the middle of the column."""

from __future__ import annotations

import re

from rich.markup import escape

#: a paragraph with a line like these is laid out by hand (a list, an indented block), as is one
#: holding click's keep-as-is mark \b: kept as is
_BLOCK_LINE = re.compile(r"^(\s|[-*•+]\s|\d+[.)]\s)")


def literal(text: str) -> str:
    """``text`` as rich markup that renders as ``text`` (paragraphs reflowed)."""
    paragraphs = text.split("\n\n")
    out = []
    for p in paragraphs:
        lines = p.split("\n")
        if len(lines) > 1 and "\b" not in p and not any(_BLOCK_LINE.match(line) for line in lines[1:]):
            p = " ".join(line.strip() for line in lines)
        out.append(p)
    return escape("\n\n".join(out))


def literal_tree(command) -> None:
    """Escape the help of ``command``, its parameters and its subcommands (recursively), where typer
    renders it as rich markup."""
    seen: set[int] = set()
    todo = [command]
    while todo:
        cmd = todo.pop()
        if id(cmd) in seen:
            continue
        seen.add(id(cmd))
        if getattr(cmd, "rich_markup_mode", None) == "rich":
            if cmd.help:
                cmd.help = literal(cmd.help)
            if cmd.short_help:
                cmd.short_help = literal(cmd.short_help)
            for p in cmd.params:
                if getattr(p, "help", None):
                    p.help = literal(p.help)
        flag_metavars(cmd)
        todo.extend(getattr(cmd, "commands", {}).values())


def usage_error(e) -> int:
    """Print click's error ``e`` (a usage error: a missing argument, an unknown option, a value out
    of range) as one line on stderr, naming the command's ``--help``, as ``fail`` prints ours; its
    exit code (2)."""
    from ._common import console

    ctx = getattr(e, "ctx", None)
    hint = f" (see '{ctx.command_path} --help')" if ctx is not None and ctx.command.get_help_option(ctx) else ""
    console.print(f"[red]error:[/red] {escape(e.format_message() + hint)}", markup=True)
    return e.exit_code


def flag_metavars(command) -> None:
    """An on/off flag (``--help`` too) shows no value in the help: typer shows ``<bool>``, which reads
    as a flag that takes one (``--json true`` is refused)."""
    for p in getattr(command, "params", []):
        if getattr(p, "is_flag", False) and p.metavar is None:
            p.metavar = ""
    make_help = getattr(command, "get_help_option", None)
    if make_help is None or getattr(make_help, "_no_metavar", False):
        return

    def get_help_option(ctx):
        option = make_help(ctx)
        if option is not None:
            option.metavar = ""
        return option

    get_help_option._no_metavar = True
    command.get_help_option = get_help_option
