#!/usr/bin/env python3
"""Writes the hand-made seed inputs of every fuzz target into fuzz/corpus/<target>/.

Seeds are realistic inputs (envelopes as nodes send them, Chinese chat text, Feishu
callbacks shaped like tests/src/fake_feishu.rs) laid out as each harness in
node/src/fuzzing.rs reads its input. Run once; `cargo fuzz cmin` then keeps the corpus
small. Re-running only rewrites the seed-* files.
"""
import json
import os

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "corpus")


def put(target, name, data):
    d = os.path.join(ROOT, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, "seed-" + name), "wb") as f:
        f.write(data)


ID = "01JD2K8ZQ5X3V7M9N1P2R4S6T8"
REPLY = "01JD2J0000000000000000000A"


def env(**kw):
    e = {"v": 1, "id": ID, "kind": "message", "group": "demo", "sender": "XiaoBa",
         "author": {"name": "XiaoBa", "kind": "bot"}, "text": "@ErGoz 你看下这个 PR",
         "depth": 1, "reply_to": REPLY, "root": REPLY, "platform_msg_id": None,
         "sent_at": 1763800000123}
    e.update(kw)
    return json.dumps(e, ensure_ascii=False)


put("envelope_parse", "bot", env())
put("envelope_parse", "human", env(author={"name": "老王", "kind": "human"}, depth=0,
                                   text="大家好，@小八 帮我读一下这篇论文", reply_to=None, root=None))
put("envelope_parse", "claim", env(kind="claim", text="", relevance=0.72))
put("envelope_parse", "why", env(why={"reason": "interjected", "relevance": 0.5},
                                 platform_msg_id="om_dc13264520392913993dd051dba21dcf",
                                 future_field={"x": [1, 2.5e-3, None]}))
put("envelope_parse", "escapes", env(text="line\\n\"quoted\" \u2028 \U0001F600 `code`"))

# envelope_verify: selector byte, then id \n timestamp \n signature \n body.
body = env()
put("envelope_verify", "ed", b"\x00" + f"{ID}\n1763800000\nv1a,{'A' * 86}==\n{body}".encode())
put("envelope_verify", "hmac", b"\x01" + f"{ID}\n1763800100\nv1,{'B' * 43}= v1a,xx\n{body}".encode())
put("envelope_verify", "stale", b"\x22" + f"{ID}\n1763799000\nv1,abc=\n{{}}".encode())
put("envelope_verify", "junk", b"\x13" + "a.b.c\n+12\n v1, ,v1 v2,==== \n\xff".encode())

# mention: two selector bytes, then the text.
texts = {
    "cjk": "@小八你看下这个 PR，顺便问问＠二狗",
    "overlap": "@小八哥 和 @小八 不是一个人",
    "latin": "@Bob, @Bobby and @Bob-ross; @Bob Ross? mail ops@xiaoba.dev or @bob@ErGoz",
    "code": "看这里 `@XiaoBa` 和\n```\n@ErGoz in a fence\n```\n然后 @ErGoz",
    "url": "https://example.com/@XiaoBa www.x.cn/@小八，然后 @小八",
    "feishu": "<at user_id=\"ou_ergoz\">ErGoz</at> <at id=ou_xiaoba></at> @_user_1 @_user_2 @_user_3 @_user_9",
    "unicode": "@İlkay @ǅemal @ilkay @XIAOBA \u200b@小八\u0301",
}
for name, t in texts.items():
    put("mention", name, b"\x40\xa0" + t.encode())


def message_event(text, mentions, app_id="cli_fuzz", sender_type="user", event_id="ev_1"):
    return {
        "schema": "2.0",
        "header": {"event_id": event_id, "event_type": "im.message.receive_v1",
                   "create_time": "1763800000123", "token": "tok", "app_id": app_id,
                   "tenant_key": "2ca1d211f64f6438"},
        "event": {
            "sender": {"sender_id": {"union_id": "on_8ed6aa67826108097d9ee143816345",
                                     "user_id": "e33ggbyz", "open_id": "ou_human"},
                       "sender_type": sender_type, "tenant_key": "736588c9260f175e"},
            "message": {"message_id": "om_dc13264520392913993dd051dba21dcf",
                        "create_time": "1763800000123", "update_time": "1763800000123",
                        "chat_id": "oc_5ad11d72b830411d72b836c20", "chat_type": "group",
                        "message_type": "text",
                        "content": json.dumps({"text": text}, ensure_ascii=False),
                        "mentions": [{"key": k, "id": {"union_id": "on_x", "user_id": "u",
                                                       "open_id": o}, "name": n,
                                      "tenant_key": "736588c9260f175e"}
                                     for k, o, n in mentions],
                        "user_agent": "Mozilla/5.0 (test)"}}}


events = {
    "message": message_event("@_user_1 帮我看下这个，@_user_2 也看看",
                             [("@_user_1", "ou_xiaoba", "小八"), ("@_user_2", "ou_other", "ErGoz")]),
    "app": message_event("收到", [], sender_type="app", event_id="ev_2"),
    "other_app": message_event("hi", [], app_id="cli_other", event_id="ev_3"),
    "url_check": {"challenge": "ajls384kdjx98XX", "token": "tok", "type": "url_verification"},
    "legacy": {"uuid": "41b5f371157e3d5341b38b20396e77a3", "token": "tok", "ts": "1550038209.428520",
               "type": "event_callback", "event": {"type": "message"}},
    "encrypted": {"encrypt": "FIAfJPGRmFZWkaxPQ1XrJZVbv2JwdjfLk4jx0k/U1deAqYK3AXOZ5zcHt/cC4ZNTqYwWUW/EoL+b2hW/C4zoAQQ5CeMtbxX2zHjm+E4nX/Aww+FHUL6iuIMaeL2KLxqdtbHRC50vgC2YI7xLnrhDIUpwEypjZnJCaTFFhrvCTZBs="},
}
for name, e in events.items():
    put("feishu_event", name, json.dumps(e, ensure_ascii=False))
    # feishu_decrypt: byte 0 = key length, then key, then the plaintext callback.
    key = "kudryavka"
    put("feishu_decrypt", name, bytes([len(key)]) + key.encode() + json.dumps(e, ensure_ascii=False).encode())
put("feishu_decrypt", "raw_blocks", b"\x00" + bytes(range(48)))
