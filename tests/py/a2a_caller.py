"""An A2A caller built on the official SDK (a2a-sdk 1.x): what tests/tests/a2a.rs
asks a served bot, one scenario per run, each result printed as one JSON line.

    a2a_caller.py BASE TOKEN card
    a2a_caller.py BASE TOKEN send TEXT [CONTEXT_ID]
    a2a_caller.py BASE TOKEN stream TEXT
    a2a_caller.py BASE TOKEN get TASK_ID
    a2a_caller.py BASE TOKEN cancel TEXT     (sends without waiting, then cancels)
    a2a_caller.py BASE TOKEN ask TEXT        (a task waiting for input, answered /allow)

TOKEN "-" sends no Authorization header. An SDK error is printed as
{"error": <exception class>, "message": …}.
"""

import asyncio
import json
import sys

import httpx
from google.protobuf.json_format import MessageToDict

from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
from a2a.helpers.proto_helpers import new_text_message
from a2a.types.a2a_pb2 import (
    CancelTaskRequest,
    GetTaskRequest,
    Role,
    SendMessageRequest,
    TaskState,
)


def out(obj):
    print(json.dumps(obj), flush=True)


def as_dict(msg):
    return MessageToDict(msg, preserving_proto_field_name=False)


async def client_for(base, token, streaming, polling=False):
    headers = {} if token == "-" else {"Authorization": f"Bearer {token}"}
    http = httpx.AsyncClient(headers=headers, timeout=30)
    card = await A2ACardResolver(http, base).get_agent_card()
    config = ClientConfig(streaming=streaming, polling=polling, httpx_client=http)
    return ClientFactory(config).create(card), card


async def main():
    base, token, scenario, *args = sys.argv[1:]
    try:
        if scenario == "card":
            async with httpx.AsyncClient(timeout=30) as http:
                card = await A2ACardResolver(http, base).get_agent_card()
            out({"card": as_dict(card)})
        elif scenario == "send":
            client, _ = await client_for(base, token, streaming=False)
            message = new_text_message(args[0], role=Role.ROLE_USER)
            if len(args) > 1:
                message.context_id = args[1]
            async for event in client.send_message(SendMessageRequest(message=message)):
                out({"event": as_dict(event)})
        elif scenario == "stream":
            client, _ = await client_for(base, token, streaming=True)
            message = new_text_message(args[0], role=Role.ROLE_USER)
            async for event in client.send_message(SendMessageRequest(message=message)):
                out({"event": as_dict(event)})
        elif scenario == "get":
            client, _ = await client_for(base, token, streaming=False)
            task = await client.get_task(GetTaskRequest(id=args[0]))
            out({"task": as_dict(task)})
        elif scenario == "ask":
            # A task that waits for input: answered with /allow naming the task, then
            # polled until it is over.
            client, _ = await client_for(base, token, streaming=False)
            message = new_text_message(args[0], role=Role.ROLE_USER)
            task = None
            async for event in client.send_message(SendMessageRequest(message=message)):
                out({"event": as_dict(event)})
                task = event.task
            answer = new_text_message(
                "/allow", role=Role.ROLE_USER, context_id=task.context_id, task_id=task.id
            )
            async for event in client.send_message(SendMessageRequest(message=answer)):
                out({"answered": as_dict(event)})
            for _ in range(150):
                now = await client.get_task(GetTaskRequest(id=task.id))
                if now.status.state in (
                    TaskState.TASK_STATE_COMPLETED,
                    TaskState.TASK_STATE_FAILED,
                    TaskState.TASK_STATE_CANCELED,
                ):
                    break
                await asyncio.sleep(0.2)
            out({"task": as_dict(now)})
        elif scenario == "cancel":
            client, _ = await client_for(base, token, streaming=False, polling=True)
            message = new_text_message(args[0], role=Role.ROLE_USER)
            task_id = None
            async for event in client.send_message(SendMessageRequest(message=message)):
                out({"event": as_dict(event)})
                task_id = event.task.id
            # Let the turn start before it is cancelled.
            await asyncio.sleep(1.0)
            canceled = await client.cancel_task(CancelTaskRequest(id=task_id))
            out({"canceled": as_dict(canceled)})
            try:
                await client.cancel_task(CancelTaskRequest(id=task_id))
                out({"again": "accepted"})
            except Exception as e:  # noqa: BLE001 - the error's class is the result
                out({"again": type(e).__name__, "message": str(e)})
        else:
            raise SystemExit(f"unknown scenario {scenario}")
    except Exception as e:  # noqa: BLE001 - the test reads the error's class
        out({"error": type(e).__name__, "message": str(e)})


asyncio.run(main())
