"""Remote reward servers (grpokit.rewards.remote) against a local standard-library HTTP server:
right answers, slow answers, wrong lengths, non-numbers, 5xx then 200, 4xx, nothing listening."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from grpokit.rewards.guard import GuardedReward, RewardError
from grpokit.rewards.remote import RemoteReward, RemoteRewardError, parse_reply


class Server:
    """A reward server whose reply per request is scripted: ``plan`` is a list of
    ``(status, body or callable(request) -> body, delay_s)``; the last entry repeats."""

    def __init__(self, plan):
        self.plan, self.requests = list(plan), []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append(request)
                status, body, delay = outer.plan[min(len(outer.requests), len(outer.plan)) - 1]
                time.sleep(delay)
                data = (body(request) if callable(body) else body).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/score"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def serve():
    servers = []

    def start(*plan):
        servers.append(Server(plan))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


def length_scores(request):
    """One score per completion: its length, or null for an empty completion."""
    return json.dumps({"rewards": [len(c) or None for c in request["completions"]]})


PROMPTS, COMPLETIONS = ["q1", "q1", "q2"], ["abc", "", "hello"]


def test_right_answers_and_the_json_contract(serve):
    server = serve((200, length_scores, 0))
    fn = RemoteReward(server.url, timeout_s=5)
    assert fn(PROMPTS, COMPLETIONS, answer=["3", "3", "5"], meta=[{"k": 1}, {"k": 1}, object()]) == [3.0, None, 5.0]
    sent = server.requests[0]
    assert sent["prompts"] == PROMPTS and sent["completions"] == COMPLETIONS
    assert sent["columns"]["answer"] == ["3", "3", "5"]
    assert sent["columns"]["meta"][0] == {"k": 1} and isinstance(sent["columns"]["meta"][2], str)


def test_a_bare_list_reply_is_accepted(serve):
    server = serve((200, "[0.5, 1, null]", 0))
    assert RemoteReward(server.url)(PROMPTS, COMPLETIONS) == [0.5, 1.0, None]


@pytest.mark.parametrize(
    "body, message",
    [
        ('{"rewards": [1, 2]}', "2 rewards for 3 completions"),
        ('{"rewards": [1, "x", 2]}', "reward 1 is 'x'"),
        ('{"rewards": [1, true, 2]}', "reward 1 is True"),
        ('{"scores": [1, 2, 3]}', "expected"),
        ("not json", "not JSON"),
    ],
)
def test_malformed_replies_name_the_url_and_the_fault(serve, body, message):
    server = serve((200, body, 0))
    with pytest.raises(RemoteRewardError, match=message) as e:
        RemoteReward(server.url, retries=2, backoff_s=0)(PROMPTS, COMPLETIONS)
    assert server.url in str(e.value)
    assert len(server.requests) == 1  # a malformed reply is not retried


def test_5xx_then_200_is_retried_with_backoff(serve):
    server = serve((500, "busy", 0), (503, "busy", 0), (200, length_scores, 0))
    start = time.monotonic()
    assert RemoteReward(server.url, retries=3, backoff_s=0.1, timeout_s=5)(PROMPTS, COMPLETIONS) == [3.0, None, 5.0]
    assert len(server.requests) == 3
    assert time.monotonic() - start >= 0.1 + 0.2  # backoff 0.1 s, then 0.2 s


def test_retries_are_bounded(serve):
    server = serve((500, "down", 0))
    with pytest.raises(RemoteRewardError, match=r"3 attempt\(s\); last: HTTP 500"):
        RemoteReward(server.url, retries=2, backoff_s=0, timeout_s=5)(PROMPTS, COMPLETIONS)
    assert len(server.requests) == 3


def test_4xx_is_not_retried(serve):
    server = serve((404, "no", 0))
    with pytest.raises(RemoteRewardError, match="HTTP 404.*not retried"):
        RemoteReward(server.url, retries=3, backoff_s=0)(PROMPTS, COMPLETIONS)
    assert len(server.requests) == 1


@pytest.mark.slow
def test_a_slow_server_never_holds_the_call_past_the_timeout(serve):
    server = serve((200, length_scores, 3.0))
    start = time.monotonic()
    with pytest.raises(RemoteRewardError, match="within 0.5 s"):
        RemoteReward(server.url, timeout_s=0.5, retries=5, backoff_s=0.05)(PROMPTS, COMPLETIONS)
    assert time.monotonic() - start < 1.0


def test_nothing_listening(serve):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed when the block ends: nothing listens there
    start = time.monotonic()
    with pytest.raises(RemoteRewardError, match="ConnectionRefused|Connection refused|URLError"):
        RemoteReward(f"http://127.0.0.1:{port}/x", timeout_s=2, retries=2, backoff_s=0.05)(PROMPTS, COMPLETIONS)
    assert time.monotonic() - start < 2.5


@pytest.mark.parametrize("on_error", ["none", "raise"])
def test_slow_server_under_the_reward_guard_follows_on_error(serve, on_error):
    server = serve((200, length_scores, 3.0))
    fn = RemoteReward(server.url, timeout_s=0.5, retries=0)
    guard = GuardedReward(server.url, fn, timeout_s=0.5, on_error=on_error, isolation="thread", find_row=False)
    start = time.monotonic()
    if on_error == "none":
        assert guard(PROMPTS, COMPLETIONS) == [None, None, None]
        assert guard.failures == 3
    else:
        with pytest.raises(RewardError, match="127.0.0.1.*batch of 3"):
            guard(PROMPTS, COMPLETIONS)
    assert time.monotonic() - start < 1.0  # one call, not one per row
    assert len(server.requests) == 1


def test_bad_arguments():
    with pytest.raises(ValueError, match="http:// or https://"):
        RemoteReward("ftp://x")
    with pytest.raises(ValueError, match="timeout_s > 0"):
        RemoteReward("http://x", timeout_s=0)
    assert parse_reply("u", b'{"rewards": [2]}', 1) == [2.0]
