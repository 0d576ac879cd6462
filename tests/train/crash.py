"""Run ``aogpt ARGS`` in this process and stop it at a chosen point (a helper for test_crashes.py).

    python -m tests.train.crash POINT ARGS...

POINT:
  mid-checkpoint  SIGKILL once the second checkpoint's weights are written, before its rename
  mid-line        SIGKILL halfway through writing the train record of step 6 (a torn last line)
  mid-step        SIGKILL after step 8, before its records are written
  pause           after step 5, write READY beside the run directory and wait for a signal
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def install(point: str, out: Path) -> None:
    import aogpt.checkpoint as checkpoint
    import aogpt.train.metrics as metrics
    from aogpt.train import Trainer

    if point == "mid-checkpoint":
        real_save, written = checkpoint.save_file, []

        def save_file(*args, **kwargs):
            real_save(*args, **kwargs)
            written.append(1)
            if len(written) == 2:
                die()

        checkpoint.save_file = save_file
    elif point == "mid-line":
        real_log = metrics.MetricsLog.log

        def log(self, record):
            if record.get("kind") == "train" and record.get("step") == 6:
                with open(self.path, "a", encoding="utf-8") as f:
                    f.write(json.dumps(record)[:25])
                die()
            real_log(self, record)

        metrics.MetricsLog.log = log
    elif point in ("mid-step", "pause"):
        real_step = Trainer.train_step

        def train_step(self):
            result = real_step(self)
            if point == "mid-step" and self.step == 8:
                die()
            if point == "pause" and self.step == 5:
                (out.parent / "READY").write_text(str(os.getpid()))
                while not self._stop_signal:
                    time.sleep(0.02)
            return result

        Trainer.train_step = train_step
    else:
        raise SystemExit(f"unknown point {point}")


if __name__ == "__main__":
    point, *argv = sys.argv[1:]
    install(point, Path(argv[argv.index("--out") + 1]))
    from aogpt.cli import main

    raise SystemExit(main(argv))
