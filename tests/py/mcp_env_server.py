"""A stdio MCP server made with the official `mcp` SDK whose one tool, `env`, returns the
environment it was started with (tests/tests/tools.rs: the node's secrets never reach a
tool server), and `exit`, which ends the process (the node reconnects)."""

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


if __name__ == "__main__":
    server.run("stdio")
