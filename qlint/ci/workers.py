"""Supervised worker processes: the model's code runs in them, never in the process that owns
stdout and decides the exit code.

A model is the user's code, and a gate must survive anything it does. ``qlint check`` hands
each model to a worker process (``-j N``: N of them; ``-j 1``: one) and supervises it:

* the worker's stdout is its stderr (file descriptor 1 is pointed at 2 before any model code
  runs, so a ``print`` or a C library writing to stdout lands in the log, never inside the
  JSON or SARIF on qlint's stdout); its stdin reads nothing; the results come back on a
  private pipe;
* a ``SystemExit`` in the model's code is a failure of that model (the caller turns it into
  a one-line error; a leftover one is caught here);
* a worker that dies (``os._exit``, a segfault, the OOM killer's SIGKILL) costs only the model
  it held: that model is reported by name, with how the process ended and what the model's
  code was doing (:func:`qlint.loader.note_phase`), a fresh worker takes the next model, and
  every other model's result is kept;
* when the supervisor stops (Ctrl-C, an error) it kills its workers; when it dies, each
  worker sees its pipe close and exits.

A worker that finished a run stays for the next run of the same process (the API called
again, the test suite's in-process command lines) and takes on that run's working folder,
environment, ``sys.path`` and warning filters with each task; the command line makes one
run, after which its workers are let go (:func:`close_idle_workers`, at exit).

The work is a picklable function and its arguments, as in ``concurrent.futures``; this module
knows nothing of models (``qlint.api`` passes its own function). Nothing here imports torch.
"""

from __future__ import annotations

import atexit
import os
import pickle
import queue
import signal
import struct
import subprocess
import sys
import threading
import warnings
from typing import IO, Any, Callable, Optional, Sequence

from qlint.core.errors import QlintError

_HEADER = struct.Struct(">Q")
_BOOT = ("import signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); sys.path[:] = {path!r}; "
         "from qlint.ci.workers import serve; serve()")
_SIGNAL_CAUSE = {
    "SIGKILL": "killed, e.g. by the out-of-memory killer",
    "SIGSEGV": "a segmentation fault",
    "SIGBUS": "a bus error",
    "SIGABRT": "aborted",
    "SIGFPE": "a floating-point exception",
    "SIGILL": "an illegal instruction",
    "SIGTERM": "terminated",
}


class WorkerDied(QlintError):
    """The worker process holding a task ended without its result; the message is one line."""


def death_message(returncode: Optional[int], phase: str) -> str:
    """How a worker ended, in one line: ``the process analysing it was killed by SIGKILL while
    tracing the model: killed, e.g. by the out-of-memory killer``."""
    where = f"while {phase or 'starting'}"
    if returncode is not None and returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        cause = _SIGNAL_CAUSE.get(name)
        return f"the process analysing it was killed by {name} {where}" + (f": {cause}" if cause else "")
    return (f"the process analysing it exited with status {returncode} {where}, before reporting a result: "
            "the model's code called os._exit(), or the interpreter crashed")


# -- the pipe protocol: length-prefixed pickles ------------------------------------------------


def _send(stream: IO[bytes], payload: bytes) -> None:
    stream.write(_HEADER.pack(len(payload)) + payload)
    stream.flush()


def _receive(stream: IO[bytes]) -> bytes:
    """One frame's bytes; EOFError when the other end closed (or died) before a whole frame."""
    header = _read_exactly(stream, _HEADER.size)
    return _read_exactly(stream, _HEADER.unpack(header)[0])


def _read_exactly(stream: IO[bytes], size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = stream.read(left)
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


# -- the worker side ---------------------------------------------------------------------------


def serve() -> None:
    """A worker's main loop (started by :class:`Supervisor` with ``python -c``): take tasks from
    the pipe on stdin, run them, send each result back, until told to stop or the pipe closes."""
    commands = os.fdopen(os.dup(0), "rb")
    results = os.fdopen(os.dup(1), "wb")
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)  # a model that reads stdin reads nothing, not the task pipe
    os.close(null)
    os.dup2(2, 1)  # whatever the model's code writes to stdout goes to stderr
    sys.stdout = sys.stderr
    lock = threading.Lock()

    def send(message: Any) -> None:
        payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        with lock:
            _send(results, payload)

    inbox: queue.Queue = queue.Queue()

    def read() -> None:  # the supervisor gone (killed, or it closed the pipe): stop at once
        while True:
            try:
                frame = _receive(commands)
            except (EOFError, OSError):
                os._exit(0)
            inbox.put(frame)

    threading.Thread(target=read, name="qlint-worker-pipe", daemon=True).start()
    from qlint.loader import set_phase_listener

    set_phase_listener(lambda phase: send(("phase", phase)))
    while True:
        frame = inbox.get()
        try:
            task = pickle.loads(frame)
            if task is None:
                break
            context, function, arguments = task
            _enter(context)
        except Exception as exc:  # noqa: BLE001  (a task this worker cannot take on: its failure, not a death)
            send(("result",
                  WorkerDied(f"the worker could not take the task: {type(exc).__name__}: {exc}".splitlines()[0])))
            continue
        try:
            result: Any = function(*arguments)
        # raised by the model's code (a signal is ignored here): the run stops, as in one process
        except KeyboardInterrupt:
            send(("interrupt", None))
            continue
        except SystemExit as exc:  # the task's own code should have turned it into its failure
            result = WorkerDied(f"the model's code called sys.exit({'' if exc.code is None else exc.code!r})")
        except BaseException as exc:  # noqa: BLE001  (anything else that escaped the task)
            result = WorkerDied(f"internal error in the worker: {type(exc).__name__}: {exc}".splitlines()[0])
        try:
            send(("result", result))
        except Exception as exc:  # noqa: BLE001  (a result that does not pickle)
            send(("result",
                  WorkerDied(f"its result could not be sent back: {type(exc).__name__}: {exc}".splitlines()[0])))
    sys.stderr.flush()
    os._exit(0)  # not waiting for threads the model's code may have left running


def _context(faulthandler: bool) -> dict[str, Any]:
    """What a task must see of the supervising process: its folder, environment, ``sys.path``
    and warning filters (a worker may serve several runs of one process, e.g. the API's)."""
    filters = list(warnings.filters)
    try:
        pickle.dumps(filters)
    except Exception:  # noqa: BLE001  (a filter holding something unpicklable: the defaults)
        filters = None
    return {"cwd": os.getcwd(), "environ": dict(os.environ), "path": list(sys.path), "warnings": filters,
            "faulthandler": faulthandler}


def _enter(context: dict[str, Any]) -> None:
    """Take on the supervising process's context before a task (in the worker)."""
    os.chdir(context["cwd"])
    if os.environ != context["environ"]:
        os.environ.clear()
        os.environ.update(context["environ"])
    sys.path[:] = context["path"]
    if context["warnings"] is not None:
        warnings.filters[:] = context["warnings"]
        mutated = getattr(warnings, "_filters_mutated", None)
        if mutated is not None:  # the filters list was replaced in place: drop the cached decisions
            mutated()
    import faulthandler

    if context["faulthandler"]:
        faulthandler.enable(sys.stderr)
    elif faulthandler.is_enabled():
        faulthandler.disable()


# -- the supervising side ----------------------------------------------------------------------

_IDLE: list[subprocess.Popen] = []  # workers a finished run left alive, for the next run of this process
_IDLE_LOCK = threading.Lock()


@atexit.register
def close_idle_workers() -> None:
    """Let the idle workers go when this process ends (each exits when its pipe closes)."""
    with _IDLE_LOCK:
        idle = list(_IDLE)
        _IDLE.clear()
    for process in idle:
        for stream in (process.stdin, process.stdout):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass
    for process in idle:
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()



class Supervisor:
    """``size`` worker processes, each replaced when it dies; :meth:`run` gives every task's
    result in order: the function's return value, or :class:`WorkerDied` for a task whose worker
    died (the caller names the task: this class knows nothing of models)."""

    def __init__(self, size: int, *, faulthandler: bool = False, timeout: float = 0.0) -> None:
        self.size = max(1, size)
        self.faulthandler = faulthandler
        self.timeout = timeout  # seconds a task may run before its worker is killed (0: no limit)
        self._processes: list[subprocess.Popen] = []
        self._lock = threading.Lock()
        self._stopping = False

    def run(self, function: Callable[..., Any], tasks: Sequence[tuple]) -> list[Any]:
        results: dict[int, Any] = {}
        interrupted: list[int] = []
        done = threading.Condition()
        pending = iter(range(len(tasks)))
        next_lock = threading.Lock()

        def take() -> Optional[int]:
            with next_lock:
                return next(pending, None)

        def slot() -> None:
            process: Optional[subprocess.Popen] = None
            try:
                while not self._stopping:
                    index = take()
                    if index is None:
                        break
                    for attempt in range(2):
                        if process is not None and process.poll() is not None:
                            process = None  # it ended while idle: not this task's doing
                        if process is None:
                            try:
                                process = self._take()
                            except OSError as exc:  # no process could be made (out of memory, a process limit)
                                outcome = WorkerDied(f"no worker process could be started: {exc.strerror or exc}")
                                break
                        outcome = self._one(process, function, tasks[index])
                        if outcome is not _DEAD:
                            break
                        phase = getattr(process, "qlint_phase", "starting")
                        returncode = process.wait()
                        outcome = WorkerDied(
                            f"it did not finish within {self.timeout:g} s (the per-model timeout: --timeout, or "
                            f"`timeout` in the config) and was stopped while {phase}"
                            if getattr(process, "qlint_timed_out", False) else death_message(returncode, phase))
                        process = None  # the next task gets a fresh worker
                        if phase != "starting" or self._stopping or isinstance(outcome, WorkerDied) and \
                                "per-model timeout" in str(outcome):
                            break  # it died in the model's code, or ran out of time; else it is tried once more
                    with done:
                        if outcome is _INTERRUPT:
                            interrupted.append(index)
                        else:
                            results[index] = outcome
                        done.notify_all()
                    if outcome is _INTERRUPT:
                        break
            finally:
                if process is not None:
                    self._give_back(process)

        threads = [threading.Thread(target=slot, name=f"qlint-supervisor-{i}", daemon=True)
                   for i in range(min(self.size, len(tasks)))]
        try:
            for thread in threads:
                thread.start()
            with done:
                while len(results) < len(tasks):
                    done.wait(0.2)  # a timeout, so Ctrl-C reaches this thread
                    if interrupted:
                        raise KeyboardInterrupt
                    if not any(thread.is_alive() for thread in threads) and len(results) < len(tasks):
                        raise QlintError("internal error: the worker supervisor stopped before every model was "
                                         "analysed")
            for thread in threads:
                thread.join()
        finally:
            if len(results) < len(tasks):  # interrupted: nobody wants the rest
                self.stop()
        return [results[i] for i in range(len(tasks))]

    def stop(self) -> None:
        """Kill every worker (Ctrl-C, an error in the supervising process)."""
        self._stopping = True
        with self._lock:
            processes = list(self._processes)
        for process in processes:
            if process.poll() is None:
                try:
                    process.kill()
                except OSError:
                    pass
        for process in processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass

    def _take(self) -> subprocess.Popen:
        """An idle worker of this process (the API and tests call again and again), else a new one."""
        while True:
            with _IDLE_LOCK:
                process = _IDLE.pop() if _IDLE else None
            if process is None:
                process = self._start()
                break
            if process.poll() is None:
                break
        with self._lock:
            self._processes.append(process)
        return process

    def _start(self) -> subprocess.Popen:
        process = subprocess.Popen([sys.executable, "-c", _BOOT.format(path=list(sys.path))],
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, close_fds=True)
        process.qlint_phase = "starting"  # type: ignore[attr-defined]
        return process

    def _give_back(self, process: subprocess.Popen) -> None:
        """A worker whose run ended keeps running for the next run of this process; none when stopping."""
        if self._stopping or process.poll() is not None:
            if process.poll() is None:
                process.kill()
            process.wait()
            return
        with _IDLE_LOCK:
            _IDLE.append(process)

    def _one(self, process: subprocess.Popen, function: Callable[..., Any], arguments: tuple) -> Any:
        """Send one task and wait for its result; ``_DEAD`` when the worker ended first."""
        process.qlint_phase = "starting"  # type: ignore[attr-defined]
        task = (_context(self.faulthandler), function, arguments)
        try:
            _send(process.stdin, pickle.dumps(task, protocol=pickle.HIGHEST_PROTOCOL))  # type: ignore[arg-type]
        except OSError:
            return _DEAD
        timer = threading.Timer(self.timeout, self._time_out, (process,)) if self.timeout else None
        if timer is not None:
            timer.daemon = True
            timer.start()
        try:
            return self._result(process)
        finally:
            if timer is not None:
                timer.cancel()

    @staticmethod
    def _time_out(process: subprocess.Popen) -> None:
        """Stop a worker whose task ran past the timeout: the model is reported as that, the run goes on."""
        process.qlint_timed_out = True  # type: ignore[attr-defined]
        try:
            process.kill()
        except OSError:
            pass

    @staticmethod
    def _result(process: subprocess.Popen) -> Any:
        while True:
            try:
                kind, value = pickle.loads(_receive(process.stdout))  # type: ignore[arg-type]
            except (EOFError, OSError):
                return _DEAD
            except Exception as exc:  # noqa: BLE001  (a result that does not unpickle here)
                return WorkerDied(f"its result could not be read back: {type(exc).__name__}: {exc}".splitlines()[0])
            if kind == "phase":
                process.qlint_phase = value  # type: ignore[attr-defined]
            elif kind == "result":
                return value
            elif kind == "interrupt":
                return _INTERRUPT


_DEAD = object()  # the worker ended before sending a result
_INTERRUPT = object()  # the task raised KeyboardInterrupt


__all__ = ["Supervisor", "WorkerDied", "close_idle_workers", "death_message", "serve"]
