"""A small MCP server over stdio for the executor's tests: newline-delimited JSON-RPC 2.0, the
`initialize` handshake, `tools/list` and `tools/call`. Standard library only.

Tools:
- add(a, b) -> structured {"sum": a + b}
- append_note(text) -> appends a line to $NOTES_FILE (a side effect tests can count)
- fail() -> an MCP tool error
"""
import json
import os
import sys

TOOLS = [
    {
        "name": "add",
        "description": "Adds two numbers.",
        "inputSchema": {
            "type": "object",
            "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
            "required": ["a", "b"],
            "additionalProperties": False,
        },
    },
    {
        "name": "append_note",
        "description": "Appends a line to the notes file.",
        "inputSchema": {
            "type": "object",
            "properties": {"text": {"type": "string"}},
            "required": ["text"],
        },
    },
    {
        "name": "fail",
        "description": "Always fails.",
        "inputSchema": {"type": "object", "properties": {}},
    },
]


def reply(msg_id, result=None, error=None):
    out = {"jsonrpc": "2.0", "id": msg_id}
    if error is not None:
        out["error"] = error
    else:
        out["result"] = result
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()


def call(name, args):
    if name == "add":
        total = args["a"] + args["b"]
        return {"content": [{"type": "text", "text": json.dumps({"sum": total})}],
                "structuredContent": {"sum": total}, "isError": False}
    if name == "append_note":
        with open(os.environ["NOTES_FILE"], "a") as notes:
            notes.write(args["text"] + "\n")
        return {"content": [{"type": "text", "text": "noted"}], "isError": False}
    if name == "fail":
        return {"content": [{"type": "text", "text": "the fail tool failed"}], "isError": True}
    return None


for line in sys.stdin:
    line = line.strip()
    if not line:
        continue
    msg = json.loads(line)
    method = msg.get("method")
    msg_id = msg.get("id")
    if msg_id is None:
        continue  # a notification, e.g. notifications/initialized
    if method == "initialize":
        reply(msg_id, {
            "protocolVersion": msg["params"].get("protocolVersion", "2025-06-18"),
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "hermes-test", "version": "1.0.0"},
        })
    elif method == "tools/list":
        reply(msg_id, {"tools": TOOLS})
    elif method == "tools/call":
        result = call(msg["params"]["name"], msg["params"].get("arguments") or {})
        if result is None:
            reply(msg_id, error={"code": -32602, "message": "unknown tool"})
        else:
            reply(msg_id, result)
    elif method == "ping":
        reply(msg_id, {})
    else:
        reply(msg_id, error={"code": -32601, "message": "method not found: %s" % method})
