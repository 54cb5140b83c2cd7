"""LaTeX output for the result tables: text escaping and one booktabs ``table`` float.

The float needs only ``\\usepackage{booktabs}``; it compiles with pdflatex's default UTF-8
input, because every character LaTeX treats specially is escaped and the non-ASCII symbols
the tables print (±, ↓, †, τ, ...) become math-mode commands.
"""

from __future__ import annotations

from collections.abc import Sequence

# Characters with a meaning in LaTeX text. Brackets are braced so that a cell starting with
# "[" is not read as the optional argument of the preceding row's "\\".
_SPECIAL = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    "[": "{[}",
    "]": "{]}",
    "<": r"\textless{}",
    ">": r"\textgreater{}",
    "|": r"\textbar{}",
    '"': r"\textquotedbl{}",
}
# Non-ASCII symbols the tables and their notes use; pdflatex's default fonts lack them.
_SYMBOLS = {
    "±": r"$\pm$",
    "↓": r"$\downarrow$",
    "↑": r"$\uparrow$",
    "†": r"$^\dagger$",
    "‡": r"$^\ddagger$",
    "τ": r"$\tau$",
    "α": r"$\alpha$",
    "²": r"$^2$",
    "³": r"$^3$",
    "×": r"$\times$",
    "−": r"$-$",
    "–": "--",
    "—": "---",
    "≥": r"$\geq$",
    "≤": r"$\leq$",
    "√": r"$\surd$",
    "·": r"$\cdot$",
    "…": r"\dots{}",
    "’": "'",
    "‘": "`",
    "“": "``",
    "”": "''",
}


def escape(text: str) -> str:
    """``text`` as LaTeX that prints it. ASCII and Latin-1 letters pass through (pdflatex reads
    them as UTF-8); any other character without a mapping is printed as its code point, e.g.
    ``U+2603``, so the document still compiles."""
    out = []
    for char in str(text):
        if char in _SPECIAL:
            out.append(_SPECIAL[char])
        elif char in _SYMBOLS:
            out.append(_SYMBOLS[char])
        elif ord(char) < 128 or (char.isalpha() and ord(char) < 256):
            out.append(char)
        else:
            out.append(rf"\texttt{{U+{ord(char):04X}}}")
    return "".join(out)


def booktabs_table(
    header: Sequence[str],
    rows: Sequence[Sequence[str]],
    caption: str,
    notes: Sequence[str] = (),
    label: str = "tab:pe-bench-results",
) -> str:
    """A ``table`` float: caption, one header row, booktabs rules, notes in footnote size below.

    ``header``, ``rows``, ``caption`` and ``notes`` are LaTeX already (escape them first): cells
    may carry ``\\textbf`` and the like.
    """
    width = len(header)
    for row in rows:
        if len(row) != width:
            raise ValueError(f"table row has {len(row)} cells for {width} columns: {row!r}")
    lines = [
        r"\begin{table}[htbp]",
        r"\centering",
        rf"\caption{{{caption}}}",
        rf"\label{{{label}}}",
        rf"\begin{{tabular}}{{l{'c' * (width - 1)}}}",
        r"\toprule",
        " & ".join(header) + r" \\",
        r"\midrule",
        *(" & ".join(row) + r" \\" for row in rows),
        r"\bottomrule",
        r"\end{tabular}",
    ]
    if notes:
        lines += [r"\par\medskip", r"{\footnotesize\raggedright", *(f"{note}\\par" for note in notes), "}"]
    lines.append(r"\end{table}")
    return "\n".join(lines) + "\n"
