"""Run a script with the pipeline protocol checker on every kernel it runs.

    python -m circbuf.check [--schedules N] [--no-interpret] script.py [args ...]

sets ``CIRCBUF_CHECK`` (``N`` random schedules per kernel, 8 by default) and
``CIRCBUF_INTERPRET=1`` (unless ``--no-interpret``), then runs the script as
``__main__``. Every ``fd.execute`` then checks each kernel it compiles before
running it: on CPU tensors in the kernel interpreter (which also runs the
kernel: the script's results are the interpreter's), on CUDA tensors on CPU
copies of the inputs before the GPU launch. At the end it lists the kernels
checked. A protocol error (a deadlock, a race on a ring stage, a wait passed
on the wrong phase, ...) stops the script: its message names the kernel,
role, barrier, stage and phase and the schedule that showed it; the exit
status is 1. An exception of the script's own gives status 2; a script that
runs no kernel says so.
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys
import traceback


def _report(checked, out) -> None:
    by: dict = {}
    for c in checked:
        by.setdefault(c["kernel"], []).append(c)
    total = sum(c["seconds"] for c in checked)
    print(
        f"circbuf.check: {len(checked)} kernel launch{'es' if len(checked) != 1 else ''} checked "
        f"({len(by)} kernel{'s' if len(by) != 1 else ''}, {total:.1f} s), no protocol error:",
        file=out,
    )
    for name, cs in by.items():
        c = cs[-1]
        print(
            f"  {name}: grid {c['grid']}, block {c['block']}, {c['schedules']} schedules of "
            f"{c['ctas']} CTAs ({c['steps']} thread steps)"
            + (f", {len(cs)} launches" if len(cs) > 1 else ""),
            file=out,
        )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m circbuf.check", description=__doc__.splitlines()[0])
    p.add_argument(
        "--schedules", type=int, default=8, help="random schedules per kernel (default 8, at least 2)"
    )
    p.add_argument(
        "--no-interpret", action="store_true", help="leave CIRCBUF_INTERPRET alone (CPU tensors are refused)"
    )
    p.add_argument("script")
    p.add_argument("args", nargs=argparse.REMAINDER)
    a = p.parse_args(argv)
    if a.schedules < 2:
        p.error("--schedules: at least 2 (CIRCBUF_CHECK=1 means the default, 8)")
    os.environ["CIRCBUF_CHECK"] = str(a.schedules)
    if not a.no_interpret:
        os.environ["CIRCBUF_INTERPRET"] = "1"

    from .interpret import CHECKED, ProtocolError

    argv0 = sys.argv
    sys.argv = [a.script, *a.args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(a.script)))
    status = 0
    try:
        runpy.run_path(a.script, run_name="__main__")
    except ProtocolError as e:
        print(f"\ncircbuf.check: protocol error: {e}", file=sys.stderr)
        status = 1
    except SystemExit as e:  # the script's own exit: a failure of its own is status 2
        code = e.code
        if isinstance(code, str):
            print(code, file=sys.stderr)
        if code not in (None, 0):
            print(f"circbuf.check: the script exited with status {code}", file=sys.stderr)
            status = 2
    except Exception:  # noqa: BLE001 - the script's own error, reported as Python would
        traceback.print_exc()
        status = 2
    finally:
        sys.argv = argv0
    if status != 1:
        if CHECKED:
            _report(CHECKED, sys.stdout)
        else:
            print(
                "circbuf.check: the script ran no kernel through the checker (no fd.execute, or every "
                "execute reused a plan made before)",
                file=sys.stdout,
            )
    return status


if __name__ == "__main__":
    sys.exit(main())
