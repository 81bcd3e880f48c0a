"""The words a shell would run, for the shell policy: a command line split into its simple
commands, each a list of words with quotes and escapes removed as bash removes them.

    r''m -rf /      -> [["rm", "-rf", "/"]]
    \\rm -rf /       -> [["rm", "-rf", "/"]]
    $'\\x72m' -rf /  -> [["rm", "-rf", "/"]]
    $(echo rm) -rf  -> [["echo", "rm"], ["echo rm", "-rf"]]

Commands are split at ``;``, ``&``, ``|``, ``&&``, ``||``, newlines and parentheses. What a
command substitution (``$(...)``, backticks, ``<(...)``) holds is lexed as commands of its own,
and its words also stand in the word it is part of, so a program name built by one still shows
in the outer command (conservatively: a shell would use the substitution's output, which cannot
be known here). Redirection operators are words of their own. Arithmetic (``$((...))``) and
parameter expansions (``$x``, ``${x}``) stay as written: their values are unknown.

Pure and total: any text lexes (an unterminated quote runs to the end), in time linear in its
length but for nested substitutions, which the command-length limit bounds.
"""

from __future__ import annotations

import re

__all__ = ["simple_commands"]

_BREAKS = frozenset(";&|\n()")
_REDIRECTS = frozenset("<>")
# ANSI-C quoting ($'...'): the escapes bash decodes.
_ANSI_C = re.compile(r"\\(x[0-9A-Fa-f]{1,2}|u[0-9A-Fa-f]{1,4}|U[0-9A-Fa-f]{1,8}|[0-7]{1,3}|c.|.)")
_ANSI_C_SIMPLE = {
    "n": "\n", "t": "\t", "r": "\r", "a": "\a", "b": "\b", "f": "\f", "v": "\v", "e": "\x1b",
    "E": "\x1b", "\\": "\\", "'": "'", '"': '"', "?": "?",
}  # fmt: skip


def simple_commands(text: str) -> list[list[str]]:
    """Every simple command in ``text`` (substitutions' commands included), as its words."""
    lexer = _Lexer(text)
    lexer.run(closing=False)
    return [words for words in lexer.commands if words]


class _Lexer:
    def __init__(self, text: str) -> None:
        self.text = text
        self.at = 0
        self.commands: list[list[str]] = []

    def run(self, *, closing: bool) -> list[list[str]]:
        """Lex to the end, or (``closing``) to the ``)`` that closes a substitution; returns the
        commands of this level (they are in ``self.commands`` too)."""
        mine: list[list[str]] = []
        words: list[str] = []
        word: list[str] | None = None
        depth = 0
        text = self.text

        def end_word() -> None:
            nonlocal word
            if word is not None:
                words.append("".join(word))
                word = None

        def end_command() -> None:
            nonlocal words
            end_word()
            if words:
                mine.append(words)
                self.commands.append(words)
            words = []

        while self.at < len(text):
            char = text[self.at]
            if char == "\\":
                escaped = text[self.at + 1 : self.at + 2]
                self.at += 2
                if escaped and escaped != "\n":  # backslash-newline joins lines
                    word = [*(word or []), escaped]
            elif char == "'":
                word = [*(word or []), self._until("'")]
            elif char == '"':
                self.at += 1
                word = [*(word or []), self._double_quoted()]
            elif char == "$" and text.startswith("$'", self.at):
                self.at += 1
                word = [*(word or []), _ansi_c(self._until_unescaped("'"))]
            elif char == "$" and text.startswith("$((", self.at):
                word = [*(word or []), self._arithmetic()]
            elif char == "$" and text.startswith("$(", self.at):
                self.at += 2
                word = [*(word or []), self._substitution()]
            elif char == "`":
                word = [*(word or []), self._backticks()]
            elif char in _REDIRECTS:
                end_word()
                operator = self._redirect()
                if operator is not None:
                    words.append(operator)
                else:  # <(...) or >(...): process substitution
                    word = [self._substitution()]
            elif char == "#" and word is None:
                end = text.find("\n", self.at)
                self.at = len(text) if end < 0 else end
            elif char in _BREAKS:
                self.at += 1
                if char == "&" and text.startswith(">", self.at):  # &> and &>>: a redirection
                    self.at -= 1
                    end_word()
                    words.append(self._redirect() or "&>")
                    continue
                end_command()
                if char == "(":
                    depth += 1
                elif char == ")":
                    if closing and depth == 0:
                        break
                    depth -= 1
            elif char.isspace():
                end_word()
                self.at += 1
            else:
                word = [*(word or []), char]
                self.at += 1
        end_command()
        return mine

    def _until(self, quote: str) -> str:
        """The text up to the next ``quote`` (none: the end), after the opening one."""
        start = self.at + 1
        end = self.text.find(quote, start)
        end = len(self.text) if end < 0 else end
        self.at = end + 1
        return self.text[start:end]

    def _until_unescaped(self, quote: str) -> str:
        start = self.at + 1
        index = start
        while index < len(self.text) and self.text[index] != quote:
            index += 2 if self.text[index] == "\\" else 1
        self.at = index + 1
        return self.text[start:index]

    def _double_quoted(self) -> str:
        """Inside "...": backslash escapes only $ ` " \\ and newline; substitutions work."""
        parts: list[str] = []
        text = self.text
        while self.at < len(text) and text[self.at] != '"':
            char = text[self.at]
            if char == "\\" and text[self.at + 1 : self.at + 2] in ("$", "`", '"', "\\", "\n"):
                if text[self.at + 1] != "\n":
                    parts.append(text[self.at + 1])
                self.at += 2
            elif text.startswith("$((", self.at):
                parts.append(self._arithmetic())
            elif text.startswith("$(", self.at):
                self.at += 2
                parts.append(self._substitution())
            elif char == "`":
                parts.append(self._backticks())
            else:
                parts.append(char)
                self.at += 1
        self.at += 1
        return "".join(parts)

    def _substitution(self) -> str:
        """After ``$(``: lex its commands; their words, as text, stand for it in the word."""
        inner = self.run(closing=True)
        return " ".join(" ".join(words) for words in inner)

    def _backticks(self) -> str:
        body = self._until_unescaped("`")
        inner = _Lexer(re.sub(r"\\([$`\\])", r"\1", body))
        commands = inner.run(closing=False)
        self.commands.extend(inner.commands)
        return " ".join(" ".join(words) for words in commands)

    def _arithmetic(self) -> str:
        """``$((...))`` as written, to its matching close."""
        start, depth, index = self.at, 0, self.at + 1
        while index < len(self.text):
            if self.text[index] == "(":
                depth += 1
            elif self.text[index] == ")":
                depth -= 1
                if depth == 0:
                    break
            index += 1
        self.at = index + 1
        return self.text[start : self.at]

    def _redirect(self) -> str | None:
        """A redirection operator (``>``, ``>>``, ``2>&1``'s ``>&``, ``<<<``, ``&>`` ...), or
        None at a process substitution (its ``(`` consumed)."""
        start = self.at
        if self.text[self.at] in _REDIRECTS and self.text.startswith("(", self.at + 1):
            self.at += 2
            return None
        while self.at < len(self.text) and self.text[self.at] in "<>&|-":
            self.at += 1
        return self.text[start : self.at]


def _ansi_c(body: str) -> str:
    def decode(match: re.Match[str]) -> str:
        escape = match[1]
        if escape[0] in "xuU":
            return chr(min(int(escape[1:], 16), 0x10FFFF))
        if escape[0] in "01234567":
            return chr(int(escape, 8) & 0xFF)
        if escape[0] == "c":
            return chr(ord(escape[1]) & 0x1F)
        return _ANSI_C_SIMPLE.get(escape, "\\" + escape)

    return _ANSI_C.sub(decode, body)
