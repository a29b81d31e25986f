"""Find the largest batch size that fits: a bounded search of short training probes.

The search runs in its own subprocess (`python -m engine.run.batch_search CONFIG_JSON DEVICE MAX_BATCH MAX_PROBES`) so an
OOM, or the memory cap of a CPU run, never touches the caller (the Streamlit server or
the CLI). Inside it, each probe builds the model and optimizer afresh and runs two full
steps (the optimizer state is allocated at the first one); OOM is caught and the
memory released before the next probe, so torch is imported only once.

Protocol: one JSON object per line on stdout: {"probe": N, "fits": bool, "reason": str}
for each probe, then {"result": {...}} last.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import subprocess
import sys
from pathlib import Path
from typing import Callable

from engine.config import MAX_BATCH_SIZE, RunConfig
from engine.proc import PROJECT_ROOT, memory_cap

PROBE_STEPS = 2
DEFAULT_MAX_PROBES = 10


def next_probe(good: int | None, bad: int | None, start: int, max_batch: int) -> int | None:
    """The next batch size to try, or None when the answer is pinned down.

    Doubling from `start` until the first OOM (halving if `start` itself fails), then
    bisection between the largest size that fit and the smallest that did not.
    """
    if good is None and bad is None:
        return start
    if good is None:
        return None if bad <= 1 else max(1, bad // 2)
    if bad is None:
        return None if good >= max_batch else min(max_batch, good * 2)
    if bad - good <= max(1, good // 16):  # within ~6 %: precise enough to plan with
        return None
    return (good + bad) // 2


def probe_fits(cfg: RunConfig, device_key: str) -> tuple[bool, str]:
    """Two real training steps at cfg.batch_size; (False, reason) on out-of-memory."""
    import torch

    from engine.training.loop import (  # imports torch: only the probe process trains
        Trainer,
        resolve_torch_device,
    )

    trainer = None
    try:
        trainer = Trainer(cfg, resolve_torch_device(device_key))
        for step in range(1, PROBE_STEPS + 1):
            loss, _ = trainer.step(step)
        float(loss.item())  # wait for the device: an asynchronous OOM surfaces here
        return True, "fits"
    except (torch.OutOfMemoryError, MemoryError) as exc:
        return False, _first_line(exc)
    except RuntimeError as exc:
        if "can't allocate memory" in str(exc) or "out of memory" in str(exc).lower():
            return False, _first_line(exc)
        raise
    finally:
        del trainer
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def _first_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0][:300]


def search_in_process(cfg: RunConfig, device_key: str, max_batch: int,
                      max_probes: int, report: Callable[[dict], None]) -> dict:
    good = bad = None
    probes = []
    for _ in range(max_probes):
        size = next_probe(good, bad, cfg.batch_size, max_batch)
        if size is None:
            break
        fits, reason = probe_fits(dataclasses.replace(cfg, batch_size=size, profile=False),
                                  device_key)
        probes.append({"batch_size": size, "fits": fits, "reason": reason})
        report({"probe": size, "fits": fits, "reason": reason})
        if fits:
            good = size
        else:
            bad = size
    return {"max_batch_fit": good, "first_oom_batch": bad, "probes": probes,
            "complete": next_probe(good, bad, cfg.batch_size, max_batch) is None,
            "max_batch_searched": max_batch}


def find_max_batch(cfg: RunConfig, device_key: str, max_batch: int = 4096,
                   max_probes: int = DEFAULT_MAX_PROBES,
                   progress: Callable[[dict], None] | None = None,
                   cwd: Path | None = None) -> dict:
    """Run the search in a subprocess (memory-capped like the run on CPU) and return it."""
    max_batch = max(1, min(int(max_batch), MAX_BATCH_SIZE))
    if cfg.nprocs > 1:
        # Probes train one process: the answer is the batch per process (each DDP rank
        # holds a full replica; FSDP2 shards, so its ranks fit at least this much).
        cfg = dataclasses.replace(cfg, nprocs=1, sharding="ddp", comm_hook="none")
    args = [sys.executable, "-m", "engine.run.batch_search", cfg.to_json(), device_key,
            str(max_batch), str(max_probes)]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=str(cwd or PROJECT_ROOT),
                            preexec_fn=memory_cap(cfg.memory_cap_mb) if device_key == "cpu" else None)
    result, probes = None, []
    for line in proc.stdout:
        message = _parse_line(line)
        if message is None:
            continue
        if "result" in message:
            result = message["result"]
        else:
            probes.append(message)
            if progress:
                progress(message)
    stderr = proc.stderr.read()
    code = proc.wait()
    if result is None:
        # Killed mid-probe (e.g. by the kernel's OOM killer): the probe in flight did not fit.
        good = max((p["probe"] for p in probes if p["fits"]), default=None)
        result = {"max_batch_fit": good, "first_oom_batch": None, "complete": False,
                  "probes": [{"batch_size": p["probe"], "fits": p["fits"], "reason": p["reason"]}
                             for p in probes],
                  "error": f"search process exited with code {code}: "
                           f"{(stderr.strip().splitlines() or [''])[-1][:300]}"}
    return result


def _parse_line(line: str) -> dict | None:
    try:
        message = json.loads(line)
    except json.JSONDecodeError:
        return None
    return message if isinstance(message, dict) else None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    cfg = RunConfig.from_json(argv[0])
    device_key, max_batch, max_probes = argv[1], int(argv[2]), int(argv[3])

    def report(message: dict) -> None:
        print(json.dumps(message), flush=True)

    result = search_in_process(cfg, device_key, max_batch, max_probes, report)
    report({"result": result})
    return 0


if __name__ == "__main__":
    sys.exit(main())
