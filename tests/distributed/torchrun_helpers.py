"""Running a script on several ranks under torchrun (gloo), for the tests in this folder."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile

#: Python 3.11 before 3.11.8 can deadlock a forked child in ``PyOS_AfterFork_Child`` when another
#: thread holds the interpreter's head lock at the fork (CPython gh-112275). torch.distributed's
#: C++ threads take that lock without the GIL, so a DataLoader worker forked by a rank hangs for
#: good now and then (seen once in about 35 runs on a loaded 2-core machine).
FORK_DEADLOCK_PYTHON = sys.version_info[:3] < (3, 11, 8) and sys.version_info[:2] == (3, 11)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _descendants(pid: int) -> list[int]:
    """The processes below ``pid`` (torchrun starts each rank in a session of its own, so a
    process group does not reach them, nor their DataLoader workers)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = open(f"/proc/{entry}/stat", "rb").read()
            except OSError:
                continue
            children.setdefault(int(stat[stat.rindex(b")") + 2 :].split()[1]), []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _run_once(command: list[str], timeout: float) -> subprocess.CompletedProcess | None:
    """The run, or None when it outlived ``timeout`` (then it and every process below it are
    killed). Output goes through files: a hung process that holds a pipe would keep reading it open."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        process = subprocess.Popen(command, stdout=out, stderr=err, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            for pid in [*_descendants(process.pid), process.pid]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            process.wait()
            return None
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(command, process.returncode, out.read(), err.read())


def torchrun(script: str, args: list[str], *, ranks: int, timeout: float = 120) -> subprocess.CompletedProcess:
    """``script args`` on ``ranks`` ranks. A run that hangs is tried once more where the
    interpreter has the fork deadlock above (our own hang would hang again); a second hang fails."""
    for attempt in range(2 if FORK_DEADLOCK_PYTHON else 1):
        command = [
            sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks),
            "--master-addr", "127.0.0.1", "--master-port", str(_free_port()), script, *args,
        ]
        run = _run_once(command, timeout)
        if run is not None:
            return run
    raise AssertionError(f"torchrun of {script} on {ranks} ranks did not finish within {timeout} s ({attempt + 1} attempts)")
