"""A person in a Matrix room, played by matrix-nio (PyPI `matrix-nio`, pinned in
tests/requirements.txt), for tests/tests/matrix.rs.

    python matrix_person.py HOMESERVER USER_ID ACCESS_TOKEN DEVICE_ID ROOM_ID

Joins ROOM_ID, syncs in the background (every m.room.message and m.typing kept), prints
`{"event": "ready"}` and then answers one JSON command per stdin line with one JSON line:

  {"op": "send", "content": {...}}            room_send of an m.room.message with this
                                              content → {"event_id": "$…"}
  {"op": "messages", "sender": "@u:hs",        waits (up to "timeout" s) until `n`
   "n": 1, "timeout": 30}                      messages from `sender` were seen →
                                              {"messages": [event source, …]} (all seen)
  {"op": "typing", "user": "@u:hs",            waits until `user` was seen typing →
   "timeout": 30}                              {"typing": true|false}
"""

import asyncio
import json
import sys

from nio import AsyncClient, RoomMessage, RoomSendResponse, TypingNoticeEvent, JoinResponse

homeserver, user_id, token, device_id, room_id = sys.argv[1:6]
messages = []
typing = set()


def say(**kw):
    print(json.dumps(kw), flush=True)


async def main():
    client = AsyncClient(homeserver, user_id)
    client.restore_login(user_id, device_id, token)

    async def on_message(room, event):
        if room.room_id == room_id:
            messages.append(event.source)

    async def on_typing(room, event):
        if room.room_id == room_id:
            typing.update(event.users)

    client.add_event_callback(on_message, RoomMessage)
    client.add_ephemeral_callback(on_typing, TypingNoticeEvent)
    joined = await client.join(room_id)
    if not isinstance(joined, JoinResponse):
        say(event="error", error=str(joined))
        return
    await client.sync(timeout=0, full_state=True)
    messages.clear()
    syncing = asyncio.create_task(client.sync_forever(timeout=1000))
    say(event="ready")
    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line:
            break
        cmd = json.loads(line)
        if cmd["op"] == "send":
            r = await client.room_send(room_id, "m.room.message", cmd["content"])
            if isinstance(r, RoomSendResponse):
                say(event_id=r.event_id)
            else:
                say(error=str(r))
        elif cmd["op"] == "messages":
            deadline = loop.time() + cmd.get("timeout", 30)
            want = lambda: [m for m in messages if m["sender"] == cmd["sender"]]
            while len(want()) < cmd.get("n", 1) and loop.time() < deadline:
                await asyncio.sleep(0.05)
            say(messages=want())
        elif cmd["op"] == "typing":
            deadline = loop.time() + cmd.get("timeout", 30)
            while cmd["user"] not in typing and loop.time() < deadline:
                await asyncio.sleep(0.05)
            say(typing=cmd["user"] in typing)
    syncing.cancel()
    await client.close()


asyncio.run(main())
