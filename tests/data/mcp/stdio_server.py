"""A tiny MCP server for tests/fake_engines/llamacpp/test_mcp.py: newline-delimited JSON-RPC 2.0 on
stdin/stdout (initialize, tools/list, tools/call). Tools: echo (a progress notification, then the
reply, in one write), add, fail_once (an error on its first call in this process), sleep (seconds),
crash (exits at once without replying), spawn_holder (leaves a grandchild holding the pipes).
`--no-tools` lists none. Written for this repository."""

import json
import os
import subprocess
import sys
import time

TOOLS = [{"name": name, "description": f"{name} tool", "inputSchema": {"type": "object", "properties": {}}}
         for name in ("echo", "add", "fail_once", "sleep", "crash", "spawn_holder")]
state = {"failed": False}


def call(name, args):
    if name == "echo":
        return {"content": [{"type": "text", "text": f"echo: {args.get('message', '')}"}]}
    if name == "add":
        return {"content": [{"type": "text", "text": str(args["a"] + args["b"])}, {"type": "image", "data": ""}]}
    if name == "fail_once" and not state["failed"]:
        state["failed"] = True
        return None
    if name == "sleep":
        time.sleep(args.get("seconds", 1))
    if name == "crash":
        os._exit(3)
    if name == "spawn_holder":
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    return {"content": [{"type": "text", "text": "ok"}], "isError": name == "sleep" and args.get("error", False)}


def main():
    tools = [] if "--no-tools" in sys.argv else TOOLS
    for line in sys.stdin:
        try:
            req = json.loads(line)
        except ValueError:
            continue
        rid, method, params = req.get("id"), req.get("method"), req.get("params") or {}
        if rid is None:
            continue  # a notification
        out = ""
        if method == "initialize":
            result = {"protocolVersion": "2024-11-05", "capabilities": {"tools": {}},
                      "serverInfo": {"name": "test", "version": "1"}}
        elif method == "tools/list":
            result = {"tools": tools}
        elif method == "tools/call":
            result = call(params.get("name"), params.get("arguments") or {})
            out = json.dumps({"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progress": 1}}) + "\n"
        else:
            result = None
        reply = {"jsonrpc": "2.0", "id": rid}
        if result is None:
            reply["error"] = {"code": -32000, "message": "transient error"}
        else:
            reply["result"] = result
        os.write(1, (out + json.dumps(reply) + "\n").encode())


if __name__ == "__main__":
    main()
