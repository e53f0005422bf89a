#!/usr/bin/env python3
"""A botmesh sidecar bot using only Python's standard library.

The node does all the mesh work (signing, dedup, mentions, judging, delays, claims,
depth). When it decides its bot should take a turn it POSTs the turn here; this bot
answers either in the response ({"text": ...}) or later through the node's
POST /v1/messages with "from" = the bot's name and "reply_to" = the trigger id.

    python3 examples/sidecar_bot.py --port 9000 --node http://127.0.0.1:8102 --mode sync

then in peers.toml for that bot:  agent = { webhook = "http://127.0.0.1:9000/turn" }
"""

import argparse
import json
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def compose(turn):
    """The bot's 'brain': replace with a call to your own agent."""
    trigger = turn["trigger"]
    who = trigger["author"]["name"]
    return f"{turn['bot']} (sidecar) got it, {who}: you said {trigger['text']!r} ({turn['why']}, depth {turn['depth']})"


def post_later(node, token, turn):
    body = json.dumps({
        "group": turn["group"],
        "text": compose(turn),
        "from": turn["bot"],
        "reply_to": turn["reply_to"],
    }).encode()
    req = urllib.request.Request(node + "/v1/messages", data=body, method="POST",
                                 headers={"content-type": "application/json"})
    if token:
        req.add_header("authorization", "Bearer " + token)
    with urllib.request.urlopen(req, timeout=10) as resp:
        resp.read()


def make_handler(args):
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            if self.path != "/turn":
                self.send_error(404)
                return
            length = int(self.headers.get("content-length", "0"))
            try:
                turn = json.loads(self.rfile.read(length))
            except ValueError:
                self.send_error(400, "not JSON")
                return
            if args.mode == "sync":
                out = json.dumps({"text": compose(turn)}).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)
            else:
                # Acknowledge now, answer when ready (e.g. after a long agent run).
                self.send_response(202)
                self.send_header("content-length", "0")
                self.end_headers()
                threading.Thread(target=post_later, args=(args.node, args.token, turn), daemon=True).start()

        def log_message(self, fmt, *a):
            if args.verbose:
                super().log_message(fmt, *a)

    return Handler


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=9000, help="0 picks a free port (printed on stdout)")
    p.add_argument("--node", default="http://127.0.0.1:8101", help="the bot's node local API")
    p.add_argument("--token", default="", help="bearer token, if the local API needs one")
    p.add_argument("--mode", choices=["sync", "async"], default="sync")
    p.add_argument("--verbose", action="store_true")
    args = p.parse_args()
    server = ThreadingHTTPServer((args.host, args.port), make_handler(args))
    print(f"listening on http://{args.host}:{server.server_address[1]}/turn", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
