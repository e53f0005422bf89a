"""A scripted ACP agent for tests/tests/acp.rs, written with the official Python ACP SDK
(PyPI `agent-client-protocol`, pinned in tests/requirements.txt).

It speaks ACP over its stdio like Codex or Claude Code do, and does what the prompt text
says:

  CHUNKS        three message chunks ("one ", "two ", "three"), a plan and a tool call
                update, then end_turn
  TOOL <kind>   a tool call of that kind (with what the kind makes its object: the
                location <cwd>/notes.txt for file kinds, rawInput {"command": "cargo
                test"} for execute, {"url": "https://example.com/page"} for fetch), then
                session/request_permission with option ids that differ from their kinds
                (only the allow ones with ONLYALLOW in the text; with AFTERGO only once
                the file `go` exists in its cwd, logging "awaiting" first); replies
                "permission: <optionId>" or "permission: cancelled" — or, with NOTEXT in
                the text and the call not allowed, ends its turn with no text, as
                opencode and Claude do after a rejection
  SLOW          works 30 s in 0.1 s steps, honouring session/cancel (then answers
                `cancelled` and writes "cancelled <sessionId>" to $ACP_STANDIN_LOG)
  AWAITGO       long work that ends on the test's word, not a clock: a tool call
                "long build" in progress, then waits (0.05 s steps, at most 120 s,
                honouring session/cancel) until the file `go` exists in the session's
                cwd, then replies "built after the signal" (logs "awaiting" first)
  STEPS <n>     several tool calls in turn, each ending on the test's word: tool call
                "step i" (kind execute) in progress, logged "step i <sessionId>", then
                it waits (0.05 s steps, at most 120 s, honouring session/cancel) for the
                file `go<i>` in the session's cwd and completes the call; after step n
                replies "all <n> steps done" (logs "finished <sessionId>")
  CRASH         one chunk, then exits with status 3 mid-turn
  ENV           replies with its environment and cwd as JSON
  REFUSE        some text, then stop reason `refusal`
  SESSION       replies with what session/new gave it (cwd, mcpServers), the session id
                and the prompt blocks it got, as JSON
  SLEEPER       starts `sleep 300` (a child in its process group) and replies its pid
  STRINGID      asks the client a permission question with a string request id and an
                unknown method; replies with both answers as JSON
  MESH <tool> <json arguments>
                calls that tool on the `mesh` MCP server session/new gave it (started
                with the official MCP Python SDK's stdio client, as an agent starts its
                servers) and replies "mesh <tool>: " and the result as JSON
                ({isError, structuredContent, text}); MESH tools lists the tool names
  HUGE <n>      a flood: a tool call titled with n "T"s, then a reply of n "x"s in
                64 KiB chunks
  PROBE <json>  a hostile agent: {"read": [paths], "write": [dirs]} ("{ppid}" in a path
                is its parent's pid, the node's); tries to read each path (a folder is
                listed; /proc/<pid>/mem only opened) and create a file in each dir;
                replies {"read": {path: {"ok", "text" | "error"}}, "write": {...},
                "uid", "gid", "groups"}
  anything else "echo: <text>" (the whole prompt text)

The keyword is looked for at the start of a word in the prompt's last line, so a bot's
prompt ("alice: @Coder SLOW") works as the bare keyword does.

With ACP_STANDIN_NO_INIT=1 it never answers `initialize` (logs "never initializing").

With ACP_STANDIN_STUBBORN=1 it ignores SIGTERM and keeps running after its stdin closes,
as codex-acp does (only SIGKILL to its process group ends it).
"""

import asyncio
import json
import os
import signal
import subprocess
import sys

import acp
from acp import (
    PROTOCOL_VERSION,
    Agent,
    InitializeResponse,
    NewSessionResponse,
    PromptResponse,
    RequestError,
    run_agent,
    start_tool_call,
    update_agent_message_text,
    update_plan,
    plan_entry,
    update_tool_call,
)
from acp.schema import AgentThoughtChunk, PermissionOption, TextContentBlock, ToolCallLocation, ToolCallUpdate


KEYWORDS = ["CHUNKS", "TOOL ", "SLOW", "AWAITGO", "STEPS ", "CRASH", "ENV", "REFUSE", "SESSION", "SLEEPER", "STRINGID", "PROBE", "HUGE", "MESH "]


def probe(spec: dict) -> dict:
    """What a hostile agent gets when it reaches for each path."""
    ppid = str(os.getppid())
    out = {"read": {}, "write": {}, "ppid": ppid, "uid": os.getuid(), "gid": os.getgid(), "groups": os.getgroups()}
    for path in spec.get("read", []):
        real = path.replace("{ppid}", ppid)
        try:
            if os.path.isdir(real):
                text = " ".join(sorted(os.listdir(real)))
            elif real.endswith("/mem"):
                with open(real, "rb"):
                    text = "(opened)"
            else:
                with open(real, "rb") as f:
                    text = f.read(65536).decode("utf-8", "replace")
            out["read"][path] = {"ok": True, "text": text}
        except OSError as e:
            out["read"][path] = {"ok": False, "error": f"{type(e).__name__}: {e.strerror}"}
    for folder in spec.get("write", []):
        target = os.path.join(folder, f"probe-{os.getpid()}")
        try:
            with open(target, "w") as f:
                f.write("hostile")
            os.remove(target)
            out["write"][folder] = {"ok": True}
        except OSError as e:
            out["write"][folder] = {"ok": False, "error": f"{type(e).__name__}: {e.strerror}"}
    return out


def command(text: str) -> str:
    """The last line from its first keyword on (a word's start), else the whole text."""
    lines = text.strip().splitlines()
    last = lines[-1] if lines else ""
    found = [
        i
        for kw in KEYWORDS
        for i in [last.find(kw)]
        if i >= 0 and (i == 0 or last[i - 1] in " @:")
    ]
    return last[min(found):] if found else text


def log(line: str) -> None:
    path = os.environ.get("ACP_STANDIN_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(line + "\n")


class StandIn(Agent):
    def __init__(self) -> None:
        self.conn = None
        self.sessions: dict[str, dict] = {}
        self.cancelled: set[str] = set()
        self.children: list[subprocess.Popen] = []

    def on_connect(self, conn) -> None:
        self.conn = conn

    async def initialize(self, protocol_version, client_capabilities=None, client_info=None, **kwargs):
        if os.environ.get("ACP_STANDIN_NO_INIT") == "1":
            log("never initializing")
            await asyncio.sleep(3600)
        log(f"initialize {protocol_version} {json.dumps(client_capabilities.model_dump(by_alias=True, exclude_none=True) if client_capabilities else None)}")
        return InitializeResponse(protocol_version=PROTOCOL_VERSION)

    async def new_session(self, cwd, mcp_servers=None, **kwargs):
        sid = f"sess-{len(self.sessions) + 1}-{os.getpid()}"
        servers = [s.model_dump(by_alias=True, exclude_none=True) for s in (mcp_servers or [])]
        self.sessions[sid] = {"cwd": cwd, "mcpServers": servers}
        log(f"new_session {sid}")
        return NewSessionResponse(session_id=sid)

    async def cancel(self, session_id, **kwargs):
        self.cancelled.add(session_id)
        log(f"cancel {session_id}")

    async def say(self, sid: str, text: str) -> None:
        await self.conn.session_update(session_id=sid, update=update_agent_message_text(text))

    async def wait(self, sid: str, ticks: int, every: float, go: str | None = None) -> str:
        """Waits `ticks` times `every` seconds, bounded: "cancelled" (logged) once the
        session is cancelled, "go" once the file `go` exists, else "elapsed"."""
        for _ in range(ticks):
            if sid in self.cancelled:
                log(f"cancelled {sid}")
                return "cancelled"
            if go is not None and os.path.exists(go):
                return "go"
            await asyncio.sleep(every)
        return "elapsed"

    async def prompt(self, prompt, session_id, **kwargs):
        sid = session_id
        self.cancelled.discard(sid)
        texts = [b.text for b in prompt if isinstance(b, TextContentBlock)]
        whole = texts[-1] if texts else ""
        log(f"prompt {sid} {json.dumps(whole)}")
        text = command(whole)

        if text.startswith("CHUNKS"):
            await self.conn.session_update(
                session_id=sid, update=update_plan([plan_entry("count to three", status="in_progress")])
            )
            await self.conn.session_update(
                session_id=sid,
                update=AgentThoughtChunk(session_update="agent_thought_chunk", content=acp.text_block("hmm")),
            )
            for chunk in ["one ", "two ", "three"]:
                await self.say(sid, chunk)
            await self.conn.session_update(
                session_id=sid, update=start_tool_call("t1", "cargo test", kind="execute", status="in_progress")
            )
            await self.conn.session_update(session_id=sid, update=update_tool_call("t1", status="completed"))
            return PromptResponse(stop_reason="end_turn")

        if text.startswith("TOOL "):
            kind = text.split()[1]
            if "AFTERGO" in text:
                # Asks only once the file `go` exists in the session's cwd.
                go = os.path.join(self.sessions[sid]["cwd"], "go")
                log(f"awaiting {sid}")
                for _ in range(2400):
                    if os.path.exists(go):
                        break
                    await asyncio.sleep(0.05)
            cwd = self.sessions[sid]["cwd"]
            objects = {
                "execute": {"raw_input": {"command": "cargo test"}},
                "fetch": {"raw_input": {"url": "https://example.com/page"}},
            }
            for file_kind in ["read", "edit", "delete", "move"]:
                objects[file_kind] = {"locations": [ToolCallLocation(path=os.path.join(cwd, "notes.txt"))]}
            await self.conn.session_update(
                session_id=sid,
                update=start_tool_call(
                    "call-7", f"do a {kind} thing", kind=kind, status="pending", **objects.get(kind, {})
                ),
            )
            options = [
                PermissionOption(option_id="proceed-once", name="Yes", kind="allow_once"),
                PermissionOption(option_id="proceed-always", name="Always", kind="allow_always"),
                PermissionOption(option_id="nope", name="No", kind="reject_once"),
            ]
            if "ONLYALLOW" in text:
                options = [o for o in options if o.kind.startswith("allow")]
            answer = await self.conn.request_permission(
                session_id=sid,
                tool_call=ToolCallUpdate(tool_call_id="call-7", title=f"do a {kind} thing", kind=kind),
                options=options,
            )
            outcome = answer.outcome
            picked = getattr(outcome, "option_id", None) or outcome.outcome
            log(f"permission {kind} {picked}")
            if "NOTEXT" in text and not picked.startswith("proceed"):
                return PromptResponse(stop_reason="end_turn")
            await self.say(sid, f"permission: {picked}")
            return PromptResponse(stop_reason="end_turn")

        if text.startswith("SLOW"):
            await self.say(sid, "working")
            if await self.wait(sid, 300, 0.1) == "cancelled":
                return PromptResponse(stop_reason="cancelled")
            await self.say(sid, "done slowly")
            return PromptResponse(stop_reason="end_turn")

        if text.startswith("AWAITGO"):
            go = os.path.join(self.sessions[sid]["cwd"], "go")
            await self.conn.session_update(
                session_id=sid, update=start_tool_call("b1", "long build", kind="execute", status="in_progress")
            )
            log(f"awaiting {sid}")
            waited = await self.wait(sid, 2400, 0.05, go)
            if waited == "cancelled":
                return PromptResponse(stop_reason="cancelled")
            if waited == "go":
                await self.conn.session_update(session_id=sid, update=update_tool_call("b1", status="completed"))
                await self.say(sid, "built after the signal")
                log(f"finished {sid}")
                return PromptResponse(stop_reason="end_turn")
            await self.say(sid, "gave up waiting for the signal")
            return PromptResponse(stop_reason="end_turn")

        if text.startswith("STEPS "):
            n = int(text.split()[1])
            cwd = self.sessions[sid]["cwd"]
            for i in range(1, n + 1):
                await self.conn.session_update(
                    session_id=sid, update=start_tool_call(f"s{i}", f"step {i}", kind="execute", status="in_progress")
                )
                log(f"step {i} {sid}")
                if await self.wait(sid, 2400, 0.05, os.path.join(cwd, f"go{i}")) == "cancelled":
                    return PromptResponse(stop_reason="cancelled")
                await self.conn.session_update(session_id=sid, update=update_tool_call(f"s{i}", status="completed"))
            await self.say(sid, f"all {n} steps done")
            log(f"finished {sid}")
            return PromptResponse(stop_reason="end_turn")

        if text.startswith("CRASH"):
            await self.say(sid, "about to crash")
            await asyncio.sleep(0.1)
            os._exit(3)

        if text.startswith("ENV"):
            await self.say(sid, json.dumps({"env": dict(os.environ), "cwd": os.getcwd()}))
            return PromptResponse(stop_reason="end_turn")

        if text.startswith("HUGE"):
            n = int(text.split()[1])
            await self.conn.session_update(
                session_id=sid, update=start_tool_call("h1", "T" * n, kind="execute", status="in_progress")
            )
            sent = 0
            while sent < n:
                part = min(65536, n - sent)
                await self.say(sid, "x" * part)
                sent += part
            return PromptResponse(stop_reason="end_turn")

        if text.startswith("PROBE"):
            await self.say(sid, json.dumps(probe(json.loads(text[len("PROBE"):].strip()))))
            return PromptResponse(stop_reason="end_turn")

        if text.startswith("REFUSE"):
            await self.say(sid, "I started, but ")
            return PromptResponse(stop_reason="refusal")

        if text.startswith("SESSION"):
            info = dict(self.sessions[sid], sessionId=sid, blocks=texts)
            await self.say(sid, json.dumps(info))
            return PromptResponse(stop_reason="end_turn")

        if text.startswith("SLEEPER"):
            child = subprocess.Popen(["sleep", "300"])
            self.children.append(child)
            await self.say(sid, str(child.pid))
            return PromptResponse(stop_reason="end_turn")

        if text.startswith("STRINGID"):
            conn = self.conn._conn  # the SDK's JSON-RPC connection: its ids are integers
            future = asyncio.get_running_loop().create_future()
            conn._pending["perm-3f2c"] = future
            await conn._transport.send(
                {
                    "jsonrpc": "2.0",
                    "id": "perm-3f2c",
                    "method": "session/request_permission",
                    "params": {
                        "sessionId": sid,
                        "toolCall": {"toolCallId": "c1", "title": "look", "kind": "read"},
                        "options": [
                            {"optionId": "ok", "name": "OK", "kind": "allow_once"},
                            {"optionId": "no", "name": "No", "kind": "reject_once"},
                        ],
                    },
                }
            )
            permission = await asyncio.wait_for(future, 10)
            try:
                await self.conn.ext_method("botmesh.test/unknown", {})
                unknown = "answered"
            except RequestError as e:
                unknown = e.code
            await self.say(sid, json.dumps({"permission": permission, "unknown": unknown}))
            return PromptResponse(stop_reason="end_turn")

        if text.startswith("MESH "):
            await self.say(sid, await self.mesh(sid, text))
            return PromptResponse(stop_reason="end_turn")

        await self.say(sid, f"echo: {whole}")
        return PromptResponse(stop_reason="end_turn")

    async def mesh(self, sid: str, text: str) -> str:
        """One call on the session's `mesh` MCP server (a stdio server, as ACP gives it)."""
        from mcp import Client
        from mcp.client.stdio import StdioServerParameters

        parts = text.split(" ", 2)
        tool = parts[1]
        arguments = json.loads(parts[2]) if len(parts) > 2 else {}
        server = next(s for s in self.sessions[sid]["mcpServers"] if s.get("name") == "mesh")
        params = StdioServerParameters(
            command=server["command"],
            args=server.get("args", []),
            env={e["name"]: e["value"] for e in server.get("env", [])},
        )
        log(f"mesh call {tool} {json.dumps(arguments)}")
        async with Client(params) as client:
            if tool == "tools":
                listed = await client.list_tools()
                return "mesh tools: " + json.dumps(sorted(t.name for t in listed.tools))
            result = await client.call_tool(tool, arguments)
        out = {
            "isError": bool(result.is_error),
            "structuredContent": result.structured_content,
            "text": "".join(getattr(c, "text", "") for c in result.content),
        }
        log(f"mesh result {tool} {json.dumps(out)}")
        return f"mesh {tool}: " + json.dumps(out)


async def main() -> None:
    stubborn = os.environ.get("ACP_STANDIN_STUBBORN") == "1"
    if stubborn:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    log(f"started {os.getpid()}")
    await run_agent(StandIn())
    log("stdin closed")
    if stubborn:
        while True:
            await asyncio.sleep(3600)


if __name__ == "__main__":
    asyncio.run(main())
    sys.exit(0)
