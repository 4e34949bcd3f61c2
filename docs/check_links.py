#!/usr/bin/env python3
"""Checks the relative links of the manual: every link of README.md and
docs/*.md (or of the Markdown files named) to a file names one that exists,
and every `#anchor` names a heading of its target, as GitHub makes anchors
from headings. Links to other sites are not followed: the tests run
offline. Exits 1 and names each broken link by file and line.

    python3 docs/check_links.py [FILE.md ...]
"""

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# `[text](target)` and `![alt](target)`, the target up to a space (a title
# may follow) or the closing parenthesis.
INLINE = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+[^)]*)?\)")
# `[label]: target`, a reference definition.
REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s.*)?$")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
HTML_ID = re.compile(r"<a\s+[^>]*(?:name|id)=\"([^\"]+)\"", re.IGNORECASE)
FENCE = re.compile(r"^\s{0,3}(```|~~~)")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def prose_lines(text: str):
    """(line number, line) of the lines outside fenced code blocks."""
    fence = None
    for n, line in enumerate(text.splitlines(), 1):
        m = FENCE.match(line)
        if m:
            if fence is None:
                fence = m.group(1)
            elif m.group(1) == fence:
                fence = None
            continue
        if fence is None:
            yield n, line


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: the text as rendered (links by their
    text, no code marks), lowercased, punctuation but `-` and `_` dropped,
    spaces made `-`."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors of a Markdown file: its headings' (a repeated one gets
    `-1`, `-2`, ... as on GitHub) and explicit `<a name=...>` or `id=`."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    for _, line in prose_lines(path.read_text(encoding="utf-8")):
        m = HEADING.match(line)
        if m:
            base = slug(m.group(2))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
        found |= set(HTML_ID.findall(line))
    return found


def links(path: Path):
    """(line number, target) of every link of a Markdown file outside code.
    A link's text may run over lines, so each paragraph is searched whole."""
    paragraph: list[tuple[int, str]] = []
    for n, line in [*prose_lines(path.read_text(encoding="utf-8")), (0, "")]:
        if line.strip() and (not paragraph or paragraph[-1][0] == n - 1):
            paragraph.append((n, line))
            continue
        if paragraph:
            yield from paragraph_links(paragraph)
        paragraph = [(n, line)] if line.strip() else []


def paragraph_links(paragraph: list[tuple[int, str]]):
    first = paragraph[0][0]
    text = "\n".join(line for _, line in paragraph)
    # Code spans show link syntax without being links: blank them, keeping
    # the line breaks so that line numbers hold.
    text = re.sub(r"(`+)(.+?)\1", lambda m: re.sub(r"[^\n]", " ", m.group(0)),
                  text, flags=re.DOTALL)
    for i, line in enumerate(text.split("\n")):
        m = REFERENCE.match(line)
        if m:
            yield first + i, m.group(1)
    for m in INLINE.finditer(text):
        yield first + text.count("\n", 0, m.start(1)), m.group(1)


def check(path: Path, cache: dict[Path, set[str]]) -> list[str]:
    problems = []
    for n, target in links(path):
        if SCHEME.match(target):
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path.resolve()
        where = f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:{n}"
        if not dest.exists():
            problems.append(f"{where}: {target}: no such file")
            continue
        if not anchor:
            continue
        if dest.is_dir() or dest.suffix != ".md":
            problems.append(f"{where}: {target}: an anchor into a file that is not Markdown")
            continue
        if dest not in cache:
            cache[dest] = anchors(dest)
        if anchor not in cache[dest]:
            problems.append(f"{where}: {target}: no heading makes #{anchor}")
    return problems


def main(argv: list[str]) -> int:
    if argv:
        files = [Path(a).resolve() for a in argv]
    else:
        files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    cache: dict[Path, set[str]] = {}
    problems = []
    count = 0
    for f in files:
        count += sum(1 for _ in links(f))
        problems += check(f, cache)
    for p in problems:
        print(p)
    if problems:
        print(f"{len(problems)} broken link(s) in {len(files)} file(s)", file=sys.stderr)
        return 1
    print(f"ok: {count} links in {len(files)} files")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
