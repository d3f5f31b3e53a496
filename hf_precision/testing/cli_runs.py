"""Whether one run of the ``hf-precision`` command behaved: the rule the command sweep and the suite judge by.

Exit 0 with only our lines (``hf-precision ...``) and progress bars on stderr passes; exit 2 with exactly one
``hf-precision CMD: error: ...`` line is a clean refusal; anything else (a traceback, another exit code, several
error lines, a library's lines) fails.
"""

from __future__ import annotations

import re

__all__ = ["judge", "ours"]

# tqdm's bars (diffusers' loading and denoising, calibrate's): a count and a rate or a time
_BAR = re.compile(r"\d+/\d+ \[|\d+%\|")


def ours(line: str) -> bool:
    """Whether a stderr line is one we allow: blank, ours (``hf-precision ...``) or a progress bar.

    Example:
        >>> ours("hf-precision check: error: x"), ours("  0%|   | 0/2 [00:00<?, ?it/s]"), ours("FutureWarning: x")
        (True, True, False)
    """
    return not line.strip() or line.startswith("hf-precision") or bool(_BAR.search(line))


def judge(command: str, code, err: str, out: str, crash: str | None) -> tuple[str, str]:
    """PASS, REFUSED or FAIL for one run of ``hf-precision COMMAND``, with the line that says why.

    ``code`` is the exit status, ``err``/``out`` what the run wrote, ``crash`` a traceback's summary or ``None``.

    Example:
        >>> judge("check", 0, "", "ok", None)
        ('PASS', '')
        >>> judge("plan", 2, "hf-precision plan: error: no such folder\\n", "", None)
        ('REFUSED', 'hf-precision plan: error: no such folder')
        >>> judge("plan", 0, "UserWarning: x\\n", "", None)
        ('FAIL', 'stderr not ours: UserWarning: x')
        >>> judge("train", 2, "hf-precision train: error: 2 problems:\\n  - a.gif: 9 frames\\n  - b.gif: 9 frames\\n", "",
        ...       None)  # several problems of one input, one per line (errors.RecipeError)
        ('REFUSED', 'hf-precision train: error: 2 problems:')
    """
    name = command.split()[0]
    if crash:
        return "FAIL", f"traceback: {crash}"
    lines = [line for part in err.splitlines() for line in part.split("\r")]
    # an error of ours listing several problems puts each on its own "  - " line under it (errors.RecipeError)
    listed = any(line.startswith("hf-precision") and line.rstrip().endswith(" problems:") for line in lines)
    foreign = [line for line in lines if not ours(line) and not (listed and line.startswith("  - "))]
    if foreign:
        return "FAIL", f"stderr not ours: {foreign[0].strip()[:200]}"
    errors = [line for line in lines if line.startswith("hf-precision")]
    if code == 0:
        return "PASS", ""
    if code == 2 and len(errors) == 1 and errors[0].startswith(f"hf-precision {name}: error:"):
        return "REFUSED", errors[0].strip()
    last = (errors or [line for line in out.splitlines() if line.strip()] or [""])[-1].strip()
    return "FAIL", f"exit {code}: {last[:200]}"
