"""Sizes, read from the source: no file under clamor/ (*.py) or csrc/ (*.c,
*.h) over MAX_FILE lines, and no function over MAX_FUNCTION, unless it says
why.  A file says why in its opening docstring or comment, a function in
its docstring or the comment right above it, with the marker ``Size:``
("Size: one state machine whose states share ...")."""
import ast
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_FILE = 600
MAX_FUNCTION = 80
MARKER = "Size:"



def sources():
    """(relative path, text) of every file the limits apply to."""
    out = []
    for top, exts in (("clamor", (".py",)), ("csrc", (".c", ".h"))):
        for dirpath, dirs, files in os.walk(os.path.join(ROOT, top)):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for f in sorted(files):
                if f.endswith(exts):
                    path = os.path.join(dirpath, f)
                    with open(path, encoding="utf-8") as fh:
                        out.append((os.path.relpath(path, ROOT).replace(os.sep, "/"), fh.read()))
    return out


# --- Python

def py_functions(text):
    """(name, first line, lines, reason given) of every function and method."""
    lines = text.splitlines()
    out = []
    for node in ast.walk(ast.parse(text)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        first = min([node.lineno] + [d.lineno for d in node.decorator_list])
        above = []
        i = first - 2
        while i >= 0 and lines[i].lstrip().startswith("#"):
            above.append(lines[i])
            i -= 1
        reason = MARKER in (ast.get_docstring(node) or "") or any(MARKER in c for c in above)
        out.append((node.name, node.lineno, node.end_lineno - node.lineno + 1, reason))
    return out


def py_file_reason(text):
    return MARKER in (ast.get_docstring(ast.parse(text)) or "")


# --- C

_C_DEF = re.compile(r"[A-Za-z_]")
_C_TYPE_LINE = re.compile(r"[A-Za-z_][\w \t*]*$")


def c_opening_comment(lines, end):
    """The comment block that ends on the line before ``end`` (0-based), as text."""
    i = end - 1
    if i < 0:
        return ""
    if lines[i].rstrip().endswith("*/"):
        j = i
        while j >= 0 and "/*" not in lines[j]:
            j -= 1
        return "\n".join(lines[max(j, 0):i + 1])
    block = []
    while i >= 0 and lines[i].lstrip().startswith("//"):
        block.append(lines[i])
        i -= 1
    return "\n".join(block)


def c_functions(text):
    """(name, first line, lines, reason given) of every function defined at
    the top level: from its definition's first line (at column 0) to its
    closing brace at column 0."""
    lines = text.splitlines()
    out = []
    i, n = 0, len(lines)
    while i < n:
        line = lines[i]
        if line.startswith("#"):                    # a directive, and its continuation lines
            while line.endswith("\\") and i + 1 < n:
                i += 1
                line = lines[i]
            i += 1
            continue
        if not _C_DEF.match(line) or "(" not in line or "=" in line.split("(", 1)[0]:
            i += 1
            continue
        # a declaration or a definition: read its header to ';' or '{'
        j = i
        header = line
        while not any(c in lines[j] for c in ";{") and j + 1 < n:
            j += 1
            header += " " + lines[j]
        if "{" not in lines[j] or (";" in lines[j] and lines[j].index(";") < lines[j].index("{")):
            i = j + 1
            continue
        name = re.findall(r"([A-Za-z_]\w*)\s*\(", header.split("{")[0])     # the first call-like word
        k = j
        if lines[j].count("{") > lines[j].count("}"):    # else the body closes on its opening line
            k = j + 1
            while k < n and not lines[k].startswith("}"):
                k += 1
            if k == n or lines[k].startswith("};"):     # an initialiser, not a body
                i = k + 1
                continue
        start = i
        if start > 0 and _C_TYPE_LINE.match(lines[start - 1]):     # "static int" on a line of its own
            start -= 1
        out.append((name[0] if name else "?", start + 1, k - start + 1, MARKER in c_opening_comment(lines, start)))
        i = k + 1
    return out


def c_file_reason(text):
    lines = text.splitlines()
    if not lines:
        return False
    if lines[0].lstrip().startswith("/*"):
        end = 0
        while end < len(lines) and "*/" not in lines[end]:
            end += 1
        return MARKER in "\n".join(lines[:end + 1])
    end = 0
    while end < len(lines) and lines[end].lstrip().startswith("//"):
        end += 1
    return MARKER in "\n".join(lines[:end])


def offenders():
    """What is over its limit with no reason given: (path, function or None, lines)."""
    out = []
    for path, text in sources():
        is_py = path.endswith(".py")
        nlines = len(text.splitlines())
        if nlines > MAX_FILE and not (py_file_reason(text) if is_py else c_file_reason(text)):
            out.append((path, None, nlines))
        for name, _, size, reason in (py_functions(text) if is_py else c_functions(text)):
            if size > MAX_FUNCTION and not reason:
                out.append((path, name, size))
    return out


def test_no_file_or_function_over_its_size_without_a_reason():
    over = offenders()
    shown = "\n".join(f"  {p}{'' if f is None else ':' + f + '()'}: {k} lines" for p, f, k in over)
    assert not over, (f"over {MAX_FILE} lines a file or {MAX_FUNCTION} a function, with no "
                      f"'{MARKER}' reason in its docstring or opening comment:\n{shown}")


# --- the scanners themselves

C_SAMPLE = """\
/* a file.  Size: one table. */
#define TWICE(x) \\
    ((x) + \\
     (x))
static int decl(int a);
static const int table[] = {
    1, 2,
};

static int
small(int a)
{
    return a;
}

int one(void) { return 1; }

/* Size: a long one, on purpose. */
int big(void) {
""" + "    x++;\n" * 90 + "}\n"


def test_c_scanner_finds_definitions_with_their_lengths_and_reasons():
    found = {name: (size, reason) for name, _, size, reason in c_functions(C_SAMPLE)}
    assert found == {"small": (5, False), "one": (1, False), "big": (92, True)}
    assert c_file_reason(C_SAMPLE)
    assert not c_file_reason("/* no reason here */\nint x;\n")


def test_py_scanner_reads_docstrings_and_the_comment_above():
    body = "    x = 1\n" * 85
    text = ("def a():\n" + body
            + "# Size: a long one, on purpose.\n@staticmethod\ndef b():\n" + body
            + "def c():\n    '''Size: said here.'''\n" + body)
    found = {name: (size, reason) for name, _, size, reason in py_functions(text)}
    assert found == {"a": (86, False), "b": (86, True), "c": (87, True)}
