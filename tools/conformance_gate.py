"""Run ComfyUI's execution test suite (``../shared/comfy-conformance/run.sh``) and fail below a pass
ratio: ``python tools/conformance_gate.py RUN_SH MIXGRAPH_EXECUTABLE MIN_RATIO``.

The suite exits non-zero on any failed test; the project's bar is a ratio (issue 25: at least
98%, each remaining failure explained in docs/subsystems.md), so this reads pytest's summary line
instead. Its output passes through unchanged; the verdict is the last line. A missing suite or a
summary that cannot be read fails, saying why.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path


def counts(summary: str) -> dict[str, int]:
    """pytest's closing line ("2 failed, 181 passed, 15 warnings in 65.13s") as outcome -> count."""
    return {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|errors?|skipped)", summary)}


def main(argv: list[str]) -> int:
    run_sh, executable, min_ratio = argv[0], argv[1], float(argv[2])
    if not Path(run_sh).is_file():
        print(f"conformance: no suite at {run_sh} (ComfyUI's tests live in shared/, beside the checkout)")
        return 1
    # absolute: run.sh runs the suite from a temporary folder, and finds the client's python
    # beside the executable
    done = subprocess.run(["bash", run_sh, str(Path(executable).absolute())], capture_output=True, text=True)
    sys.stdout.write(done.stdout)
    sys.stderr.write(done.stderr)
    lines = [line for line in done.stdout.splitlines() if counts(line)]
    if not lines:
        print(f"conformance: no pytest summary in the suite's output (exit {done.returncode})")
        return 1
    c = counts(lines[-1])
    passed = c.get("passed", 0)
    ran = passed + c.get("failed", 0) + c.get("error", 0) + c.get("errors", 0)
    ratio = passed / ran if ran else 0.0
    ok = ran > 0 and ratio >= min_ratio
    print(f"conformance: {passed} of {ran} ComfyUI execution tests pass ({ratio:.1%}; at least "
          f"{min_ratio:.0%} needed): {'ok' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
