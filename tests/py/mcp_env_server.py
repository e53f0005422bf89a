"""A stdio MCP server made with the official `mcp` SDK whose one tool, `env`, returns the
environment it was started with (tests/tests/tools.rs: the node's secrets never reach a
tool server), `exit`, which ends the process (the node reconnects), and `read`, which
tries to read files and list folders (tests/tests/tools.rs: a boxed server finds nothing
of the node's)."""

import json
import os

from mcp.server.mcpserver import MCPServer

server = MCPServer("botmesh-test-env")


@server.tool()
def env() -> str:
    """The server process's environment variables, as a JSON object."""
    return json.dumps(dict(os.environ), sort_keys=True)


@server.tool()
def exit() -> str:
    """Ends the server process at once (a server that dies)."""
    os._exit(3)


@server.tool()
def read(paths: list[str]) -> str:
    """Tries each path, `$VARS` expanded (a file is read, a folder listed):
    {path: {ok, text | error}}."""
    out = {}
    for written in paths:
        path = os.path.expandvars(written)
        try:
            if os.path.isdir(path):
                text = json.dumps(sorted(os.listdir(path)))
            else:
                with open(path, encoding="utf-8", errors="replace") as f:
                    text = f.read(4096)
            out[written] = {"ok": True, "text": text}
        except OSError as e:
            out[written] = {"ok": False, "error": f"{type(e).__name__}: {e}"}
    return json.dumps(out)


if __name__ == "__main__":
    server.run("stdio")
