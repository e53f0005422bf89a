"""A streamable-HTTP MCP server made with the official `mcp` SDK (MCPServer, the former
FastMCP), for tests/tests/tools.rs: tools that answer, fail, time out, return a huge
result, and change the tool list.

    python mcp_http_server.py PORT
"""

import json
import sys

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("botmesh-test-tools")


@server.tool()
def ok(text: str) -> str:
    """Echoes the text back."""
    return f"ok: {text}"


@server.tool()
def fails() -> str:
    """Always fails (the result carries isError)."""
    raise ToolError("this tool always fails")


@server.tool()
async def slow(seconds: float) -> str:
    """Answers after `seconds`."""
    await anyio.sleep(seconds)
    return "slept"


@server.tool()
def huge(chars: int) -> str:
    """Returns `chars` characters."""
    return "x" * chars


@server.tool()
def headers(ctx: Context) -> str:
    """The HTTP request headers this call came with, as a JSON object."""
    request = ctx.request_context.request
    return json.dumps({k.lower(): v for k, v in request.headers.items()}, sort_keys=True)


def fresh() -> str:
    """A tool that exists only after `grow` was called."""
    return "fresh and new"


@server.tool()
async def grow(ctx: Context) -> str:
    """Adds the tool `fresh` and tells the client its tool list changed."""
    server.add_tool(fresh, name="fresh")
    await ctx.session.send_tool_list_changed()
    return "grown"


if __name__ == "__main__":
    server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[1]))
