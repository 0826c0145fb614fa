"""`approvals.commands` against what a command line would really run (runners/sdk/shell_commands.py): every way
of reaching a gated program a model might write asks, plain commands that run none do not, and whatever cannot
be resolved asks (fail closed)."""

from __future__ import annotations

import shlex

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agenthost.runners.sdk.approval_rules import approval_reason
from agenthost.runners.sdk.approvals import ApprovalsConfig
from agenthost.runners.sdk.shell_commands import DYN, MAX_COMMANDS, MAX_LINE_BYTES, could_match, parse

POLICY = ApprovalsConfig(commands=["rm *", "git push*"])


def asks(line: str, policy: ApprovalsConfig = POLICY) -> str:
    return approval_reason(policy, "shell", {"command": line}, shell_tools=("shell",))


# Each of these ran unapproved under the operator-split matcher, or is a neighbour of one that did.
BYPASSES = [
    "if true; then rm x; fi",
    "if rm x; then :; fi",
    "while true; do rm x; done",
    "until false; do rm x; done",
    "for i in 1; do rm x; done",
    "select x in a; do rm x; done",
    "case a in a) rm x;; esac",
    "{ rm x; }",
    "(rm x)",
    "! rm x",
    "ls | rm x",
    "ls |& rm x",
    "true && rm x || false",
    "rm x &",
    "echo $(rm x)",
    "echo `rm x`",
    'echo "$(rm x)"',
    "cat <(rm x)",
    "tee >(rm x)",
    "x=$(rm x)",
    "export X=$(rm x)",
    "ls > $(rm x)",
    "cat <<END\n$(rm x)\nEND",
    "[[ -f x ]] && rm x",
    "command rm x",
    "exec rm x",
    "builtin command exec rm x",
    "env rm x",
    "env -i A=1 B=2 rm x",
    "env -u HOME -- rm x",
    "sudo -u root rm x",
    "nohup rm x",
    "time rm x",
    "nice -n 5 rm x",
    "timeout -s KILL 5 rm x",
    "echo x | xargs rm",
    "echo x | xargs -0 -n1 rm",
    "find . -exec rm {} +",
    "env -S 'rm -rf' x",
    "su -c 'rm x' root",
    "flock /tmp/lock -c 'rm x'",
    "script -qc 'rm x' /dev/null",
    "watch -n 1 rm x",
    "coproc rm x",
    "bash -c 'rm x'",
    'sh -lc "rm x"',
    "bash -c 'bash -c \"rm x\"'",
    "FOO=1 rm x",
    "FOO=1 BAR=$(ls) rm x",
    "/bin/rm x",
    "./rm x",
    "~/bin/rm x",
    '"$HOME"/bin/rm x',
    "\\rm x",
    "'rm' x",
    '"rm" x',
    'r"m" x',
    "r\\m x",
    "git push",
    "git $SUB origin",  # $SUB may be push
    "git push$X",
    "r\\\nm x",  # bash joins a backslash-newline inside a word: `rm x`
    "echo \\\\\nrm x",  # an escaped backslash, then a newline: two commands
    # programs on a stock Debian that run their arguments as a program (found by the issue 25 review)
    "toybox rm x",
    "parallel rm ::: x",
    "echo x | parallel rm",
    "prlimit --nofile=10 rm x",
    "setpriv --reuid=1 rm x",
    "fakeroot -- rm x",
    "valgrind rm x",
    "setarch x86_64 rm x",
    "linux64 rm x",
    "perf stat rm x",
    "gdb --args rm x",
    "sg root 'rm x'",
    "sg root -c 'rm x'",
    "capsh -- -c 'rm x'",
    "start-stop-daemon --start --exec /bin/rm -- x",
    # a program's own options before the subcommand a pattern names
    "git -C . push",
    "git --git-dir=.git push",
    "git -c a=b push",
    "git --no-pager push",
    "git -C . -c a=b push origin",
    "sudo git -C . push",
    # a wrapper's long option whose value is a line it runs
    "env --split-string='rm -rf x'",
    "su --command='rm x'",
    "env -i --split-string='git push origin'",
]
FAIL_CLOSED = [
    # a cluster of short options whose value, starting at a letter only the wrapper knows, is a line it runs
    "env -iS'rm -rf x'",
    "su -c'rm x'",
    # the dynamic loader runs a library of the line's choosing inside whatever program comes next
    "LD_PRELOAD=/tmp/x.so ls",
    "env LD_PRELOAD=./x.so ls",
    "LD_AUDIT=./a.so true",
    # a shell that reads startup files an earlier command may have written (`r() { rm "$@"; }` in ~/.bashrc)
    "bash -ic 'r x'",
    "bash -lc 'r x'",
    "sh -l -c 'r x'",
    "bash --login -c 'r x'",
    "bash --rcfile ./rc -c 'r x'",
    "zsh -c 'r x'",
    "fish -c 'r x'",
    # A program named by a path outside the system's program directories may be anything under any name (a copy of
    # rm made by this line or an earlier call), and a line that sets PATH makes a plain name such a file.
    "cp /bin/rm ./tidy && ./tidy -rf x",
    "/tmp/tidy -rf x",
    "bin/tidy x",
    "cd /tmp && ./tidy x",
    "/usr/bin/../../tmp/tidy x",
    "PATH=/tmp tidy x",
    "export PATH=/tmp:$PATH; tidy x",
    "env PATH=. tidy x",
    "$X x",  # a variable in command position
    "${X} x",
    "$(echo rm) x",
    "r$X x",
    "$'\\x72m' x",
    "r* x",  # a glob in command position may name any file
    "/bin/r? x",
    "{rm,x} y",
    "rm{,} x",  # brace expansion: `rm rm x`
    "PS4='$(rm x)' bash -xc ls",  # a shell runs PS4 when tracing
    "env BASH_ENV=x.sh bash -c ls",
    "r{m,} x",
    "eval rm x",
    "eval 'ls'",
    "alias r=rm",
    "source script.sh",
    ". script.sh",
    "trap 'ls' EXIT",
    "f() { ls; }; f",
    "function f { ls; }",
    "bash script.sh",
    "echo ls | sh",
    'bash -c "$CMD"',
    "sudo $CMD",
    "if true; then",  # a parse error
    "echo 'unterminated",
    "bash -c 'if; then'",
    "! if true; then rm x; fi",  # the grammar reads `if` here as a command name: distrusted
    'echo "${x:-`rm x`}"',  # backticks the grammar leaves as a word
    "cat <<END\n\t$(rm x)\nEND",  # a here-document line starting with a tab: the grammar skips it
    "echo `echo \\`rm x\\``",  # nested backticks
    " && ".join(["true"] * 600) + " && rm x",  # past MAX_COMMANDS
    "git -c alias.x=push x",  # git's own alias: `git push` under another name
    "git -calias.x=push x",
    "git --config-env=alias.x=V x",
    'git -c "$A" x',
    "GIT_CONFIG_COUNT=1 GIT_CONFIG_KEY_0=alias.x GIT_CONFIG_VALUE_0=push git x",
    "env GIT_CONFIG_KEY_0=alias.x git x",
]
BENIGN = [
    "/usr/bin/env python3 -V",
    "/usr/local/bin/jq . f.json",
    "/bin/ls -la",
    "ls -la",
    "echo rm",
    "echo rm x",
    "ls -la; echo rm x",
    "grep -r 'rm -rf' .",
    'echo "rm x" > notes.txt',
    "cat <<'END'\nrm x\nEND",
    "git status && git diff | head -5 > out.txt 2>&1",
    "git pull --rebase",
    "git commit -m push",  # a word after the subcommand is not taken for it
    'git commit -m "$MSG"',
    "git -c user.name=x commit",
    "git -C . pull",
    'for f in *.py; do echo "$f"; done',
    'echo $((1+2)) "$HOME" ${X:-y} $HOME',
    "x=(a b); echo ${x[@]}",
    'case $a in *.py) python "$a";; *) echo no;; esac',
    "if [ -f x ]; then cat x; else echo none; fi",
    "[[ -n $X ]] && echo yes",
    "timeout 5 pytest -q",
    "find . -name '*.pyc' -print",
    "command -v rm",
    "sudo apt-get install -y jq",
    "env A=1 python -m pytest",
    "bash -c 'ls; echo rm x'",
    "rmdir empty",
    "ENVIRONMENT=prod make",
    "ls | xargs -I{} mv {} dir",
    "find . -exec grep -l x {} +",
    "echo {a,b} {1..3} {}",
    "rm",  # 'rm *' needs an argument
    "docker run \\\n  -v a:b \\\n  img",
    "echo \\\nrm x",  # a line continuation: `echo rm x`
    "cat > s.sh <<'EOF'\necho $(date) `id`\nEOF",  # a quoted here-document runs nothing
    "cat <<EOF\nhello $(date), don't\nEOF",
    'echo "it\'s $(date)"',
    "ls  # $(rm x)",
    "echo $'\\'' $(date)",
]


@pytest.mark.parametrize("line", BYPASSES)
def test_each_way_of_running_a_gated_program_asks(line: str) -> None:
    reason = asks(line)
    assert "matches approvals.commands" in reason, (line, reason)


@pytest.mark.parametrize("line", FAIL_CLOSED)
def test_what_cannot_be_resolved_asks(line: str) -> None:
    assert asks(line), line


@pytest.mark.parametrize("line", BENIGN)
def test_lines_that_run_no_gated_program_do_not_ask(line: str) -> None:
    assert not asks(line), (line, asks(line))


def test_reasons_say_what_matched_or_why_it_cannot_be_checked() -> None:
    assert asks("if true; then /bin/rm -rf x; fi") == "command matches approvals.commands 'rm *' ('rm -rf x')"
    assert asks("eval ls") == (
        "approvals.commands cannot be checked against this command: 'eval' runs code that cannot be seen in the line"
    )
    assert "could not read it" in asks("if true; then")


def test_regex_patterns_see_the_normalised_program_and_ask_when_the_run_fills_in_text() -> None:
    policy = ApprovalsConfig(commands=["re:^curl\\s"])
    assert asks("command /usr/bin/curl http://x", policy)
    assert asks("echo $X", policy)  # a regular expression cannot be decided against unknown text
    assert not asks("echo curl http://x", policy)


def test_without_command_patterns_nothing_is_parsed() -> None:
    assert not asks("eval $X", ApprovalsConfig(tools=["write_*"]))


def test_work_is_bounded_and_what_is_past_the_bound_asks() -> None:
    """Wrapper candidates multiply (every suffix of `command command … x` is one): the work stops at the bound."""
    line = "command " * 3000 + "ls"
    assert parse(line).steps <= MAX_COMMANDS + 1 and asks(line)
    assert "longer than" in asks("ls " + "x " * MAX_LINE_BYTES)


def test_could_match_fills_dynamic_stretches() -> None:
    assert could_match("git push*", ("git ", DYN))
    assert could_match("git push*", ("git ", DYN, " origin"))
    assert not could_match("git push*", ("git status ", DYN))
    assert could_match("rm [!a]*", ("rm ", DYN))
    assert not could_match("rm x?", ("rm y", DYN))


PREFIXES = ["", "command ", "exec ", "/bin/", "./", "\\", "env A=1 ", "sudo ", "FOO=1 ", "nohup ", "time ", "nice "]
_WRAPS = [  # '@' stands for the line so far
    "if true; then @; fi",
    "if @; then :; fi",
    "while false; do :; done; @",
    "for i in 1 2; do @; done",
    "case a in a) @;; esac",
    "( @ )",  # spaced: "((" opens arithmetic
    "{ @; }",
    "echo $( @ )",
    "cat <( @ )",
    "true && @",
    "false || @",
    "ls | @",
    "@ &",
    "ls; @",
    "! @",
    "x=$( @ )",
]


def _wrap(line: str, how: int) -> str:
    if how == len(_WRAPS):
        return "bash -c " + shlex.quote(line)
    return _WRAPS[how].replace("@", line, 1)


@settings(max_examples=300, deadline=None)
@given(
    prefix=st.sampled_from(PREFIXES),
    target=st.sampled_from(["x", "-rf /tmp/x", "'a b'"]),
    wraps=st.lists(st.integers(0, len(_WRAPS)), max_size=4),
)
def test_rm_in_command_position_in_any_structure_asks(prefix: str, target: str, wraps: list[int]) -> None:
    line = f"{prefix}rm {target}"
    for how in wraps:
        line = _wrap(line, how)
    assert asks(line), line  # matched, or (where the grammar reads it differently from bash) fail closed
