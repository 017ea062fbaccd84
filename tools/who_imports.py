#!/usr/bin/env python3
"""Who imports heavy libraries that training does not need? Runs `brisk train ARGS` in this process and
prints, for each of scipy, pandas, sklearn, matplotlib, tensorboard that got imported, the call chain
of its first import (the frames outside importlib) and the import's own time.

    python tools/who_imports.py configs/demo.yaml train.max_steps=1 diagnose.report=false
"""

from __future__ import annotations

import builtins
import sys
import time
import traceback

WATCH = ("scipy", "pandas", "sklearn", "matplotlib", "tensorboard")


def main() -> int:
    seen: dict[str, dict] = {}
    real = builtins.__import__

    def watched(name, *args, **kwargs):
        top = name.split(".")[0]
        if top in WATCH and top not in seen and top not in sys.modules:
            chain = [f"{f.filename}:{f.lineno}" for f in traceback.extract_stack()[:-1]
                     if "importlib" not in f.filename and "<frozen" not in f.filename and f.filename != __file__]
            t0 = time.perf_counter()
            out = real(name, *args, **kwargs)
            seen[top] = {"chain": chain[-8:], "seconds": time.perf_counter() - t0}
            return out
        return real(name, *args, **kwargs)

    builtins.__import__ = watched
    from brisk.cli import main as brisk_main

    rc = brisk_main(["train", *sys.argv[1:]])
    builtins.__import__ = real
    print("\nheavy imports during the run:", sorted(seen) or "none")
    for name, info in seen.items():
        print(f"== {name} ({info['seconds']:.2f} s, first imported from):")
        print("\n".join(f"   {c}" for c in info["chain"]))
    return rc


if __name__ == "__main__":
    sys.exit(main())
