"""llama-server's HTTP-surface flags: who may call (API keys, CORS), what is served besides the API
(the web UI, the CORS proxy, slot files) and how the model is named (aliases, tags).

They shape what clients see, never the engine, so they live apart from the engine's flags; the
config fields keep the values as given and fake_engines/llamacpp/access.py reads them.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

CORS_METHODS = "GET, POST, DELETE, OPTIONS"
"""--cors-methods default (common/arg.cpp's help)."""
CORS_HEADERS = "*"
"""--cors-headers default."""


def add_http_flags(p: argparse.ArgumentParser) -> None:
    """The flags, each spelled as llama-server spells it; the other spellings (--webui, --ui,
    --cors-credentials, ...) come from the upstream table as aliases of these."""
    g = p.add_argument_group("HTTP surface")
    g.add_argument("--api-key-file", default=None, metavar="FNAME",
                   help="file of API keys, one per line; lines starting with # are comments")
    g.add_argument("--cors-origins", default=None, metavar="ORIGINS",
                   help="allowed origins (default: *, or localhost when --tools or MCP servers are on); "
                        "'localhost' reflects the Origin header only if it is a localhost origin")
    g.add_argument("--cors-methods", default=CORS_METHODS, metavar="METHODS", help="allowed methods for CORS")
    g.add_argument("--cors-headers", default=CORS_HEADERS, metavar="HEADERS", help="allowed headers for CORS")
    g.add_argument("--no-cors-credentials", action="store_true",
                   help="do not allow credentials; by default, with --cors-origins *, the Origin is echoed back")
    g.add_argument("--no-ui", action="store_true", help="do not serve the web UI (GET / answers 404)")
    g.add_argument("--ui-mcp-proxy", action="store_true",
                   help="serve /cors-proxy?url=...: fetch a URL for the client (403 otherwise)")
    g.add_argument("--slot-save-path", default=None, metavar="PATH",
                   help="folder for POST /slots/ID?action=save|restore files (501 otherwise)")
    g.add_argument("--tags", default=None, metavar="STRING", help="model tags, comma-separated (informational)")


def http_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The LlamaServerConfig fields of these flags."""
    return {"api_key_file": args.api_key_file, "cors_origins": args.cors_origins, "cors_methods": args.cors_methods,
            "cors_headers": args.cors_headers, "no_cors_credentials": args.no_cors_credentials,
            "no_ui": args.no_ui, "ui_mcp_proxy": args.ui_mcp_proxy, "slot_save_path": args.slot_save_path,
            "tags": args.tags}


def comma_set(text: str | None) -> list[str]:
    """-a / --tags: split on commas, stripped, empties dropped, sorted and unique (llama.cpp keeps a
    std::set, so the first alias in alphabetical order names the model)."""
    return sorted({part.strip() for part in (text or "").split(",") if part.strip()})


def api_keys(api_key: str | None, api_key_file: str | None) -> tuple[str, ...]:
    """--api-key's comma-separated keys, then --api-key-file's lines (not those starting with #)."""
    keys = [k for k in (api_key or "").split(",") if k]
    if api_key_file:
        with open(api_key_file, encoding="utf-8") as f:
            keys += [line for line in f.read().splitlines() if line and not line.startswith("#")]
    return tuple(keys)


def check_http_settings(api_key_file: str | None, slot_save_path: str | None) -> str | None:
    """The message llama-server exits with for a bad file or folder, or None."""
    if api_key_file and not os.path.isfile(api_key_file):
        return f"--api-key-file: error: failed to open file '{api_key_file}'"
    if slot_save_path is not None and not os.path.isdir(slot_save_path):
        return f"--slot-save-path: not a directory: {slot_save_path}"
    return None
