"""A remote A2A agent built with the official SDK's server classes (a2a-sdk 1.x):
what tests/tests/a2a.rs gives a bot as its reply engine (`agent = { a2a = … }`).

    a2a_agent.py TOKEN

Listens on 127.0.0.1 (a free port) and prints `listening on http://127.0.0.1:PORT`. Every
request must carry `Authorization: Bearer TOKEN` (else 401). What a message makes it do,
by what its text contains:
- `slow`: waits 2 s before it creates its task (so a turn stopped right after the message
  went out is stopped before the agent named its task), then works for 30 s (status
  "working slowly"), so the test can cancel it;
- `permission` (a new task): asks "may I deploy?" (INPUT_REQUIRED); the message that
  continues that task gets "deployed after: <its text>";
- anything else: a status "reading the group" then the artifact
  "remote saw <n> lines; last: <last line>" and COMPLETED.
Every message it received is appended to the file named by $A2A_AGENT_LOG, one JSON line
`{"context": …, "task": …, "text": …}`, and every cancellation as `{"canceled": <task>}`,
for the test to read.
"""

import asyncio
import json
import os
import socket
import sys

import uvicorn
from starlette.applications import Starlette
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.responses import JSONResponse

from a2a.helpers.proto_helpers import new_task_from_user_message, new_text_part
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types.a2a_pb2 import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    TaskState,
)

TOKEN = sys.argv[1]


class Scripted(AgentExecutor):
    async def execute(self, context: RequestContext, event_queue) -> None:
        text = context.get_user_input()
        log = os.environ.get("A2A_AGENT_LOG")
        if log:
            with open(log, "a") as f:
                f.write(json.dumps({"context": context.context_id, "task": context.task_id, "text": text}) + "\n")
        task = context.current_task
        if task is None and "slow" in text:
            await asyncio.sleep(2)
        if task is None:
            task = new_task_from_user_message(context.message)
            await event_queue.enqueue_event(task)
        updater = TaskUpdater(event_queue, task.id, task.context_id)
        asked = task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
        if asked:
            await updater.add_artifact([new_text_part(f"deployed after: {text}")], name="answer")
            await updater.complete()
            return
        if "permission" in text:
            await updater.requires_input(updater.new_agent_message([new_text_part("may I deploy?")]))
            return
        if "slow" in text:
            await updater.start_work(updater.new_agent_message([new_text_part("working slowly")]))
            await asyncio.sleep(30)
            await updater.complete()
            return
        await updater.start_work(updater.new_agent_message([new_text_part("reading the group")]))
        lines = [l for l in text.splitlines() if l.strip()]
        await updater.add_artifact(
            [new_text_part(f"remote saw {len(lines)} lines; last: {lines[-1] if lines else ''}")],
            name="answer",
        )
        await updater.complete()

    async def cancel(self, context: RequestContext, event_queue) -> None:
        task = context.current_task
        log = os.environ.get("A2A_AGENT_LOG")
        if log:
            with open(log, "a") as f:
                f.write(json.dumps({"canceled": task.id}) + "\n")
        updater = TaskUpdater(event_queue, task.id, task.context_id)
        await updater.cancel()


class Bearer(BaseHTTPMiddleware):
    async def dispatch(self, request, call_next):
        if request.url.path != "/.well-known/agent-card.json" and request.headers.get(
            "authorization"
        ) != f"Bearer {TOKEN}":
            return JSONResponse({"error": "unauthorized"}, status_code=401)
        return await call_next(request)


def main():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    # Listening before the port is announced: a connection made at once waits in the backlog.
    sock.listen(64)
    port = sock.getsockname()[1]
    base = f"http://127.0.0.1:{port}"
    card = AgentCard(
        name="Remote",
        description="a scripted remote agent",
        supported_interfaces=[
            AgentInterface(url=f"{base}/rpc", protocol_binding="JSONRPC", protocol_version="1.0")
        ],
        version="1.0.0",
        capabilities=AgentCapabilities(streaming=True),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        skills=[AgentSkill(id="chat", name="chat", description="answers", tags=["chat"])],
    )
    handler = DefaultRequestHandler(
        agent_executor=Scripted(), task_store=InMemoryTaskStore(), agent_card=card
    )
    app = Starlette(routes=create_agent_card_routes(card) + create_jsonrpc_routes(handler, "/rpc"))
    app.add_middleware(Bearer)
    print(f"listening on {base}", flush=True)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    asyncio.run(server.serve(sockets=[sock]))


main()
