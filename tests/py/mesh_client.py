"""An agent outside the mesh, as tests/tests/group_tools.rs plays it: the official MCP
Python SDK's client starts `botmesh mcp …` over stdio (as Claude Code or Codex would),
lists its tools, then makes the calls it is given, in order.

    mesh_client.py <calls JSON> <command> [args…]

<calls JSON> is a list of [tool, arguments]. It prints one JSON object:
{"tools": [names], "results": [{"tool", "isError", "structuredContent", "text"}]}.
"""

import asyncio
import json
import os
import sys

from mcp import Client
from mcp.client.stdio import StdioServerParameters


async def main() -> None:
    calls = json.loads(sys.argv[1])
    params = StdioServerParameters(command=sys.argv[2], args=sys.argv[3:], env=dict(os.environ))
    results = []
    async with Client(params) as client:
        listed = await client.list_tools()
        for tool, arguments in calls:
            r = await client.call_tool(tool, arguments)
            results.append(
                {
                    "tool": tool,
                    "isError": bool(r.is_error),
                    "structuredContent": r.structured_content,
                    "text": "".join(getattr(c, "text", "") for c in r.content),
                }
            )
    print(json.dumps({"tools": sorted(t.name for t in listed.tools), "results": results}))


if __name__ == "__main__":
    asyncio.run(main())
