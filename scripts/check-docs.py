#!/usr/bin/env python3
"""Checks that README.md and docs/*.md say what the tree does. The test command runs it.

1. Links: every relative link of README.md and docs/*.md resolves to a file, and a `#anchor` to a
   heading of that file.
2. Paths and references: every repository path a doc names in backticks exists, every
   `docs/NAME.md` (and `ABI.md`-style sibling name in docs/) that a source,
   script, header or doc mentions exists, and a section it names in quotes (`docs/C-ABI.md, "How
   structs grow"`, `README, "Use it from Python"`) is a heading there.
3. Code blocks: each ```sh, ```c, ```python, ```rust and ```yaml block of README.md and docs/*.md
   is preceded by one marker line saying what the check does with it:
     <!-- check: run -->            sh: run by bash from the repository root, with the built
                                    binaries first on PATH; python: run when `import cxlkv` works
                                    in this interpreter (else compiled only, said so). Pools they
                                    make are named shm:cxlkv-readme*; the check removes those
                                    before and after each block.
     <!-- check: c -->              c: compiled (syntax and types) against ffi/include/cxlkv.h,
                                    wrapped in a function body unless it defines main
     <!-- check: compile -->        python: compiled only
     <!-- check: skip (REASON) -->  not run; REASON says why (needs a GPU, a model, minutes)
     <!-- check: synopsis -->       a ```text synopsis of the command line (see 4)
4. Flags: every `--flag` on a line that runs `cxlkv SUBCOMMAND` or `cxlkv-ndpd` (in sh blocks,
   whatever their marker, and in the synopsis) appears in that command's `--help`.

Usage: scripts/check-docs.py [--bin-dir DIR] [--python-only]
  --bin-dir DIR   where `cxlkv` and `cxlkv-ndpd` are (default target/debug); without them, steps 3
                  (sh) and 4 fail: build first (`cargo build --workspace`).
  --python-only   only run the python blocks marked run (for an interpreter that has `cxlkv`).
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARKER = re.compile(r"^<!-- check: (run|c|compile|synopsis|skip \((.+)\)) -->$")
NEEDS_MARKER = {"sh", "c", "python", "rust", "yaml"}
SOURCE_EXT = (".rs", ".py", ".h", ".c", ".sh", ".md", ".toml", ".cpp")


def docs():
    names = ["README.md"] + sorted(
        os.path.join("docs", n) for n in os.listdir(os.path.join(ROOT, "docs")) if n.endswith(".md")
    )
    return names


def read(rel):
    with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
        return f.read()


def slug(heading):
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    h = re.sub(r"`", "", heading.strip().lower())
    h = re.sub(r"[^\w\- ]", "", h)
    return h.replace(" ", "-")


def headings(rel):
    out = []
    fence = False
    for line in read(rel).splitlines():
        if line.startswith("```"):
            fence = not fence
        elif not fence and line.startswith("#"):
            out.append(line.lstrip("#").strip())
    return out


def blocks(rel):
    """(line number, language, marker line or None, text) of every fenced block."""
    lines = read(rel).splitlines()
    out = []
    i = 0
    while i < len(lines):
        m = re.match(r"^```(\w*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        j = i + 1
        while j < len(lines) and not lines[j].startswith("```"):
            j += 1
        marker = lines[i - 1].strip() if i > 0 else ""
        out.append((i + 1, m.group(1), marker if MARKER.match(marker) else None,
                    "\n".join(lines[i + 1:j])))
        i = j + 1
    return out


def check_links(errors):
    link = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
    for rel in docs():
        text = read(rel)
        text = re.sub(r"```.*?```", "", text, flags=re.S)
        for target in link.findall(text):
            if re.match(r"^[a-z]+:", target):
                continue  # an absolute URL
            path, _, anchor = target.partition("#")
            dest = os.path.normpath(os.path.join(os.path.dirname(rel), path)) if path else rel
            if not os.path.exists(os.path.join(ROOT, dest)):
                errors.append("%s: link to %s: no such file" % (rel, target))
            elif anchor and dest.endswith(".md"):
                if anchor not in {slug(h) for h in headings(dest)}:
                    errors.append("%s: link to %s: no heading with that anchor" % (rel, target))


def tracked_files():
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True)
    return [f for f in out.stdout.splitlines() if f.endswith(SOURCE_EXT)]


def check_references(errors):
    """`docs/X.md` mentions anywhere, and quoted section names after them, resolve."""
    ref = re.compile(r"\b(docs/[A-Z][A-Z0-9-]*\.md|README(?:\.md)?|(?<![/\w])[A-Z][A-Z0-9-]+\.md)"
                     r"(?:(?:,| section)? \"([^\"]+)\")?")
    docnames = {os.path.basename(d) for d in docs() if d.startswith("docs/")}
    for rel in tracked_files():
        if rel == "scripts/check-docs.py" or not os.path.exists(os.path.join(ROOT, rel)):
            continue
        try:
            text = read(rel)
        except UnicodeDecodeError:
            continue
        for lineno, line in enumerate(text.splitlines(), 1):
            for m in ref.finditer(line):
                name, section = m.group(1), m.group(2)
                if name.startswith("README"):
                    target = "README.md"
                    if section is None:
                        continue
                elif name.startswith("docs/"):
                    target = name
                elif rel.startswith("docs/") and name in docnames | {"ABI.md"}:
                    target = "docs/" + name
                elif name in docnames and not rel.startswith(("fpga/", "data/")):
                    target = "docs/" + name
                else:
                    continue
                if not os.path.exists(os.path.join(ROOT, target)):
                    errors.append("%s:%d: names %s, which does not exist" % (rel, lineno, name))
                elif section is not None and section not in headings(target) and not any(
                    h.startswith(section) or slug(h) == slug(section) for h in headings(target)
                ):
                    errors.append('%s:%d: names %s, "%s": no such heading there'
                                  % (rel, lineno, target, section))


def expand(path):
    """`runtime/src/{format,pool}.rs` -> both paths."""
    m = re.match(r"^(.*?)\{([^}]*)\}(.*)$", path)
    if not m:
        return [path]
    return [q for alt in m.group(2).split(",") for q in expand(m.group(1) + alt + m.group(3))]


def check_paths(errors):
    """Every repository path a doc names in backticks exists (files move; docs must follow)."""
    top = {p.split("/")[0] for p in tracked_files() if "/" in p}
    import glob
    for rel in docs():
        for lineno, line in enumerate(read(rel).splitlines(), 1):
            for code in re.findall(r"`([^`\s]+)`", line):
                path = code.rstrip(".,:;")
                if "/" not in path or path.split("/")[0] not in top or "/." in path:
                    continue
                if not re.match(r"^[\w.{},*/-]+$", path):
                    continue
                for p in expand(path):
                    if not glob.glob(os.path.join(ROOT, p)):
                        errors.append("%s:%d: names `%s`, which is not in the tree" % (rel, lineno, p))


def help_flags(bin_dir, argv, cache={}):
    key = tuple(argv)
    if key not in cache:
        r = subprocess.run([os.path.join(bin_dir, argv[0])] + argv[1:] + ["--help"],
                           capture_output=True, text=True, cwd=ROOT, timeout=60)
        cache[key] = (r.returncode, r.stdout + r.stderr)
    return cache[key]


def subcommands(help_text):
    names, on = [], False
    for line in help_text.splitlines():
        if line.startswith("Commands:"):
            on = True
        elif on and re.match(r"^  [a-z][\w-]*", line):
            names.append(line.split()[0])
        elif on and line and not line.startswith(" "):
            on = False
    return names


def command_lines(text):
    """Lines that invoke cxlkv or cxlkv-ndpd, with their continuation lines joined."""
    out, cur = [], None
    for line in text.splitlines():
        body = line.split("#")[0] if not line.lstrip().startswith("#") else ""
        # A command position: a line's start, after ; & | or $(, or after do/then/time/sudo/exec.
        m = re.search(r"(?:^\s*|[;&|]\s*|\$\(\s*|\b(?:do|then|time|sudo|exec)\s+)"
                      r"(?:\./)?(?:target/\w+/)?(cxlkv(?:-ndpd)?)(?=\s|$)", body)
        if m:
            cur = [body[m.start(1):]]
            out.append(cur)
        elif cur is not None and re.match(r"^\s+(\[|--|-n\b)", line):
            cur.append(line.strip())
        else:
            cur = None
    return [" ".join(c) for c in out]


def check_flags(errors, where, text, bin_dir):
    for cmd in command_lines(text):
        words = cmd.split()
        binary = words[0]
        path = [binary]
        if binary == "cxlkv":
            code, top = help_flags(bin_dir, [binary])
            level = subcommands(top)
            for w in words[1:]:
                alts = w.split("|")
                if all(a in level for a in alts):
                    path.append(alts[0])
                    code, text_ = help_flags(bin_dir, path)
                    level = subcommands(text_)
                    if not level:
                        break
                else:
                    break
            if len(path) == 1:
                errors.append("%s: `%s`: no such cxlkv subcommand" % (where, cmd[:60]))
                continue
            alternatives = [path]
            for w in words[1:len(path)]:
                if "|" in w:
                    alternatives = [path[:-1] + [a] for a in w.split("|")]
        else:
            alternatives = [path]
        flags = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", cmd))
        for argv in alternatives:
            code, help_text = help_flags(bin_dir, argv)
            # `cxlkv testbed --help` prints testbed.sh's usage and exits 1.
            if help_text.startswith("error") or len(help_text.splitlines()) < 3:
                errors.append("%s: `%s --help` failed (exit %d)" % (where, " ".join(argv), code))
                continue
            known = set(re.findall(r"--[a-z][a-z0-9-]*", help_text))
            # `--features` belongs to cargo in "need --features sim-teeth".
            for f in sorted(flags - known - {"--features"}):
                errors.append("%s: `%s` has no flag %s (see `%s --help`)"
                              % (where, " ".join(argv), f, " ".join(argv)))


C_PRELUDE = "#include <stdint.h>\n#include <stdio.h>\n#include <string.h>\n#include \"cxlkv.h\"\n"


def check_c(errors, where, text):
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        errors.append("%s: no C compiler to check the block with" % where)
        return
    src = C_PRELUDE + (text if re.search(r"\bint\s+main\s*\(", text)
                       else "int main(void) {\n%s\nreturn 0;\n}\n" % text)
    with tempfile.NamedTemporaryFile("w", suffix=".c", delete=False) as f:
        f.write(src)
        name = f.name
    try:
        r = subprocess.run([cc, "-std=c11", "-fsyntax-only", "-Wall", "-Werror",
                            "-Wno-unused-variable", "-Wno-unused-but-set-variable",
                            "-I", os.path.join(ROOT, "ffi", "include"), name],
                           capture_output=True, text=True)
        if r.returncode != 0:
            errors.append("%s: the C block does not compile against cxlkv.h:\n%s"
                          % (where, r.stderr.strip()))
    finally:
        os.unlink(name)


def remove_doc_pools():
    """Blocks that run name their pools shm:cxlkv-readme*; a failed block leaves its pool behind,
    so every run starts and ends by removing them."""
    shm = "/dev/shm"
    if os.path.isdir(shm):
        for n in os.listdir(shm):
            if n.startswith("cxlkv-readme"):
                os.unlink(os.path.join(shm, n))


def check_python(errors, notes, where, text, run):
    try:
        code = compile(text, where, "exec")
    except SyntaxError as e:
        errors.append("%s: the python block does not compile: %s" % (where, e))
        return
    if not run:
        return
    try:
        import cxlkv  # noqa: F401
    except ImportError:
        notes.append("%s: compiled only (no `cxlkv` in this interpreter; the Python step runs it)"
                     % where)
        return
    remove_doc_pools()
    try:
        exec(code, {"__name__": "__docs__"})
    except Exception as e:  # the block's failure, whatever it is, is the finding
        errors.append("%s: the python block failed: %s: %s" % (where, type(e).__name__, e))
    finally:
        remove_doc_pools()


def check_sh(errors, where, text, bin_dir):
    env = dict(os.environ, PATH=os.path.abspath(bin_dir) + os.pathsep + os.environ.get("PATH", ""))
    remove_doc_pools()
    try:
        r = subprocess.run(["bash", "-euo", "pipefail", "-c", text], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=120)
    finally:
        remove_doc_pools()
    if r.returncode != 0:
        errors.append("%s: the sh block failed (exit %d):\n%s%s"
                      % (where, r.returncode, r.stdout[-2000:], r.stderr[-2000:]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin-dir", default=os.path.join(ROOT, "target", "debug"))
    ap.add_argument("--python-only", action="store_true")
    a = ap.parse_args()
    errors, notes = [], []
    counts = {"run": 0, "c": 0, "compile": 0, "synopsis": 0, "skip": 0, "flags": 0}
    if not a.python_only:
        for b in ("cxlkv", "cxlkv-ndpd"):
            if not os.access(os.path.join(a.bin_dir, b), os.X_OK):
                sys.exit("check-docs: no %s in %s: build first (cargo build --workspace)"
                         % (b, a.bin_dir))
        check_links(errors)
        check_references(errors)
        check_paths(errors)
    for rel in docs():
        for line, lang, marker, text in blocks(rel):
            where = "%s:%d" % (rel, line)
            kind = MARKER.match(marker).group(1) if marker else None
            kind = "skip" if kind and kind.startswith("skip") else kind
            if a.python_only:
                if lang == "python" and kind == "run":
                    check_python(errors, notes, where, text, run=True)
                    counts["run"] += 1
                continue
            if lang in NEEDS_MARKER and kind is None:
                errors.append("%s: a ```%s block without a `<!-- check: ... -->` line above it"
                              % (where, lang))
                continue
            if kind is None:
                continue
            counts[kind] += 1
            if lang == "sh" or kind == "synopsis":
                check_flags(errors, where, text, a.bin_dir)
                counts["flags"] += 1
            if kind == "run" and lang == "sh":
                check_sh(errors, where, text, a.bin_dir)
            elif kind == "run" and lang == "python":
                check_python(errors, notes, where, text, run=True)
            elif kind == "compile" and lang == "python":
                check_python(errors, notes, where, text, run=False)
            elif kind == "c" and lang == "c":
                check_c(errors, where, text)
            elif kind in ("run", "c", "compile"):
                errors.append("%s: `check: %s` does not apply to a ```%s block" % (where, kind, lang))
    for n in notes:
        print("note:", n)
    for e in errors:
        print("error:", e)
    print("check-docs: %d files; blocks: %s; %d error(s)"
          % (len(docs()), ", ".join("%s %d" % kv for kv in counts.items()), len(errors)))
    sys.exit(1 if errors else 0)


if __name__ == "__main__":
    main()
