"""llama-server's agent flags: `--tools` (built-in tools at /tools), `--tools-runtime`, and the MCP
servers of `--mcp-servers-config` / `--mcp-servers-json` (fake_engines/llamacpp/tools_route.py).

All are off by default. What they enable runs on this host (files, shell commands, MCP servers'
commands), exactly as on the real server: for local use only, never on a shared machine.
"""

from __future__ import annotations

import argparse
from typing import Any


class _Agent(argparse.Action):
    """-ag/--agent: every built-in tool and the CORS proxy; -no-ag/--no-agent: neither (what comes
    later on the command line wins, as llama.cpp applies its options in order)."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        on = not (option_string or "").lstrip("-").startswith("no")
        namespace.tools = "all" if on else None
        namespace.ui_mcp_proxy = on


def add_tools_flags(p: argparse.ArgumentParser) -> None:
    """The flags, spelled as llama-server spells them."""
    g = p.add_argument_group("agent tools (they act on this host: local use only)")
    g.add_argument("-ag", "--agent", "-no-ag", "--no-agent", action=_Agent,
                   help="enable (disable) every built-in tool and the CORS proxy (--tools all --ui-mcp-proxy)")
    g.add_argument("--tools", default=None, metavar="TOOL1,TOOL2,...",
                   help="serve these built-in tools at /tools ('all' for every one): read_file, file_glob_search, "
                        "grep_search, exec_shell_command, write_file, edit_file, get_info (default: none, /tools 403)")
    g.add_argument("--tools-runtime", default="", metavar="OPTION",
                   help="where tools run; the look-alike has only the host, so an isolate is refused")
    g.add_argument("--mcp-servers-config", default="", metavar="PATH",
                   help="JSON file of MCP servers ({\"mcpServers\": {NAME: {command, args, env, cwd, timeout_ms}}}); "
                        "their tools join /tools as NAME_TOOL")
    g.add_argument("--mcp-servers-json", default="", metavar="JSON", help="the same as inline JSON")


def tools_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The LlamaServerConfig fields of these flags."""
    names = tuple(part.strip() for part in (args.tools or "").split(",") if part.strip())
    return {"server_tools": names, "tools_runtime": args.tools_runtime,
            "mcp_servers_config": args.mcp_servers_config, "mcp_servers_json": args.mcp_servers_json}
