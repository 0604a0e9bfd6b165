"""Start a real server process on a free loopback port, wait for /health, always stop it.

The child runs in its own session, so stopping it (SIGTERM, then SIGKILL of that session's
process group if it hangs) also takes down any tensor-parallel workers it started. It must not
inherit TRITON_INTERPRET=1 from the test conftest: the engine's CPU path is the torch reference,
not the Triton interpreter.
"""

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

from vllm.entrypoints.openai.api_server import logged_port

ROOT = Path(__file__).resolve().parents[3]


def server_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("HF_DATASETS_OFFLINE", "1")
    return env


class RemoteServer:
    """`with RemoteServer(["serve", "kimi-k3-tiny", ...]) as server: server.url(...)`.

    `argv` follows `python -m vllm.entrypoints.cli.main` (that is, the `vllm` command) unless
    `command` is given in full; `--host 127.0.0.1 --port 0` are added. Without `port` the
    server binds a port the OS picks and must log it in `SERVING_LINE` (`vllm serve` does;
    `logged_port` reads it): a port found free and released before the server binds it could be
    taken by another process in between (another test worker's server, whose /health would
    answer)."""

    def __init__(
        self,
        argv: list[str] | None = None,
        command: list[str] | None = None,
        timeout: float = 240.0,
        port: int | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.port = port  # without one, learnt from the server's log once it has bound
        if command is None:
            command = [sys.executable, "-m", "vllm.entrypoints.cli.main", *argv]
            command += ["--host", "127.0.0.1", "--port", str(port or 0)]
        self.command = command
        self.env = {**server_env(), **(env or {})}
        self.timeout = timeout
        self.log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
        self.proc: subprocess.Popen | None = None
        self.exit_code: int | None = None  # of a clean exit after SIGTERM
        self.leftover: list[int] = []  # processes of its session still alive after it exited
        self._stopped = False

    def url(self, path: str = "") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def output(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text(errors="replace")

    def __enter__(self) -> "RemoteServer":
        self.proc = subprocess.Popen(
            self.command,
            cwd=ROOT,
            env=self.env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.output()}")
            if self.port is None:
                self.port = logged_port(self.output())
                if self.port is None:
                    time.sleep(0.5)
                    continue
            try:
                if requests.get(self.url("/health"), timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"server not healthy after {self.timeout} s:\n{self.output()}")

    def session_pids(self) -> list[int]:
        """Live processes in the server's session (the server and anything it started)."""
        pids = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            # After the command name: state, ppid, pgrp, session; zombies are already dead.
            if fields[0] != "Z" and int(fields[3]) == self.proc.pid:
                pids.append(int(stat.parent.name))
        return pids

    def stop(
        self,
        timeout: float = 60.0,
        sig: int = signal.SIGTERM,
        group: bool = False,
        linger: float = 30.0,
        times: int = 1,
    ) -> None:
        """Send `sig` `times` times 10 ms apart (to the whole process group with `group`, as
        Ctrl-C in a terminal does) and wait; record the exit code and any process of its session
        still alive `linger` seconds after it exited, then SIGKILL that process group, so that
        nothing outlives the test."""
        if self.proc is None or self._stopped:
            return
        self._stopped = True
        if self.proc.poll() is None:
            for i in range(times):
                if i:
                    time.sleep(0.01)
                if group:
                    os.killpg(self.proc.pid, sig)
                else:
                    self.proc.send_signal(sig)
            try:
                self.exit_code = self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.exit_code = None
        else:
            self.exit_code = self.proc.returncode
        # Some helpers only notice the exit afterwards (multiprocessing's resource tracker reads
        # the end of its pipe), and on a loaded machine they may take a while to go.
        deadline = time.monotonic() + linger
        while True:
            self.leftover = [pid for pid in self.session_pids() if pid != self.proc.pid]
            if not self.leftover or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if self.proc.poll() is None:
            self.proc.wait()

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self.log.close()
        os.unlink(self.log.name)
