"""`RemoteServer`'s check for processes a server leaves behind: a helper that goes a moment after
the server (as multiprocessing's resource tracker does, later on a loaded machine) is not one, a
helper that stays is."""

import sys

from server_utils import RemoteServer

from vllm.entrypoints.openai.api_server import SERVING_LINE, logged_port

# HELPER_LINGER LINE: answers /health on a port the OS picks (logged in LINE, `vllm serve`'s
# format), exits 0 on SIGTERM; its helper sees the end of its stdin pipe when the server exits,
# then stays HELPER_LINGER seconds.
_SERVER = """
import http.server, signal, subprocess, sys
helper = "import sys, time; sys.stdin.read(); time.sleep(float(sys.argv[1]))"
subprocess.Popen([sys.executable, "-c", helper, sys.argv[1]], stdin=subprocess.PIPE)

class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass

signal.signal(signal.SIGTERM, lambda *args: sys.exit(0))
server = http.server.HTTPServer(("127.0.0.1", 0), Health)
print(sys.argv[2] % ("helper", "127.0.0.1", server.server_port), flush=True)
server.serve_forever()
"""


def _server(helper_linger: float) -> RemoteServer:
    command = [sys.executable, "-c", _SERVER, str(helper_linger), SERVING_LINE]
    return RemoteServer(command=command, timeout=60)


def test_a_helper_that_goes_after_the_server_is_not_left_behind() -> None:
    with _server(helper_linger=1.0) as server:
        pass
    assert server.exit_code == 0
    assert server.leftover == []


def test_a_helper_that_stays_is_left_behind() -> None:
    with _server(helper_linger=3600) as server:
        server.stop(linger=1.0)
    assert server.exit_code == 0
    assert len(server.leftover) == 1


def test_logged_port_reads_the_line_run_server_logs() -> None:
    line = SERVING_LINE % ("a, b", "127.0.0.1", 43210)
    assert logged_port(f"INFO start\nINFO {line}\nINFO more") == 43210
    assert logged_port(line.replace("127.0.0.1", "0.0.0.0")) is None  # another host
    assert logged_port(line, host="0.0.0.0") is None
    assert logged_port(line.replace("127.0.0.1", "0.0.0.0"), host="0.0.0.0") == 43210
    assert logged_port("INFO Serving a on http://127.0.0.1:4321") is None  # not yet whole
    assert logged_port("") is None
    v6 = SERVING_LINE % ("a", "[::1]", 4321)  # run_server logs an IPv6 host in brackets
    assert logged_port(v6, host="::1") == logged_port(v6, host="[::1]") == 4321
    assert logged_port(v6) is None
