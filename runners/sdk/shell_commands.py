"""The programs a shell command line would run, for matching a binding's `approvals.commands` against them.

The line is parsed with tree-sitter's bash grammar, not split on operators, so a program is found wherever bash
would run one: in lists and pipelines, if/while/until/for/select/case bodies, subshells and brace groups, `$(…)`,
backticks and `<(…)`/`>(…)` (in arguments, assignments, redirections and here-documents alike), behind the
wrappers that run their arguments as a program (`command`, `exec`, `env A=1`, `sudo`, `nice`, `timeout`, `xargs`,
`find -exec` …) and inside the string of `bash -c` / `sh -c`. A program is named by its basename with quotes and
backslashes removed, so `/bin/rm`, `./rm`, `\\rm` and `'rm'` are all `rm`. A command is also matched without its
leading options, so `git -C . push` meets a pattern `git push*`.

It fails closed: what it cannot resolve is reported in `Commands.unresolved`, and the caller asks a person rather
than guess. That covers a parse error, a program name built from a variable, a glob, braces or `$'…'`, `eval`,
`source`, `alias`, `trap`, a function defined in the line, a shell reading a script or stdin, an assignment to a
variable a shell runs (PS4, BASH_ENV, PROMPT_COMMAND …), a git alias defined in the line, and nesting deeper than
`MAX_DEPTH`. The grammar is not bash, so the text gets a second opinion: a substitution bash would run that the
grammar did not read, or a reserved word the grammar took for a program, asks too; backslash-newlines inside words
are joined as bash joins them.

An argument made from an expansion, a glob or braces is kept as a wildcard (`Dynamic`): a pattern that could match
it once filled in asks too (`could_match`).

A name is only as good as the file behind it, so a program run by a path outside the system's program directories
(`./x`, `/tmp/x`, `bin/x`: a file a model may have written, or a copy of `rm` under another name) asks, and so does a
line that sets PATH (after which a plain name may run such a file). What stays beyond any reading of one line: an
interpreter (`python -c`), and a program on the system's PATH that runs another by a name the line never shows;
`approvals.tools: ["shell"]` asks for every command.
"""

from __future__ import annotations

import fnmatch
import functools
import posixpath
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


class Dynamic:
    """A stretch of a word only known when the command runs (an expansion, a glob, braces)."""

    def __repr__(self) -> str:
        return "<dynamic>"


DYN = Dynamic()
Piece = str | Dynamic
Template = tuple[Piece, ...]  # one simple command as text: literal strings and DYN stretches

MAX_DEPTH = 6  # nested `bash -c` strings / wrappers before it gives up (and asks)
MAX_COMMANDS = 500
MAX_LINE_BYTES = 64 * 1024  # a person reads a longer command anyway; parsing it would hold the event loop
MAX_MATCH_STATES = 1_000_000  # pattern × command length, for a command with DYN stretches

# Run their arguments as a program. The program may start at any later argument that is not an option or an
# assignment: every such suffix is a candidate, so an option taking a value the table does not know can only make
# it ask more, never less.
WRAPPERS = frozenset(
    {
        "command", "exec", "builtin", "nohup", "time", "env", "sudo", "doas", "nice", "timeout", "xargs",
        "stdbuf", "setsid", "ionice", "chrt", "taskset", "flock", "unbuffer", "strace", "ltrace", "busybox",
        "coproc", "nsenter", "unshare", "chroot", "runuser", "caffeinate", "proxychains", "torsocks",
        "su", "script", "ssh", "toybox", "parallel", "prlimit", "setpriv", "fakeroot", "valgrind", "setarch",
        "linux32", "linux64", "i386", "x86_64", "perf", "gdb", "sg", "start-stop-daemon",
    }
)  # fmt: skip
# Appends arguments read from stdin to its command.
APPENDS_INPUT = frozenset({"xargs", "parallel"})
# `-c STRING` runs STRING as shell code; without it they read a script or stdin (not visible here). capsh passes
# what follows its `--` to bash.
SHELLS = frozenset(
    {"sh", "bash", "dash", "zsh", "ksh", "mksh", "ash", "yash", "posh", "fish", "csh", "tcsh", "capsh"}
)  # fmt: skip
# Read startup files whatever their options (zsh: ~/.zshenv, fish: config.fish, csh: ~/.cshrc): a file an earlier
# command wrote there can define a function or alias under any name, so what the line names says nothing.
READS_STARTUP_FILES = frozenset({"zsh", "fish", "csh", "tcsh"})
# The options that make the others read them: interactive (~/.bashrc, $ENV) or login (~/.profile), or a file named.
STARTUP_OPTIONS = frozenset({"--login", "--interactive", "--rcfile", "--init-file"})
# Join their arguments into one string a shell runs.
JOINS_FOR_SHELL = frozenset({"watch"})
# Run shell code from a string or a file, or change what a later name runs.
OPAQUE = frozenset({"eval", "source", ".", "alias", "trap", "enable", "fc", "hash"})
# Bash reads these as syntax where a command starts; a grammar that hands one back as a program name has read the
# line differently from bash (`! if …; fi` comes back as commands `if`, `then rm x`, `fi`), so nothing is trusted.
RESERVED = frozenset(
    {"if", "then", "else", "elif", "fi", "do", "done", "case", "esac", "while", "until", "for", "select", "in",
     "function", "{", "}", "[[", "]]", "!"}
)  # fmt: skip
# Variables whose value a shell runs or sources (PS4 under `-x`, BASH_ENV at start, exported functions), that give
# git configuration (an alias among it), or that load a library of the line's choosing into any program it runs (the
# dynamic loader's): an assignment to one is code that cannot be seen.
CODE_VARIABLES = re.compile(
    r"(PATH|BASH_ENV|ENV|PS[0-4]|PROMPT_COMMAND|SHELLOPTS|BASHOPTS|BASH_FUNC_.*|GIT_CONFIG_(COUNT|KEY_.*|VALUE_.*|PARAMETERS)"
    r"|LD_PRELOAD|LD_LIBRARY_PATH|LD_AUDIT)"
    r"\+?=?$"
)
FIND_EXEC = frozenset({"-exec", "-execdir", "-ok", "-okdir"})
# Where a sandbox's programs live, bound read-only from the system: a program named by a path elsewhere is a file a
# command could have written or copied, whose name says nothing of what it does.
SYSTEM_PROGRAM_DIRS = frozenset({"/bin", "/sbin", "/usr/bin", "/usr/sbin", "/usr/local/bin", "/usr/local/sbin"})

_GLOB = frozenset("*?[")
_GIT_ALIAS = re.compile(r"(-c|--config-env=)alias\.", re.IGNORECASE)
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\[[^]]*\])?\+?=")
_DOUBLE_QUOTE_ESCAPES = re.compile(r"\\([$`\"\\\n])")


@dataclass
class Commands:
    """The simple commands a line would run (program basename first), and why not all could be resolved."""

    commands: list[Template] = field(default_factory=list)
    unresolved: list[str] = field(default_factory=list)
    steps: int = 0  # simple commands and wrapper candidates looked at, against MAX_COMMANDS


@functools.cache
def _parser() -> Any:
    import tree_sitter
    import tree_sitter_bash

    return tree_sitter.Parser(tree_sitter.Language(tree_sitter_bash.language()))


def parse(line: str) -> Commands:
    out = Commands()
    _parse_line(line, out, depth=0)
    return out


def _parse_line(line: str, out: Commands, depth: int, *, joined: bool = False) -> None:
    if depth > MAX_DEPTH:
        out.unresolved.append(f"nested more than {MAX_DEPTH} levels deep")
        return
    data = line.encode("utf-8", "surrogatepass")
    if len(data) > MAX_LINE_BYTES:
        out.unresolved.append(f"it is longer than {MAX_LINE_BYTES // 1024} KiB")
        return
    tree = _parser().parse(data)
    if tree.root_node.has_error:
        out.unresolved.append("the shell parser could not read it")
        return
    walked = _walk(tree.root_node, out, depth)
    # A second opinion on the grammar, from the text: it misses some substitutions bash runs (backticks inside
    # ${x:-…}, a here-document line that starts with a tab) and splits a word at a backslash-newline that bash
    # joins (`r\<newline>m x` is `rm x`).
    scan = _Scan(data, walked.skip, walked.heredocs)
    if scan.escaped_backtick:
        out.unresolved.append("it nests backticks")
    elif scan.substitutions > walked.substitutions:
        out.unresolved.append("it has a substitution the shell parser did not read")
    if scan.joined != data:
        if joined:
            out.unresolved.append("it continues lines inside words")
        else:
            _parse_line(scan.joined.decode("utf-8", "surrogatepass"), out, depth, joined=True)


@dataclass
class _Walked:
    substitutions: int = 0  # $(…), `…`, <(…), >(…) the grammar found
    skip: list[tuple[int, int]] = field(default_factory=list)  # byte ranges the text scan leaves alone
    heredocs: list[tuple[int, int]] = field(default_factory=list)  # unquoted here-document bodies


def _walk(root: Any, out: Commands, depth: int) -> _Walked:
    """Every node (iteratively: `a && b && …` nests as deep as it is long), recording each simple command.
    Substitutions run wherever they appear (arguments, assignments, redirections, here-documents)."""
    walked = _Walked()
    stack = [root]
    while stack:
        node = stack.pop()
        kind = node.type
        if kind == "function_definition":
            out.unresolved.append("it defines a function")
        elif kind == "command":
            if out.steps > MAX_COMMANDS:
                return walked  # _argv said so
            _command(node, out, depth)
        elif kind in ("command_substitution", "process_substitution"):
            walked.substitutions += 1
        elif kind == "comment":
            walked.skip.append((node.start_byte, node.end_byte))
        elif kind == "variable_assignment":
            _assignment(node.text.decode("utf-8", "surrogatepass").split("=", 1)[0], out)
        elif kind == "heredoc_redirect":
            start = next((c for c in node.children if c.type == "heredoc_start"), None)
            quoted = start is not None and any(q in start.text for q in (b"'", b'"', b"\\"))
            for body in (c for c in node.children if c.type == "heredoc_body"):
                walked.skip.append((body.start_byte, body.end_byte))
                if not quoted:
                    walked.heredocs.append((body.start_byte, body.end_byte))
        stack.extend(reversed(node.children))
    return walked


class _Scan:
    """Counts the substitutions bash would run in `data` by its quoting rules alone, and joins its
    backslash-newlines (outside single quotes). `skip`: comments and here-document bodies (the unquoted ones are
    scanned on their own, where quotes mean nothing)."""

    def __init__(
        self, data: bytes, walked_skip: list[tuple[int, int]], heredocs: Sequence[tuple[int, int]] = ()
    ) -> None:
        self.substitutions = 0
        self.escaped_backtick = False
        self._backticks = 0
        self.joined = self._scan(data, sorted(walked_skip), quotes=True)
        for start, end in heredocs:
            self._scan(data[start:end], [], quotes=False)
        self.substitutions += (self._backticks + 1) // 2

    def _scan(self, data: bytes, skip: list[tuple[int, int]], *, quotes: bool) -> bytes:
        kept = bytearray()
        i, n, dquote = 0, len(data), False
        skips = iter(skip)
        next_skip = next(skips, None)
        while i < n:
            if next_skip is not None and i >= next_skip[0]:
                kept += data[i : next_skip[1]]
                i = max(i, next_skip[1])
                next_skip = next(skips, None)
                continue
            char = data[i : i + 1]
            if char == b"\\" and i + 1 < n:
                following = data[i + 1 : i + 2]
                if following == b"`":
                    self.escaped_backtick = True
                if following != b"\n":
                    kept += data[i : i + 2]
                i += 2
                continue
            if quotes and not dquote and char == b"'":
                end = data.find(b"'", i + 1)
                end = n if end < 0 else end + 1
                kept += data[i:end]
                i = end
                continue
            if quotes and not dquote and data.startswith(b"$'", i):
                end = i + 2
                while end < n and data[end : end + 1] != b"'":
                    end += 2 if data[end : end + 1] == b"\\" else 1
                kept += data[i : end + 1]
                i = end + 1
                continue
            if quotes and char == b'"':
                dquote = not dquote
            elif data.startswith(b"$(", i) and not data.startswith(b"$((", i):
                self.substitutions += 1
            elif char == b"`":
                self._backticks += 1
            elif quotes and not dquote and data[i : i + 2] in (b"<(", b">("):
                self.substitutions += 1
            kept += char
            i += 1
        return bytes(kept)


def _command(node: Any, out: Commands, depth: int) -> None:
    name = node.child_by_field_name("name")
    if name is None:  # only assignments / redirections: their substitutions are walked by the caller
        return
    argv = [_word(name.named_children[0] if name.named_children else name)]
    if name.text.decode("utf-8", "surrogatepass") in RESERVED:
        out.unresolved.append(f"the parser read {argv[0][0]!r} as a command where bash reads syntax")
    # Arguments are the named children after the name, less redirections (walked by the caller for substitutions).
    started = False
    for child in node.named_children:
        if child.id == name.id:
            started = True
        elif started and not child.type.endswith("redirect"):
            argv.append(_word(child))
    _argv(argv, out, depth)


def _argv(argv: list[Template], out: Commands, depth: int, *, appended: bool = False) -> None:
    """One simple command: record it under its program's basename, then follow what it runs in turn."""
    out.steps += 1
    if out.steps > MAX_COMMANDS:
        # wrapper candidates multiply (`command command … x`): a bound on the work, not only on the result
        if out.steps == MAX_COMMANDS + 1:
            out.unresolved.append(f"more than {MAX_COMMANDS} commands")
        return
    if depth > MAX_DEPTH:
        out.unresolved.append(f"nested more than {MAX_DEPTH} levels deep")
        return
    head = argv[0]
    program = _program(head)
    if program is None:
        out.unresolved.append(f"the program {show(head)!r} is only known when it runs")
        return
    path = show(head)
    if "/" in path and (not is_literal(head) or posixpath.dirname(posixpath.normpath(path)) not in SYSTEM_PROGRAM_DIRS):
        out.unresolved.append(f"the program {path!r} is a file outside the system's program directories")
    rest = argv[1:] + ([(DYN,)] if appended else [])
    out.commands.append(_join([(program,), *rest]))
    _without_leading_options(program, rest, out)
    if is_literal(head) and any(c.isspace() for c in show(head)):
        # No program has such a name, but what splits a string into a command (env -S, su -c, flock -c, script
        # -c …) runs it as one: read it as a line too.
        if all(is_literal(a) for a in argv[1:]):
            _parse_line(" ".join([show(head), *(shlex.quote(show(a)) for a in argv[1:])]), out, depth + 1)
        else:
            out.unresolved.append(f"{show(head)!r} may be split into a command only known when it runs")
    if program in OPAQUE:
        out.unresolved.append(f"{program!r} runs code that cannot be seen in the line")
    elif program in SHELLS:
        _shell(program, argv[1:], out, depth)
    elif program in JOINS_FOR_SHELL:
        for start in range(1, len(argv)):
            joined = _join(argv[start:])
            if is_literal(joined):
                _parse_line("".join(p for p in joined if isinstance(p, str)), out, depth + 1)
            else:
                out.unresolved.append(f"{program!r} runs a string only known when it runs")
                return
    elif program == "git" and _git_alias(argv[1:]):
        # `git -c alias.x=push x` runs `git push` under another name (the line's own alias, like bash's `alias`)
        out.unresolved.append("it defines a git alias, which runs a command the line names otherwise")
    elif program == "find":
        for i, word in enumerate(argv):
            if word in {(flag,) for flag in FIND_EXEC} and i + 1 < len(argv):
                _argv(argv[i + 1 :], out, depth + 1)
    elif program in WRAPPERS:
        for start in range(1, len(argv)):
            if out.steps > MAX_COMMANDS:
                return
            word = argv[start]
            text = word[0] if len(word) == 1 and isinstance(word[0], str) else None
            if text is not None and _ASSIGNMENT.match(text):
                _assignment(text.split("=", 1)[0], out)
                continue
            if text is not None and text.startswith("-"):
                if any(c.isspace() for c in text):
                    _option_string(program, text, out, depth)
                continue
            _argv(argv[start:], out, depth + 1, appended=appended or program in APPENDS_INPUT)


def _option_string(program: str, option: str, out: Commands, depth: int) -> None:
    """A wrapper's option word with a command string in it: `env --split-string='rm x'`, `su --command='rm x'` run
    the value as a line, so it is read as one; a cluster of short options (`env -iS'rm x'`, `su -c'rm x'`), whose
    value starts at a letter only the wrapper knows, asks."""
    name, eq, value = option.partition("=")
    if name.startswith("--") and eq:
        _parse_line(value, out, depth + 1)
    else:
        out.unresolved.append(f"{program!r} option {option[:40]!r} may carry a command to run")


def _without_leading_options(program: str, rest: list[Template], out: Commands) -> None:
    """The command again without each run of its leading options (`git -C . push` is also `git push`, `npm
    --prefix . install x` also `npm install x`), so a pattern naming a subcommand finds it behind a program's
    global options. A word after an option may be its value and an expansion may be an option: both are skipped
    too, which can only make it ask more."""
    after_option = False
    for k, word in enumerate(rest):
        text = word[0] if len(word) == 1 and isinstance(word[0], str) else None
        option = text is None or text.startswith("-")
        if not (option or after_option) or text == "--":
            return
        out.steps += 1
        if out.steps > MAX_COMMANDS:
            if out.steps == MAX_COMMANDS + 1:
                out.unresolved.append(f"more than {MAX_COMMANDS} commands")
            return
        out.commands.append(_join([(program,), *rest[k + 1 :]]))
        after_option = option


def _git_alias(args: list[Template]) -> bool:
    """Whether git's own options define an alias (`-c alias.x=…`, `-calias.x=…`, `--config-env=alias.x=…`) or a
    configuration only known when it runs (`-c "$X"`)."""
    for i, word in enumerate(args):
        text = show(word)
        after_c = i > 0 and show(args[i - 1]) == "-c"
        if _GIT_ALIAS.match(text) or (after_c and (not is_literal(word) or text.lower().startswith("alias."))):
            return True
    return False


def _assignment(name: str, out: Commands) -> None:
    if CODE_VARIABLES.match(name):
        out.unresolved.append(f"it sets {name.rstrip('+')}, which runs code the line does not show")


def _shell(program: str, args: list[Template], out: Commands, depth: int) -> None:
    """`bash -c 'code'` runs code: parse it (every literal operand, so an option's value only asks more)."""
    flags = [a[0] for a in args if len(a) == 1 and isinstance(a[0], str) and a[0].startswith("-")]
    short = [f[1:] for f in flags if not f.startswith("--")]
    if (
        program in READS_STARTUP_FILES
        or any(f.split("=", 1)[0] in STARTUP_OPTIONS for f in flags)
        or any("i" in f or "l" in f for f in short)
    ):
        out.unresolved.append(
            f"{program!r} reads startup files (~/.bashrc, ~/.profile, ~/.zshenv …) here, where an earlier command"
            " may have defined any name as another command"
        )
    if not any("c" in f for f in short):
        out.unresolved.append(f"{program!r} runs a script or its input, which cannot be seen in the line")
        return
    for arg in args:
        if len(arg) == 1 and isinstance(arg[0], str) and arg[0].startswith("-"):
            continue
        if is_literal(arg):
            _parse_line("".join(p for p in arg if isinstance(p, str)), out, depth + 1)
        else:
            out.unresolved.append(f"{program!r} -c runs a string only known when it runs")


def _program(word: Template) -> str | None:
    """The basename a program word names, or None when only the run decides it (an unquoted expansion can split
    into several words; a glob or braces can become any file)."""
    if len(word) == 1 and isinstance(word[0], str):
        text = word[0]
    elif word and isinstance(word[-1], str) and "/" in word[-1]:
        # "$HOME"/bin/tool or ~/bin/tool: what precedes the last slash does not change the basename; an unquoted
        # expansion never gets here (_word marks it as splitting).
        text = word[-1]
    else:
        return None
    return text.rsplit("/", 1)[-1]


def _join(words: list[Template]) -> Template:
    pieces: list[Piece] = []
    for i, word in enumerate(words):
        if i:
            pieces.append(" ")
        pieces.extend(word)
    merged: list[Piece] = []
    for piece in pieces:
        if isinstance(piece, str) and merged and isinstance(merged[-1], str):
            merged[-1] += piece
        elif piece is DYN and merged and merged[-1] is DYN:
            continue
        else:
            merged.append(piece)
    return tuple(merged)


def show(template: Template) -> str:
    """The command as a person reads it, '…' where the run fills in."""
    return "".join(p if isinstance(p, str) else "…" for p in template)


def is_literal(template: Template) -> bool:
    return all(isinstance(p, str) for p in template)


def _word(node: Any) -> Template:
    """A word as the command sees it: quotes and backslashes removed, DYN for what the run fills in. A word with
    an unquoted expansion is all DYN (word splitting can make it several words)."""
    pieces = _pieces(node, quoted=False)
    if any(p is _SPLIT for p in pieces):
        return (DYN,)
    return _join([tuple(p for p in pieces if p is not _SPLIT)])


_SPLIT = Dynamic()  # an unquoted expansion: the word's boundaries are unknown


def _pieces(node: Any, *, quoted: bool, braces: bool | None = None) -> list[Piece]:
    """`braces`: whether the whole word may brace-expand (the grammar splits `rm{,}` into `rm`, `{`, `,`, `}`)."""
    kind = node.type
    text = node.text.decode("utf-8", "surrogatepass")
    if braces is None:
        braces = "{" in text and ("," in text or ".." in text)  # `{}` alone (find -exec, xargs -I{}) is literal
    if kind in ("word", "number"):
        return _unquoted(text, braces=braces)
    if kind == "raw_string":
        return [text[1:-1]]
    if kind in ("string", "translated_string"):
        inner: list[Piece] = []
        for child in node.named_children:
            if child.type == "string_content":
                inner.append(_DOUBLE_QUOTE_ESCAPES.sub(r"\1", child.text.decode("utf-8", "surrogatepass")))
            else:
                inner.extend(_pieces(child, quoted=True))
        return inner
    if kind == "concatenation":
        return [p for child in node.children for p in _pieces(child, quoted=quoted, braces=braces)]
    # Expansions, substitutions, $'…' and anything this does not know: filled in at run time.
    return [DYN] if quoted else [DYN, _SPLIT]


def _unquoted(text: str, *, braces: bool) -> list[Piece]:
    pieces: list[Piece] = []
    literal = ""
    i = 0
    if text.startswith("~"):  # tilde expansion: the home directory (a path prefix, never split)
        pieces.append(DYN)
        end = text.find("/")
        i = len(text) if end < 0 else end
    while i < len(text):
        char = text[i]
        if char == "\\" and i + 1 < len(text):
            if text[i + 1] != "\n":
                literal += text[i + 1]
            i += 2
            continue
        if char in _GLOB or (braces and char in "{}"):
            # pathname or brace expansion: any file name, or several words
            pieces.extend([literal, DYN, _SPLIT])
            literal = ""
        else:
            literal += char
        i += 1
    pieces.append(literal)
    return [p for p in pieces if p != ""]


def could_match(pattern: str, template: Template) -> bool:
    """Whether the fnmatch `pattern` matches `template` for some text in its DYN stretches."""
    if is_literal(template):
        return fnmatch.fnmatchcase("".join(p for p in template if isinstance(p, str)), pattern)
    tokens = _glob_tokens(pattern)
    chars: list[str | None] = []  # None: any text
    for piece in template:
        if isinstance(piece, str):
            chars.extend(piece)
        elif not chars or chars[-1] is not None:
            chars.append(None)
    if len(tokens) * len(chars) > MAX_MATCH_STATES:
        return True  # too long to decide in time: it may match
    return _intersects(tokens, chars)


def _glob_tokens(pattern: str) -> list[str]:
    """fnmatch's units: '*', '?', a '[…]' set, or one literal character."""
    tokens: list[str] = []
    i = 0
    while i < len(pattern):
        char = pattern[i]
        if char == "[":
            j = i + 1
            if j < len(pattern) and pattern[j] == "!":
                j += 1
            if j < len(pattern) and pattern[j] == "]":
                j += 1
            close = pattern.find("]", j)
            if close >= 0:
                tokens.append(pattern[i : close + 1])
                i = close + 1
                continue
        tokens.append(char)
        i += 1
    return tokens


def _accepts(token: str, char: str) -> bool:
    if token in ("*", "?"):
        return True
    if len(token) > 1:
        return fnmatch.fnmatchcase(char, token)
    return token == char


def _intersects(tokens: list[str], chars: list[str | None]) -> bool:
    """Is there a string both the glob `tokens` and the template `chars` (None = any text) match? A search over
    (pattern position, template position): a '*' or a None may take no character, or one and stay."""
    start = (0, 0)
    seen = {start}
    stack = [start]
    while stack:
        i, j = stack.pop()
        if i == len(tokens) and j == len(chars):
            return True
        steps: list[tuple[int, int]] = []
        if i < len(tokens) and tokens[i] == "*":
            steps.append((i + 1, j))
        if j < len(chars) and chars[j] is None:
            steps.append((i, j + 1))
        if i < len(tokens) and j < len(chars):
            token, char = tokens[i], chars[j]
            # One character both sides accept: a literal on either side must be accepted by the other; a set
            # against any text is assumed to have a member (at worst it asks once more).
            if char is not None:
                ok = _accepts(token, char)
            else:
                ok = True
            if ok:
                steps.append((i if token == "*" else i + 1, j if char is None else j + 1))
        for step in steps:
            if step not in seen:
                seen.add(step)
                stack.append(step)
    return False
