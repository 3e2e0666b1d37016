#!/usr/bin/env python3
"""Every relative link in the docs resolves: the file (or folder) exists in the checkout, and an
#anchor names a heading of the target page, by mdBook's heading-id rules (which GitHub's README
rendering shares for the headings we write).

    scripts/check-docs.py              # README.md, CONTRIBUTING.md, tests/README.md, docs/src/**.md
    scripts/check-docs.py FILE...      # those files only
    scripts/check-docs.py --self-test  # the checker against pages with known faults

Also checked: every page under docs/src is listed in docs/src/SUMMARY.md (mdBook renders only
listed pages), no link points outside the repository, and README.md stays within 250 lines. Exit status 1 and one line
per fault (FILE:LINE: what) when anything is broken. Links inside code (fenced blocks, `spans`) are
text, not links; http(s) and mailto links are not fetched.
"""

import os
import re
import sys
import tempfile

ROOT = os.path.realpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
DEFAULT_FILES = ["README.md", "CONTRIBUTING.md", "tests/README.md"]
BOOK_SRC = "docs/src"
# The README is the short tour; everything else lives in the book.
README_MAX_LINES = 250

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
ATX = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?[ \t]*$")
HEADING_ATTRS = re.compile(r"[ \t]*\{([^{}]*)\}[ \t]*$")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
INLINE_LINK = re.compile(r"!?\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\(\s*(<[^>]*>|[^)\s]+)(?:\s+\"[^\"]*\")?\s*\)")
REF_DEF = re.compile(r"^ {0,3}\[([^\]]+)\]:\s*(<[^>]*>|\S+)")
EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def id_from_content(text):
    """mdBook 0.5's `id_from_content`: lowercase; letters, digits, `_` and `-` kept; whitespace
    becomes `-`; everything else is dropped."""
    out = []
    for ch in text.strip().lower():
        if ch.isalnum() or ch in "_-":
            out.append(ch)
        elif ch.isspace():
            out.append("-")
    return "".join(out)


def heading_text(raw):
    """The text mdBook sees in a heading: code spans keep their content, links their text,
    emphasis markers and inline HTML tags go."""
    text = CODE_SPAN.sub(lambda m: m.group(2).strip(), raw)
    text = INLINE_LINK.sub(lambda m: m.group(1), text)
    text = re.sub(r"<[^>]+>", "", text)
    return text.replace("*", "")


def prose_lines(text):
    """(line number, line) for every line outside fenced code blocks."""
    fence = None
    for number, line in enumerate(text.split("\n"), 1):
        m = FENCE.match(line)
        if fence is None:
            if m:
                fence = m.group(1)
                continue
            yield number, line
        elif m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) \
                and not line.strip()[len(m.group(1)):].strip():
            fence = None


def anchors(text):
    """The ids mdBook gives this page's headings, in order, made unique with -1, -2, ..."""
    used = set()
    for _, line in prose_lines(text):
        m = ATX.match(line)
        if not m:
            continue
        raw = re.sub(r"[ \t]+#+[ \t]*$", "", m.group(2) or "")
        attrs = HEADING_ATTRS.search(raw)
        explicit = None
        if attrs:
            ids = [a[1:] for a in attrs.group(1).split() if a.startswith("#")]
            if ids:
                explicit = ids[-1]
                raw = raw[: attrs.start()]
        if explicit is not None:
            used.add(explicit)
            continue
        base = id_from_content(heading_text(raw))
        candidate, counter = base, 0
        while candidate in used:
            counter += 1
            candidate = f"{base}-{counter}"
        used.add(candidate)
    return used


def links(text):
    """(line number, target) for every link and image outside code."""
    for number, line in prose_lines(text):
        m = REF_DEF.match(line)
        if m:
            yield number, m.group(2).strip("<>")
            continue
        prose = CODE_SPAN.sub(lambda m: " " * len(m.group(0)), line)
        for m in INLINE_LINK.finditer(prose):
            yield number, m.group(2).strip("<>")


class Checker:
    def __init__(self, root):
        self.root = os.path.realpath(root)
        self.faults = []
        self._anchors = {}

    def page_anchors(self, path):
        if path not in self._anchors:
            with open(path, encoding="utf-8") as f:
                self._anchors[path] = anchors(f.read())
        return self._anchors[path]

    def fault(self, path, line, what):
        self.faults.append(f"{os.path.relpath(path, self.root)}:{line}: {what}")

    def check_file(self, path):
        path = os.path.realpath(path)
        with open(path, encoding="utf-8") as f:
            text = f.read()
        book = os.path.join(self.root, BOOK_SRC)
        for line, target in links(text):
            if EXTERNAL.match(target) or target.startswith("//"):
                continue
            file_part, _, anchor = target.partition("#")
            file_part = file_part.split("?", 1)[0]
            if file_part.startswith("/"):
                self.fault(path, line, f"{target}: an absolute path; link relative to this page")
                continue
            resolved = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) \
                if file_part else path
            if os.path.commonpath([resolved, self.root]) != self.root:
                self.fault(path, line, f"{target}: points outside the repository")
                continue
            if not os.path.exists(resolved):
                hint = ""
                if file_part.endswith(".html") and path.startswith(book + os.sep):
                    hint = " (link the .md page; mdBook rewrites it to .html)"
                self.fault(path, line, f"{target}: no such file or folder{hint}")
                continue
            if not anchor:
                continue
            if not resolved.endswith(".md") or os.path.isdir(resolved):
                self.fault(path, line, f"{target}: an anchor into a file that is not a page")
                continue
            if anchor not in self.page_anchors(resolved):
                self.fault(path, line, f"{target}: no heading with id #{anchor} in "
                                       f"{os.path.relpath(resolved, self.root)}")

    def check_summary(self):
        """Every page of the book is listed in SUMMARY.md (mdBook renders only those)."""
        book = os.path.join(self.root, BOOK_SRC)
        summary = os.path.join(book, "SUMMARY.md")
        if not os.path.exists(summary):
            self.fault(summary, 0, "the book has no SUMMARY.md")
            return
        with open(summary, encoding="utf-8") as f:
            listed = {os.path.normpath(os.path.join(book, t.partition("#")[0]))
                      for _, t in links(f.read()) if not EXTERNAL.match(t)}
        for page in book_pages(self.root):
            if page != summary and page not in listed:
                self.fault(page, 0, "not listed in docs/src/SUMMARY.md, so mdBook does not render it")


    def check_readme_length(self):
        readme = os.path.join(self.root, "README.md")
        if not os.path.exists(readme):
            return
        with open(readme, encoding="utf-8") as f:
            lines = f.read().count("\n")
        if lines > README_MAX_LINES:
            self.fault(readme, lines, f"{lines} lines, over {README_MAX_LINES}: move the detail "
                                      "into a page of the book (docs/src)")


def book_pages(root):
    book = os.path.join(root, BOOK_SRC)
    pages = []
    for folder, _, files in os.walk(book):
        pages += [os.path.join(folder, f) for f in files if f.endswith(".md")]
    return sorted(pages)


def check(root, files=None):
    checker = Checker(root)
    if files is None:
        files = [os.path.join(checker.root, f) for f in DEFAULT_FILES
                 if os.path.exists(os.path.join(checker.root, f))]
        files += book_pages(checker.root)
        checker.check_summary()
        checker.check_readme_length()
    for path in files:
        checker.check_file(path)
    return checker.faults


def self_test():
    """The checker against a small tree with one of each fault, and with the cases that must
    pass. Fails (exit 1) when a fault goes unreported or a good link is reported."""
    pages = {
        "README.md": "# Top\n\n## Two commands\n\n## Two commands\n\n"
                     "[ok](docs/src/a.md#the-queue--prefill-split) [ok](#two-commands-1) "
                     "[ok](docs/) [ok](https://example.invalid/x#y)\n"
                     "`[not a link](nowhere.md)`\n\n```\n[not a link](nowhere.md)\n```\n"
                     "[bad file](docs/src/missing.md)\n"
                     "[bad anchor](#two-commands-2)\n",
        "docs/src/SUMMARY.md": "# Summary\n\n- [A](a.md)\n",
        "docs/src/a.md": "# A\n\n### The `queue` + *prefill* split\n\n## Custom {#custom}\n\n"
                         "[ok](#custom) [ok](../../README.md#top) [ok](a.md)\n"
                         "[bad anchor](../../README.md#nope)\n"
                         "[outside](../../../etc/passwd)\n"
                         "[html](b.html)\n",
        "docs/src/orphan.md": "# Orphan\n",
    }
    expected = [
        "README.md:13: docs/src/missing.md: no such file or folder",
        "README.md:14: #two-commands-2: no heading with id #two-commands-2 in README.md",
        "docs/src/orphan.md:0: not listed in docs/src/SUMMARY.md, so mdBook does not render it",
        "docs/src/a.md:8: ../../README.md#nope: no heading with id #nope in README.md",
        "docs/src/a.md:9: ../../../etc/passwd: points outside the repository",
        "docs/src/a.md:10: b.html: no such file or folder (link the .md page; mdBook rewrites "
        "it to .html)",
    ]
    with tempfile.TemporaryDirectory() as root:
        for name, text in pages.items():
            os.makedirs(os.path.join(root, os.path.dirname(name)), exist_ok=True)
            with open(os.path.join(root, name), "w", encoding="utf-8") as f:
                f.write(text)
        faults = check(root)
    if sorted(faults) != sorted(expected):
        print("check-docs self-test FAILED", file=sys.stderr)
        print("  expected:\n    " + "\n    ".join(sorted(expected)), file=sys.stderr)
        print("  reported:\n    " + "\n    ".join(sorted(faults)), file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as root:
        os.makedirs(os.path.join(root, BOOK_SRC))
        with open(os.path.join(root, BOOK_SRC, "SUMMARY.md"), "w", encoding="utf-8") as f:
            f.write("# Summary\n")
        with open(os.path.join(root, "README.md"), "w", encoding="utf-8") as f:
            f.write("line\n" * (README_MAX_LINES + 1))
        long_readme = check(root)
    if long_readme != [f"README.md:{README_MAX_LINES + 1}: {README_MAX_LINES + 1} lines, over "
                       f"{README_MAX_LINES}: move the detail into a page of the book (docs/src)"]:
        print(f"check-docs self-test FAILED: a long README gave {long_readme}", file=sys.stderr)
        return 1
    assert id_from_content(heading_text("Losses, counted in requests")) == \
        "losses-counted-in-requests"
    assert id_from_content(heading_text("SGLang: admission, retractions")) == \
        "sglang-admission-retractions"
    print(f"check-docs self-test: {len(expected) + 1} planted faults reported, good links passed")
    return 0


def main(argv):
    if argv[1:] == ["--self-test"]:
        return self_test()
    files = [os.path.abspath(f) for f in argv[1:]] or None
    faults = check(ROOT, files)
    for fault in faults:
        print(fault, file=sys.stderr)
    if faults:
        print(f"check-docs: {len(faults)} broken link(s)", file=sys.stderr)
        return 1
    print("check-docs: every relative link and anchor resolves")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
